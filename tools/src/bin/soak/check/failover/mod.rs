//! The checks of the database's failovers (`--cluster`), over every lane at once: nobody leads
//! while no server accepts writes, nor through a server in recovery; a new leader within 1·I
//! of the promoted server accepting writes; epochs rise across terms; the schedule's claims
//! survive a synchronous failover, and only the claims an asynchronous one lost are run again;
//! no replica's backend stays on the standby.

use std::collections::{BTreeMap, BTreeSet};

use super::intervals::within;
use super::runs::{RunIv, runs};
use super::{Input, Violation, ms, us};
use crate::failover::{Failover, RecoveryHold};
use crate::fleet::{Event, What};
use crate::options::Replication;

/// A term may begin this long before the prober saw the promoted server take writes: both
/// connect and ask on their own, every 5 ms for the prober.
const WRITABLE_MARGIN: u64 = 100_000;

/// How long before the cut (the crash, with no cut) a claim may still be on its way to an
/// asynchronous standby: replication lag on one machine is milliseconds (plus the machine's
/// stalls around it).
const LAG: u64 = 250_000;

/// What the failovers' checks found, besides violations.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Failovers completed (crashes, switchovers).
    pub(crate) crashes: usize,
    pub(crate) switchovers: usize,
    /// Per failover: from the promoted server taking writes to a leader of every lane (µs).
    pub(crate) to_leader: Vec<u64>,
    /// Failovers whose leader came later than 1·I, excused: another fault was in effect after
    /// the promotion (its own bounds judge the gap).
    pub(crate) to_leader_excused: usize,
    /// Samples of a server in recovery taken by the watch.
    pub(crate) recovery_samples: u64,
    /// Claims of the schedule made before a failover and missing on the promoted server.
    pub(crate) lost_claims: Vec<(u64, u32, usize)>,
    /// Dues run again after an asynchronous failover lost their claim: (due, attempt,
    /// failover fault).
    pub(crate) repeats: Vec<(u64, u32, usize)>,
    /// Terms seen, each with a rising epoch.
    pub(crate) terms: usize,
    /// The most replica backends on the standby at a checkpoint.
    pub(crate) standby_backends_max: i64,
    /// Failovers completed (the old primary back as the standby).
    pub(crate) completed: usize,
    /// The violations of each check.
    pub(crate) counts: Counts,
}

/// The violations of each of this module's checks, for the report's table.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Terms begun while no server took writes.
    pub(crate) no_primary: usize,
    /// Leaders later than 1·I after the promotion.
    pub(crate) late_leader: usize,
    /// Locks held on a server in recovery.
    pub(crate) in_recovery: usize,
    /// Epochs not above an earlier term's.
    pub(crate) epochs_back: usize,
    /// Claims lost or dues run twice beyond what the docs allow.
    pub(crate) dues: usize,
    /// Replica backends left on the standby.
    pub(crate) standby_backends: usize,
    /// All of this module's violations (too few failovers among them).
    pub(crate) all: usize,
}

/// What the failovers' checks read besides [`Input`].
#[derive(Debug)]
pub(crate) struct Seen<'a> {
    /// The failovers, in order.
    pub(crate) failovers: &'a [Failover],
    /// Samples of a server in recovery, and the locks held there.
    pub(crate) recovery: (u64, &'a [RecoveryHold]),
    /// How the cluster replicated (`None`: one server).
    pub(crate) replication: Option<Replication>,
}

