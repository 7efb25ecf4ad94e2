//! The failover checks' unit tests: events, failovers, holds and checkpoints made by hand.

use super::*;
use crate::check::Checkpoint;
use crate::faults::{Fault, Kind};
use crate::options::Options;

/// `--cluster <cluster> --min-failovers 0`: the tests with no failover are about other
/// checks.
fn options(cluster: &str) -> Options {
    let args = ["--cluster", cluster, "--min-failovers", "0"].map(str::to_owned);
    Options::parse(&args).expect("options")
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
        due_overlaps_allowed: &[],
        candidates: &[],
        handovers: &[],
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
        run(1, 7, 1, 800_000),
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
        run(1, 7, 1, 800_000),
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
    let events: Vec<Event> = [run(1, 7, 1, 800_000), run(2, 7, 1, 1_500_000)].concat();
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

#[test]
fn an_asynchronous_crash_loses_only_what_was_claimed_within_the_lag_and_a_switchover_nothing() {
    let o = options("async");
    // Claimed 0.4 s before the crash at 0.9 s, with no cut: past the 250 ms of lag.
    let early: Vec<Event> = [run(1, 7, 1, 500_000), run(2, 7, 1, 1_500_000)].concat();
    let f = [failover(0, 1_000_000, Some(&[]))];
    let (v, facts) = check(
        &input(&o, &early, &[], &[]),
        &seen(&f, &[], Replication::Async),
    );
    assert_eq!(
        what(&v),
        vec![
            (900_000, 0, Some(0), vec![1]),
            (1_500_000, 0, None, vec![1, 2])
        ]
    );
    assert_eq!(facts.lost_claims, vec![(7, 1, 0)]);
    assert!(facts.repeats.is_empty());
    // The same claim within a cut of 0.5 s before the crash: lost as allowed.
    let mut cut = failover(0, 1_000_000, Some(&[]));
    cut.cut = std::time::Duration::from_millis(500);
    let (v, facts) = check(
        &input(&o, &early, &[], &[]),
        &seen(&[cut.clone()], &[], Replication::Async),
    );
    assert!(v.is_empty(), "{v:?}");
    assert_eq!(facts.repeats, vec![(7, 1, 0)]);
    // A switchover loses nothing, even within the cut's time.
    let switchover = Failover {
        crash: false,
        ..cut
    };
    let (v, _) = check(
        &input(&o, &early, &[], &[]),
        &seen(&[switchover], &[], Replication::Async),
    );
    assert_eq!(v.len(), 2, "the lost claim and the due run twice: {v:?}");
}

#[test]
fn fewer_failovers_than_asked_is_a_violation() {
    let args = ["--cluster", "sync", "--min-failovers", "2"].map(str::to_owned);
    let o = Options::parse(&args).expect("options");
    let mut broken = failover(1, 3_000_000, None);
    broken.rejoined = None;
    let f = [failover(0, 1_000_000, None), broken];
    let (v, facts) = check(&input(&o, &[], &[], &[]), &seen(&f, &[], Replication::Sync));
    assert_eq!(facts.completed, 1);
    assert_eq!(what(&v), vec![(1_500_000, 0, None, vec![])]);
    assert_eq!(facts.counts.all, 1);
}

#[test]
fn an_asynchronous_crash_lets_the_old_run_go_on_until_its_heartbeats_cut_it_off() {
    let runs = [RunIv {
        replica: 1,
        due: 7,
        span: (800_000, 950_000),
        attempt: 1,
    }];
    let f = [failover(0, 1_000_000, Some(&[]))];
    let lost = lost_claims(&runs, &f, Some(Replication::Async), &[]);
    assert_eq!(lost.len(), 1);
    assert!(lost[0].allowed);
    // The crash at 0.9 s, two thirds of the 3 s stale threshold, the slack.
    assert_eq!(overlaps_allowed(&lost, 375_000), vec![(7, 1, 3_275_000)]);
    let sync = lost_claims(&runs, &f, Some(Replication::Sync), &[]);
    assert!(
        overlaps_allowed(&sync, 375_000).is_empty(),
        "never with sync"
    );
}
