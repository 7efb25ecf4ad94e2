//! Shard mode: the checks of one key, run once per shard on what concerns that shard (its
//! events, its rows, its `pg_locks` samples, and the faults as that shard saw them), then
//! summed up.

use super::{Analysis, Input, analyse_lane};
use crate::db::Run;
use crate::faults::Fault;
use crate::fleet::{Event, What};

/// Every check, per shard; `runs` holds each shard's samples. Resources (memory, backends)
/// belong to the processes, not to a shard, and are checked once.
pub(crate) fn analyse_shards(input: &Input<'_>, runs: &[Vec<Run>]) -> Analysis {
    let mut total = Analysis::default();
    for lane in 0..input.options.lanes() {
        let events: Vec<Event> = input
            .events
            .iter()
            .filter(|e| e.lane == lane || e.what.of_process())
            .copied()
            .collect();
        let rows: Vec<_> = input
            .rows
            .iter()
            .filter(|r| r.lane == lane)
            .copied()
            .collect();
        let faults: Vec<Fault> = input
            .faults
            .iter()
            .map(|f| as_seen_by(f, &events))
            .collect();
        let shard = Input {
            events: &events,
            rows: &rows,
            faults: &faults,
            runs: runs.get(lane).map_or(&[][..], Vec::as_slice),
            ..*input
        };
        let a = analyse_lane(&shard, lane == 0);
        add(&mut total, a, lane);
    }
    total.violations.sort_by_key(|v| v.at);
    total
}

/// A fault as one shard saw it: it hit that shard's owner if it hit a replica that owned the
/// shard then (and, for a terminate, the lock session), or the server; with that owner's
/// epoch. `events` are the shard's and the processes'.
fn as_seen_by(f: &Fault, events: &[Event]) -> Fault {
    let mut f = f.clone();
    if f.kind.server_wide() {
        let owner = owner_at(events, f.inject);
        f.replica = owner.map(|(p, _)| p);
        f.epoch = owner.and_then(|(_, e)| e);
        return f;
    }
    let owned = f
        .replica
        .and_then(|p| term_at(events, p, f.inject))
        .filter(|_| f.on_leader);
    f.on_leader = owned.is_some();
    f.epoch = owned.flatten();
    f
}

/// Whether process `p` led just before `t` as its reports tell (a live, not stopped term),
/// and the term's epoch: before, so that a fault's own signal, stamped at its injection, does
/// not count.
fn term_at(events: &[Event], p: usize, t: u64) -> Option<Option<u64>> {
    let mut term = None;
    let mut stopped = false;
    let mut mine: Vec<&Event> = events
        .iter()
        .filter(|e| e.replica == p && e.at < t)
        .collect();
    mine.sort_by_key(|e| e.at);
    for e in mine {
        match e.what {
            What::Leader { epoch, .. } => term = Some(epoch),
            What::Standby { .. } | What::Killed | What::Exited => term = None,
            What::Stopped => stopped = true,
            What::Continued => stopped = false,
            _ => {}
        }
    }
    term.filter(|_| !stopped)
}

/// The process that led at `t`, if one did, and its epoch.
fn owner_at(events: &[Event], t: u64) -> Option<(usize, Option<u64>)> {
    let mut processes: Vec<usize> = events.iter().map(|e| e.replica).collect();
    processes.sort_unstable();
    processes.dedup();
    processes
        .into_iter()
        .find_map(|p| term_at(events, p, t).map(|epoch| (p, epoch)))
}

