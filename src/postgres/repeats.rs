//! Keeps a standby or a shard member that fails the same way every I from flooding the log.

use std::time::Duration;

use tokio::time::Instant;

/// How often a standby or a shard member repeats the same complaint at its full level; in
/// between, at DEBUG.
pub(crate) const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// A failure is logged at its level the first time and then once a minute while it lasts, in
/// between at DEBUG (see [`loud_or_debug`]); each kind on its own clock, so that two failures
/// that come in turn are not both loud every time.
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    /// When each kind was last logged at its level (a handful of kinds at most).
    loud_at: Vec<(&'static str, Instant)>,
}

impl Repeats {
    /// Whether a failure of `kind` now is logged at its own level.
    pub(crate) fn loud(&mut self, kind: &'static str) -> bool {
        let now = Instant::now();
        match self.loud_at.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, at)) if now.duration_since(*at) < REPEAT_EVERY => false,
            Some((_, at)) => {
                *at = now;
                true
            }
            None => {
                self.loud_at.push((kind, now));
                true
            }
        }
    }

    /// Forgets every failure: the next one is new.
    pub(crate) fn clear(&mut self) {
        self.loud_at.clear();
    }
}

/// One log event at `$level` when `$loud` holds, else the same event at DEBUG.
macro_rules! loud_or_debug {
    ($loud:expr, $level:ident, $($event:tt)+) => {
        if $loud {
            tracing::$level!($($event)+)
        } else {
            tracing::debug!($($event)+)
        }
    };
}
pub(crate) use loud_or_debug;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_repeated_failure_is_loud_once_a_minute_and_a_new_one_at_once() {
        let mut repeats = Repeats::default();
        assert!(repeats.loud("recovery"));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!repeats.loud("recovery"));
        assert!(repeats.loud("acquire"), "a different failure");
        assert!(!repeats.loud("acquire"));
        tokio::time::advance(REPEAT_EVERY).await;
        assert!(repeats.loud("acquire"), "a minute later");
        repeats.clear();
        assert!(
            repeats.loud("acquire"),
            "after a refused try, the same failure is new"
        );
    }

    /// A full lock table and a failed bump in turn are each loud once a minute, not
    /// every round because the other came in between.
    #[tokio::test(start_paused = true)]
    async fn alternating_failures_are_each_loud_once_a_minute() {
        let mut repeats = Repeats::default();
        assert!(repeats.loud("lock table"));
        assert!(repeats.loud("bump"));
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(5)).await;
            assert!(!repeats.loud("lock table"));
            assert!(!repeats.loud("bump"));
        }
        tokio::time::advance(REPEAT_EVERY).await;
        assert!(repeats.loud("lock table"), "a minute later");
        assert!(repeats.loud("bump"), "a minute later");
    }
}
