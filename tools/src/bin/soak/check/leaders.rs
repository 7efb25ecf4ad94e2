//! The checks of who led: nobody for too long, two at once, per fault, the demotions of the
//! leaders the faults hit, and frozen leaders on resume.

use super::intervals::{Iv, extend, normalize, subtract, within};
use super::lead::two_leaders;
use super::{Analysis, Checker, Violation, ms, names, us};
use crate::faults::{Fault, Kind};
use crate::fleet::What;

impl Checker<'_> {
    /// Nobody leads, past what the faults excuse; where nobody led.
    pub(super) fn nobody_led(&self, a: &mut Analysis) -> Vec<Iv> {
        let (input, i, slack, faults) = (self.input, self.i, self.slack, self.input.faults);
        let lead = &self.lead;
        let latest_fault = |t: u64| self.latest_fault(t);
        let (machine, windows) = (&self.ex.machine, &self.ex.windows);
        let leaderless_excused = &self.ex.leaderless_excused;
        let union = normalize(lead.possible.iter().flatten().copied().collect());
        a.first_leader = union.first().map(|iv| iv.0);
        let boot_limit = input.start + 10_000_000;
        let from = match a.first_leader {
            Some(t) if t <= boot_limit => t,
            _ => {
                a.violations.push(Violation {
                    at: input.start,
                    what: "no replica led within 10 s of the start".into(),
                    lane: 0,
                    fault: None,
                    replicas: Vec::new(),
                });
                a.first_leader.unwrap_or(input.end)
            }
        };
        let leaderless = subtract(&[(from, input.end)], &union);
        // A leader that stepped down by itself (a check slower than I on a loaded machine) is
        // allowed its next try, 1·I. A shard also moves whenever the members change (a join, a
        // leave, a member back after a fault, sometimes well after the fault's own bound): its
        // owner ends the term, drains (≤ the drain timeout, I) and unlocks, and the new owner
        // takes it at its next try (≤ 1·I): 2·I from the gap's start.
        // With preferences, a leader also steps down by itself for a live standby of a higher
        // preference (a new replica, one back from a fault): it drains (≤ I, or the rest of a
        // run of the schedule's) and unlocks, and the standby takes the lock at its next try
        // (docs/preferences.md; as a graceful shutdown's bound counts it): 2·I.
        let (settle, why) = if input.options.shards > 0 {
            (us(i * 2), "a shard's move, 2·I")
        } else if input.options.preferences {
            (
                us(i * 2),
                "a spontaneous demotion, or a move to a more preferred standby: drain + 1·I",
            )
        } else {
            (us(i), "a spontaneous demotion, 1·I")
        };
        for &gap in &leaderless {
            if self.phantom_join(gap, a) {
                continue;
            }
            let settle = settle + self.run_drained(gap.0);
            let settled = extend((gap.0, gap.0 + settle + slack), machine).1;
            // With preferences a leader may step down for a more preferred standby at any time,
            // a fault's heal among them (a replica back from a partition): the move's
            // allowance holds for every gap, not only for one no fault explains.
            let moved;
            let excused = if input.options.preferences {
                moved = normalize([leaderless_excused.as_slice(), &[(gap.0, settled)]].concat());
                &moved
            } else {
                leaderless_excused
            };
            for piece in subtract(&[gap], excused) {
                let len = piece.1 - piece.0;
                if piece.0 != gap.0 && input.options.shards > 0 && piece.1 <= settled {
                    // Begun within a fault's bound, over within a move's.
                    a.unprovoked.push(piece);
                } else if piece.0 == gap.0 {
                    // Nothing explains how it started.
                    if piece.1 > settled {
                        a.violations.push(Violation {
                            at: piece.0,
                            what: format!(
                                "nobody led for {} ms with no fault to explain it (allowed: \
                                 {why} + slack = {} ms)",
                                ms(len),
                                ms(settle + slack)
                            ),
                            lane: 0,
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
                        lane: 0,
                        fault,
                        replicas: fault
                            .and_then(|id| faults[id].replica)
                            .into_iter()
                            .collect(),
                    });
                }
            }
        }
        leaderless
    }

    /// With preferences, the rest of a run of the schedule's in progress at `t` (up to the drain
    /// timeout): a leader that hands over to a more preferred standby drains it first.
    pub(super) fn run_drained(&self, t: u64) -> u64 {
        if !self.input.options.preferences {
            return 0;
        }
        self.ex
            .runs
            .iter()
            .filter(|r| r.span.0 <= t && t < r.span.1)
            .map(|r| (r.span.1 - t).min(us(crate::app::DRAIN)))
            .max()
            .unwrap_or(0)
    }

    /// A gap that began while a joiner cut off at its grant was partitioned, with no other
    /// fault to explain it: nobody left, so no shard may wait for that joiner; allowed 1·I +
    /// slack (a move the joiner's grant started before it was cut off), not a move's 2·I.
    /// Whether the gap was judged here.
    fn phantom_join(&self, gap: Iv, a: &mut Analysis) -> bool {
        let Some(join) = join_of(gap, self.input.faults, &self.ex.windows) else {
            return false;
        };
        let allowed = us(self.i) + self.slack;
        let limit = extend((gap.0, gap.0 + allowed), &self.ex.machine).1;
        if gap.1 > limit {
            a.violations.push(Violation {
                at: gap.0,
                what: format!(
                    "nobody owned the shard for {} ms, from {} ms after fault #{} \
                     (join-partition: a joiner cut off right after its grant; nobody left; \
                     allowed 1·I + slack = {} ms)",
                    ms(gap.1 - gap.0),
                    ms(gap.0 - join.inject),
                    join.id,
                    ms(allowed)
                ),
                lane: 0,
                fault: Some(join.id),
                replicas: join.replica.into_iter().collect(),
            });
        }
        true
    }

    /// Two lead at once, past what the faults excuse; where they did.
    pub(super) fn two_led(&self, a: &mut Analysis) -> Vec<Iv> {
        let faults = self.input.faults;
        let lead = &self.lead;
        let latest_fault = |t: u64| self.latest_fault(t);
        let overlap_excused = &self.ex.overlap_excused;
        let two = two_leaders(lead);
        let two_ivs = normalize(two.iter().map(|(iv, _)| *iv).collect());
        for (iv, who) in &two {
            if within(overlap_excused, *iv) > 0 {
                a.excused_overlaps
                    .push((*iv, who.clone(), latest_fault(iv.0)));
            }
            for piece in subtract(&[*iv], overlap_excused) {
                a.violations.push(Violation {
                    at: piece.0,
                    what: format!(
                        "{} led at once for {} ms{}",
                        names(who),
                        ms(piece.1 - piece.0),
                        match latest_fault(piece.0) {
                            Some(id) => format!(
                                " ({} ms after fault #{id}, {}, outside every overlap allowance)",
                                ms(piece.0 - faults[id].inject),
                                faults[id].kind.name()
                            ),
                            None => String::new(),
                        }
                    ),
                    lane: 0,
                    fault: latest_fault(piece.0),
                    replicas: who.clone(),
                });
            }
        }
        two_ivs
    }

    /// Per fault, from its injection to the next one's: nobody leading, two leading.
    pub(super) fn per_fault(&self, a: &mut Analysis, leaderless: &[Iv], two_ivs: &[Iv]) {
        let (input, faults) = (self.input, self.input.faults);
        for (k, f) in faults.iter().enumerate() {
            let next = faults
                .get(k + 1)
                .map_or(input.end, |n| n.inject.max(f.inject));
            let span = (f.inject, next.min(input.end).max(f.inject));
            a.leaderless.push(within(leaderless, span));
            a.two_leaders.push(within(two_ivs, span));
        }
    }

    /// The leader a fault hit demotes within its bound.
    pub(super) fn demotions(&self, a: &mut Analysis) {
        let (i, slack, faults) = (self.i, self.slack, self.input.faults);
        let lead = &self.lead;
        let stalled = &self.ex.stalled;
        let deaf = |p: usize, t: u64| self.deaf(p, t);
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
            if f.kind.partitions() && f.heal < f.inject + us(demote) + slack {
                continue;
            }
            if !f.kind.partitions() && deaf(p, f.inject) {
                continue;
            }
            let deadline = extend((f.inject, f.inject + us(demote) + slack), &stalled[p]).1;
            // A handover's leader hands over only to a target still live at its next check: a
            // target that stopped gracefully or resigned meanwhile removed its row at once, and
            // the lead stays where it is (a killed, frozen or cut-off target's row still counts
            // for 2·I, so the leader must hand over all the same).
            if f.kind.handover() && target_hit(f, faults, deadline) {
                continue;
            }
            // Nor to one whose row stopped counting before the leader's next check: a row is
            // live for 2·I after its replica's last try, and a fault before the request (a
            // server restart) can have kept it from trying.
            let window = (f.inject, f.inject + us(i));
            if f.kind.handover() && !target_live(f, self.input.candidates, window) {
                continue;
            }
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
                    lane: 0,
                    fault: Some(f.id),
                    replicas: vec![p],
                });
            }
        }
    }

    /// A leader frozen for longer than 3·I never acts as leader on resume.
    pub(super) fn frozen(&self, a: &mut Analysis) {
        let (input, i, faults) = (self.input, self.i, self.input.faults);
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
                        lane: 0,
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
                    lane: 0,
                    fault: Some(f.id),
                    replicas: vec![p],
                });
            }
        }
    }
}
/// The join-partition a leaderless gap is judged by: one whose partition the gap began in,
/// when no other fault's window (`windows`) holds the gap's start.
pub(super) fn join_of<'a>(
    gap: Iv,
    faults: &'a [Fault],
    windows: &[(Iv, usize)],
) -> Option<&'a Fault> {
    let join = faults.iter().find(|f| {
        f.kind == Kind::JoinPartition && f.inject <= gap.0 && gap.0 <= f.heal.max(f.inject)
    })?;
    let other = windows
        .iter()
        .any(|&(w, id)| id != join.id && w.0 <= gap.0 && gap.0 < w.1);
    (!other).then_some(join)
}

