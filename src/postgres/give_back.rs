//! Giving the lock back: the graceful handover at a term's end (drain, then unlock), and the
//! bounded unlock itself.

use std::future::Future;

use tokio::time::{Instant, timeout};

use super::candidates;
use super::handover;
use super::loss::Loss;
use super::session::{Check, LockSession};
use super::settings::{PgSettings, RELEASE_BOUND};
use crate::in_flight::InFlight;
use crate::lease::instant_after;
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::TermEnd;

/// Gives the lock up gracefully (shutdown or resign). The term ends first, so that no
/// instant has two leaders; then the work still running here drains, up to the drain
/// timeout, while the session keeps being checked; only then the unlock.
/// `own_row`: this replica's candidates row may still be there (the term had no look yet).
pub(super) async fn hand_over(
    shared: &Shared,
    pg: &PgSettings,
    session: Box<LockSession>,
    (end, change): (TermEnd, Change),
    own_row: bool,
) {
    let grace = shared.demote_to_drain(end, change);
    let held = drain(shared, pg, &session).await;
    // The term's fenced writes end here, before the unlock lets another term begin.
    drop(grace);
    if held {
        unlock(pg, session, true, own_row).await;
    }
}

/// Waits for the work still running on this replica, at most the drain timeout; `false` when
/// the lock was lost meanwhile (there is nothing left to unlock).
async fn drain(shared: &Shared, pg: &PgSettings, session: &LockSession) -> bool {
    drain_checked(pg, &[shared.in_flight()], || async {
        match session.check(pg.interval).await {
            Ok(Check::Holds) => Ok(()),
            other => Err(Loss::from_check(other)),
        }
    })
    .await
}

/// Waits for `work` (what still runs of the terms that ended), at most the drain timeout,
/// while `check` proves the lock session every interval, so that the server's bound on a
/// silent session never ends it under running work, and a lost lock is seen; `false` when the
/// lock was lost meanwhile (there is nothing left to unlock). A single elector's drain and a
/// shard member's at its leave.
pub(crate) async fn drain_checked<F, Fut>(pg: &PgSettings, work: &[&InFlight], mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Loss>>,
{
    // A drain timeout too long for the clock waits for the work, however long.
    let deadline = instant_after(Instant::now(), pg.drain_timeout);
    let running = || -> Vec<String> { work.iter().flat_map(|w| w.names()).collect() };
    loop {
        let names = running();
        if names.is_empty() {
            return true;
        }
        tracing::debug!(key = %pg.key, running = ?names, "draining before the lock is given up");
        tokio::select! {
            biased;
            () = all_drained(work) => return true,
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    key = %pg.key,
                    running = ?running(),
                    drain_timeout = ?pg.drain_timeout,
                    "work still running at the drain timeout; the lock is given up anyway"
                );
                return true;
            }
            () = tokio::time::sleep(pg.interval) => {
                if let Err(loss) = check().await {
                    tracing::warn!(key = %pg.key, cause = %loss, "the lock was lost while draining");
                    return false;
                }
            }
        }
    }
}

async fn all_drained(work: &[&InFlight]) {
    for w in work {
        w.drained().await;
    }
}

/// Unlocks, bounded, and closes the session; `led` says whether a term was held on it. A
/// replica with a preference whose row may still say it is a live standby (`own_row`: no look
/// of a term dropped it yet) first drops it, within a quarter of the bound (see
/// [`candidates::drop_own_row`]); the drop and the unlock together take at most the bound.
pub(super) async fn unlock(pg: &PgSettings, session: Box<LockSession>, led: bool, own_row: bool) {
    let deadline = tokio::time::Instant::now() + RELEASE_BOUND;
    if own_row && pg.preference.is_some() {
        let dropping =
            candidates::drop_own_row(session.client(), &pg.candidates, pg.key, &pg.identity);
        if timeout(RELEASE_BOUND / 4, dropping).await.is_err() {
            tracing::debug!(key = %pg.key, "dropping this replica's row before it unlocks got no answer in time; it counts for two more intervals at most");
        }
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    // `timeout` runs on its own timer, not on the (cancelled) shutdown token.
    match timeout(left, session.unlock(left)).await {
        Ok(Ok(unlocked)) if unlocked.held => {
            if led {
                tracing::info!(key = %pg.key, "leadership released");
            } else {
                tracing::debug!(key = %pg.key, "the lock was given back before a term began");
            }
            // The session the lock went to looks for its marker right after its grant: this
            // session, which holds it, stays open a moment. In place, not in a task: a process
            // that exits after `run` returns would otherwise close it at once.
            if unlocked.named {
                tokio::time::sleep(handover::LINGER).await;
            }
        }
        Ok(Ok(_)) => {
            tracing::warn!(key = %pg.key, "the unlock found the lock not held")
        }
        Ok(Err(e)) => {
            tracing::warn!(key = %pg.key, error = %e, "the unlock failed; closing the session frees the lock")
        }
        Err(_) => {
            tracing::warn!(key = %pg.key, "the unlock timed out; closing the session frees the lock")
        }
    }
    drop(session);
}
