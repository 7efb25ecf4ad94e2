//! The election loop behind [`Elector::run`](crate::Elector::run).

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior, interval, timeout};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::elector::{PgSettings, Shared};
use crate::lease::{Lease, deadline_after, now_ms};
use crate::lock_session::{Attempt, Check, LockSession, SessionError, WATCH_POLL, try_acquire};
use crate::term::TermEnd;

/// What the logs say when a transaction-mode pooler is detected (E16).
const POOLER: &str = "the connection goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction), which cannot carry a session advisory lock; connect directly or through a session-mode pooler";

const RECOVERY: &str = "the server is in recovery (a read replica): its advisory locks are local to it, so this replica stays standby; point the pool at the primary";

const SHARED_TRY: &str = "this try ran on a server session that another elector holds the lock on; this replica stays standby";

/// How long the unlock at shutdown may take (E6).
pub(crate) const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// The least time a standby's try query is given. A try that times out costs a backend: its
/// connection must be closed, since the lock may have been granted unseen. So a standby with
/// a very short interval does not give up on a merely slow answer; this is far above any
/// healthy round trip, and the try still waits at most I for a pool connection.
const MIN_TRY_BOUND: Duration = Duration::from_secs(1);

pub(crate) async fn run(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let _slot = shared.claim_run()?;
    let mut ticks = interval(pg.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut held = Held {
        shared,
        pg,
        session: None,
    };
    loop {
        let Some((session, sent_at, unbounded)) = standby(pg, &shutdown, &mut ticks).await else {
            return Ok(());
        };
        if unbounded {
            shared.warn_no_idle_session_timeout(pg.key);
        }
        // Guarded from here on: a drop or a panic closes the session (E7).
        let session = held.session.insert(session);
        let deadline = deadline_after(sent_at, lease_length(pg.interval));
        if now_ms() >= deadline {
            drop(held.session.take());
            tracing::warn!(key = %pg.key, "the grant answered after the lease it would start had expired; closing that session");
            continue;
        }
        shared.promote(|lease| lease.hold_until(deadline));
        tracing::info!(key = %pg.key, "leadership acquired");
        ticks.reset();
        match lead(shared, pg, &shutdown, &mut ticks, session).await {
            Led::Shutdown => {
                if let Some(session) = held.session.take() {
                    release(shared, pg, session).await;
                }
                return Ok(());
            }
            Led::Lost(cause) => {
                shared.demote(TermEnd::LeadershipLost);
                drop(held.session.take());
                tracing::warn!(key = %pg.key, %cause, "leadership lost: {cause}");
            }
        }
    }
}

/// Tries the lock every tick until it is granted (`Some`, with the try's send time and whether
/// the server lacks `idle_session_timeout`) or `shutdown` is cancelled (`None`).
async fn standby(
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
) -> Option<(Box<LockSession>, u64, bool)> {
    let mut repeats = Repeats::default();
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            _ = ticks.tick() => {}
        }
        let attempt = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            attempt = try_acquire(
                &pg.pool,
                pg.key,
                4 * pg.interval,
                pg.interval,
                pg.interval.max(MIN_TRY_BOUND),
            ) => attempt,
        };
        match attempt {
            Ok(Attempt::Granted {
                session,
                sent_at,
                unbounded,
            }) => return Some((session, sent_at, unbounded)),
            Ok(Attempt::Refused) => {
                repeats.clear();
                tracing::trace!(key = %pg.key, "lock held by another session")
            }
            Ok(Attempt::InRecovery) => {
                if repeats.loud("recovery") {
                    tracing::error!(key = %pg.key, "{RECOVERY}")
                } else {
                    tracing::debug!(key = %pg.key, "{RECOVERY}")
                }
            }
            Ok(Attempt::SharedSession) => {
                if repeats.loud("pooler") {
                    tracing::error!(key = %pg.key, "{POOLER}: {SHARED_TRY}")
                } else {
                    tracing::debug!(key = %pg.key, "{POOLER}: {SHARED_TRY}")
                }
            }
            Err(e) => {
                if repeats.loud("acquire") {
                    tracing::warn!(key = %pg.key, error = %e, "acquire lock connection: {e}")
                } else {
                    tracing::debug!(key = %pg.key, error = %e, "acquire lock connection: {e}")
                }
            }
        }
    }
}

