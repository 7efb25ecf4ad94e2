//! The bounds of a schedule, all derived from its poll interval: how long a query, a borrow
//! and the end of a term's job tasks may take, and when a silent run is taken for dead.

use std::time::Duration;

use super::{MAX_POLL_INTERVAL, MIN_POLL_INTERVAL};

/// `every` as a poll interval: from [`MIN_POLL_INTERVAL`] to [`MAX_POLL_INTERVAL`].
pub(super) fn poll_within_bounds(every: Duration) -> Duration {
    every.clamp(MIN_POLL_INTERVAL, MAX_POLL_INTERVAL)
}

/// How long one query of the job tables may take, for a schedule polling every `poll`: two
/// polls, at least 2 s.
pub(super) fn query_bound(poll: Duration) -> Duration {
    poll.saturating_mul(2).max(Duration::from_secs(2))
}

/// How many of the heartbeat periods its runner promised (the poll interval of the replica
/// that claimed it, stored with the run) a run may stay silent before another term calls it
/// abandoned ...
pub(super) const STALE_BEATS: u32 = 3;

/// ... and at least how long. (A period is at most [`MAX_POLL_INTERVAL`], so the threshold is
/// at most three hours.)
pub(super) const STALE_FLOOR: Duration = Duration::from_secs(3);

/// How long a run whose runner beats every `poll` may stay silent before another term calls it
/// abandoned: [`STALE_BEATS`] periods, at least [`STALE_FLOOR`] (the rule of the SQL's `stale`).
pub(super) fn stale_after(poll: Duration) -> Duration {
    poll.saturating_mul(STALE_BEATS).max(STALE_FLOOR)
}

/// How long the job tasks of an ended term may go on before they are cut off, for a schedule
/// polling every `poll` on an elector whose graceful handover waits `drain` for work
/// ([`ElectorBuilder::drain_timeout`](crate::ElectorBuilder::drain_timeout)): the query bound, and at least the drain timeout.
pub(super) fn grace(poll: Duration, drain: Duration) -> Duration {
    query_bound(poll).max(drain)
}

/// How long a pool borrow may wait, for a schedule polling every `poll`: a poll, at least 1 s.
pub(super) fn borrow_bound(poll: Duration) -> Duration {
    poll.max(Duration::from_secs(1))
}
