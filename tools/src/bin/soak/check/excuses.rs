//! The excuses: when a fault lets nobody lead, and when it lets two lead; and the stalls that
//! extend every bound.

use std::time::Duration;

use super::intervals::{Iv, extend, normalize};
use super::{Input, us};
use crate::faults::{Kind, SCHEDULING, SESSION_ENDED};
use crate::fleet::What;

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
                    Kind::TerminateLock | Kind::TerminateRandom => {
                        g.on_leader && g.replica == Some(p)
                    }
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
        }
    }
}
