//! The excuses: when a fault lets nobody lead, and when it lets two lead; and the stalls that
//! extend every bound.

use std::time::Duration;

use super::intervals::{Iv, extend, normalize};
use super::runs::RunIv;
use super::{Input, us};
use crate::faults::{Fault, Kind, SCHEDULING, SESSION_ENDED};
use crate::fleet::What;

/// How much longer than I a graceful handover by fault `f` may drain: the rest of a run of
/// the schedule's in progress on its replica then, up to the drain timeout. A leader asked to
/// hand over (`handover-*`) ends its term at its next check, within I: a run begun by then
/// counts too.
pub(super) fn drain(f: &Fault, runs: &[RunIv], i: Duration) -> u64 {
    let seen = match f.kind {
        Kind::Graceful | Kind::Resign => 0,
        Kind::HandoverLive | Kind::HandoverDying => us(i),
        _ => return 0,
    };
    runs.iter()
        .filter(|r| {
            Some(r.replica) == f.replica && r.span.0 <= f.inject + seen && f.inject < r.span.1
        })
        .map(|r| r.span.1.min(f.inject + seen + us(crate::app::DRAIN)) - f.inject)
        .max()
        .unwrap_or(0)
}

/// With `--preferences`, the leaderless allowance from the injection of a fault that takes a
/// standby out while it may be the one the free lock is left to (docs/preferences.md: "a
/// preferred standby that freezes can leave the key without a leader for up to 3·I"; a killed
/// or starved one's row, too, counts until two intervals after its last try): at least 3·I.
fn preferred_standby_gone(f: &Fault, i: Duration) -> Duration {
    match f.kind {
        Kind::Kill | Kind::Stop | Kind::Partition | Kind::LongPartition | Kind::Exhaust => i * 3,
        _ => Duration::ZERO,
    }
}

/// Where a fault's leaderless allowance begins: its injection, or, for a crash of a
/// synchronous primary whose standby was cut off first, the cut (every COMMIT waits from then:
/// a fenced transaction left by a killed leader holds the epoch row, and no term can begin,
/// as under `sync-standby`).
fn commits_wait_from(input: &Input<'_>, f: &Fault) -> u64 {
    let sync = input.options.cluster == Some(crate::options::Replication::Sync);
    if sync && f.kind == Kind::Failover {
        f.inject.saturating_sub(us(f.param))
    } else {
        f.inject
    }
}

/// The spans the faults excuse, and the stalls.
#[derive(Debug)]
pub(super) struct Excuses {
    /// The machine's stalls.
    pub(super) machine: Vec<Iv>,
    /// Per replica: its watcher's gaps of more than 100 ms, and the machine's stalls.
    pub(super) stalled: Vec<Vec<Iv>>,
    /// Per fault: the span in which nobody may lead, and the fault.
    pub(super) windows: Vec<(Iv, usize)>,
    /// Where nobody may lead.
    pub(super) leaderless_excused: Vec<Iv>,
    /// Where two may lead.
    pub(super) overlap_excused: Vec<Iv>,
    /// Sessions ended while their leader could not hear (fault id, and the freeze's or the
    /// partition's).
    pub(super) deaf: Vec<(usize, usize)>,
    /// The schedule's runs (the drains).
    pub(super) runs: Vec<RunIv>,
}

impl Excuses {
    /// The excuses of `input`'s faults at check interval `i` with `slack` (µs).
    pub(super) fn new(input: &Input<'_>, i: Duration, slack: u64) -> Self {
        let faults = input.faults;
        let machine = normalize(input.stalls.to_vec());
        let mut stalled: Vec<Vec<Iv>> = vec![machine.clone(); input.procs.len()];
        for e in input.events {
            if let (What::Woke { previous, .. }, Some(list)) = (e.what, stalled.get_mut(e.replica))
            {
                list.push((previous, e.at));
            }
        }
        let stalled: Vec<Vec<Iv>> = stalled.into_iter().map(normalize).collect();
        let stalls_of = |p: Option<usize>| p.and_then(|p| stalled.get(p)).unwrap_or(&machine);
        let runs = super::runs::runs(input.events, input.end);
        let windows: Vec<(Iv, usize)> = faults
            .iter()
            .map(|f| {
                let b = f.kind.bound(i);
                let from_inject = if input.options.preferences {
                    b.from_inject.max(preferred_standby_gone(f, i))
                } else {
                    b.from_inject
                };
                let end = (f.inject + us(from_inject)).max(f.heal + us(b.after_heal)) + slack;
                let end = end + drain(f, &runs, i);
                (extend((commits_wait_from(input, f), end), &machine), f.id)
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
                k if k.partitions() => (f.inject + us(i * 2)).min(f.heal + us(SESSION_ENDED)),
                _ => continue,
            } + slack;
            for g in faults
                .iter()
                .filter(|g| (f.inject..=f.heal).contains(&g.inject))
            {
                let ends_session = match g.kind {
                    Kind::TerminateLock | Kind::TerminateRandom => {
                        g.on_leader && g.replica == Some(p)
                    }
                    Kind::RestartFast | Kind::RestartImmediate | Kind::Failover => true,
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
        // A leader that hears its session end steps down before the next term begins, unless
        // its process waits longer than the term's 5 ms for the CPU (see [`SCHEDULING`]).
        for f in faults.iter().filter(|f| f.on_leader) {
            if matches!(
                f.kind,
                Kind::TerminateLock | Kind::TerminateRandom | Kind::Reset
            ) {
                let window = (f.inject, f.inject + us(SCHEDULING));
                overlap_windows.push((extend(window, stalls_of(f.replica)), f.id));
            }
        }
        let overlap_excused = normalize(overlap_windows.iter().map(|w| w.0).collect());

        Excuses {
            machine,
            stalled,
            windows,
            leaderless_excused,
            overlap_excused,
            deaf: deaf_overlaps,
            runs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(kind: Kind, inject: u64) -> Fault {
        Fault::instant(kind, Some(2), true, inject)
    }

    fn run(replica: usize, span: Iv) -> RunIv {
        RunIv {
            replica,
            due: 1,
            span,
            attempt: 1,
        }
    }

    #[test]
    fn a_graceful_handover_drains_the_rest_of_its_run_up_to_the_drain_timeout() {
        let runs = [run(2, (100, 5_000)), run(3, (0, 90_000_000))];
        let i = Duration::from_millis(1);
        assert_eq!(drain(&fault(Kind::Graceful, 1_000), &runs, i), 4_000);
        assert_eq!(drain(&fault(Kind::Resign, 1_000), &runs, i), 4_000);
        assert_eq!(
            drain(&fault(Kind::Kill, 1_000), &runs, i),
            0,
            "not a handover"
        );
        assert_eq!(
            drain(&fault(Kind::Graceful, 6_000), &runs, i),
            0,
            "no run then"
        );
        assert_eq!(
            drain(&fault(Kind::HandoverLive, 50), &runs, i),
            4_950,
            "a run begun before the leader's next check"
        );
        let long = [run(2, (0, 90_000_000))];
        assert_eq!(
            drain(&fault(Kind::Graceful, 1_000), &long, i),
            us(crate::app::DRAIN),
            "at most the drain timeout"
        );
    }
}
