//! How a worker that failed is restarted: the policy, and each worker's restarts within its
//! window. Plain state, no I/O.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How a [`Supervisor`](super::Supervisor) restarts a worker that failed.
///
/// After a failure (an `Err` or a panic), the worker waits `initial · 2^r`, capped at `max`,
/// where `r` is the number of its restarts within the last `window`, and then starts again,
/// unless it already had `budget` restarts within the `window`: then it stops for good,
/// and the supervisor's probe reports it. A worker that fails rarely thus restarts after
/// `initial`, and one that fails in a loop backs off and, past its budget, stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct RestartPolicy {
    pub(super) initial: Duration,
    pub(super) max: Duration,
    pub(super) budget: u32,
    pub(super) window: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            budget: 5,
            window: Duration::from_secs(600),
        }
    }
}

impl RestartPolicy {
    /// The default policy: backoff from 1 s up to 60 s, at most 5 restarts within 10 min.
    pub fn new() -> Self {
        Self::default()
    }

    /// The first backoff (default 1 s) and its cap (default 60 s). A cap below `initial` is
    /// raised to `initial`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial = initial;
        self.max = max.max(initial);
        self
    }

    /// At most `restarts` restarts within `window` (default 5 within 10 minutes). A budget of
    /// zero never restarts.
    pub fn budget(mut self, restarts: u32, window: Duration) -> Self {
        self.budget = restarts;
        self.window = window;
        self
    }

    /// The wait before a restart, given the restarts already counted in the window.
    pub fn backoff_after(&self, restarts_in_window: u32) -> Duration {
        let factor = 2u32.saturating_pow(restarts_in_window);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// The restarts of one worker within the policy's window.
#[derive(Debug, Default)]
pub(super) struct Restarts {
    at: VecDeque<Instant>,
}

impl Restarts {
    /// After a failure at `now`: the wait before the restart, or `None` past the budget.
    pub(super) fn next(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        while self
            .at
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) >= policy.window)
        {
            self.at.pop_front();
        }
        let counted = u32::try_from(self.at.len()).unwrap_or(u32::MAX);
        if counted >= policy.budget {
            return None;
        }
        self.at.push_back(now);
        Some(policy.backoff_after(counted))
    }
}