/// Adds one shard's analysis to the total: its violations (named by shard), the worst
/// leaderless and two-leader time per fault, the counts summed.
fn add(total: &mut Analysis, a: Analysis, lane: usize) {
    for mut v in a.violations {
        v.lane = lane;
        v.what = format!("shard {lane}: {}", v.what);
        total.violations.push(v);
    }
    let worst = |into: &mut Vec<u64>, from: Vec<u64>| {
        into.resize(into.len().max(from.len()), 0);
        for (k, t) in from.into_iter().enumerate() {
            into[k] = into[k].max(t);
        }
    };
    worst(&mut total.leaderless, a.leaderless);
    worst(&mut total.two_leaders, a.two_leaders);
    total.unprovoked.extend(a.unprovoked);
    total.unprovoked.sort_unstable();
    total.first_leader = total.first_leader.max(a.first_leader);
    total.rows += a.rows;
    total.epochs += a.epochs;
    total.rows_other_holder += a.rows_other_holder;
    total.rows_no_holder += a.rows_no_holder;
    total.fence_refusals += a.fence_refusals;
    total.excused_overlaps.extend(a.excused_overlaps);
    for d in a.deaf {
        if !total.deaf.contains(&d) {
            total.deaf.push(d);
        }
    }
    if lane == 0 {
        total.rss = a.rss;
        total.backends = a.backends;
        total.backends_per_replica_max = a.backends_per_replica_max;
        total.stalls = a.stalls;
        total.pool_stuck = a.pool_stuck;
        total.probes = a.probes;
        total.due_overlaps = a.due_overlaps;
        total.due_overlaps_frozen = a.due_overlaps_frozen;
        total.due_overlaps_lost_claim = a.due_overlaps_lost_claim;
        (total.job_runs, total.reruns, total.long_runs) = (a.job_runs, a.reruns, a.long_runs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Kind;

    fn fault(kind: Kind, replica: Option<usize>, on_leader: bool, inject: u64) -> Fault {
        Fault::instant(kind, replica, on_leader, inject)
    }

    fn leads(replica: usize, lane: usize, at: u64, epoch: u64) -> Event {
        Event {
            replica,
            lane,
            at,
            what: What::Leader {
                possible: at - 1,
                epoch: Some(epoch),
            },
        }
    }

    /// What one shard sees: replica 1 owns shard 0 from t = 100 (epoch 7); replica 2 owned
    /// it from 10 to 50 (epoch 3).
    fn shard_zero() -> Vec<Event> {
        vec![
            leads(2, 0, 10, 3),
            Event {
                replica: 2,
                lane: 0,
                at: 50,
                what: What::Standby { definite: 49 },
            },
            leads(1, 0, 100, 7),
        ]
    }

    #[test]
    fn a_fault_hits_a_shard_its_replica_owned() {
        let hit = as_seen_by(&fault(Kind::Partition, Some(1), true, 200), &shard_zero());
        assert!(hit.on_leader);
        assert_eq!(hit.epoch, Some(7));
        // Replica 2 led some shard at 200 (the injector said so), but not this one any more.
        let missed = as_seen_by(&fault(Kind::Partition, Some(2), true, 200), &shard_zero());
        assert!(!missed.on_leader);
        assert_eq!(missed.epoch, None);
    }

    #[test]
    fn the_faults_own_signal_does_not_hide_the_owner() {
        let mut events = shard_zero();
        // The parent stamps its SIGSTOP at the injection itself.
        events.push(Event::of_process(1, 200, What::Stopped));
        let hit = as_seen_by(&fault(Kind::Stop, Some(1), true, 200), &events);
        assert!(hit.on_leader, "a freeze of the owner hits the shard");
        // A replica frozen before the fault does not lead, so the fault hits no owner.
        events.push(Event::of_process(1, 300, What::Stopped));
        let later = as_seen_by(&fault(Kind::Reset, Some(1), true, 400), &events);
        assert!(
            !later.on_leader,
            "a replica frozen before the fault is not hit as owner"
        );
    }

    #[test]
    fn a_terminate_of_no_lock_session_hits_no_shard() {
        let f = fault(Kind::TerminateRandom, Some(1), false, 200);
        assert!(!as_seen_by(&f, &shard_zero()).on_leader);
    }

    #[test]
    fn a_restart_hits_each_shards_owner_then() {
        let f = fault(Kind::RestartFast, None, true, 200);
        let seen = as_seen_by(&f, &shard_zero());
        assert!(seen.on_leader);
        assert_eq!((seen.replica, seen.epoch), (Some(1), Some(7)));
        let early = as_seen_by(&fault(Kind::RestartFast, None, true, 20), &shard_zero());
        assert_eq!((early.replica, early.epoch), (Some(2), Some(3)));
    }
}