/// Every check of this module.
pub(crate) fn check(input: &Input<'_>, seen: &Seen<'_>) -> (Vec<Violation>, Facts) {
    let mut v = Vec::new();
    let mut facts = Facts {
        recovery_samples: seen.recovery.0,
        ..Facts::default()
    };
    epochs_rise(input.events, &mut v, &mut facts);
    facts.counts.epochs_back = v.len();
    let mut failovers: Vec<&Failover> = seen.failovers.iter().collect();
    failovers.sort_by_key(|f| f.inject);
    for f in &failovers {
        if f.crash {
            facts.crashes += 1;
        } else {
            facts.switchovers += 1;
        }
        let before = v.len();
        no_leader_without_a_primary(input, f, &mut v);
        facts.counts.no_primary += v.len() - before;
        let before = v.len();
        if let Some(t) = to_leader(input, f, &mut v, &mut facts) {
            facts.to_leader.push(t);
        }
        facts.counts.late_leader += v.len() - before;
    }
    let before = v.len();
    recovery_holds(seen.recovery.1, &mut v);
    facts.counts.in_recovery = v.len() - before;
    let before = v.len();
    if input.options.shards == 0 {
        claims(input, seen.failovers, seen.replication, &mut v, &mut facts);
    }
    facts.counts.dues = v.len() - before;
    let completed = failovers.iter().filter(|f| f.rejoined.is_some()).count();
    facts.completed = completed;
    if completed < input.options.min_failovers {
        v.push(Violation {
            at: input.end,
            what: format!(
                "{completed} failovers completed, fewer than the {} asked (--min-failovers)",
                input.options.min_failovers
            ),
            lane: 0,
            fault: None,
            replicas: Vec::new(),
        });
    }
    let before = v.len();
    standby_backends(input, &mut v, &mut facts);
    facts.counts.standby_backends = v.len() - before;
    facts.counts.all = v.len();
    (v, facts)
}

/// A replica's session holding a key's lock on a server in recovery.
fn recovery_holds(holds: &[RecoveryHold], v: &mut Vec<Violation>) {
    for hold in holds {
        if let Some(p) = crate::db::replica_of(&hold.holder) {
            v.push(Violation {
                at: hold.at,
                what: format!(
                    "{} held a lock of the soak's keys on {}, a server in recovery",
                    hold.holder, hold.server
                ),
                lane: 0,
                fault: None,
                replicas: vec![p],
            });
        }
    }
}

/// No replica backend on the standby at a quiet checkpoint.
fn standby_backends(input: &Input<'_>, v: &mut Vec<Violation>, facts: &mut Facts) {
    for c in input.checkpoints {
        let n = c.standby.unwrap_or(0);
        facts.standby_backends_max = facts.standby_backends_max.max(n);
        if n > 0 {
            v.push(Violation {
                at: c.at,
                what: format!(
                    "{n} replica backend(s) on the standby at a quiet checkpoint (a server in \
                     recovery: none should stay there)"
                ),
                lane: 0,
                fault: None,
                replicas: Vec::new(),
            });
        }
    }
}

/// One term as its replica reported it: lane, the earliest and the certain start, replica,
/// epoch.
type TermSeen = (usize, u64, u64, usize, u64);

/// Per lane, each term's epoch (from the replicas' reports) is above the epoch of every term
/// certainly begun before it possibly began (a watcher reporting late cannot reorder them).
fn epochs_rise(events: &[Event], v: &mut Vec<Violation>, facts: &mut Facts) {
    let mut lanes: BTreeMap<usize, Vec<TermSeen>> = BTreeMap::new();
    for e in events {
        if let What::Leader {
            possible,
            epoch: Some(epoch),
        } = e.what
        {
            lanes
                .entry(e.lane)
                .or_default()
                .push((e.lane, possible, e.at, e.replica, epoch));
        }
    }
    for (_, mut terms) in lanes {
        facts.terms += terms.len();
        // By certain start; the highest epoch (and whose) among the first k.
        terms.sort_unstable_by_key(|t| (t.2, t.4));
        let mut top: Vec<(u64, usize)> = Vec::with_capacity(terms.len());
        for t in &terms {
            let prev = top.last().copied().unwrap_or((0, usize::MAX));
            top.push(if t.4 > prev.0 { (t.4, t.3) } else { prev });
        }
        for &(lane, possible, at, replica, epoch) in &terms {
            let before = terms.partition_point(|t| t.2 < possible);
            let Some(&(highest, by)) = before.checked_sub(1).and_then(|k| top.get(k)) else {
                continue;
            };
            if epoch <= highest {
                v.push(Violation {
                    at,
                    what: format!(
                        "replica-{replica}'s term has epoch {epoch}, not above replica-{by}'s \
                         {highest} of a term begun before it"
                    ),
                    lane,
                    fault: None,
                    replicas: vec![replica, by],
                });
            }
        }
    }
}

