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

/// What the failovers' checks found, besides violations.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Failovers completed (crashes, switchovers).
    pub(crate) crashes: usize,
    pub(crate) switchovers: usize,
    /// Per failover: from the promoted server taking writes to a leader of every lane (µs).
    pub(crate) to_leader: Vec<u64>,
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
    let mut failovers: Vec<&Failover> = seen.failovers.iter().collect();
    failovers.sort_by_key(|f| f.inject);
    for f in &failovers {
        if f.crash {
            facts.crashes += 1;
        } else {
            facts.switchovers += 1;
        }
        no_leader_without_a_primary(input, f, &mut v);
        if let Some(t) = to_leader(input, f, &mut v) {
            facts.to_leader.push(t);
        }
    }
    for hold in seen.recovery.1 {
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
    if input.options.shards == 0 {
        claims(input, &failovers, seen.replication, &mut v, &mut facts);
    }
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
    (v, facts)
}

/// Per lane, each term's epoch (from the replicas' reports, in the order the terms began) is
/// above every earlier term's.
fn epochs_rise(events: &[Event], v: &mut Vec<Violation>, facts: &mut Facts) {
    let mut terms: Vec<(usize, u64, usize, u64)> = events
        .iter()
        .filter_map(|e| match e.what {
            What::Leader {
                epoch: Some(epoch), ..
            } => Some((e.lane, e.at, e.replica, epoch)),
            _ => None,
        })
        .collect();
    terms.sort_unstable();
    facts.terms = terms.len();
    let mut highest: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
    for (lane, at, replica, epoch) in terms {
        if let Some(&(top, by)) = highest.get(&lane) {
            if epoch <= top {
                v.push(Violation {
                    at,
                    what: format!(
                        "replica-{replica}'s term has epoch {epoch}, not above replica-{by}'s \
                         earlier {top}"
                    ),
                    lane,
                    fault: None,
                    replicas: vec![replica, by],
                });
                continue;
            }
        }
        highest.insert(lane, (epoch, replica));
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
        if possible > stopped && e.at + WRITABLE_MARGIN < writable {
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
/// and the slack (and the machine's stalls within), unless another fault began meanwhile.
fn to_leader(input: &Input<'_>, f: &Failover, v: &mut Vec<Violation>) -> Option<u64> {
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
    let others = input
        .faults
        .iter()
        .any(|g| g.id != f.id && g.inject <= bound_end && g.heal >= f.inject);
    if worst > i + slack + stalled && !others {
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

/// Key mode: the claims of runs begun on the old primary (since the previous failover) are on
/// the promoted server with a synchronous standby; with an asynchronous one, those missing may
/// run again, once. No other due runs twice.
fn claims(
    input: &Input<'_>,
    failovers: &[&Failover],
    replication: Option<Replication>,
    v: &mut Vec<Violation>,
    facts: &mut Facts,
) {
    let all = runs(input.events, input.end);
    let mut lost: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    let mut since = 0;
    for f in failovers {
        let Some(on_promoted) = &f.claims else {
            continue;
        };
        let stopped = f.stopped.unwrap_or(f.inject);
        for r in all.iter().filter(|r| (since..stopped).contains(&r.span.0)) {
            if on_promoted.contains(&(r.due, r.attempt)) {
                continue;
            }
            facts.lost_claims.push((r.due, r.attempt, f.id));
            lost.insert((r.due, r.attempt), f.id);
            if replication == Some(Replication::Sync) {
                v.push(lost_claim(r, f));
            }
        }
        since = f.writable.unwrap_or(f.inject);
    }
    repeats(&all, &lost, failovers, v, facts);
}

fn lost_claim(r: &RunIv, f: &Failover) -> Violation {
    Violation {
        at: f.inject,
        what: format!(
            "the claim of due {} (attempt {}), which replica-{} ran from {} ms before the \
             failover, is not on the promoted server, though the standby was synchronous",
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
mod tests {
    use super::*;
    use crate::check::Checkpoint;
    use crate::faults::{Fault, Kind};
    use crate::options::Options;

    fn options(cluster: &str) -> Options {
        Options::parse(&["--cluster".to_owned(), cluster.to_owned()]).expect("options")
    }

    fn input<'a>(
        options: &'a Options,
        events: &'a [Event],
        faults: &'a [Fault],
        checkpoints: &'a [Checkpoint],
    ) -> Input<'a> {
        Input {
            options,
            start: 0,
            // Soon after the helper failover's promotion: a lane with no leader after it
            // counts as led at the end, within the bound.
            end: 1_500_000,
            events,
            procs: &[],
            faults,
            runs: &[],
            rows: &[],
            offset: 0,
            checkpoints,
            stalls: &[],
            probes: &[],
        }
    }

    fn seen<'a>(failovers: &'a [Failover], holds: &'a [RecoveryHold], r: Replication) -> Seen<'a> {
        Seen {
            failovers,
            recovery: (42, holds),
            replication: Some(r),
        }
    }

    /// A crash stopping the old primary at 1 s; the promoted server takes writes at 1.4 s.
    fn failover(id: usize, at: u64, claims: Option<&[(u64, u32)]>) -> Failover {
        Failover {
            id,
            crash: true,
            cut: std::time::Duration::ZERO,
            inject: at - 100_000,
            stopped: Some(at),
            writable: Some(at + 400_000),
            claims: claims.map(|c| c.iter().copied().collect()),
            rejoined: Some(at + 2_000_000),
        }
    }

    fn ev(replica: usize, lane: usize, at: u64, what: What) -> Event {
        Event {
            replica,
            lane,
            at,
            what,
        }
    }

    fn leads(replica: usize, lane: usize, possible: u64, at: u64, epoch: Option<u64>) -> Event {
        ev(replica, lane, at, What::Leader { possible, epoch })
    }

    /// Replica `p` runs `due` (attempt `attempt`) from `at` for 100 ms.
    fn run(p: usize, due: u64, attempt: u32, at: u64) -> [Event; 2] {
        [
            ev(p, 0, at, What::Run { due, attempt }),
            ev(p, 0, at + 100_000, What::Ran { due }),
        ]
    }

    fn what(v: &[Violation]) -> Vec<(u64, usize, Option<usize>, Vec<usize>)> {
        v.iter()
            .map(|v| (v.at, v.lane, v.fault, v.replicas.clone()))
            .collect()
    }

    #[test]
    fn a_later_term_of_a_lane_with_an_epoch_not_above_an_earlier_one_is_a_violation() {
        let o = options("sync");
        // Out of order on purpose: the terms are ordered by when they began.
        let events = [
            leads(2, 0, 19, 20, Some(5)),
            leads(1, 0, 9, 10, Some(5)),
            leads(3, 0, 29, 30, Some(4)),
            leads(4, 0, 39, 40, Some(6)),
            // Another lane's epochs are its own.
            leads(2, 1, 14, 15, Some(1)),
        ];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&[], &[], Replication::Sync),
        );
        assert_eq!(
            what(&v),
            vec![(20, 0, None, vec![2, 1]), (30, 0, None, vec![3, 1])]
        );
        assert_eq!(facts.terms, 5);
    }

    #[test]
    fn rising_epochs_are_no_violation() {
        let o = options("sync");
        let events = [
            leads(1, 0, 9, 10, Some(1)),
            leads(2, 0, 19, 20, Some(2)),
            leads(1, 0, 29, 30, Some(7)),
            leads(1, 1, 9, 10, Some(1)),
        ];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&[], &[], Replication::Sync),
        );
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(facts.terms, 4);
    }

    #[test]
    fn a_claim_missing_after_a_synchronous_failover_is_a_violation() {
        let o = options("sync");
        let events: Vec<Event> = [run(1, 7, 1, 500_000), run(1, 8, 1, 700_000)].concat();
        let f = [failover(0, 1_000_000, Some(&[(8, 1)]))];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Sync),
        );
        assert_eq!(what(&v), vec![(900_000, 0, Some(0), vec![1])]);
        assert_eq!(facts.lost_claims, vec![(7, 1, 0)]);
        assert!(facts.repeats.is_empty());
        assert_eq!(facts.crashes, 1);
    }

    #[test]
    fn a_claim_an_asynchronous_failover_lost_may_run_once_more_after_it() {
        let o = options("async");
        let events: Vec<Event> = [
            run(1, 7, 1, 500_000),
            run(1, 8, 1, 700_000),
            run(2, 7, 1, 1_500_000),
        ]
        .concat();
        let f = [failover(0, 1_000_000, Some(&[(8, 1)]))];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Async),
        );
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(facts.lost_claims, vec![(7, 1, 0)]);
        assert_eq!(facts.repeats, vec![(7, 1, 0)]);
    }

    #[test]
    fn a_lost_claim_run_twice_more_is_a_violation() {
        let o = options("async");
        let events: Vec<Event> = [
            run(1, 7, 1, 500_000),
            run(2, 7, 1, 1_500_000),
            run(3, 7, 1, 1_700_000),
        ]
        .concat();
        let f = [failover(0, 1_000_000, Some(&[]))];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Async),
        );
        assert_eq!(what(&v), vec![(1_500_000, 0, None, vec![1, 2])]);
        assert!(facts.repeats.is_empty());
    }

    #[test]
    fn a_claim_lost_at_one_failover_is_not_lost_again_at_the_next() {
        let o = options("async");
        let events: Vec<Event> = [run(1, 7, 1, 500_000), run(2, 7, 1, 1_500_000)].concat();
        let f = [
            failover(0, 1_000_000, Some(&[])),
            failover(1, 3_000_000, Some(&[(7, 1)])),
        ];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Async),
        );
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(facts.lost_claims, vec![(7, 1, 0)]);
        assert_eq!(facts.repeats, vec![(7, 1, 0)]);
        assert_eq!(facts.crashes, 2);
    }

    #[test]
    fn a_due_run_twice_with_no_failover_losing_its_claim_is_a_violation() {
        let o = options("async");
        let events: Vec<Event> = [run(1, 7, 1, 500_000), run(2, 7, 1, 1_500_000)].concat();
        let f = [failover(0, 1_000_000, Some(&[(7, 1)]))];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Async),
        );
        assert_eq!(what(&v), vec![(1_500_000, 0, None, vec![1, 2])]);
        assert!(facts.lost_claims.is_empty());
        assert!(facts.repeats.is_empty());
        let (v, _) = check(
            &input(&o, &events, &[], &[]),
            &seen(&[], &[], Replication::Async),
        );
        assert_eq!(v.len(), 1, "without any failover too: {v:?}");
    }

    #[test]
    fn runs_after_the_failover_are_not_its_claims_to_keep() {
        let o = options("sync");
        let events: Vec<Event> = [
            run(1, 8, 1, 700_000),
            run(2, 9, 1, 1_500_000),
            run(2, 10, 1, 1_700_000),
        ]
        .concat();
        let f = [failover(0, 1_000_000, Some(&[(8, 1), (9, 1)]))];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Sync),
        );
        assert!(v.is_empty(), "{v:?}");
        assert!(facts.lost_claims.is_empty());
    }

    #[test]
    fn a_term_begun_between_the_stop_and_the_promoted_server_taking_writes_is_a_violation() {
        let o = options("sync");
        let events = [
            // Stopped at 1 s, writable at 1.4 s.
            leads(1, 0, 1_100_000, 1_200_000, None),
            leads(2, 0, 1_290_000, 1_350_000, None),
            leads(3, 0, 900_000, 1_200_000, None),
        ];
        let f = [failover(0, 1_000_000, None)];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Sync),
        );
        assert_eq!(what(&v), vec![(1_200_000, 0, Some(0), vec![1])]);
        assert_eq!(facts.to_leader, vec![0]);
    }

    #[test]
    fn a_leader_later_than_one_interval_after_the_promotion_is_a_violation_unless_another_fault_began()
     {
        let o = options("sync");
        // I = 250 ms, slack 375 ms: a leader 1 s after the promoted server took writes.
        let events = [leads(1, 0, 2_300_000, 2_400_000, None)];
        let f = [failover(0, 1_000_000, None)];
        let (v, facts) = check(
            &input(&o, &events, &[], &[]),
            &seen(&f, &[], Replication::Sync),
        );
        assert_eq!(what(&v), vec![(2_400_000, 0, Some(0), Vec::new())]);
        assert_eq!(facts.to_leader, vec![1_000_000]);
        let mut kill = Fault::instant(Kind::Kill, Some(1), true, 1_600_000);
        kill.id = 1;
        let faults = [kill];
        let (v, _) = check(
            &input(&o, &events, &faults, &[]),
            &seen(&f, &[], Replication::Sync),
        );
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn a_replica_holding_a_lock_on_a_server_in_recovery_is_a_violation_and_the_checker_is_not() {
        let o = options("sync");
        let server = "127.0.0.1:5433".parse().unwrap();
        let holds = [
            RecoveryHold {
                at: 10,
                server,
                holder: "replica-3".to_owned(),
            },
            RecoveryHold {
                at: 20,
                server,
                holder: crate::db::CHECKER.to_owned(),
            },
        ];
        let (v, facts) = check(
            &input(&o, &[], &[], &[]),
            &seen(&[], &holds, Replication::Sync),
        );
        assert_eq!(what(&v), vec![(10, 0, None, vec![3])]);
        assert_eq!(facts.recovery_samples, 42);
    }

    #[test]
    fn replica_backends_on_the_standby_at_a_checkpoint_are_a_violation() {
        let o = options("sync");
        let checkpoint = |at, standby| Checkpoint {
            at,
            backends: Vec::new(),
            live: Vec::new(),
            standby,
        };
        let checkpoints = [
            checkpoint(10, Some(2)),
            checkpoint(20, Some(0)),
            checkpoint(30, None),
        ];
        let (v, facts) = check(
            &input(&o, &[], &[], &checkpoints),
            &seen(&[], &[], Replication::Sync),
        );
        assert_eq!(what(&v), vec![(10, 0, None, Vec::new())]);
        assert_eq!(facts.standby_backends_max, 2);
    }

    #[test]
    fn a_key_never_led_again_after_the_promotion_is_a_violation() {
        let o = options("async");
        let f = [failover(0, 1_000_000, None)];
        let long = Input {
            end: 10_000_000,
            ..input(&o, &[], &[], &[])
        };
        let (v, facts) = check(&long, &seen(&f, &[], Replication::Async));
        assert_eq!(what(&v), vec![(10_000_000, 0, Some(0), vec![])]);
        assert_eq!(facts.to_leader, vec![8_600_000]);
    }
}