/// Whether the target of handover request `f` stopped gracefully or resigned (each removes its
/// candidates row at once) from the request up to `until`.
fn target_hit(f: &Fault, faults: &[Fault], until: u64) -> bool {
    let Some(target) = f.handover.as_ref().and_then(|h| h.target) else {
        return false;
    };
    faults.iter().any(|g| {
        let row_gone = matches!(g.kind, Kind::Graceful | Kind::Resign);
        row_gone && g.replica == Some(target) && g.inject >= f.inject && g.inject <= until
    })
}

/// Whether the target of handover request `f` had a live candidates row in every read of
/// `samples` within `window` (true without reads: nothing says otherwise).
fn target_live(f: &Fault, samples: &[crate::prefs::Sample], window: Iv) -> bool {
    let Some(target) = f.handover.as_ref().and_then(|h| h.target) else {
        return true;
    };
    samples
        .iter()
        .filter(|r| r.at >= window.0 && r.at <= window.1)
        .all(|r| r.live.iter().any(|&(p, _)| p == target))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fault(id: usize, kind: Kind, inject: u64, heal: u64) -> Fault {
        Fault {
            id,
            kind,
            replica: Some(3),
            on_leader: false,
            epoch: None,
            param: Duration::ZERO,
            inject,
            lag: 0,
            heal,
            done: true,
            overlapped: false,
            note: String::new(),
            handover: None,
        }
    }

    #[test]
    fn a_gap_begun_during_a_join_s_partition_is_the_join_s_unless_another_fault_explains_it() {
        let faults = [
            fault(0, Kind::Kill, 100, 100),
            fault(1, Kind::JoinPartition, 1_000, 2_000),
        ];
        let windows = [((100, 600), 0), ((1_000, 1_200), 1)];
        assert_eq!(
            join_of((1_300, 2_500), &faults, &windows).map(|f| f.id),
            Some(1)
        );
        assert!(
            join_of((900, 2_500), &faults, &windows).is_none(),
            "begun before"
        );
        assert!(
            join_of((2_100, 2_500), &faults, &windows).is_none(),
            "begun after the heal"
        );
        let busy = [((100, 600), 0), ((1_000, 1_200), 1), ((1_250, 1_900), 0)];
        assert!(
            join_of((1_300, 2_500), &faults, &busy).is_none(),
            "another fault's window"
        );
    }

    #[test]
    fn a_handover_whose_target_stops_meanwhile_asks_no_demotion() {
        let mut request = Fault::instant(Kind::HandoverLive, Some(1), true, 1_000);
        request.handover = Some(crate::handover::Asked {
            named: None,
            target: Some(2),
            target_fast: false,
            answer: crate::handover::Answer::Made,
            killed: false,
        });
        let mut stop = Fault::instant(Kind::Graceful, Some(2), false, 1_100);
        stop.id = 1;
        let mut other = Fault::instant(Kind::Graceful, Some(3), false, 1_100);
        other.id = 1;
        let mut killed = Fault::instant(Kind::Kill, Some(2), false, 1_100);
        killed.id = 1;
        assert!(
            !target_hit(&request, &[request.clone(), killed], 2_000),
            "a killed target's row still counts"
        );
        assert!(target_hit(
            &request,
            &[request.clone(), stop.clone()],
            2_000
        ));
        assert!(!target_hit(&request, &[request.clone(), other], 2_000));
        assert!(
            !target_hit(&request, &[request.clone(), stop], 1_050),
            "after the bound"
        );
    }

    #[test]
    fn a_handover_target_whose_row_lapses_before_the_check_asks_no_demotion() {
        let mut request = Fault::instant(Kind::HandoverDying, Some(1), true, 1_000);
        request.handover = Some(crate::handover::Asked {
            named: None,
            target: Some(2),
            target_fast: false,
            answer: crate::handover::Answer::Made,
            killed: true,
        });
        let read = |at: u64, live: bool| crate::prefs::Sample {
            at,
            live: if live { vec![(2, 5)] } else { Vec::new() },
            requested: Vec::new(),
        };
        let lapsed = [read(1_010, true), read(1_100, false)];
        assert!(!target_live(&request, &lapsed, (1_000, 1_250)));
        let held = [read(1_010, true), read(1_100, true), read(2_000, false)];
        assert!(target_live(&request, &held, (1_000, 1_250)));
    }
}
