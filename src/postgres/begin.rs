//! What stands between a grant and the term: a cooldown, a late grant's check, the epoch
//! bump with fencing, the settle wait, and the lease the term starts with.

use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::candidates::{self, Claim, Standing};
use super::loss::Loss;
use super::repeats::{Repeats, loud_or_debug};
use super::session::{AppliedBounds, Check, LockSession, MIN_TRY_BOUND, bounded};
use super::settings::PgSettings;
use super::standby::Grant;
use super::{Held, lease_length, millis};
use crate::lease::{deadline_after, now_ms};
use crate::state::Shared;

/// What became of a grant.
pub(super) enum Start {
    /// The term began.
    Leading(Begun),
    /// No term: the lock was given back, or its session closed; the standby goes on.
    GaveUp,
    /// Shutdown came before the term began; the lock was given back.
    Stopped,
    /// The lock was given back for a live standby that should have it (a more preferred one,
    /// or the target of a handover asked); this standby tries again at its next tick.
    Deferred,
}

/// A term that began.
pub(super) struct Begun {
    /// Its epoch, with fencing.
    pub(super) epoch: Option<u64>,
    /// Its standing among the candidates of preferred leaders.
    pub(super) standing: Standing,
}

/// Starts a term on `grant`, whose session `held` guards from here on (a drop or a panic
/// closes it without an unlock), unless something stands in the way.
pub(super) async fn start_term(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    grant: Grant,
    held: &mut Held<'_>,
    repeats: &mut Repeats,
) -> Start {
    if grant.unbounded {
        shared.warn_no_idle_session_timeout(pg.key);
    }
    held.session = Some(grant.session);
    held.settle_until = grant.settle_until;
    // A resign asked while the try was on the wire: its cooldown holds, and no epoch is
    // bumped for a term that will not start.
    if shared.cooling_down() {
        return give_back(held, Start::GaveUp).await;
    }
    let Some(session) = held.session.as_deref() else {
        return Start::GaveUp;
    };
    log_bounds(pg, &grant.applied, grant.from_wait, grant.handed_over);
    let claimed = tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        claimed = claim(pg, session) => Some(claimed),
    };
    let standing = match claimed {
        Some(Claim::Keep(standing)) => standing,
        other => return leave(held, other.is_some()).await,
    };
    let prepared = tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        prepared = prepare(pg, session, grant.sent_at, repeats) => Some(prepared),
    };
    let (held_since, epoch) = match prepared {
        Some(Ok(ready)) => ready,
        Some(Err(())) => return give_back(held, Start::GaveUp).await,
        None => return give_back(held, Start::Stopped).await,
    };
    // A resign asked while the try was on the wire: its cooldown holds.
    if shared.cooling_down() {
        return give_back(held, Start::GaveUp).await;
    }
    if let Some(until) = grant.settle_until {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return give_back(held, Start::Stopped).await,
            () = tokio::time::sleep_until(until) => {}
        }
    }
    let Some(deadline) = lease_left(held, pg, held_since) else {
        return Start::GaveUp;
    };
    shared.promote(|lease| lease.hold_until(deadline), epoch, pg.fence_target());
    Start::Leading(Begun { epoch, standing })
}

/// The deadline of the lease a term would start with, counted from `held_since` (when the
/// lock was last known held); `None` when it has passed already, the session then closed.
fn lease_left(held: &mut Held<'_>, pg: &PgSettings, held_since: u64) -> Option<u64> {
    let deadline = deadline_after(held_since, lease_length(pg.interval));
    if now_ms() < deadline {
        return Some(deadline);
    }
    held.close();
    tracing::warn!(key = %pg.key, "the grant was confirmed after the lease it would start had expired; its session is closed");
    None
}

/// Gives the grant back gracefully before its term began: `start`, as the term will not.
async fn give_back(held: &mut Held<'_>, start: Start) -> Start {
    held.give_back().await;
    start
}

/// Gives back a grant before its term began: for a live standby that should have it
/// (`deferred`), or at shutdown.
async fn leave(held: &mut Held<'_>, deferred: bool) -> Start {
    held.give_back().await;
    match deferred {
        true => Start::Deferred,
        false => Start::Stopped,
    }
}