/// How often a standby repeats the same complaint at its full level; in between, at DEBUG.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// Keeps a standby that fails the same way every I from flooding the log: a failure is logged
/// at its level when it is new (or differs from the last one) and once a minute while it lasts.
#[derive(Debug, Default)]
struct Repeats {
    last: Option<(&'static str, Instant)>,
}

impl Repeats {
    fn loud(&mut self, kind: &'static str) -> bool {
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

    fn clear(&mut self) {
        self.last = None;
    }
}

enum Led {
    Shutdown,
    Lost(String),
}

/// Checks the session every tick (E5) until leadership is lost or `shutdown` is cancelled.
async fn lead(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    session: &LockSession,
) -> Led {
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(cause.into()),
            _ = ticks.tick() => {}
        }
        if !shared.lease().is_live() {
            return Led::Lost(LEASE_EXPIRED.into());
        }
        let sent_at = now_ms();
        let check = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            check = session.check(pg.interval) => check,
        };
        match check {
            // A late answer does not revive a lease that has run out: the term has ended for
            // everyone who read `is_leader` meanwhile.
            Ok(Check::Holds) if !shared.lease().is_live() => {
                return Led::Lost(LEASE_EXPIRED.into());
            }
            Ok(Check::Holds) => shared
                .lease()
                .hold_until(deadline_after(sent_at, lease_length(pg.interval))),
            Ok(Check::Lost) => return Led::Lost("the session no longer holds the lock".into()),
            Ok(Check::SharedSession) => {
                tracing::error!(key = %pg.key, "{POOLER}: the leader check ran on a server session that is not the lock session, or that another elector's try reached");
                return Led::Lost(POOLER.into());
            }
            Err(SessionError::Timeout(bound)) => {
                return Led::Lost(format!("the leader check got no answer within {bound:?}"));
            }
            Err(e) => return Led::Lost(format!("the leader check failed: {e}")),
        }
    }
}

const LEASE_EXPIRED: &str =
    "the local lease expired: the process was paused or starved for longer than the lease";

/// Completes, with the cause, when the lock connection closes (F2) or the local lease expires
/// (E18) between two checks: within [`WATCH_POLL`] of either, so that a process resumed after
/// a freeze ends its term (and cancels its token) at once rather than at its next tick.
async fn watch(lease: &Lease, session: &LockSession) -> &'static str {
    loop {
        if session.is_closed() {
            return "the lock connection closed";
        }
        if !lease.is_live() {
            return LEASE_EXPIRED;
        }
        tokio::time::sleep(WATCH_POLL).await;
    }
}

/// Gives the lock up at shutdown (E6). The term ends first, so that no instant has two
/// leaders: a standby can only take the lock after the unlock.
async fn release(shared: &Shared, pg: &PgSettings, session: Box<LockSession>) {
    shared.demote(TermEnd::Shutdown);
    // `timeout` runs on its own timer, not on the (cancelled) shutdown token.
    match timeout(RELEASE_BOUND, session.unlock(RELEASE_BOUND)).await {
        Ok(Ok(true)) => tracing::info!(key = %pg.key, "leadership released"),
        Ok(Ok(false)) => {
            tracing::warn!(key = %pg.key, "unlock at shutdown found the lock not held")
        }
        Ok(Err(e)) => {
            tracing::warn!(key = %pg.key, error = %e, "unlock at shutdown failed; closing the session frees the lock")
        }
        Err(_) => {
            tracing::warn!(key = %pg.key, "unlock at shutdown timed out; closing the session frees the lock")
        }
    }
    drop(session);
}

/// The local lease (E18): the server cannot free the lock within 4·I of the last check's
/// send time; one I of that is kept as a margin.
fn lease_length(interval: Duration) -> Duration {
    3 * interval
}

/// The session of a running election. If `run` is dropped or unwinds while leading, the
/// session is closed without an unlock, since it may be mid-query (E7).
struct Held<'a> {
    shared: &'a Shared,
    pg: &'a PgSettings,
    session: Option<Box<LockSession>>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared.demote(TermEnd::LeadershipLost);
            drop(session);
            tracing::warn!(key = %self.pg.key, "lock abandoned: run was dropped or panicked while leading; closing its session frees the lock");
        }
    }
}

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
