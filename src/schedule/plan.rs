//! What the leader does with one job's dues at one look at its row: which to run, and which to
//! count as handled without running them. A pure function of the instants, so that the rule
//! is tested on fixed ones.

use jiff::Timestamp;

use super::job::{CatchUp, Spec};

/// Why a due did not run: the `reason` of a `skipped` row in the runs table, and the `reason`
/// label of `pg_elector_job_skipped_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// The job's [`CatchUp`] dropped it: it was missed (nobody led, or another run of the job
    /// was still going) and the policy is `Skip`, or `Latest` and it was not the latest.
    CatchUp,
    /// [`CatchUp::All`] would have run it, but it was older than the most recent
    /// [`max_catch_up`](super::Job::max_catch_up) dues to run.
    CatchUpLimit,
    /// Its run was cut off (called abandoned) and the job does not ask for reruns (or it was
    /// a triggered run, which is never rerun).
    Abandoned,
    /// The job was halted in this process by [`LostState::Halt`](super::LostState::Halt),
    /// and this process led.
    Halted,
}

impl SkipReason {
    /// Every reason, in the order of their declaration.
    pub const ALL: [SkipReason; 4] = [
        SkipReason::CatchUp,
        SkipReason::CatchUpLimit,
        SkipReason::Abandoned,
        SkipReason::Halted,
    ];

    /// The reason as the table and the metric say it: `catch_up`, `catch_up_limit`,
    /// `abandoned` or `halted`.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::CatchUp => "catch_up",
            SkipReason::CatchUpLimit => "catch_up_limit",
            SkipReason::Abandoned => "abandoned",
            SkipReason::Halted => "halted",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stretch of dues that do not run, for one reason: how many, and the latest of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub(crate) reason: SkipReason,
    /// The latest due of the stretch (the `due` of its row).
    pub(crate) latest: Timestamp,
    /// How many dues it stands for.
    pub(crate) dues: u64,
}

/// The dues of one job at one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The dues to claim and run, oldest first.
    pub(crate) run: Vec<Timestamp>,
    /// The dues that do not run, by reason, oldest stretch first: recorded, and counted as
    /// handled, before the claims.
    pub(crate) skipped: Vec<Skipped>,
    /// Whether some dues to run are late (a catch-up).
    pub(crate) catching_up: bool,
}

impl Plan {
    /// The latest due that does not run: the job's row counts every due up to it as handled.
    pub(crate) fn skip_through(&self) -> Option<Timestamp> {
        self.skipped.iter().map(|s| s.latest).max()
    }
}

/// The plan for the dues in `(last, now]`, at most `limit` of them (the most recent ones).
///
/// `on_time_from` is when this leader began watching the job with nothing in the way: dues
/// from it on came while it led and watched, and run, whatever the policy, even when their
/// claim failed at first (a lock wait, a pool timeout): the leader was alive, nothing was
/// missed. Dues before it were missed: they passed while nobody led, while another leader's
/// run was still going, or while this leader's own previous run overran them; `catch_up`
/// decides which of those run.
pub(crate) fn plan(
    spec: &Spec,
    last: Timestamp,
    now: Timestamp,
    on_time_from: Timestamp,
    catch_up: CatchUp,
    limit: usize,
) -> Plan {
    let (dues, more) = spec.dues_between(last, now, limit);
    // Dues are oldest first, so the on-time ones are a suffix.
    let first_on_time = dues.partition_point(|&due| due < on_time_from);
    let (late, on_time) = dues.split_at(first_on_time);
    let first_run = match catch_up {
        CatchUp::All => 0,
        CatchUp::Skip => first_on_time,
        // The latest missed one, unless a due came on time after it.
        CatchUp::Latest if on_time.is_empty() => late.len().saturating_sub(1),
        CatchUp::Latest => first_on_time,
    };
    let run = dues[first_run..].to_vec();
    // Dropped by the policy: the listed dues before the first to run (all of them missed).
    let mut dropped = Skipped {
        reason: SkipReason::CatchUp,
        latest: first_run.checked_sub(1).map_or(last, |i| dues[i]),
        dues: first_run as u64,
    };
    let limited = beyond_limit(
        spec,
        Window {
            last,
            on_time_from,
            first_run,
        },
        catch_up,
        more.then(|| dues.first().copied()).flatten(),
        &mut dropped,
    );
    let mut skipped: Vec<Skipped> = [dropped, limited]
        .into_iter()
        .filter(|s| s.dues > 0)
        .collect();
    skipped.sort_by_key(|s| s.latest);
    Plan {
        catching_up: run.iter().any(|&due| due < on_time_from),
        skipped,
        run,
    }
}

