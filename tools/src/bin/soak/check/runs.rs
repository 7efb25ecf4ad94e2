//! The check of the schedule's runs: never two runs of one due at once, from the replicas' own
//! reports of each run's start and end (a run cut off by its process's end ends there). A
//! process that froze during its run is the docs' one exception: such an overlap is listed,
//! not a violation.

use std::collections::BTreeMap;

use super::intervals::Iv;
use super::{Analysis, Input, Violation, ms};
use crate::faults::Kind;
use crate::fleet::{Event, What};

/// One run of the job, as its replica reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunIv {
    /// The replica process.
    pub(crate) replica: usize,
    /// The due (ms since the UNIX epoch).
    pub(crate) due: u64,
    /// Its start and end (µs).
    pub(crate) span: Iv,
    /// 1, or 2 for a rerun.
    pub(crate) attempt: u32,
}

/// Two runs of one due at once: the earlier-started, the later, and when both ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overlap {
    pub(crate) first: RunIv,
    pub(crate) second: RunIv,
    pub(crate) both: Iv,
}

/// Every run from the events (in any order): a `run` line opens one, the `ran` line of its due
/// closes it; the process's end (killed, exited) or `end` closes what is left.
pub(crate) fn runs(events: &[Event], end: u64) -> Vec<RunIv> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| e.at);
    let mut open: BTreeMap<(usize, u64), (u64, u32)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in sorted {
        match e.what {
            What::Run { due, attempt } => {
                open.insert((e.replica, due), (e.at, attempt));
            }
            What::Ran { due } => {
                if let Some((start, attempt)) = open.remove(&(e.replica, due)) {
                    out.push(RunIv {
                        replica: e.replica,
                        due,
                        span: (start, e.at),
                        attempt,
                    });
                }
            }
            What::Killed | What::Exited => {
                let cut: Vec<(usize, u64)> = open
                    .keys()
                    .filter(|(p, _)| *p == e.replica)
                    .copied()
                    .collect();
                for key in cut {
                    let (start, attempt) = open.remove(&key).expect("just listed");
                    out.push(RunIv {
                        replica: key.0,
                        due: key.1,
                        span: (start, e.at),
                        attempt,
                    });
                }
            }
            _ => {}
        }
    }
    for ((replica, due), (start, attempt)) in open {
        out.push(RunIv {
            replica,
            due,
            span: (start, end.max(start)),
            attempt,
        });
    }
    out.sort_by_key(|r| (r.due, r.span.0));
    out
}

/// Every pair of runs of one due that ran at once.
pub(crate) fn overlaps(runs: &[RunIv]) -> Vec<Overlap> {
    let mut out = Vec::new();
    for (k, a) in runs.iter().enumerate() {
        for b in runs[k + 1..].iter().take_while(|b| b.due == a.due) {
            let both = (a.span.0.max(b.span.0), a.span.1.min(b.span.1));
            if both.1 > both.0 {
                out.push(Overlap {
                    first: *a,
                    second: *b,
                    both,
                });
            }
        }
    }
    out
}

/// Whether `p` was SIGSTOPped within `span`.
fn froze(events: &[Event], p: usize, span: Iv) -> bool {
    events
        .iter()
        .any(|e| e.replica == p && e.what == What::Stopped && (span.0..=span.1).contains(&e.at))
}

