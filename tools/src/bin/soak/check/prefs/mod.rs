//! The checks of preferences (`--preferences`, README "Who leads"), on the reads of the live
//! rows of `pg_elector_candidates` (every 20 ms) and the replicas' own reports of who led:
//!
//! - **The most preferred live replica leads.** At each read, a replica that certainly leads
//!   must have a preference at least that of every other live row, or hold a term taken on
//!   request (a handover's target keeps the lead against preferences until its term ends): the
//!   first term of a target a request named, or a term begun while the table showed a request
//!   pending for that replica (the target of a timed-out request to the most preferred).
//!   Every stretch of reads where none does must fall within an allowance: after a fault, until
//!   it healed and then **4·I plus the leader's drain** (plus, after a cut link, one bounded
//!   try for each connection of the elector's pool), or the fault's own leaderless bound if
//!   later; from the moment a more preferred standby is live (a respawned replica of a newer
//!   release, one back from a fault), the move's **2·I plus the drain** (3·I when that standby
//!   runs fast takeover); after a handover request to a live target, **2·I plus the drain**
//!   (3·I with fast takeover) for the target to lead; after one to a target that dies, its
//!   **3·I and one try** without a leader, then a move's 2·I plus the drain. The drain is the
//!   rest of a run of the schedule's in progress (a tick takes milliseconds); every allowance
//!   gets the slack and the machine's stalls.
//! - **A handover's live target leads** within its bound, unless another fault came first.
//! - **A handover costs the other standbys nothing**: after a request (to a live or a missing
//!   target) with no other fault meanwhile, no pool connection of a replica other than the old
//!   leader and the target was born, and at most one lock session and the key's three waiting
//!   slots were (docs: "a handover costs the other standbys no logins").

use std::time::Duration;

use super::intervals::{Iv, extend, normalize, subtract};
use super::{Analysis, Checker, Violation, ms, us};
use crate::child::POOL_SIZE;
use crate::faults::{Fault, Kind, try_bound};
use crate::handover::{Answer, STAY_AWAY};
use crate::prefs::SAMPLE_EVERY;

/// Reads further apart than this (the sampler reconnecting) break a stretch.
const READ_GAP: u64 = 200_000;
/// A stretch is known to within two reads (and a row's write to its read).
const RESOLUTION: u64 = 50_000;
/// A key's waiting slots (docs, "Fast takeover").
const WAITING_SLOTS: i64 = 3;
/// How long a handover request stays valid (docs: "a minute").
const REQUEST_VALID: u64 = 60_000_000;

/// What the preference checks found.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Reads of the live rows.
    pub(crate) reads: usize,
    /// Per fault: from its heal (a resign's cooldown's end; a request) to the first read where
    /// the most preferred live replica led, if before the next fault.
    pub(crate) to_preferred: Vec<Option<u64>>,
    /// Stretches where it did not, and the longest (µs).
    pub(crate) stretches: (usize, u64),
    /// The share of the run the allowances cover (the rest is judged strictly).
    pub(crate) allowed_share: f64,
    /// Handovers to a live target: from the request to the target's lead (µs); requests whose
    /// target another fault hit first.
    pub(crate) target_led: Vec<u64>,
    pub(crate) target_cut: usize,
    /// Per handover kind, how the requests were answered.
    pub(crate) answers: Vec<(Kind, Answer)>,
    /// Handovers counted (clean, of all), the logins through the proxies per handover, the
    /// most pool connections of other standbys and lock or waiting sessions born in one, and
    /// the most backends gained.
    pub(crate) costs: (usize, usize),
    pub(crate) logins: Vec<u64>,
    pub(crate) pool_logins_max: i64,
    pub(crate) session_logins_max: i64,
    pub(crate) backends_gained_max: i64,
}

/// One read, judged.
struct Read {
    at: u64,
    good: bool,
    /// The most preferred other live row, and who led.
    best: Option<(usize, u64)>,
    leaders: Vec<usize>,
}

