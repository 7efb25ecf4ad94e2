//! Keeps a standby that fails the same way every I from flooding the log.

use std::time::Duration;

use tokio::time::Instant;

/// How often a standby repeats the same complaint at its full level; in between, at DEBUG.
pub(super) const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// A failure is logged at its level when it is new (or differs from the last one) and once a
/// minute while it lasts; in between at DEBUG (see [`loud_or_debug`]).
#[derive(Debug, Default)]
pub(super) struct Repeats {
    last: Option<(&'static str, Instant)>,
}

impl Repeats {
    /// Whether a failure of `kind` now is logged at its own level.
    pub(super) fn loud(&mut self, kind: &'static str) -> bool {
        let now = Instant::now();
        let loud = match self.last {
            Some((last, at)) => last != kind || now.duration_since(at) >= REPEAT_EVERY,
            None => true,
        };
        if loud {
            self.last = Some((kind, now));
        }
        loud
    }

    /// Forgets the last failure: the next one is new.
    pub(super) fn clear(&mut self) {
        self.last = None;
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
pub(super) use loud_or_debug;

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
}
