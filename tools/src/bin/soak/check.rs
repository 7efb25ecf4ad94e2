//! The checks, run once the faults are over, on what was seen from outside the replicas:
//! their reports, the `pg_locks` samples and the rows written.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::child::POOL_SIZE;
use crate::db::{Holder, RUN_GAP_US, Row, Run};
use crate::faults::{Fault, Kind, SESSION_ENDED};
use crate::fleet::{Event, What};
use crate::options::Options;

/// An interval of µs, `[start, end)`.
pub(crate) type Iv = (u64, u64);

/// Something the README says cannot happen, or a bound missed.
#[derive(Clone, Debug)]
pub(crate) struct Violation {
    /// When (µs, this machine's clock).
    pub(crate) at: u64,
    /// What happened.
    pub(crate) what: String,
    /// The fault it is attributed to.
    pub(crate) fault: Option<usize>,
    /// The replica processes involved (for the log excerpts).
    pub(crate) replicas: Vec<usize>,
}

/// A replica process as the checks need it.
#[derive(Clone, Debug)]
pub(crate) struct ProcInfo {
    /// Its slot.
    pub(crate) slot: usize,
    /// When it was spawned.
    pub(crate) spawned: u64,
    /// When it was killed or exited.
    pub(crate) ended: Option<u64>,
    /// RSS samples (µs, kB).
    pub(crate) rss: Vec<(u64, u64)>,
    /// Fast takeover.
    pub(crate) fast: bool,
}

/// The backends seen at a quiet moment.
#[derive(Clone, Debug)]
pub(crate) struct Checkpoint {
    /// When.
    pub(crate) at: u64,
    /// Per `application_name`, the checker's excluded.
    pub(crate) backends: Vec<(String, i64)>,
    /// The live replica processes then.
    pub(crate) live: Vec<usize>,
}

/// Everything the checks read.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    /// The run's options.
    pub(crate) options: &'a Options,
    /// When the fleet started (µs, this machine).
    pub(crate) start: u64,
    /// When the checks end (after the last fault healed and the fleet settled).
    pub(crate) end: u64,
    /// Every event, in any order.
    pub(crate) events: &'a [Event],
    /// Every replica process, by index.
    pub(crate) procs: &'a [ProcInfo],
    /// Every fault, by id (in injection order).
    pub(crate) faults: &'a [Fault],
    /// The `pg_locks` and epoch samples (server clock).
    pub(crate) runs: &'a [Run],
    /// The rows, ordered by `at`, then epoch (server clock).
    pub(crate) rows: &'a [Row],
    /// The server's clock minus this machine's (µs).
    pub(crate) offset: i64,
    /// The backends at quiet moments.
    pub(crate) checkpoints: &'a [Checkpoint],
    /// When the soak's own 1 ms sleeper ran more than 20 ms late (the machine stalled).
    pub(crate) stalls: &'a [Iv],
}

/// What the checks found.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    /// Every violation.
    pub(crate) violations: Vec<Violation>,
    /// Per fault: the time nobody led, from its injection to the next fault's.
    pub(crate) leaderless: Vec<u64>,
    /// Per fault: the time two replicas led at once, over the same span.
    pub(crate) two_leaders: Vec<u64>,
    /// Leaderless gaps no fault explains (a leader that stepped down by itself, within the
    /// allowance of 1·I + slack).
    pub(crate) unprovoked: Vec<Iv>,
    /// The first moment a replica may have led.
    pub(crate) first_leader: Option<u64>,
    /// Rows checked, epochs seen, rows written while the sampled holder was another
    /// replica (within an allowance) or nobody.
    pub(crate) rows: usize,
    /// Distinct epochs in the rows.
    pub(crate) epochs: usize,
    /// Rows written while `pg_locks` showed another replica holding the lock, within the
    /// allowance.
    pub(crate) rows_other_holder: usize,
    /// Rows written while `pg_locks` showed nobody holding it.
    pub(crate) rows_no_holder: usize,
    /// Ticks refused by `Term::fence`.
    pub(crate) fence_refusals: usize,
    /// Per process living ≥ 30 s: (index, life, RSS after 10 s, last RSS) in µs and kB.
    pub(crate) rss: Vec<(usize, u64, u64, u64)>,
    /// Backends (total) at each checkpoint.
    pub(crate) backends: Vec<i64>,
    /// The most backends a live replica had at a checkpoint.
    pub(crate) backends_per_replica_max: i64,
    /// Two replicas leading at once within a fault's allowance: when, how long, who, and
    /// the fault.
    pub(crate) excused_overlaps: Vec<(Iv, Vec<usize>, Option<usize>)>,
    /// Sessions ended while their leader could not hear (fault id, and the freeze's or the
    /// partition's).
    pub(crate) deaf: Vec<(usize, usize)>,
    /// The machine's stalls: how many, their total and the longest (µs).
    pub(crate) stalls: (usize, u64, u64),
}