/// No term begins after the old primary stopped and before the promoted one takes writes.
fn no_leader_without_a_primary(input: &Input<'_>, f: &Failover, v: &mut Vec<Violation>) {
    let (Some(stopped), Some(writable)) = (f.stopped, f.writable) else {
        return;
    };
    for e in input.events {
        let What::Leader { possible, .. } = e.what else {
            continue;
        };
        // The prober runs in the soak's own process: a stall of it makes `writable` late.
        let stalled = within(input.stalls, (e.at, writable));
        if possible > stopped && e.at + WRITABLE_MARGIN + stalled < writable {
            v.push(Violation {
                at: e.at,
                what: format!(
                    "replica-{} began to lead {} ms after the old primary stopped and {} ms \
                     before the promoted server took writes",
                    e.replica,
                    ms(possible - stopped),
                    ms(writable - e.at)
                ),
                lane: e.lane,
                fault: Some(f.id),
                replicas: vec![e.replica],
            });
        }
    }
}

/// From the promoted server taking writes to a leader of every lane; a violation beyond 1·I
/// and the slack (and the machine's stalls within), unless another fault was in effect after
/// the promotion, within that bound.
fn to_leader(
    input: &Input<'_>,
    f: &Failover,
    v: &mut Vec<Violation>,
    facts: &mut Facts,
) -> Option<u64> {
    let writable = f.writable?;
    let lanes = input.options.lanes();
    let mut worst = 0;
    for lane in 0..lanes {
        let first = input
            .events
            .iter()
            .filter(|e| e.lane == lane && matches!(e.what, What::Leader { .. }))
            .map(|e| e.at)
            .filter(|&at| at + WRITABLE_MARGIN >= writable)
            .min()
            .unwrap_or(input.end);
        worst = worst.max(first.saturating_sub(writable));
    }
    let i = us(input.options.interval);
    let slack = us(input.options.slack());
    let bound_end = writable + i + slack;
    let stalled = within(input.stalls, (writable, bound_end));
    if worst <= i + slack + stalled {
        return Some(worst);
    }
    // Late. Another fault in effect after the promotion, begun before the bound's end (a kill
    // or a partition of the replica that was about to lead), may hold the new leader back:
    // its own bounds judge that gap, and the table counts these.
    let others = input
        .faults
        .iter()
        .any(|g| g.id != f.id && g.inject <= bound_end && g.heal >= writable);
    if others {
        facts.to_leader_excused += 1;
    } else {
        v.push(Violation {
            at: writable + worst,
            what: format!(
                "a leader of every {} came {} ms after the promoted server took writes (bound \
                 1·I + slack {} ms, + {} ms of machine stalls)",
                if lanes > 1 { "shard" } else { "key" },
                ms(worst),
                ms(i + slack),
                ms(stalled)
            ),
            lane: 0,
            fault: Some(f.id),
            replicas: Vec::new(),
        });
    }
    Some(worst)
}

/// A claim of a run begun on the old primary that the promoted server lacks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lost {
    /// The run whose claim it was.
    pub(crate) run: RunIv,
    /// The failover's fault, and when its crash (or switchover) began (µs).
    pub(crate) failover: usize,
    pub(crate) crash: u64,
    /// Whether the docs allow it: an asynchronous standby, a crash, and a claim made from
    /// the cut on (or within the replication lag before it).
    pub(crate) allowed: bool,
}

/// Every claim a failover lost (key mode), in the failovers' order: of the runs begun on the
/// old primary since the previous failover's stop.
pub(crate) fn lost_claims(
    all: &[RunIv],
    failovers: &[Failover],
    replication: Option<Replication>,
    stalls: &[super::Iv],
) -> Vec<Lost> {
    let mut failovers: Vec<&Failover> = failovers.iter().collect();
    failovers.sort_by_key(|f| f.inject);
    let mut out = Vec::new();
    let mut since = 0;
    for f in failovers {
        let stopped = f.stopped.unwrap_or(f.inject);
        if let Some(on_promoted) = &f.claims {
            // What a crash may lose: the commits the standby had not received, from the cut
            // (or the replication lag before the crash) on. A switchover loses nothing.
            let cut_at = f.inject.saturating_sub(us(f.cut));
            let stalled = within(stalls, (cut_at.saturating_sub(2_000_000), stopped));
            let lag_from = cut_at.saturating_sub(LAG + stalled).max(since);
            let may_lose = replication == Some(Replication::Async) && f.crash;
            for r in all.iter().filter(|r| (since..stopped).contains(&r.span.0)) {
                if !on_promoted.contains(&(r.due, r.attempt)) {
                    out.push(Lost {
                        run: *r,
                        failover: f.id,
                        crash: f.inject,
                        allowed: may_lose && r.span.0 >= lag_from,
                    });
                }
            }
        }
        since = stopped;
    }
    out
}

