//! `--restart`: whether a command that ended while leading runs again, and after what pause.

use std::time::Duration;

/// When a command that ended while leading runs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Restart {
    /// Never: the lead is given up and `run` exits with the command's status.
    Never,
    /// When it failed (a status other than 0); a success ends `run` as `never` does.
    OnFailure,
    /// Always, whatever its status.
    Always,
}

/// The first pause before a restart.
const FIRST: Duration = Duration::from_secs(1);
/// The longest pause.
const LONGEST: Duration = Duration::from_secs(60);

/// The pause before the next restart: doubled after each run shorter than the pause it came
/// after, back to the first after a longer one.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Backoff {
    /// The pause before running the command again, after a run of `lasted` that ended with
    /// `status`; `None`: it is not run again.
    pub(crate) fn after(
        &mut self,
        policy: Restart,
        status: i32,
        lasted: Duration,
    ) -> Option<Duration> {
        let again = match policy {
            Restart::Never => false,
            Restart::OnFailure => status != 0,
            Restart::Always => true,
        };
        if !again {
            return None;
        }
        if lasted > self.next.saturating_mul(2) {
            self.next = FIRST;
        }
        let pause = self.next;
        self.next = (self.next * 2).min(LONGEST);
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(10);

    #[test]
    fn never_runs_again_and_on_failure_only_after_a_failure() {
        let mut backoff = Backoff::default();
        assert_eq!(backoff.after(Restart::Never, 1, SHORT), None);
        assert_eq!(backoff.after(Restart::OnFailure, 0, SHORT), None);
        assert_eq!(backoff.after(Restart::OnFailure, 1, SHORT), Some(FIRST));
        assert_eq!(backoff.after(Restart::Always, 0, SHORT), Some(2 * FIRST));
    }

    #[test]
    fn the_pause_doubles_up_to_a_minute_and_comes_back_after_a_long_run() {
        let mut backoff = Backoff::default();
        let pauses: Vec<_> = (0..8)
            .map(|_| backoff.after(Restart::Always, 1, SHORT).unwrap().as_secs())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60]);
        let long = Duration::from_secs(600);
        assert_eq!(backoff.after(Restart::Always, 1, long), Some(FIRST));
    }
}
