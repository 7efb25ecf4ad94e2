//! The election loop behind [`Elector::run`](crate::Elector::run).

use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior, interval, timeout};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::elector::Shared;
use crate::lease::{deadline_after, now_ms};
use crate::lock_session::{Attempt, LockSession, SessionError, try_acquire};
use crate::term::TermEnd;

/// How long the unlock at shutdown may take (E6).
pub(crate) const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// The least time a standby's try query is given. A try that times out costs a backend: its
/// connection must be closed, since the lock may have been granted unseen. So a standby with
/// a very short interval does not give up on a merely slow answer; this is far above any
/// healthy round trip, and the try still waits at most I for a pool connection.
const MIN_TRY_BOUND: Duration = Duration::from_secs(1);

pub(crate) async fn run(shared: &Shared, shutdown: CancellationToken) -> Result<(), Error> {
    let _slot = shared.claim_run()?;
    let mut ticks = interval(shared.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut held = Held {
        shared,
        session: None,
    };
    loop {
        let Some(session) = standby(shared, &shutdown, &mut ticks).await else {
            return Ok(());
        };
        let session = held.session.insert(session);
        ticks.reset();
        match lead(shared, &shutdown, &mut ticks, session).await {
            Led::Shutdown => {
                if let Some(session) = held.session.take() {
                    release(shared, session).await;
                }
                return Ok(());
            }
            Led::Lost(cause) => {
                shared.demote(TermEnd::LeadershipLost);
                drop(held.session.take());
                tracing::warn!(key = %shared.key, %cause, "leadership lost: {cause}");
            }
        }
    }
}

/// Tries the lock every tick until it is granted (`Some`) or `shutdown` is cancelled (`None`).
async fn standby(
    shared: &Shared,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
) -> Option<LockSession> {
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
                &shared.pool,
                shared.key,
                shared.interval,
                shared.interval.max(MIN_TRY_BOUND),
            ) => attempt,
        };
        match attempt {
            Ok(Attempt::Granted { session, sent_at }) => {
                let set_up = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return None,
                    set_up = session.set_up(4 * shared.interval, shared.interval) => set_up,
                };
                match set_up {
                    Ok(setup) => {
                        if setup.no_idle_session_timeout {
                            shared.warn_no_idle_session_timeout();
                        }
                        shared
                            .lease()
                            .hold_until(deadline_after(sent_at, lease_length(shared.interval)));
                        shared.promote();
                        tracing::info!(key = %shared.key, "leadership acquired");
                        return Some(session);
                    }
                    // Dropping the session closes it, which frees the lock.
                    Err(e) => {
                        tracing::warn!(key = %shared.key, error = %e, "acquire lock connection: {e}")
                    }
                }
            }
            Ok(Attempt::Refused) => {
                tracing::trace!(key = %shared.key, "lock held by another session")
            }
            Ok(Attempt::InRecovery) => tracing::error!(
                key = %shared.key,
                "the server is in recovery (a read replica): its advisory locks are local to it, so this replica stays standby; point the pool at the primary"
            ),
            Err(e) => tracing::warn!(key = %shared.key, error = %e, "acquire lock connection: {e}"),
        }
    }
}

enum Led {
    Shutdown,
    Lost(String),
}

/// Checks the session every tick (E5) until leadership is lost or `shutdown` is cancelled.
async fn lead(
    shared: &Shared,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    session: &LockSession,
) -> Led {
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            () = session.closed() => return Led::Lost("the lock connection closed".into()),
            _ = ticks.tick() => {}
        }
        if !shared.lease().is_live() {
            return Led::Lost(
                "the local lease expired: the process was paused or starved for longer than the lease".into(),
            );
        }
        let sent_at = now_ms();
        let check = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            check = session.holds_lock(shared.interval) => check,
        };
        match check {
            Ok(true) => shared
                .lease()
                .hold_until(deadline_after(sent_at, lease_length(shared.interval))),
            Ok(false) => return Led::Lost("the session no longer holds the lock".into()),
            Err(SessionError::Timeout(bound)) => {
                return Led::Lost(format!("the leader check got no answer within {bound:?}"));
            }
            Err(e) => return Led::Lost(format!("the leader check failed: {e}")),
        }
    }
}

/// Gives the lock up at shutdown (E6). The term ends first, so that no instant has two
/// leaders: a standby can only take the lock after the unlock.
async fn release(shared: &Shared, session: LockSession) {
    shared.demote(TermEnd::Shutdown);
    // `timeout` runs on its own timer, not on the (cancelled) shutdown token.
    match timeout(RELEASE_BOUND, session.unlock(RELEASE_BOUND)).await {
        Ok(Ok(true)) => tracing::info!(key = %shared.key, "leadership released"),
        Ok(Ok(false)) => {
            tracing::warn!(key = %shared.key, "unlock at shutdown found the lock not held")
        }
        Ok(Err(e)) => {
            tracing::warn!(key = %shared.key, error = %e, "unlock at shutdown failed; closing the session frees the lock")
        }
        Err(_) => {
            tracing::warn!(key = %shared.key, "unlock at shutdown timed out; closing the session frees the lock")
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
    session: Option<LockSession>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared.demote(TermEnd::LeadershipLost);
            drop(session);
            tracing::warn!(key = %self.shared.key, "lock abandoned: run was dropped or panicked while leading; closing its session frees the lock");
        }
    }
}