/// Sorts and merges intervals, dropping empty ones.
pub(crate) fn normalize(mut v: Vec<Iv>) -> Vec<Iv> {
    v.retain(|&(s, e)| e > s);
    v.sort_unstable();
    let mut out: Vec<Iv> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `a` minus `holes` (both normalized).
pub(crate) fn subtract(a: &[Iv], holes: &[Iv]) -> Vec<Iv> {
    let mut out = Vec::new();
    let mut h = 0;
    for &(mut s, e) in a {
        while h < holes.len() && holes[h].1 <= s {
            h += 1;
        }
        let mut k = h;
        while k < holes.len() && holes[k].0 < e {
            if holes[k].0 > s {
                out.push((s, holes[k].0));
            }
            s = s.max(holes[k].1);
            k += 1;
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// The length of `ivs` (normalized) within `span`.
pub(crate) fn within(ivs: &[Iv], span: Iv) -> u64 {
    ivs.iter()
        .map(|&(s, e)| e.min(span.1).saturating_sub(s.max(span.0)))
        .sum()
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e3)
}

/// The per-process leadership intervals.
struct Lead {
    /// Certainly led (and ran), stops removed.
    definite: Vec<Vec<Iv>>,
    /// May have led (and ran), stops removed.
    possible: Vec<Vec<Iv>>,
    /// May have led, stops included, one interval per term (not merged: a term that ends
    /// and a term that begins a read later touch).
    possible_terms: Vec<Vec<Iv>>,
    /// SIGSTOP to SIGCONT.
    stops: Vec<Vec<Iv>>,
    /// When each process ended (kill or exit).
    ended: Vec<Option<u64>>,
}

fn leadership(input: &Input<'_>) -> Lead {
    let n = input.procs.len();
    let mut per: Vec<Vec<Event>> = vec![Vec::new(); n];
    for e in input.events {
        if e.replica < n {
            per[e.replica].push(*e);
        }
    }
    let mut lead = Lead {
        definite: Vec::with_capacity(n),
        possible: Vec::with_capacity(n),
        possible_terms: Vec::with_capacity(n),
        stops: Vec::with_capacity(n),
        ended: Vec::with_capacity(n),
    };
    for (p, events) in per.iter_mut().enumerate() {
        events.sort_by_key(|e| e.at);
        let (mut definite, mut possible, mut stops) = (Vec::new(), Vec::new(), Vec::new());
        let (mut def_open, mut pos_open, mut stop_open) = (None, None, None);
        let mut ended = input.procs[p].ended;
        for e in events.iter() {
            match e.what {
                What::Leader { possible: from, .. } => {
                    def_open.get_or_insert(e.at);
                    pos_open.get_or_insert(from);
                }
                What::Standby { definite: until } => {
                    if let Some(s) = def_open.take() {
                        definite.push((s, until));
                    }
                    if let Some(s) = pos_open.take() {
                        possible.push((s, e.at));
                    }
                }
                What::Killed | What::Exited => {
                    if let Some(s) = def_open.take() {
                        definite.push((s, e.at));
                    }
                    if let Some(s) = pos_open.take() {
                        possible.push((s, e.at));
                    }
                    ended = Some(ended.map_or(e.at, |x| x.min(e.at)));
                }
                What::Stopped => {
                    stop_open.get_or_insert(e.at);
                }
                What::Continued => {
                    if let Some(s) = stop_open.take() {
                        stops.push((s, e.at));
                    }
                }
                _ => {}
            }
        }
        let close = ended.unwrap_or(input.end).min(input.end);
        if let Some(s) = def_open {
            definite.push((s, close));
        }
        if let Some(s) = pos_open {
            possible.push((s, close));
        }
        if let Some(s) = stop_open {
            stops.push((s, close));
        }
        let stops = normalize(stops);
        possible.sort_unstable();
        lead.definite.push(subtract(&normalize(definite), &stops));
        lead.possible
            .push(subtract(&normalize(possible.clone()), &stops));
        lead.possible_terms.push(possible);
        lead.stops.push(stops);
        lead.ended.push(ended);
    }
    lead
}

/// Where two or more processes certainly led at once, and which.
fn two_leaders(lead: &Lead) -> Vec<(Iv, Vec<usize>)> {
    let mut points: Vec<(u64, i32, usize)> = Vec::new();
    for (p, ivs) in lead.definite.iter().enumerate() {
        for &(s, e) in ivs {
            points.push((s, 1, p));
            points.push((e, -1, p));
        }
    }
    points.sort_unstable();
    let mut active: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    let mut last = 0;
    for (t, delta, p) in points {
        if active.len() >= 2 && t > last {
            out.push(((last, t), active.clone()));
        }
        if delta > 0 {
            active.push(p);
        } else if let Some(i) = active.iter().position(|&a| a == p) {
            active.swap_remove(i);
        }
        last = t;
    }
    out
}

/// `iv` with its end pushed back by the stall time within it (the README's bounds are
/// "+ scheduling": time the machine could not run the replicas is not theirs), repeated for
/// the stalls within the extension.
fn extend(iv: Iv, stalls: &[Iv]) -> Iv {
    let mut end = iv.1;
    let mut counted = 0;
    for _ in 0..4 {
        let stalled = within(stalls, (iv.0, end));
        if stalled == counted {
            break;
        }
        end += stalled - counted;
        counted = stalled;
    }
    (iv.0, end)
}

/// Runs every check.
pub(crate) fn analyse(input: &Input<'_>) -> Analysis {
    let o = input.options;
    let i = o.interval;
    let slack = us(o.slack());
    let mut a = Analysis::default();
    let lead = leadership(input);
    let faults = input.faults;
    let machine = normalize(input.stalls.to_vec());
    // Per replica: its watcher's gaps of more than 100 ms, and the machine's stalls.
    let mut stalled: Vec<Vec<Iv>> = vec![machine.clone(); input.procs.len()];
    for e in input.events {
        if let (What::Woke { previous, .. }, Some(list)) = (e.what, stalled.get_mut(e.replica)) {
            list.push((previous, e.at));
        }
    }
    let stalled: Vec<Vec<Iv>> = stalled.into_iter().map(normalize).collect();
    let stalls_of = |p: Option<usize>| p.and_then(|p| stalled.get(p)).unwrap_or(&machine);
    a.stalls = (
        machine.len(),
        within(&machine, (0, u64::MAX)),
        machine.iter().map(|iv| iv.1 - iv.0).max().unwrap_or(0),
    );
    let latest_fault = |t: u64| faults.iter().rev().find(|f| f.inject <= t).map(|f| f.id);

    // Excuses: when a fault lets nobody lead, and when it lets two lead.
    let windows: Vec<(Iv, usize)> = faults
        .iter()
        .map(|f| {
            let b = f.kind.bound(i);
            let end = (f.inject + us(b.from_inject)).max(f.heal + us(b.after_heal)) + slack;
            (extend((f.inject, end), &machine), f.id)
        })
        .collect();
    let leaderless_excused = normalize(windows.iter().map(|w| w.0).collect());
    let overlap_windows: Vec<(Iv, usize)> = faults
        .iter()
        .filter(|f| {
            f.kind.bound(i).overlap > Duration::ZERO
                && (f.on_leader || f.kind != Kind::TerminateRandom)
        })
        .map(|f| {
            let end = f.inject + us(f.kind.bound(i).overlap) + slack;
            (extend((f.inject, end), stalls_of(f.replica)), f.id)
        })
        .collect();
    // A session the server ends while its leader cannot hear it (frozen, or partitioned)
    // leaves that leader leading until it can: 100 ms after the SIGCONT, or its partition's
    // demotion bound (2·I, or 100 ms after the heal if sooner). Meanwhile a standby may take
    // the freed lock.
    let mut overlap_windows = overlap_windows;
    let mut deaf_overlaps = Vec::new();
    for f in faults.iter().filter(|f| f.on_leader) {
        let Some(p) = f.replica else { continue };
        let until = match f.kind {
            Kind::Stop => f.heal + us(SESSION_ENDED),
            Kind::Partition => (f.inject + us(i * 2)).min(f.heal + us(SESSION_ENDED)),
            _ => continue,
        } + slack;
        for g in faults
            .iter()
            .filter(|g| (f.inject..=f.heal).contains(&g.inject))
        {
            let ends_session = match g.kind {
                Kind::TerminateLock | Kind::TerminateRandom => g.on_leader && g.replica == Some(p),
                Kind::RestartFast | Kind::RestartImmediate => true,
                Kind::Reset => f.kind == Kind::Stop && g.replica == Some(p),
                _ => false,
            };
            if ends_session {
                let window = extend((g.inject, until.max(g.inject)), stalls_of(Some(p)));
                overlap_windows.push((window, g.id));
                deaf_overlaps.push((g.id, f.id));
            }
        }
    }
    a.deaf = deaf_overlaps;
    let overlap_excused = normalize(overlap_windows.iter().map(|w| w.0).collect());
    // Whether replica `p` could not hear the server at `t` (frozen or partitioned).
    let deaf = |p: usize, t: u64| {
        faults.iter().any(|g| {
            matches!(g.kind, Kind::Stop | Kind::Partition)
                && g.replica == Some(p)
                && (g.inject..=g.heal).contains(&t)
        })
    };

    // Nobody leads.
    let union = normalize(lead.possible.iter().flatten().copied().collect());
    a.first_leader = union.first().map(|iv| iv.0);
    let boot_limit = input.start + 10_000_000;
    let from = match a.first_leader {
        Some(t) if t <= boot_limit => t,
        _ => {
            a.violations.push(Violation {
                at: input.start,
                what: "no replica led within 10 s of the start".into(),
                fault: None,
                replicas: Vec::new(),
            });
            a.first_leader.unwrap_or(input.end)
        }
    };
    let leaderless = subtract(&[(from, input.end)], &union);
    for &gap in &leaderless {
        for piece in subtract(&[gap], &leaderless_excused) {
            let len = piece.1 - piece.0;
            if piece.0 == gap.0 {
                // Nothing explains how it started: a leader that stepped down by itself (a
                // check slower than I on a loaded machine) is allowed its next try.
                let allowed = extend((piece.0, piece.0 + us(i) + slack), &machine);
                if piece.1 > allowed.1 {
                    a.violations.push(Violation {
                        at: piece.0,
                        what: format!(
                            "nobody led for {} ms with no fault to explain it (allowed: a \
                             spontaneous demotion, 1·I + slack = {} ms)",
                            ms(len),
                            ms(us(i) + slack)
                        ),
                        fault: latest_fault(piece.0),
                        replicas: Vec::new(),
                    });
                } else {
                    a.unprovoked.push(piece);
                }
            } else if len > 1_000 {
                let fault = windows
                    .iter()
                    .filter(|(w, _)| w.1 <= piece.0 && w.1 >= gap.0)
                    .max_by_key(|(w, _)| w.1)
                    .map(|&(_, id)| id);
                let what = match fault {
                    Some(id) => format!(
                        "nobody led for {} ms past the bound of fault #{id} ({}, bound {} + \
                         slack); the gap began {} ms after its injection",
                        ms(len),
                        faults[id].kind.name(),
                        faults[id].kind.bound_text(),
                        ms(gap.0.saturating_sub(faults[id].inject))
                    ),
                    None => format!("nobody led for {} ms past every fault's bound", ms(len)),
                };
                a.violations.push(Violation {
                    at: piece.0,
                    what,
                    fault,
                    replicas: fault
                        .and_then(|id| faults[id].replica)
                        .into_iter()
                        .collect(),
                });
            }
        }
    }

    // Two lead at once.
    let two = two_leaders(&lead);
    let two_ivs = normalize(two.iter().map(|(iv, _)| *iv).collect());
    for (iv, who) in &two {
        if within(&overlap_excused, *iv) > 0 {
            a.excused_overlaps
                .push((*iv, who.clone(), latest_fault(iv.0)));
        }
        for piece in subtract(&[*iv], &overlap_excused) {
            a.violations.push(Violation {
                at: piece.0,
                what: format!(
                    "{} led at once for {} ms{}",
                    names(who),
                    ms(piece.1 - piece.0),
                    match latest_fault(piece.0) {
                        Some(id) => format!(
                            " ({} ms after fault #{id}, {}, which allows no overlap)",
                            ms(piece.0 - faults[id].inject),
                            faults[id].kind.name()
                        ),
                        None => String::new(),
                    }
                ),
                fault: latest_fault(piece.0),
                replicas: who.clone(),
            });
        }
    }

    // Per fault, from its injection to the next one's.
    for (k, f) in faults.iter().enumerate() {
        let next = faults
            .get(k + 1)
            .map_or(input.end, |n| n.inject.max(f.inject));
        let span = (f.inject, next.min(input.end).max(f.inject));
        a.leaderless.push(within(&leaderless, span));
        a.two_leaders.push(within(&two_ivs, span));
    }

    // The leader a fault hit demotes within its bound.
    for f in faults {
        let b = f.kind.bound(i);
        let (Some(demote), Some(p), true) = (b.demote, f.replica, f.on_leader) else {
            continue;
        };
        if p >= lead.possible_terms.len() {
            continue;
        }
        // A partition healed before the bound proves nothing; a session ended while its
        // leader could not hear it is judged by the partition's or the freeze's bound.
        if f.kind == Kind::Partition && f.heal < f.inject + us(demote) + slack {
            continue;
        }
        if f.kind != Kind::Partition && deaf(p, f.inject) {
            continue;
        }
        let deadline = extend((f.inject, f.inject + us(demote) + slack), &stalled[p]).1;
        let Some(&(_, end)) = lead.possible_terms[p]
            .iter()
            .find(|&&(s, e)| s <= f.inject && f.inject < e)
        else {
            continue;
        };
        let stopped = within(
            &lead.stops[p],
            (f.inject.saturating_sub(1_000_000), deadline),
        ) > 0;
        if end > deadline && !stopped {
            a.violations.push(Violation {
                at: deadline,
                what: format!(
                    "replica-{p} still led {} ms after fault #{} ({}; bound {} ms + slack + \
                     {} ms stalled)",
                    ms(end - f.inject),
                    f.id,
                    f.kind.name(),
                    ms(us(demote)),
                    ms(deadline - f.inject - us(demote) - slack)
                ),
                fault: Some(f.id),
                replicas: vec![p],
            });
        }
    }

    // A leader frozen for longer than 3·I never acts as leader on resume.
    let frozen_limit = us(i * 3) + 50_000;
    for f in faults
        .iter()
        .filter(|f| f.kind == Kind::Stop && f.on_leader)
    {
        let (Some(p), Some(epoch)) = (f.replica, f.epoch) else {
            continue;
        };
        if us(f.param) <= frozen_limit || f.heal <= f.inject {
            continue;
        }
        let woke = input
            .events
            .iter()
            .filter(|e| e.replica == p && e.at >= f.heal && e.at <= f.heal + 2_000_000)
            .filter_map(|e| match e.what {
                What::Woke { leading, epoch, .. } => Some((e.at, leading, epoch)),
                _ => None,
            })
            .min_by_key(|w| w.0);
        if let Some((at, true, Some(e))) = woke {
            if e == epoch {
                a.violations.push(Violation {
                    at,
                    what: format!(
                        "replica-{p}, frozen {} ms while leading (epoch {epoch}), still read \
                         as leader on resume",
                        f.param.as_millis()
                    ),
                    fault: Some(f.id),
                    replicas: vec![p],
                });
            }
        }
        let resumed = (f.heal as i64 + input.offset) as u64 + 5_000;
        if let Some(row) = input
            .rows
            .iter()
            .find(|r| r.epoch == epoch as i64 && r.at > resumed)
        {
            a.violations.push(Violation {
                at: (row.at as i64 - input.offset) as u64,
                what: format!(
                    "replica-{p}, frozen {} ms while leading (epoch {epoch}), wrote a row of that \
                     epoch {} ms after the SIGCONT",
                    f.param.as_millis(),
                    ms(row.at - resumed + 5_000)
                ),
                fault: Some(f.id),
                replicas: vec![p],
            });
        }
    }

    rows(input, &overlap_excused, &mut a);

    a.fence_refusals = input
        .events
        .iter()
        .filter(|e| matches!(e.what, What::Fenced { .. }))
        .count();

    // Memory: flat over each long life.
    for (p, proc) in input.procs.iter().enumerate() {
        let life = proc.ended.unwrap_or(input.end).saturating_sub(proc.spawned);
        if life < 30_000_000 {
            continue;
        }
        let Some(&(_, first)) = proc
            .rss
            .iter()
            .find(|(t, _)| *t >= proc.spawned + 10_000_000)
        else {
            continue;
        };
        let Some(&(at, last)) = proc.rss.last() else {
            continue;
        };
        a.rss.push((p, life, first, last));
        if last > first + 16 * 1024 && last > first + first / 2 {
            a.violations.push(Violation {
                at,
                what: format!(
                    "replica-{p}'s RSS grew from {first} kB to {last} kB over {} s (allowed: \
                     16 MiB and 50 %)",
                    life / 1_000_000
                ),
                fault: None,
                replicas: vec![p],
            });
        }
    }

    // Backends at the checkpoints: none of a dead process, at most the pools and one lock or
    // waiting session per live one.
    let per_replica = (2 * POOL_SIZE + 1) as i64;
    for c in input.checkpoints {
        a.backends.push(c.backends.iter().map(|(_, n)| n).sum());
        let mut per: BTreeMap<usize, i64> = BTreeMap::new();
        for (name, n) in &c.backends {
            match crate::db::replica_of(name) {
                Some(p) => *per.entry(p).or_default() += n,
                None => a.violations.push(Violation {
                    at: c.at,
                    what: format!("{n} backend(s) named {name:?}, not a replica's"),
                    fault: None,
                    replicas: Vec::new(),
                }),
            }
        }
        for (&p, &n) in &per {
            if !c.live.contains(&p) {
                a.violations.push(Violation {
                    at: c.at,
                    what: format!(
                        "leaked backends: {n} of replica-{p}, which ended {} s before",
                        lead.ended
                            .get(p)
                            .copied()
                            .flatten()
                            .map_or("?".into(), |e| format!(
                                "{:.1}",
                                c.at.saturating_sub(e) as f64 / 1e6
                            ))
                    ),
                    fault: latest_fault(c.at),
                    replicas: vec![p],
                });
            } else {
                a.backends_per_replica_max = a.backends_per_replica_max.max(n);
                if n > per_replica {
                    a.violations.push(Violation {
                        at: c.at,
                        what: format!(
                            "leaked backends: replica-{p} has {n}, more than its pools and one \
                             lock or waiting session ({per_replica})"
                        ),
                        fault: latest_fault(c.at),
                        replicas: vec![p],
                    });
                }
            }
        }
    }
    a.violations.sort_by_key(|v| v.at);
    a
}

/// The fenced rows: epochs never go back, one replica per epoch, no row of a term after a
/// later term began, and none while another replica held the lock beyond the allowance.
fn rows(input: &Input<'_>, overlap_excused: &[Iv], a: &mut Analysis) {
    let offset = input.offset;
    let local = |server: u64| (server as i64 - offset) as u64;
    let faults = input.faults;
    let latest_fault = |t: u64| faults.iter().rev().find(|f| f.inject <= t).map(|f| f.id);
    a.rows = input.rows.len();
    // Epochs as the sampler saw them become current: (first seen, epoch), epochs increasing.
    let mut bumps: Vec<(u64, i64)> = Vec::new();
    for run in input.runs {
        if let Some(e) = run.epoch {
            if bumps.last().is_none_or(|&(_, last)| e > last) {
                bumps.push((run.first, e));
            }
        }
    }
    let mut owner: BTreeMap<i64, Option<usize>> = BTreeMap::new();
    let mut newest: Option<Row> = None;
    // One violation per (check, epoch), with a count.
    let mut seen: BTreeMap<(u8, i64), usize> = BTreeMap::new();
    let mut found: Vec<(u8, i64, Violation)> = Vec::new();
    let mut flag = |check: u8, epoch: i64, v: Violation| {
        let n = seen.entry((check, epoch)).or_default();
        *n += 1;
        if *n == 1 {
            found.push((check, epoch, v));
        }
    };
    for row in input.rows {
        // Epochs never go back in time.
        match newest {
            Some(n) if row.epoch < n.epoch => flag(
                0,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: format!(
                        "a row of epoch {} (replica-{}) at {} came after a row of epoch {} \
                         (replica-{}) {} ms earlier: two terms' writes interleaved",
                        row.epoch,
                        who(row.replica),
                        row.at,
                        n.epoch,
                        who(n.replica),
                        ms(row.at - n.at)
                    ),
                    fault: latest_fault(local(row.at)),
                    replicas: row.replica.into_iter().chain(n.replica).collect(),
                },
            ),
            Some(n) if row.epoch == n.epoch => {}
            _ => newest = Some(*row),
        }
        // One replica per epoch.
        match owner.get(&row.epoch) {
            None => {
                owner.insert(row.epoch, row.replica);
            }
            Some(&first) if first != row.replica => flag(
                1,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: format!(
                        "epoch {} has rows of replica-{} and replica-{}",
                        row.epoch,
                        who(first),
                        who(row.replica)
                    ),
                    fault: latest_fault(local(row.at)),
                    replicas: first.into_iter().chain(row.replica).collect(),
                },
            ),
            Some(_) => {}
        }
        // No row of a term once a later epoch was current.
        let later = bumps.partition_point(|&(_, e)| e <= row.epoch);
        if let Some(&(seen_at, e)) = bumps.get(later) {
            if row.at > seen_at {
                flag(
                    2,
                    row.epoch,
                    Violation {
                        at: local(row.at),
                        what: format!(
                            "a row of epoch {} (replica-{}) was written {} ms after the sampler \
                             saw epoch {e} current",
                            row.epoch,
                            who(row.replica),
                            ms(row.at - seen_at)
                        ),
                        fault: latest_fault(local(row.at)),
                        replicas: row.replica.into_iter().collect(),
                    },
                );
            }
        }
        // Who held the lock when it was written.
        let k = input.runs.partition_point(|r| r.first <= row.at);
        if k == 0 {
            continue;
        }
        let run = input.runs[k - 1];
        if row.at > run.last {
            continue;
        }
        match run.holder {
            Holder::None => a.rows_no_holder += 1,
            Holder::Replica(q) if Some(q) == row.replica => {}
            Holder::Replica(q) => {
                let held = row.at - run.first;
                let excused = within(overlap_excused, (local(row.at), local(row.at) + 1)) > 0;
                if held <= RUN_GAP_US || excused {
                    a.rows_other_holder += 1;
                } else {
                    flag(
                        3,
                        row.epoch,
                        Violation {
                            at: local(row.at),
                            what: format!(
                                "replica-{} wrote a row of epoch {} while pg_locks had shown \
                                 replica-{q} holding the lock for {} ms",
                                who(row.replica),
                                row.epoch,
                                ms(held)
                            ),
                            fault: latest_fault(local(row.at)),
                            replicas: row.replica.into_iter().chain([q]).collect(),
                        },
                    );
                }
            }
            Holder::Unknown => flag(
                4,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: "pg_locks showed the lock held by a session that is no replica's".into(),
                    fault: latest_fault(local(row.at)),
                    replicas: Vec::new(),
                },
            ),
        }
    }
    a.epochs = owner.len();
    for (check, epoch, mut v) in found {
        let n = seen[&(check, epoch)];
        if n > 1 {
            v.what.push_str(&format!(" ({n} such rows)"));
        }
        a.violations.push(v);
    }
}

fn who(replica: Option<usize>) -> String {
    replica.map_or("?".into(), |r| r.to_string())
}

fn names(replicas: &[usize]) -> String {
    let names: Vec<String> = replicas.iter().map(|r| format!("replica-{r}")).collect();
    names.join(" and ")
}