impl Checker<'_> {
    /// Every preference check.
    pub(super) fn preferences(&self, a: &mut Analysis) {
        let reads = self.reads();
        a.prefs.reads = reads.len();
        self.stretches(&reads, a);
        self.to_preferred(&reads, a);
        self.targets(a);
        self.costs(a);
        a.prefs.answers = self
            .input
            .faults
            .iter()
            .filter_map(|f| Some((f.kind, f.handover.as_ref()?.answer.clone())))
            .collect();
    }

    fn pref(&self, p: usize) -> u64 {
        self.input
            .procs
            .get(p)
            .and_then(|q| q.preference)
            .unwrap_or(0)
    }

    fn fast(&self, p: usize) -> bool {
        self.input.procs.get(p).is_some_and(|q| q.fast)
    }

    /// The terms taken on request: the target's first term begun within the request's
    /// validity; and any term that began while the library's candidates table showed a request
    /// pending for that replica (a request that timed out names no target the soak knows,
    /// and it may still land, seconds later, when a silent synchronous standby comes back).
    fn requested_terms(&self) -> Vec<(usize, Iv)> {
        let lead = &self.lead;
        let mut pending: Vec<(usize, Iv)> = Vec::new();
        for read in self.input.candidates {
            for &p in &read.requested {
                let Some(terms) = lead.definite.get(p) else {
                    continue;
                };
                // Seen pending from just before the term's start until its first check.
                if let Some(&term) = terms
                    .iter()
                    .find(|&&(s, _)| s <= read.at + READ_GAP && read.at <= s + us(self.i))
                {
                    if !pending.contains(&(p, term)) {
                        pending.push((p, term));
                    }
                }
            }
        }
        self.input
            .faults
            .iter()
            .filter_map(|f| {
                let asked = f.handover.as_ref()?;
                let t = asked
                    .target
                    .filter(|_| asked.maybe_made() && !asked.killed)?;
                let term = lead
                    .definite
                    .get(t)?
                    .iter()
                    .find(|&&(s, e)| e > f.inject && s <= f.inject + REQUEST_VALID)?;
                Some((t, *term))
            })
            .chain(pending)
            .collect()
    }

    /// Each read, with who certainly led then (a sweep over the terms).
    fn reads(&self) -> Vec<Read> {
        let on_request = self.requested_terms();
        let mut points: Vec<(u64, i32, usize)> = Vec::new();
        for (p, ivs) in self.lead.definite.iter().enumerate() {
            for &(s, e) in ivs {
                points.push((s, 1, p));
                points.push((e, -1, p));
            }
        }
        points.sort_unstable();
        let mut active: Vec<usize> = Vec::new();
        let mut k = 0;
        let mut out = Vec::with_capacity(self.input.candidates.len());
        for sample in self.input.candidates {
            if sample.at < self.input.start || sample.at > self.input.end {
                continue;
            }
            while k < points.len() && points[k].0 <= sample.at {
                let (_, delta, p) = points[k];
                if delta > 0 {
                    active.push(p);
                } else if let Some(i) = active.iter().position(|&q| q == p) {
                    active.swap_remove(i);
                }
                k += 1;
            }
            let best_other = |p: Option<usize>| {
                sample
                    .live
                    .iter()
                    .filter(|&&(q, _)| Some(q) != p)
                    .max_by_key(|&&(q, pref)| (pref, std::cmp::Reverse(q)))
                    .copied()
            };
            let good = active.iter().any(|&p| {
                let requested = on_request
                    .iter()
                    .any(|&(t, (s, e))| t == p && s <= sample.at && sample.at < e);
                requested || best_other(Some(p)).is_none_or(|(_, pref)| pref <= self.pref(p))
            });
            out.push(Read {
                at: sample.at,
                good,
                best: best_other(None),
                leaders: active.clone(),
            });
        }
        out
    }

    /// The rest of a run of the schedule's in progress from `t` or begun within `within` of it,
    /// up to the drain timeout after that: what a leader ending its term then drains.
    fn drain_from(&self, t: u64, within: Duration) -> u64 {
        self.ex
            .runs
            .iter()
            .filter(|r| r.span.0 <= t + us(within) && t < r.span.1)
            .map(|r| (r.span.1 - t).min(us(within + crate::app::DRAIN)))
            .max()
            .unwrap_or(0)
    }

    /// A move to a more preferred standby, from `t` (its first try): two intervals and the
    /// drain, three with fast takeover.
    fn move_bound(&self, t: u64, fast: bool) -> u64 {
        let i = self.i;
        us(if fast { i * 3 } else { i * 2 }) + self.drain_from(t, i)
    }

    /// When fault `f`'s effect on who leads is over, counted from (a request, a resign's
    /// cooldown's end, the heal).
    fn pref_heal(f: &Fault) -> u64 {
        match f.kind {
            Kind::HandoverLive | Kind::HandoverDying | Kind::HandoverMissing => f.inject,
            Kind::Resign => f.inject + us(f.param),
            _ => f.heal,
        }
    }

    /// Until when fault `f` excuses a replica other than the most preferred leading (before
    /// the slack and the stalls).
    fn pref_end(&self, f: &Fault) -> u64 {
        let i = self.i;
        // A request that may have been made (made, or timed out) to a target left alive is a
        // handover to a live target.
        let asked = f.handover.as_ref().filter(|h| h.maybe_made());
        match (f.kind, asked) {
            (Kind::HandoverMissing, _) => f.inject,
            (k, None) if k.handover() => f.inject,
            (_, Some(h)) if h.killed => {
                let stranded = f.inject + us(i * 3 + try_bound(i)) + self.drain_from(f.inject, i);
                stranded + self.move_bound(stranded, self.input.procs.iter().any(|p| p.fast))
            }
            (_, Some(h)) => f.inject + self.move_bound(f.inject, h.target_fast),
            _ => {
                let h = Self::pref_heal(f);
                let window_end = self
                    .ex
                    .windows
                    .iter()
                    .find(|&&(_, id)| id == f.id)
                    .map_or(h, |&(w, _)| w.1);
                let tries = if f.kind.partitions() {
                    us(try_bound(i)) * POOL_SIZE as u64
                } else {
                    0
                };
                window_end.max(h + us(i * 4) + self.drain_from(h, i * 4) + tries)
            }
        }
    }

    /// The stretches where the most preferred live replica did not lead, past every allowance.
    fn stretches(&self, reads: &[Read], a: &mut Analysis) {
        let (slack, machine, faults) = (self.slack, &self.ex.machine, self.input.faults);
        let mut allowed: Vec<Iv> = faults
            .iter()
            .map(|f| extend((f.inject, self.pref_end(f) + slack), machine))
            .collect();
        let mut stretches: Vec<Iv> = Vec::new();
        let mut open: Option<Iv> = None;
        let mut best_before = None;
        for r in reads {
            let best = r.best.map(|(_, pref)| pref);
            if r.good {
                stretches.extend(open.take());
            } else {
                let fresh = match open {
                    Some((_, last)) if r.at <= last + READ_GAP => false,
                    _ => {
                        stretches.extend(open.take());
                        true
                    }
                };
                // A rise of the most preferred live standby starts a move.
                if fresh || best > best_before {
                    let fast = r.best.is_some_and(|(p, _)| self.fast(p));
                    let end = r.at + self.move_bound(r.at, fast) + slack;
                    allowed.push(extend((r.at, end), machine));
                }
                open = Some((open.map_or(r.at, |o| o.0), r.at));
            }
            best_before = best;
        }
        stretches.extend(open);
        let allowed = normalize(allowed);
        let run = (self.input.start, self.input.end);
        a.prefs.allowed_share =
            super::intervals::within(&allowed, run) as f64 / (run.1 - run.0).max(1) as f64;
        a.prefs.stretches = (
            stretches.len(),
            stretches.iter().map(|s| s.1 - s.0).max().unwrap_or(0),
        );
        for &stretch in &stretches {
            for piece in subtract(&[stretch], &allowed) {
                if piece.1 - piece.0 <= RESOLUTION {
                    continue;
                }
                let at = reads.partition_point(|r| r.at < piece.0);
                let read = &reads[at.min(reads.len() - 1)];
                let fault = self.latest_fault(stretch.0);
                a.violations.push(Violation {
                    at: piece.0,
                    what: format!(
                        "for {} ms past every bound, the most preferred live replica did not lead \
                         ({}; leading: {}); it had not for {} ms{}",
                        ms(piece.1 - piece.0),
                        read.best.map_or("no live row".into(), |(p, pref)| format!(
                            "live: replica-{p}, preference {pref}"
                        )),
                        self.named(&read.leaders),
                        ms(piece.1 - stretch.0),
                        fault.map_or(String::new(), |id| format!(
                            ", since {} ms after fault #{id} ({})",
                            ms(stretch.0.saturating_sub(faults[id].inject)),
                            faults[id].kind.name()
                        ))
                    ),
                    lane: 0,
                    fault,
                    replicas: read
                        .best
                        .map(|b| b.0)
                        .into_iter()
                        .chain(read.leaders.iter().copied())
                        .collect(),
                });
            }
        }
    }

    fn named(&self, replicas: &[usize]) -> String {
        if replicas.is_empty() {
            return "nobody".into();
        }
        let names: Vec<String> = replicas
            .iter()
            .map(|&p| format!("replica-{p}, preference {}", self.pref(p)))
            .collect();
        names.join(" and ")
    }

    /// Per fault, from its heal to the first read where the most preferred live replica led.
    fn to_preferred(&self, reads: &[Read], a: &mut Analysis) {
        let (input, faults) = (self.input, self.input.faults);
        for (k, f) in faults.iter().enumerate() {
            let h = Self::pref_heal(f);
            let next = faults.get(k + 1).map_or(input.end, |n| n.inject.max(h));
            let from = reads.partition_point(|r| r.at < h);
            let found = reads[from..]
                .iter()
                .take_while(|r| r.at < next)
                .find(|r| r.good)
                .map(|r| r.at - h);
            a.prefs.to_preferred.push(found);
        }
    }

    /// A handover's live target leads within its bound, unless another fault came first.
    fn targets(&self, a: &mut Analysis) {
        let faults = self.input.faults;
        for f in faults.iter().filter(|f| f.kind == Kind::HandoverLive) {
            let Some(h) = f.handover.as_ref() else {
                continue;
            };
            let (Answer::Made, Some(t)) = (&h.answer, h.target) else {
                continue;
            };
            let deadline = extend((f.inject, self.pref_end(f) + self.slack), &self.ex.machine).1;
            let led = self
                .lead
                .definite
                .get(t)
                .and_then(|ivs| ivs.iter().find(|&&(_, e)| e > f.inject))
                .map(|&(s, _)| s.saturating_sub(f.inject));
            let led_by = led.map_or(deadline, |after| (f.inject + after).min(deadline));
            if cut_short(f, faults, led_by) {
                a.prefs.target_cut += 1;
                continue;
            }
            match led {
                Some(after) if f.inject + after <= deadline => a.prefs.target_led.push(after),
                _ => a.violations.push(Violation {
                    at: deadline,
                    what: format!(
                        "the handover's target replica-{t} ({}) {} (bound: the leader's next check, \
                         the drain and the target's next try, {} ms, + slack = {} ms)",
                        if h.target_fast { "fast" } else { "poll" },
                        led.map_or("never led".into(), |after| format!(
                            "led {} ms after the request",
                            ms(after)
                        )),
                        ms(self.pref_end(f) - f.inject),
                        ms(deadline - f.inject),
                    ),
                    lane: 0,
                    fault: Some(f.id),
                    replicas: vec![t],
                }),
            }
        }
    }

    /// What the handovers cost, and the ones that cost the other standbys logins.
    fn costs(&self, a: &mut Analysis) {
        let input = self.input;
        let p = &mut a.prefs;
        p.costs = (
            input.handovers.iter().filter(|c| c.clean).count(),
            input.handovers.len(),
        );
        for c in input.handovers {
            p.logins.push(c.logins);
            p.pool_logins_max = p.pool_logins_max.max(c.pool_logins);
            p.session_logins_max = p.session_logins_max.max(c.session_logins);
            p.backends_gained_max = p.backends_gained_max.max(c.backends.1 - c.backends.0);
            if !c.clean {
                continue;
            }
            let at = input.faults.get(c.fault).map_or(0, |f| f.inject);
            if c.pool_logins > 0 {
                a.violations.push(Violation {
                    at,
                    what: format!(
                        "a handover request made the other standbys replace {} pool \
                         connection(s) (docs: no logins): {}",
                        c.pool_logins,
                        c.born.join(", ")
                    ),
                    lane: 0,
                    fault: Some(c.fault),
                    replicas: Vec::new(),
                });
            }
            if c.session_logins > 1 + WAITING_SLOTS {
                a.violations.push(Violation {
                    at,
                    what: format!(
                        "a handover request opened {} lock or waiting sessions (at most the \
                         target's lock session and the key's {WAITING_SLOTS} waiting slots)",
                        c.session_logins
                    ),
                    lane: 0,
                    fault: Some(c.fault),
                    replicas: Vec::new(),
                });
            }
        }
    }
}

