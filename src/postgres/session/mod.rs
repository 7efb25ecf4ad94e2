//! The database side of the election: the try on a borrowed connection ([`tries`]), and the
//! session that holds the lock once it is granted ([`lock_session`]), with their statements
//! ([`sql`]), the bounds a granted session gets ([`bounds`]) and what each found ([`answer`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod answer;
mod bounds;
mod lock_session;
mod sql;
mod tries;

pub(crate) use super::prepared::Prepared;
pub(crate) use super::session_error::SessionError;
pub(crate) use super::session_error::bounded;
pub(crate) use answer::{Answer, Attempt, Check};
pub(crate) use bounds::{AppliedBounds, SessionBounds};
pub(crate) use lock_session::LockSession;
pub(crate) use sql::ours_alone;
pub(crate) use tries::{Tried, TryFor, answer_of, try_acquire};

/// How often the leader looks at its connection and its lease between checks, in both modes: a
/// closed socket, or a lease that expired while the process was frozen, is noticed within this
/// time rather than at the next check. A grant that was not handed over gracefully waits
/// `standby::SETTLE`, five times this, before its term starts, so that an old leader whose
/// session was ended under it has stepped down first, whichever mode either of them runs in.
pub(crate) const WATCH_POLL: Duration = Duration::from_millis(1);

/// The least time a standby's try query is given. A try that times out costs a backend: its
/// connection must be closed, since the lock may have been granted unseen. So a standby with
/// a very short interval does not give up on a merely slow answer; this is far above any
/// healthy round trip, and the try still waits at most I for a pool connection.
pub(crate) const MIN_TRY_BOUND: Duration = Duration::from_secs(1);

/// Which lock of the key a try asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// The key's exclusive lock: one holder, the leader.
    Exclusive,
    /// The key's shared lock: every member of a group of shards holds it at once.
    Shared,
}

/// A mark unique to one grant: process, time, and a counter.
pub(crate) fn session_mark() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{nanos:x}-{n}", std::process::id())
}