/// The runs of a due that may go on at once after an asynchronous crash lost its claim: the
/// old leader's run goes on until its heartbeats have not landed for two thirds of the stale
/// threshold (the docs), while the new leader, who cannot see the claim, runs the due
/// again. Per (due, attempt): until when the old run may last (µs), with `slack`.
pub(crate) fn overlaps_allowed(lost: &[Lost], slack: u64) -> Vec<(u64, u32, u64)> {
    let cut_after = us(crate::faults::STALE) * 2 / 3;
    lost.iter()
        .filter(|l| l.allowed)
        .map(|l| (l.run.due, l.run.attempt, l.crash + cut_after + slack))
        .collect()
}

/// Key mode: the claims of runs begun on the old primary are on the promoted server, but for
/// those the docs allow an asynchronous crash to lose; each such due may run once more.
/// No other due runs twice.
fn claims(
    input: &Input<'_>,
    failovers: &[Failover],
    replication: Option<Replication>,
    v: &mut Vec<Violation>,
    facts: &mut Facts,
) {
    let all = runs(input.events, input.end);
    let mut allowed: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for l in lost_claims(&all, failovers, replication, input.stalls) {
        facts
            .lost_claims
            .push((l.run.due, l.run.attempt, l.failover));
        if l.allowed {
            allowed.insert((l.run.due, l.run.attempt), l.failover);
        } else {
            let f = failovers
                .iter()
                .find(|f| f.id == l.failover)
                .expect("a lost claim's failover");
            v.push(lost_claim(&l.run, f, replication));
        }
    }
    let failovers: Vec<&Failover> = failovers.iter().collect();
    repeats(&all, &allowed, &failovers, v, facts);
}

fn lost_claim(r: &RunIv, f: &Failover, replication: Option<Replication>) -> Violation {
    let why = if replication == Some(Replication::Sync) {
        "though the standby was synchronous"
    } else if !f.crash {
        "though a switchover loses nothing"
    } else {
        "though it was claimed before the standby was cut off (and its replication lag)"
    };
    Violation {
        at: f.inject,
        what: format!(
            "the claim of due {} (attempt {}), which replica-{} ran from {} ms before the \
             failover, is not on the promoted server, {why}",
            r.due,
            r.attempt,
            r.replica,
            ms(f.inject.saturating_sub(r.span.0))
        ),
        lane: 0,
        fault: Some(f.id),
        replicas: vec![r.replica],
    }
}

/// Two runs of one due and attempt: allowed once, after the failover that lost its claim.
fn repeats(
    all: &[RunIv],
    lost: &BTreeMap<(u64, u32), usize>,
    failovers: &[&Failover],
    v: &mut Vec<Violation>,
    facts: &mut Facts,
) {
    let mut by_due: BTreeMap<(u64, u32), Vec<&RunIv>> = BTreeMap::new();
    for r in all {
        by_due.entry((r.due, r.attempt)).or_default().push(r);
    }
    let mut excused: BTreeSet<(u64, u32)> = BTreeSet::new();
    for ((due, attempt), mut runs) in by_due {
        if runs.len() < 2 {
            continue;
        }
        runs.sort_by_key(|r| r.span.0);
        let (first, again) = (runs[0], runs[1]);
        let allowed = lost.get(&(due, attempt)).and_then(|&id| {
            let f = failovers.iter().find(|f| f.id == id)?;
            (runs.len() == 2 && again.span.0 >= f.stopped.unwrap_or(f.inject)).then_some(id)
        });
        if let Some(id) = allowed {
            if excused.insert((due, attempt)) {
                facts.repeats.push((due, attempt, id));
            }
            continue;
        }
        v.push(Violation {
            at: again.span.0,
            what: format!(
                "the due {due} (attempt {attempt}) ran {} times: replica-{} from {} ms before \
                 replica-{}, {}",
                runs.len(),
                first.replica,
                ms(again.span.0.saturating_sub(first.span.0)),
                again.replica,
                if lost.contains_key(&(due, attempt)) {
                    "more than once more after the failover that lost its claim"
                } else {
                    "and no failover lost its claim"
                }
            ),
            lane: 0,
            fault: None,
            replicas: vec![first.replica, again.replica],
        });
    }
}

#[cfg(test)]
mod tests;