/// The stay-away the requests ask, and the reads' period, for the report.
pub(crate) fn asked() -> (Duration, Duration) {
    (STAY_AWAY, SAMPLE_EVERY)
}

#[cfg(test)]
mod tests;

/// Whether another fault that bears on request `f` was in effect between it and `until` (the
/// target's lead, or the deadline): one on the leader or the target, or on the whole server
/// (a restart, a failover, a silent synchronous standby), or a later request, injected meanwhile or injected
/// before and not healed by the request (a partitioned leader cannot see the request; its term
/// ends by the partition's bound instead, which the leaderless check judges).
pub(super) fn cut_short(f: &Fault, faults: &[Fault], until: u64) -> bool {
    let target = f.handover.as_ref().and_then(|h| h.target);
    faults.iter().any(|g| {
        let bears = g.replica.is_some() && (g.replica == f.replica || g.replica == target)
            || g.kind.server_wide()
            || g.kind == Kind::SyncStandby;
        let overlaps = g.inject <= until && g.heal.max(g.inject) >= f.inject;
        // A later request supersedes this one (the later one counts); one to a missing
        // identity changes nothing.
        let changes = g.kind != Kind::HandoverMissing;
        g.id != f.id && changes && (bears || g.kind.handover()) && overlaps
    })
}