/// Whether this replica leaves the lock it was just granted to a live standby that should have
/// it instead (see [`candidates`](super::candidates)). A failure to ask keeps the grant: the
/// check that follows proves the session, and a leader that should not lead hands over at its
/// next check.
async fn claim(pg: &PgSettings, session: &LockSession) -> Claim {
    let asked = bounded(
        pg.interval.max(MIN_TRY_BOUND),
        candidates::claim(
            session.client(),
            &pg.candidates,
            pg.key,
            &pg.identity,
            pg.own_preference(),
            pg.interval,
        ),
    )
    .await;
    match asked {
        Ok(Claim::Defer) => {
            tracing::debug!(key = %pg.key, "a live standby should have the lock (more preferred, or a handover asked to it); given back");
            Claim::Defer
        }
        Ok(keep) => keep,
        Err(e) => {
            tracing::warn!(key = %pg.key, error = %e, "cannot ask the candidates table after a grant; keeping the lock");
            Claim::Keep(Standing::default())
        }
    }
}

/// The server's bounds on the granted session, at DEBUG.
fn log_bounds(pg: &PgSettings, applied: &AppliedBounds, waited: bool, handed_over: bool) {
    tracing::debug!(
        key = %pg.key,
        idle_session_timeout = applied.idle_session_timeout.as_deref().unwrap_or("(none)"),
        tcp_user_timeout = applied.tcp_user_timeout.as_deref().unwrap_or("(none)"),
        tcp_keepalives_idle = applied.keepalives_idle.as_deref().unwrap_or("(none)"),
        tcp_keepalives_interval = applied.keepalives_interval.as_deref().unwrap_or("(none)"),
        tcp_keepalives_count = applied.keepalives_count.as_deref().unwrap_or("(none)"),
        waited,
        handed_over,
        "lock granted; the server's bounds on the lock session"
    );
}

/// A grant that took longer than one interval to answer is checked once more (it would start
/// a lease that runs out before, or soon after, the first check), and with fencing the epoch
/// is bumped. Returns when the lock was last seen held (for the lease) and the epoch, or
/// `Err` when the lock should be given back.
async fn prepare(
    pg: &PgSettings,
    session: &LockSession,
    granted_at: u64,
    repeats: &mut Repeats,
) -> Result<(u64, Option<u64>), ()> {
    let mut held_since = granted_at;
    if now_ms().saturating_sub(granted_at) > millis(pg.interval) {
        let sent_at = now_ms();
        match session.check(pg.interval).await {
            Ok(Check::Holds) => held_since = sent_at,
            other => {
                tracing::warn!(
                    key = %pg.key,
                    cause = %Loss::from_check(other),
                    "a late grant failed its first check; the lock is given back"
                );
                return Err(());
            }
        }
    }
    let Some(table) = &pg.fencing else {
        return Ok((held_since, None));
    };
    let sent_at = now_ms();
    // The server gives up the row lock after I (lock_timeout); one more I covers the round trip.
    let bumped = timeout(
        2 * pg.interval,
        table.bump(session.client(), pg.key, &pg.identity, pg.interval),
    )
    .await;
    match bumped {
        Ok(Ok(epoch)) => Ok((sent_at.max(held_since), Some(epoch))),
        Ok(Err(e)) => {
            // Each on its own clock: a missing table that a WARN about a busy row came just
            // before is still said at ERROR.
            if e.needs_an_operator() {
                loud_or_debug!(repeats.loud("bump: no table"), error, key = %pg.key, table = table.name(), error = %e, "cannot bump the fencing epoch; the lock is given back");
            } else {
                loud_or_debug!(repeats.loud("bump"), warn, key = %pg.key, table = table.name(), error = %e, "cannot bump the fencing epoch; the lock is given back");
            }
            Err(())
        }
        Err(_) => {
            tracing::warn!(key = %pg.key, table = table.name(), bound = ?2 * pg.interval, "the fencing epoch bump got no answer in time; the lock is given back");
            Err(())
        }
    }
}
