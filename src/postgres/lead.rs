//! The leader: checks its session every tick, watches its connection and its lease all
//! along, and ends the term when one of them, a shutdown or a resign says so.

use tokio::sync::watch;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::begin::Begun;
use super::candidates::{self, Look, Request, Standing, Yield};
use super::give_back::hand_over;
use super::loss::{Loss, Statement, proven};
use super::repeats::{Repeats, loud_or_debug};
use super::session::{LockSession, SessionError, WATCH_POLL, bounded};
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
    /// A more preferred standby, or a handover asked from outside.
    Yield(Yield),
    Lost(Loss),
}

/// How [`lead_term`] ended a term: `Gracefully` for a shutdown or a resign, `Yielded` after a
/// handover to a preferred standby (or, with the request, one asked from outside), `Lost` when
/// leadership was lost.
pub(super) enum Ended {
    Gracefully(TermEnd),
    Yielded(Option<Request>),
    Lost,
}

/// Leads the term just begun on `held`'s session until it ends; a graceful end (shutdown,
/// resign, or a yield to another replica) hands the lock over.
pub(super) async fn lead_term(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    resigns: &mut watch::Receiver<u64>,
    held: &mut Held<'_>,
    Begun { epoch, standing }: Begun,
) -> Ended {
    let Some(session) = held.session.as_deref() else {
        // Unreachable: the term began on this session.
        shared.demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
        return Ended::Lost;
    };
    tracing::info!(key = %pg.key, epoch, "leadership acquired");
    ticks.reset();
    let mut looked = false;
    let led = lead(
        shared,
        pg,
        shutdown,
        ticks,
        session,
        resigns,
        standing,
        &mut looked,
    )
    .await;
    let own_row = !looked;
    let (end, change) = match led {
        Led::Lost(loss) => {
            shared.demote(TermEnd::LeadershipLost, Change::Lost(loss.cause));
            held.close();
            tracing::warn!(key = %pg.key, cause = %loss, "leadership lost");
            return Ended::Lost;
        }
        Led::Shutdown => (TermEnd::Shutdown, Change::Released),
        Led::Resign => (TermEnd::Resigned, Change::Resigned),
        Led::Yield(why) => {
            let request = yield_term(pg, why);
            if let Some(session) = held.session.take() {
                let end = (TermEnd::HandedOver, Change::HandedOver);
                hand_over(shared, pg, session, end, own_row).await;
            }
            return Ended::Yielded(request);
        }
    };
    if let Some(session) = held.session.take() {
        hand_over(shared, pg, session, (end, change), own_row).await;
    }
    Ended::Gracefully(end)
}

/// The leader's look at the candidates, its lock waits bounded first (once per term).
async fn look(
    session: &LockSession,
    pg: &PgSettings,
    standing: &mut Standing,
) -> Result<candidates::Look, tokio_postgres::Error> {
    if !standing.waits_bounded {
        candidates::bound_lock_waits(session.client(), pg.interval).await?;
        standing.waits_bounded = true;
    }
    candidates::look(
        session.client(),
        &pg.candidates,
        pg.key,
        &pg.identity,
        pg.interval,
    )
    .await
}

/// Says why the term is given up to another replica; the request of a handover asked from
/// outside, after which this replica stays away (see [`StayAway`](candidates::StayAway)).
fn yield_term(pg: &PgSettings, why: Yield) -> Option<Request> {
    match why {
        Yield::ToPreferred { best } => {
            tracing::info!(
                key = %pg.key,
                preference = pg.own_preference(),
                standby_preference = best,
                "a more preferred standby is live; handing the lead over"
            );
            None
        }
        Yield::OnRequest(request) => {
            tracing::info!(key = %pg.key, target = %request.target, stay_away = ?request.stay_away, "a handover was asked; handing the lead over");
            Some(request)
        }
    }
}

/// Checks the session every tick until leadership is lost or `shutdown` is cancelled.
/// The connection and the lease are watched all along, during a check too. `looked` turns
/// true once a look at the candidates answered (it drops this replica's own row).
#[allow(clippy::too_many_arguments)]
async fn lead(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    session: &LockSession,
    resigns: &mut watch::Receiver<u64>,
    mut standing: Standing,
    looked: &mut bool,
) -> Led {
    let lease_expired = || Led::Lost(Loss::of(LossCause::LeaseExpired));
    let mut repeats = Repeats::default();
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
            check = session.check_seeing(pg.interval, &pg.candidates) => check,
        };
        if let Some(metrics) = shared.metrics() {
            metrics.observe_check(started.elapsed());
        }
        let (check, candidates) = match check {
            Ok((check, candidates)) => (Ok(check), candidates),
            Err(e) => (Err(e), false),
        };
        if let Err(loss) = proven(check, pg.key).and_then(|()| renew(shared.lease(), sent_at, pg)) {
            return Led::Lost(loss);
        }
        if !candidates {
            continue;
        }
        let looked_at = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(Loss::of(cause)),
            looked = bounded(pg.interval, look(session, pg, &mut standing)) => looked,
        };
        if let Some(led) = after_look(pg, looked_at, &mut standing, looked, &mut repeats) {
            return led;
        }
    }
}

/// What the leader's look at the candidates (`looked_at`) means for its term: a yield to
/// another standby, a loss when it got no answer, or nothing (the term goes on).
fn after_look(
    pg: &PgSettings,
    looked_at: Result<Look, SessionError>,
    standing: &mut Standing,
    looked: &mut bool,
    repeats: &mut Repeats,
) -> Option<Led> {
    match looked_at {
        Ok(look) => {
            *looked = true;
            if standing.duplicate(&look) {
                loud_or_debug!(repeats.loud("duplicate"), error, key = %pg.key, identity = %pg.identity, "another live replica of this key has this leader's identity: the leader drops its row at every check, so preferences cannot see it; give each replica its own identity (the default, hostname-pid, is unique on a host)");
            }
            standing.after(&look, pg.own_preference()).map(Led::Yield)
        }
        // The server answered with an error (the table dropped since, a role without rights
        // on it): the session is fine and still leads; said once a minute.
        Err(SessionError::Query(e)) if e.as_db_error().is_some() => {
            loud_or_debug!(repeats.loud("candidates"), error, key = %pg.key, error = %crate::error::chain(&e), "cannot read the candidates table; this leader does not hand over to a preferred standby meanwhile");
            None
        }
        // No answer in time, or the connection broke: the session proves nothing more.
        Err(e) => Some(Led::Lost(Loss::failed(Statement::Candidates, e))),
    }
}

/// Renews `lease` after a check sent at `sent_at` proved the session: it then runs until the
/// lease length after `sent_at`, which it returns. A late answer does not revive a lease that
/// ran out while the check was under way: the term has ended for everyone who read it
/// meanwhile. The one rule of a leader's checks and a shard member's.
pub(crate) fn renew(lease: &Lease, sent_at: u64, pg: &PgSettings) -> Result<u64, Loss> {
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
pub(crate) async fn watch(lease: &Lease, session: &LockSession) -> LossCause {
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
