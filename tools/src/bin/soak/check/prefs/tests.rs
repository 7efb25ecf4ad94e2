//! The preference checks against made-up reads and reports.

use crate::check::{Input, ProcInfo, analyse};
use crate::fleet::{Event, What};
use crate::options::Options;
use crate::prefs::Sample;

fn proc(preference: u64) -> ProcInfo {
    ProcInfo {
        slot: 0,
        spawned: 0,
        ended: None,
        rss: Vec::new(),
        fast: false,
        preference: Some(preference),
    }
}

fn leads(replica: usize, from: u64) -> Event {
    Event {
        replica,
        lane: 0,
        at: from,
        what: What::Leader {
            possible: from - 1,
            epoch: Some(from),
        },
    }
}

/// Replica 1 (preference 2) is live from 1 s on; replica 0 (preference 1) leads from the
/// start; `events` add to that. The preference violations of a 20 s run at I = 250 ms.
fn judged(more: &[Event]) -> Vec<String> {
    judged_with(more, false)
}

/// As [`judged`]; with `asked`, the first read shows a handover request pending for
/// replica 0 (its term is then one taken on request).
fn judged_with(more: &[Event], asked: bool) -> Vec<String> {
    let options = Options::parse(&[]).expect("the defaults");
    let procs = [proc(1), proc(2)];
    let mut events = vec![leads(0, 100)];
    events.extend_from_slice(more);
    let candidates: Vec<Sample> = (0..1_000u64)
        .map(|k| Sample {
            at: k * 20_000,
            live: if k * 20_000 >= 1_000_000 {
                vec![(1, 2)]
            } else {
                Vec::new()
            },
            requested: if asked && k == 0 { vec![0] } else { Vec::new() },
        })
        .collect();
    let input = Input {
        options: &options,
        start: 0,
        end: 20_000_000,
        events: &events,
        procs: &procs,
        faults: &[],
        runs: &[],
        rows: &[],
        offset: 0,
        checkpoints: &[],
        stalls: &[],
        probes: &[],
        due_overlaps_allowed: &[],
        candidates: &candidates,
        handovers: &[],
    };
    analyse(&input)
        .violations
        .into_iter()
        .map(|v| v.what)
        .filter(|w| w.contains("most preferred"))
        .collect()
}

#[test]
fn a_less_preferred_leader_that_never_hands_over_is_a_violation() {
    let found = judged(&[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("live: replica-1, preference 2"),
        "{found:?}"
    );
}

#[test]
fn a_move_within_two_intervals_is_allowed_and_one_later_is_not() {
    let moved = |to: u64| {
        judged(&[
            Event {
                replica: 0,
                lane: 0,
                at: to - 100_000,
                what: What::Standby {
                    definite: to - 100_001,
                },
            },
            leads(1, to),
        ])
    };
    // 2·I + slack = 875 ms from the standby's first live row at 1 s.
    assert!(moved(1_500_000).is_empty(), "{:?}", moved(1_500_000));
    assert_eq!(moved(3_000_000).len(), 1, "{:?}", moved(3_000_000));
}

#[test]
fn a_term_begun_while_the_table_showed_a_request_for_it_keeps_the_lead() {
    assert!(judged_with(&[], true).is_empty(), "taken on request");
}

#[test]
fn a_request_made_while_the_leader_is_partitioned_is_cut_short() {
    use crate::faults::{Fault, Kind};
    let mut partition = Fault::instant(Kind::Partition, Some(3), true, 1_000_000);
    partition.heal = 3_000_000;
    let mut request = Fault::instant(Kind::HandoverLive, Some(3), true, 2_000_000);
    request.id = 1;
    let mut before = Fault::instant(Kind::Partition, Some(3), true, 100_000);
    before.heal = 500_000;
    before.id = 2;
    assert!(super::cut_short(
        &request,
        &[partition, request.clone()],
        2_900_000
    ));
    assert!(!super::cut_short(
        &request,
        &[before.clone(), request.clone()],
        2_900_000
    ));
    let mut later = before;
    later.inject = 2_500_000;
    later.heal = 2_500_000;
    assert!(super::cut_short(
        &request,
        &[later.clone(), request.clone()],
        2_900_000
    ));
    assert!(!super::cut_short(
        &request,
        &[later.clone(), request.clone()],
        2_400_000
    ));
    let mut elsewhere = later;
    elsewhere.replica = Some(4);
    assert!(
        !super::cut_short(&request, &[elsewhere, request.clone()], 2_900_000),
        "a fault on an uninvolved standby"
    );
    let mut superseding = Fault::instant(Kind::HandoverLive, Some(3), true, 2_100_000);
    superseding.id = 3;
    assert!(
        super::cut_short(&request, &[superseding.clone(), request.clone()], 2_900_000),
        "a later request counts instead"
    );
    superseding.kind = Kind::HandoverMissing;
    assert!(
        !super::cut_short(&request, &[superseding, request.clone()], 2_900_000),
        "a request to a missing identity changes nothing"
    );
}