/// Where a pass's dues fall: after `last` (handled), on time from `on_time_from`, and the
/// first that runs at index `first_run` of the listed ones.
#[derive(Clone, Copy)]
struct Window {
    last: Timestamp,
    on_time_from: Timestamp,
    first_run: usize,
}

/// The dues past the limit: those older than the listed ones (the oldest listed being
/// `first`, `None` when nothing is past the limit). Those that came on time would have run,
/// and so would the missed ones under `All`; under `Skip` and `Latest` the missed ones are
/// dropped by the policy anyway, and added to `dropped`.
fn beyond_limit(
    spec: &Spec,
    window: Window,
    catch_up: CatchUp,
    first: Option<Timestamp>,
    dropped: &mut Skipped,
) -> Skipped {
    let Window {
        last,
        on_time_from,
        first_run,
    } = window;
    let mut limited = Skipped {
        reason: SkipReason::CatchUpLimit,
        latest: last,
        dues: 0,
    };
    let Some(first) = first else {
        return limited;
    };
    let Some(older_latest) = spec.previous(first, false).filter(|&d| d > last) else {
        return limited;
    };
    let older = spec.count_between(last, older_latest);
    let older_late = spec
        .previous(on_time_from.min(first), false)
        .filter(|&d| d > last)
        .map_or(0, |latest_late| spec.count_between(last, latest_late))
        .min(older);
    limited.latest = older_latest;
    limited.dues = older - older_late;
    match catch_up {
        CatchUp::All => limited.dues += older_late,
        _ if older_late > 0 => {
            dropped.dues += older_late;
            if first_run == 0 {
                // Only older dues are dropped: the latest of the missed ones.
                dropped.latest = spec
                    .previous(on_time_from.min(first), false)
                    .unwrap_or(older_latest);
            }
        }
        _ => {}
    }
    limited
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::schedule::Job;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Times of day on one date, `HH:MM:SS`.
    fn at(hms: &str) -> Timestamp {
        ts(&format!("2026-11-30T{hms}Z"))
    }

    fn every_minute() -> Spec {
        Job::every("j", Duration::from_secs(60)).spec
    }

    fn plan_of(last: &str, now: &str, on_time_from: &str, catch_up: CatchUp) -> Plan {
        plan(
            &every_minute(),
            at(last),
            at(now),
            at(on_time_from),
            catch_up,
            100,
        )
    }

    fn skipped(reason: SkipReason, latest: &str, dues: u64) -> Skipped {
        Skipped {
            reason,
            latest: at(latest),
            dues,
        }
    }

    #[test]
    fn a_due_that_came_while_the_leader_watched_runs_whatever_the_policy() {
        // The leader has watched since 10:00:30; the 10:01 due's claim failed (a row lock for
        // 3 s, say), so the next look, at 10:01:04, still counts it on time.
        for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
            let plan = plan_of("10:00:00", "10:01:04", "10:00:30", catch_up);
            assert_eq!(plan.run, [at("10:01:00")], "{catch_up:?}");
            assert_eq!(plan.skipped, [], "{catch_up:?}");
            assert!(!plan.catching_up, "{catch_up:?}");
        }
        // A claim that kept failing for a while: every due since stays on time, oldest first.
        let plan = plan_of("10:00:00", "10:03:10", "10:00:30", CatchUp::Skip);
        assert_eq!(plan.run, [at("10:01:00"), at("10:02:00"), at("10:03:00")]);
        assert_eq!(plan.skipped, []);
    }

    /// Dues missed before the leader watched follow the catch-up policy, and the dropped ones
    /// are counted.
    #[test]
    fn dues_missed_before_watching_follow_the_policy() {
        // Nobody led from 10:00 to 10:04:30; this leader watches from 10:04:30.
        let skip = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::Skip);
        assert_eq!(skip.run, []);
        assert_eq!(skip.skipped, [skipped(SkipReason::CatchUp, "10:04:00", 4)]);
        assert_eq!(skip.skip_through(), Some(at("10:04:00")));
        let latest = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::Latest);
        assert_eq!(latest.run, [at("10:04:00")]);
        assert_eq!(
            latest.skipped,
            [skipped(SkipReason::CatchUp, "10:03:00", 3)]
        );
        assert!(latest.catching_up);
        let all = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::All);
        assert_eq!(all.run.len(), 4);
        assert_eq!(all.skipped, []);
        assert_eq!(all.skip_through(), None);
        assert!(all.catching_up);
    }

    #[test]
    fn missed_and_on_time_dues_together() {
        // Missed 10:01 and 10:02 (before 10:02:30); 10:03 came on time.
        let skip = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::Skip);
        assert_eq!(skip.run, [at("10:03:00")]);
        assert_eq!(skip.skipped, [skipped(SkipReason::CatchUp, "10:02:00", 2)]);
        assert!(!skip.catching_up);
        let latest = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::Latest);
        assert_eq!(
            latest.run,
            [at("10:03:00")],
            "the on-time due is the latest; the missed ones are not run besides"
        );
        assert_eq!(
            latest.skipped,
            [skipped(SkipReason::CatchUp, "10:02:00", 2)]
        );
        let all = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::All);
        assert_eq!(all.run, [at("10:01:00"), at("10:02:00"), at("10:03:00")]);
        assert_eq!(all.skipped, []);
        assert!(all.catching_up);
    }

    #[test]
    fn nothing_due_nothing_to_do() {
        for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
            let plan = plan_of("10:01:00", "10:01:59", "10:00:00", catch_up);
            assert_eq!(
                plan,
                Plan {
                    run: vec![],
                    skipped: vec![],
                    catching_up: false
                }
            );
        }
    }

    fn limited(catch_up: CatchUp, on_time_from: &str, limit: usize) -> Plan {
        plan(
            &every_minute(),
            at("10:00:00"),
            at("11:00:00"),
            at(on_time_from),
            catch_up,
            limit,
        )
    }

    #[test]
    fn past_the_limit_the_older_dues_are_counted_as_limited() {
        // Sixty missed dues, the three most recent run: 57 past the limit.
        let all = limited(CatchUp::All, "11:00:00", 3);
        assert_eq!(all.run, [at("10:58:00"), at("10:59:00"), at("11:00:00")]);
        assert_eq!(
            all.skipped,
            [skipped(SkipReason::CatchUpLimit, "10:57:00", 57)]
        );
        assert_eq!(all.skip_through(), Some(at("10:57:00")));
        // Under Skip and Latest the older missed dues are the policy's to drop.
        let skip = limited(CatchUp::Skip, "11:00:00", 3);
        assert_eq!(skip.run, [at("11:00:00")], "11:00 came on time");
        assert_eq!(skip.skipped, [skipped(SkipReason::CatchUp, "10:59:00", 59)]);
        let latest = limited(CatchUp::Latest, "11:00:30", 3);
        assert_eq!(latest.run, [at("11:00:00")]);
        assert_eq!(
            latest.skipped,
            [skipped(SkipReason::CatchUp, "10:59:00", 59)]
        );
        let latest = limited(CatchUp::Latest, "11:00:30", 1);
        assert_eq!(latest.run, [at("11:00:00")]);
        assert_eq!(
            latest.skipped,
            [skipped(SkipReason::CatchUp, "10:59:00", 59)]
        );
    }

    #[test]
    fn on_time_dues_past_the_limit_are_limited_whatever_the_policy() {
        // Watching since 10:30: the 30 dues from 10:31 came on time (a claim failing for half
        // an hour, say), the 30 before were missed; a limit of 10 keeps 10:51 … 11:00.
        for catch_up in [CatchUp::Skip, CatchUp::Latest] {
            let plan = limited(catch_up, "10:30:30", 10);
            assert_eq!(plan.run.len(), 10, "{catch_up:?}");
            assert_eq!(plan.run[0], at("10:51:00"));
            assert_eq!(
                plan.skipped,
                [
                    skipped(SkipReason::CatchUp, "10:30:00", 30),
                    skipped(SkipReason::CatchUpLimit, "10:50:00", 20),
                ],
                "{catch_up:?}"
            );
            assert_eq!(plan.skip_through(), Some(at("10:50:00")));
        }
        let all = limited(CatchUp::All, "10:30:30", 10);
        assert_eq!(
            all.skipped,
            [skipped(SkipReason::CatchUpLimit, "10:50:00", 50)]
        );
    }

    #[test]
    fn the_skipped_and_the_run_add_up_to_every_due() {
        let spec = every_minute();
        for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
            for limit in [1, 3, 59, 60, 100] {
                for watch in ["10:00:00", "10:20:30", "10:59:30", "11:00:00"] {
                    let plan = limited(catch_up, watch, limit);
                    let skipped: u64 = plan.skipped.iter().map(|s| s.dues).sum();
                    assert_eq!(
                        plan.run.len() as u64 + skipped,
                        spec.count_between(at("10:00:00"), at("11:00:00")),
                        "{catch_up:?} {limit} {watch}: {plan:?}"
                    );
                    if let (Some(through), Some(first)) = (plan.skip_through(), plan.run.first()) {
                        assert!(through < *first, "{plan:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn reasons_are_named_as_the_table_and_the_metric_say_them() {
        let labels: Vec<&str> = SkipReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            labels,
            ["catch_up", "catch_up_limit", "abandoned", "halted"]
        );
        assert_eq!(SkipReason::Halted.to_string(), "halted");
    }
}