/// Runs of one due at once are violations, but for a process that froze during its run; each
/// is attributed to the latest partition or freeze of the first run's replica before the
/// overlap, else to the latest fault.
pub(crate) fn check(input: &Input<'_>, a: &mut Analysis) {
    let all = runs(input.events, input.end);
    a.job_runs = all.len();
    a.reruns = all.iter().filter(|r| r.attempt > 1).count();
    a.long_runs = all
        .iter()
        .filter(|r| r.span.1 - r.span.0 > 3_000_000)
        .count();
    a.due_overlaps = vec![0; input.faults.len()];
    for o in overlaps(&all) {
        let frozen = [o.first, o.second]
            .iter()
            .any(|r| froze(input.events, r.replica, (r.span.0, o.both.0)));
        if frozen {
            a.due_overlaps_frozen += 1;
            continue;
        }
        let lost_claim = input
            .due_overlaps_allowed
            .iter()
            .any(|&(due, attempt, until)| {
                due == o.first.due
                    && attempt == o.first.attempt
                    && o.first.attempt == o.second.attempt
                    && o.first.span.1 <= until
            });
        if lost_claim {
            a.due_overlaps_lost_claim += 1;
            continue;
        }
        let fault = input
            .faults
            .iter()
            .rev()
            .find(|f| {
                f.inject <= o.both.0
                    && f.replica == Some(o.first.replica)
                    && (f.kind.partitions() || f.kind == Kind::Stop)
            })
            .or_else(|| input.faults.iter().rev().find(|f| f.inject <= o.both.0))
            .map(|f| f.id);
        if let Some(id) = fault {
            a.due_overlaps[id] += 1;
        }
        a.violations.push(Violation {
            at: o.both.0,
            what: format!(
                "two runs of the due {} at once for {} ms: replica-{}'s (attempt {}, from {} ms \
                 before) and replica-{}'s (attempt {})",
                o.first.due,
                ms(o.both.1 - o.both.0),
                o.first.replica,
                o.first.attempt,
                ms(o.both.0 - o.first.span.0),
                o.second.replica,
                o.second.attempt
            ),
            lane: 0,
            fault,
            replicas: vec![o.first.replica, o.second.replica],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(replica: usize, at: u64, what: What) -> Event {
        Event {
            replica,
            lane: 0,
            at,
            what,
        }
    }

    #[test]
    fn a_run_ends_at_its_own_report_or_its_process_s_end() {
        let events = vec![
            ev(1, 10, What::Run { due: 7, attempt: 1 }),
            ev(2, 15, What::Run { due: 9, attempt: 1 }),
            ev(1, 20, What::Ran { due: 7 }),
            ev(2, 30, What::Killed),
            ev(3, 40, What::Run { due: 9, attempt: 2 }),
        ];
        let r = runs(&events, 100);
        let spans: Vec<(usize, u64, Iv)> = r.iter().map(|r| (r.replica, r.due, r.span)).collect();
        assert_eq!(
            spans,
            vec![(1, 7, (10, 20)), (2, 9, (15, 30)), (3, 9, (40, 100))]
        );
        assert!(overlaps(&r).is_empty(), "the rerun began after the kill");
    }

    #[test]
    fn a_rerun_beside_a_run_still_going_is_an_overlap_and_other_dues_are_not() {
        let events = vec![
            ev(1, 10, What::Run { due: 7, attempt: 1 }),
            ev(2, 40, What::Run { due: 7, attempt: 2 }),
            ev(2, 45, What::Run { due: 8, attempt: 1 }),
            ev(1, 70, What::Ran { due: 7 }),
            ev(2, 90, What::Ran { due: 7 }),
            ev(2, 95, What::Ran { due: 8 }),
        ];
        let o = overlaps(&runs(&events, 100));
        assert_eq!(o.len(), 1);
        assert_eq!((o[0].first.replica, o[0].second.replica), (1, 2));
        assert_eq!(o[0].both, (40, 70));
    }

    #[test]
    fn a_frozen_runner_is_seen_as_frozen() {
        let events = vec![ev(1, 20, What::Stopped)];
        assert!(froze(&events, 1, (10, 30)));
        assert!(!froze(&events, 1, (25, 30)));
        assert!(!froze(&events, 2, (10, 30)));
    }

    #[test]
    fn an_overlap_after_a_lost_claim_is_excused_only_while_the_old_run_may_go_on() {
        let options = crate::options::Options::parse(&[]).expect("options");
        let events = vec![
            ev(1, 10, What::Run { due: 7, attempt: 1 }),
            ev(2, 40, What::Run { due: 7, attempt: 1 }),
            ev(1, 70, What::Ran { due: 7 }),
            ev(2, 90, What::Ran { due: 7 }),
        ];
        let judged = |allowed: &[(u64, u32, u64)]| {
            let input = Input {
                options: &options,
                start: 0,
                end: 100,
                events: &events,
                procs: &[],
                faults: &[],
                runs: &[],
                rows: &[],
                offset: 0,
                checkpoints: &[],
                stalls: &[],
                probes: &[],
                due_overlaps_allowed: allowed,
                candidates: &[],
                handovers: &[],
            };
            let mut a = Analysis::default();
            check(&input, &mut a);
            (a.violations.len(), a.due_overlaps_lost_claim)
        };
        assert_eq!(judged(&[]), (1, 0));
        assert_eq!(judged(&[(7, 1, 70)]), (0, 1), "the old run ended in time");
        assert_eq!(
            judged(&[(7, 1, 69)]),
            (1, 0),
            "the old run went on too long"
        );
        assert_eq!(judged(&[(8, 1, 1_000)]), (1, 0), "another due's allowance");
    }
}
