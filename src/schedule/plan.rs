//! What the leader does with one job's dues at one look at its row: which to run, and which to
//! count as handled without running them. A pure function of the instants, so that the rule
//! is tested on fixed ones.

use jiff::Timestamp;

use super::job::{CatchUp, Spec};

/// The dues of one job at one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The dues to claim and run, oldest first.
    pub(crate) run: Vec<Timestamp>,
    /// The latest due that the job's catch-up policy drops, to be counted as handled before
    /// the claims (the claim of a later due would count it too).
    pub(crate) skip_through: Option<Timestamp>,
    /// Whether some dues to run are late (a catch-up).
    pub(crate) catching_up: bool,
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
    let (dues, _more) = spec.dues_between(last, now, limit);
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
    Plan {
        catching_up: run.iter().any(|&due| due < on_time_from),
        skip_through: first_run.checked_sub(1).map(|i| dues[i]),
        run,
    }
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

    #[test]
    fn a_due_that_came_while_the_leader_watched_runs_whatever_the_policy() {
        // The leader has watched since 10:00:30; the 10:01 due's claim failed (a row lock for
        // 3 s, say), so the next look, at 10:01:04, still counts it on time.
        for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
            let plan = plan_of("10:00:00", "10:01:04", "10:00:30", catch_up);
            assert_eq!(plan.run, [at("10:01:00")], "{catch_up:?}");
            assert_eq!(plan.skip_through, None, "{catch_up:?}");
            assert!(!plan.catching_up, "{catch_up:?}");
        }
        // A claim that kept failing for a while: every due since stays on time, oldest first.
        let plan = plan_of("10:00:00", "10:03:10", "10:00:30", CatchUp::Skip);
        assert_eq!(plan.run, [at("10:01:00"), at("10:02:00"), at("10:03:00")]);
    }

    #[test]
    fn dues_missed_before_the_leader_watched_follow_the_policy() {
        // Nobody led from 10:00 to 10:04:30; this leader watches from 10:04:30.
        let skip = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::Skip);
        assert_eq!(skip.run, []);
        assert_eq!(skip.skip_through, Some(at("10:04:00")));
        let latest = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::Latest);
        assert_eq!(latest.run, [at("10:04:00")]);
        assert_eq!(latest.skip_through, Some(at("10:03:00")));
        assert!(latest.catching_up);
        let all = plan_of("10:00:00", "10:04:30", "10:04:30", CatchUp::All);
        assert_eq!(all.run.len(), 4);
        assert_eq!(all.skip_through, None);
        assert!(all.catching_up);
    }

    #[test]
    fn missed_and_on_time_dues_together() {
        // Missed 10:01 and 10:02 (before 10:02:30); 10:03 came on time.
        let skip = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::Skip);
        assert_eq!(skip.run, [at("10:03:00")]);
        assert_eq!(skip.skip_through, Some(at("10:02:00")));
        assert!(!skip.catching_up);
        let latest = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::Latest);
        assert_eq!(
            latest.run,
            [at("10:03:00")],
            "the on-time due is the latest; the missed ones are not run besides"
        );
        assert_eq!(latest.skip_through, Some(at("10:02:00")));
        let all = plan_of("10:00:00", "10:03:05", "10:02:30", CatchUp::All);
        assert_eq!(all.run, [at("10:01:00"), at("10:02:00"), at("10:03:00")]);
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
                    skip_through: None,
                    catching_up: false
                }
            );
        }
    }

    #[test]
    fn the_limit_keeps_the_most_recent_dues() {
        let plan = plan(
            &every_minute(),
            at("10:00:00"),
            at("11:00:00"),
            at("11:00:00"),
            CatchUp::All,
            3,
        );
        assert_eq!(plan.run, [at("10:58:00"), at("10:59:00"), at("11:00:00")]);
    }
}
