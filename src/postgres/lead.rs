//! The leader: checks its session every tick, watches its connection and its lease all
//! along, and ends the term when one of them, a shutdown or a resign says so.

use tokio::sync::watch;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::give_back::hand_over;
use super::loss::{Loss, proven};
use super::session::{LockSession, WATCH_POLL};
use super::settings::PgSettings;
use super::{Held, lease_length};
use crate::lease::{Lease, deadline_after, now_ms};
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};

/// How a term ended.
enum Led {
    Shutdown,
    Resign,
    Lost(Loss),
}

/// Leads the term just begun on `held`'s session until it ends; a graceful end (shutdown or
/// resign) hands the lock over. Returns that end, or `None` when leadership was lost.
pub(super) async fn lead_term(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    resigns: &mut watch::Receiver<u64>,
    held: &mut Held<'_>,
    epoch: Option<u64>,
) -> Option<TermEnd> {
    let Some(session) = held.session.as_deref() else {
        // Unreachable: the term began on this session.
        shared.demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
        return None;
    };
    tracing::info!(key = %pg.key, epoch, "leadership acquired");
    ticks.reset();
    let (end, change) = match lead(shared, pg, shutdown, ticks, session, resigns).await {
        Led::Lost(loss) => {
            shared.demote(TermEnd::LeadershipLost, Change::Lost(loss.cause));
            held.close();
            tracing::warn!(key = %pg.key, cause = %loss, "leadership lost");
            return None;
        }
        Led::Shutdown => (TermEnd::Shutdown, Change::Released),
        Led::Resign => (TermEnd::Resigned, Change::Resigned),
    };
    if let Some(session) = held.session.take() {
        hand_over(shared, pg, session, end, change).await;
    }
    Some(end)
}

/// Checks the session every tick until leadership is lost or `shutdown` is cancelled.
/// The connection and the lease are watched all along, during a check too.
async fn lead(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    session: &LockSession,
    resigns: &mut watch::Receiver<u64>,
) -> Led {
    let lease_expired = || Led::Lost(Loss::of(LossCause::LeaseExpired));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(Loss::of(cause)),
            Ok(()) = resigns.changed() => return Led::Resign,
            _ = ticks.tick() => {}
        }
        if !shared.lease().is_live() {
            return lease_expired();
        }
        let sent_at = now_ms();
        let started = Instant::now();
        let check = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(Loss::of(cause)),
            check = session.check(pg.interval) => check,
        };
        if let Some(metrics) = shared.metrics() {
            metrics.observe_check(started.elapsed());
        }
        if let Err(loss) = proven(check, pg.key).and_then(|()| renew(shared.lease(), sent_at, pg)) {
            return Led::Lost(loss);
        }
    }
}

/// Renews `lease` after a check sent at `sent_at` proved the session: it then runs until the
/// lease length after `sent_at`, which it returns. A late answer does not revive a lease that
/// ran out while the check was under way: the term has ended for everyone who read it
/// meanwhile. The one rule of a leader's checks and a shard member's.
pub(super) fn renew(lease: &Lease, sent_at: u64, pg: &PgSettings) -> Result<u64, Loss> {
    if !lease.is_live() {
        return Err(Loss::of(LossCause::LeaseExpired));
    }
    let deadline = deadline_after(sent_at, lease_length(pg.interval));
    lease.hold_until(deadline);
    Ok(deadline)
}

/// Completes, with the cause, when the lock connection closes or the local lease expires,
/// within [`WATCH_POLL`] of either, so that a process resumed after a freeze ends its
/// term (and cancels its token) at once rather than at its next tick or when its check ends.
pub(super) async fn watch(lease: &Lease, session: &LockSession) -> LossCause {
    loop {
        if session.is_closed() {
            return LossCause::ConnectionClosed;
        }
        if !lease.is_live() {
            return LossCause::LeaseExpired;
        }
        tokio::time::sleep(WATCH_POLL).await;
    }
}
