//! Everything PostgreSQL-specific: the election loop behind [`Elector::run`](crate::Elector::run)
//! (here) and the SQL of the lock session ([`session`]).

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior, interval, timeout};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::Error;
use crate::lease::{Lease, deadline_after, now_ms};
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::TermEnd;
use fence::BumpError;
use session::{
    AppliedBounds, Attempt, Borrower, Check, LockSession, SessionBounds, SessionError, WATCH_POLL,
    try_acquire,
};
use settings::{PgSettings, RELEASE_BOUND};
use tokio::sync::watch;
use waiter::{WaitSpec, Waiter};

pub(crate) mod fence;
mod handover;
mod leader;
mod session;
pub(crate) mod settings;
mod waiter;

pub(crate) use leader::leader_via;
pub use leader::{LeaderInfo, current_leader};

pub(crate) use fence::{DEFAULT_TABLE as DEFAULT_FENCING_TABLE, FenceTable};

/// What the logs say when a transaction-mode pooler is detected.
const POOLER: &str = "the connection goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction), which cannot carry a session advisory lock; connect directly or through a session-mode pooler";

const RECOVERY: &str = "the server is in recovery (a read replica): its advisory locks are local to it, so this replica stays standby; point the pool at the primary";

const SHARED_TRY: &str = "this try ran on a server session that another elector holds the lock on; this replica stays standby";

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
    let mut borrower = Borrower::new(pg.pool.clone());
    let bounds = SessionBounds::for_interval(pg.interval);
    let mut resigns = shared.resign.subscribe();
    resigns.borrow_and_update();
    let mut repeats = Repeats::default();
    let mut held = Held {
        shared,
        pg,
        session: None,
    };
    loop {
        let Some(grant) = standby(
            shared,
            pg,
            &bounds,
            &shutdown,
            &mut ticks,
            &mut borrower,
            &mut resigns,
        )
        .await
        else {
            return Ok(());
        };
        if grant.unbounded {
            shared.warn_no_idle_session_timeout(pg.key);
        }
        // Guarded from here on: a drop or a panic closes the session (E7).
        held.session = Some(grant.session);
        // A resign asked while the try was on the wire: its cooldown holds, and no epoch is
        // bumped for a term that will not start.
        if shared.cooling_down() {
            if let Some(session) = held.session.take() {
                unlock(pg, session, false).await;
            }
            continue;
        }
        let Some(session) = held.session.as_deref() else {
            continue;
        };
        let applied = &grant.applied;
        tracing::debug!(
            key = %pg.key,
            idle_session_timeout = applied.idle_session_timeout.as_deref().unwrap_or("(none)"),
            tcp_user_timeout = applied.tcp_user_timeout.as_deref().unwrap_or("(none)"),
            tcp_keepalives_idle = applied.keepalives_idle.as_deref().unwrap_or("(none)"),
            tcp_keepalives_interval = applied.keepalives_interval.as_deref().unwrap_or("(none)"),
            tcp_keepalives_count = applied.keepalives_count.as_deref().unwrap_or("(none)"),
            waited = grant.from_wait,
            handed_over = grant.handed_over,
            "lock granted; the server's bounds on the lock session"
        );
        let prepared = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            prepared = prepare(pg, session, grant.sent_at, &mut repeats) => Some(prepared),
        };
        let (held_since, epoch) = match prepared {
            // Shut down before the term began: give the lock back.
            None => {
                if let Some(session) = held.session.take() {
                    unlock(pg, session, false).await;
                }
                return Ok(());
            }
            Some(Ok(ready)) => ready,
            Some(Err(())) => {
                if let Some(session) = held.session.take() {
                    unlock(pg, session, false).await;
                }
                continue;
            }
        };
        // A resign asked while the try was on the wire: its cooldown holds.
        if shared.cooling_down() {
            if let Some(session) = held.session.take() {
                unlock(pg, session, false).await;
            }
            continue;
        }
        if let Some(until) = grant.settle_until {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    if let Some(session) = held.session.take() {
                        unlock(pg, session, false).await;
                    }
                    return Ok(());
                }
                () = tokio::time::sleep_until(until) => {}
            }
        }
        let deadline = deadline_after(held_since, lease_length(pg.interval));
        if now_ms() >= deadline {
            drop(held.session.take());
            tracing::warn!(key = %pg.key, "the grant was confirmed after the lease it would start had expired; its session is closed");
            continue;
        }
        shared.promote(|lease| lease.hold_until(deadline), epoch, pg.fence_target());
        // One span per term, inside the election's: every line of the term carries its epoch.
        let term_span = tracing::info_span!("term", epoch);
        let end = async {
            let Some(session) = held.session.as_deref() else {
                // Unreachable: the session was put there above.
                shared.demote(TermEnd::LeadershipLost, Change::Abandoned);
                return None;
            };
            tracing::info!(key = %pg.key, epoch, "leadership acquired");
            ticks.reset();
            let led = lead(shared, pg, &shutdown, &mut ticks, session, &mut resigns).await;
            let (end, change) = match led {
                Led::Lost(cause) => {
                    shared.demote(TermEnd::LeadershipLost, cause.change());
                    drop(held.session.take());
                    tracing::warn!(key = %pg.key, %cause, "leadership lost");
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
        .instrument(term_span)
        .await;
        match end {
            None => continue,
            Some(TermEnd::Shutdown) => return Ok(()),
            Some(_) => {}
        }
        shared.resign_handled();
    }
}

/// What stands between a grant and the term: a grant that took longer than one interval to
/// answer is checked once more (it would start a lease that runs out before, or soon after,
/// the first check), and with fencing the epoch is bumped. Returns when the lock was last seen
/// held (for the lease) and the epoch, or `Err` when the lock should be given back.
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
                    cause = %LossCause::from_check(other),
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
            let loud = repeats.loud("bump");
            match &e {
                BumpError::CannotCreate { .. } if loud => {
                    tracing::error!(key = %pg.key, table = table.name(), error = %e, "cannot bump the fencing epoch; the lock is given back")
                }
                _ if loud => {
                    tracing::warn!(key = %pg.key, table = table.name(), error = %e, "cannot bump the fencing epoch; the lock is given back")
                }
                _ => {
                    tracing::debug!(key = %pg.key, table = table.name(), error = %e, "cannot bump the fencing epoch; the lock is given back")
                }
            }
            Err(())
        }
        Err(_) => {
            tracing::warn!(key = %pg.key, table = table.name(), bound = ?2 * pg.interval, "the fencing epoch bump got no answer in time; the lock is given back");
            Err(())
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// Tries the lock every tick until it is granted (`Some`) or `shutdown` is cancelled (`None`).
/// During a resign's cooldown it does not try; a resign asked of a standby is answered at once.
///
/// With fast takeover, a try refused because another session holds the lock also starts a
/// waiting session, unless one is waiting already; the tries go on every tick all the same,
/// so a waiting session that breaks only leaves the standby trying as without it until the
/// next refused try starts another. Whichever is granted first wins; the other is closed.
async fn standby(
    shared: &Shared,
    pg: &PgSettings,
    bounds: &SessionBounds,
    shutdown: &CancellationToken,
    ticks: &mut Interval,
    borrower: &mut Borrower,
    resigns: &mut watch::Receiver<u64>,
) -> Option<Grant> {
    let mut repeats = Repeats::default();
    let spec = pg.fast_takeover.then(|| WaitSpec {
        pool: pg.pool.clone(),
        key: pg.key,
        identity: pg.identity.clone(),
        bounds: *bounds,
        interval: pg.interval,
        setup_bound: pg.interval.max(MIN_TRY_BOUND),
    });
    let mut waiter: Option<Waiter> = None;
    let mut wait_repeats = Repeats::default();
    // With fast takeover the first try is at once, not at the next tick: a replica that has
    // just stopped leading gets its waiting session within a round trip rather than within I,
    // so that a second failover soon after the first still finds a session waiting.
    let mut try_now = spec.is_some();
    loop {
        let waited = tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            () = std::future::ready(()), if std::mem::take(&mut try_now) => None,
            Ok(()) = resigns.changed() => {
                // No session may wait for the lock during the cooldown the resign set.
                waiter = None;
                borrower.let_go();
                shared.resign_handled();
                continue;
            }
            outcome = wait_for(&mut waiter) => Some(outcome),
            _ = ticks.tick() => None,
        };
        let mut from_wait = waited.is_some();
        let attempt = match waited {
            Some(outcome) => {
                waiter = None;
                outcome
            }
            None if shared.cooling_down() => {
                // No session may wait for the lock while this replica stays away from it, and
                // no borrow of an earlier try may hold a pool connection meanwhile.
                waiter = None;
                borrower.let_go();
                continue;
            }
            None => {
                let attempt = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return None,
                    // A grant to the waiting session while the try is under way: the try, which
                    // the lock now refuses, is dropped (its connection closed).
                    outcome = wait_for(&mut waiter) => {
                        waiter = None;
                        from_wait = true;
                        outcome
                    }
                    attempt = try_acquire(
                        borrower,
                        pg.key,
                        &pg.identity,
                        bounds,
                        pg.interval,
                        pg.interval.max(MIN_TRY_BOUND),
                    ) => attempt,
                };
                if let (Ok(Attempt::Refused), Some(spec), None) = (&attempt, &spec, &waiter) {
                    waiter = Some(Waiter::start(spec));
                }
                attempt
            }
        };
        match attempt {
            Ok(Attempt::Granted {
                session,
                sent_at,
                unbounded,
                applied,
                handed_over,
            }) => {
                // The waiting session, if the try won, is closed with the waiter; a borrow of a
                // try that the waiting session beat gives its connection back to the pool.
                borrower.let_go();
                return Some(Grant {
                    session,
                    sent_at,
                    unbounded,
                    applied,
                    // A graceful unlock came after the old leader stepped down: no wait.
                    settle_until: (!handed_over).then(|| Instant::now() + SETTLE),
                    from_wait,
                    handed_over,
                });
            }
            Ok(Attempt::Refused) => {
                repeats.clear();
                tracing::trace!(key = %pg.key, "lock held by another session")
            }
            Ok(Attempt::QueueFull) => {
                tracing::trace!(key = %pg.key, "every waiting slot is taken; this standby only tries")
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
            // A waiting session that could not get a pool connection: the tries, which use the
            // same pool, say so at their level.
            Err(e @ SessionError::PoolTimeout(_)) if from_wait => {
                tracing::debug!(key = %pg.key, error = %e, "no pool connection for a waiting session; this standby only tries meanwhile")
            }
            Err(e) if from_wait => {
                // Its own record: a refused try clears the tries' record, and would make this
                // line loud every interval.
                if wait_repeats.loud("wait") {
                    tracing::warn!(key = %pg.key, error = %e, "the waiting session ended; this standby tries every interval until it waits again")
                } else {
                    tracing::debug!(key = %pg.key, error = %e, "the waiting session ended; this standby tries every interval until it waits again")
                }
            }
            Err(e) => {
                if repeats.loud("acquire") {
                    tracing::warn!(key = %pg.key, error = %e, "acquire lock connection")
                } else {
                    tracing::debug!(key = %pg.key, error = %e, "acquire lock connection")
                }
            }
        }
    }
}

/// The outcome of the waiting session, if there is one; pending forever otherwise.
async fn wait_for(waiter: &mut Option<Waiter>) -> waiter::Outcome {
    match waiter {
        Some(waiter) => waiter.outcome().await,
        None => std::future::pending().await,
    }
}

/// A granted try.
struct Grant {
    session: Box<LockSession>,
    /// When the try was sent ([`now_ms`]).
    sent_at: u64,
    /// The server has no `idle_session_timeout`.
    unbounded: bool,
    applied: AppliedBounds,
    /// A grant that was not handed over gracefully: the term starts no earlier than this.
    settle_until: Option<Instant>,
    /// The grant came from a graceful unlock.
    handed_over: bool,
    /// The grant came to the waiting session.
    from_wait: bool,
}

/// How long a term whose lock was not handed over gracefully waits before it starts, counted
/// from the grant. Such a lock was freed by a session that ended: its leader may be alive and
/// not know yet (`pg_terminate_backend`, a proxy reset), and a leader notices its closed
/// connection within [`WATCH_POLL`] in either mode; this gives it five times that to step down
/// first, so that no instant has two leaders, whether the new leader was granted the lock by its
/// waiting session at once or by a try that happened to land right after the session ended.
/// A lock handed over by a graceful unlock needs no wait: that leader stepped down before it
/// unlocked (see [`handover`]).
const SETTLE: Duration = Duration::from_millis(5);

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
    Resign,
    Lost(LossCause),
}

/// Why a leader stopped leading.
#[derive(Debug)]
pub(crate) enum LossCause {
    /// The lock connection closed (noticed between checks).
    ConnectionClosed,
    /// The local lease ran out: the process was paused or starved for longer than the lease.
    LeaseExpired,
    /// The check found the session no longer holds the lock.
    LockGone,
    /// The check ran on a server session that is not (only) the lock session: a pooler.
    Pooler,
    /// The check got no answer within its bound.
    CheckTimeout(Duration),
    /// The check failed.
    CheckFailed(SessionError),
}

impl LossCause {
    /// The cause of a check that did not find the lock held (a `Holds` is not a loss; it maps
    /// to [`LossCause::LockGone`] only if passed by mistake).
    fn from_check(check: Result<Check, SessionError>) -> Self {
        match check {
            Ok(Check::Holds | Check::Lost) => Self::LockGone,
            Ok(Check::SharedSession) => Self::Pooler,
            Err(SessionError::Timeout(bound)) => Self::CheckTimeout(bound),
            Err(e) => Self::CheckFailed(e),
        }
    }
}

impl LossCause {
    /// The `cause` label of the changes counter.
    fn change(&self) -> Change {
        match self {
            Self::ConnectionClosed => Change::ConnectionClosed,
            Self::LeaseExpired => Change::LeaseExpired,
            Self::LockGone => Change::LockGone,
            Self::Pooler => Change::Pooler,
            Self::CheckTimeout(_) => Change::CheckTimeout,
            Self::CheckFailed(_) => Change::CheckFailed,
        }
    }
}

impl std::fmt::Display for LossCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ConnectionClosed => f.write_str("the lock connection closed"),
            Self::LeaseExpired => f.write_str(LEASE_EXPIRED),
            Self::LockGone => f.write_str("the session no longer holds the lock"),
            Self::Pooler => f.write_str(POOLER),
            Self::CheckTimeout(bound) => {
                write!(f, "the leader check got no answer within {bound:?}")
            }
            Self::CheckFailed(e) => write!(f, "the leader check failed: {e}"),
        }
    }
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
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(cause),
            Ok(()) = resigns.changed() => return Led::Resign,
            _ = ticks.tick() => {}
        }
        if !shared.lease().is_live() {
            return Led::Lost(LossCause::LeaseExpired);
        }
        let sent_at = now_ms();
        let started = Instant::now();
        let check = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Led::Shutdown,
            cause = watch(shared.lease(), session) => return Led::Lost(cause),
            check = session.check(pg.interval) => check,
        };
        if let Some(metrics) = shared.metrics() {
            metrics.observe_check(started.elapsed());
        }
        match check {
            // A late answer does not revive a lease that has run out: the term has ended for
            // everyone who read `is_leader` meanwhile.
            Ok(Check::Holds) if !shared.lease().is_live() => {
                return Led::Lost(LossCause::LeaseExpired);
            }
            Ok(Check::Holds) => shared
                .lease()
                .hold_until(deadline_after(sent_at, lease_length(pg.interval))),
            Ok(Check::SharedSession) => {
                tracing::error!(key = %pg.key, "{POOLER}: the leader check ran on a server session that is not the lock session, or that another elector's try reached");
                return Led::Lost(LossCause::Pooler);
            }
            other => return Led::Lost(LossCause::from_check(other)),
        }
    }
}

const LEASE_EXPIRED: &str =
    "the local lease expired: the process was paused or starved for longer than the lease";

/// Completes, with the cause, when the lock connection closes or the local lease expires,
/// within [`WATCH_POLL`] of either, so that a process resumed after a freeze ends its
/// term (and cancels its token) at once rather than at its next tick or when its check ends.
async fn watch(lease: &Lease, session: &LockSession) -> LossCause {
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

/// Gives the lock up gracefully (shutdown or resign). The term ends first, so that no
/// instant has two leaders; then the work still running here drains, up to the drain
/// timeout, while the session keeps being checked; only then the unlock.
async fn hand_over(
    shared: &Shared,
    pg: &PgSettings,
    session: Box<LockSession>,
    end: TermEnd,
    change: Change,
) {
    shared.demote(end, change);
    if drain(shared, pg, &session).await {
        unlock(pg, session, true).await;
    }
}

/// Waits for the work still running on this replica, at most the drain timeout; `false` when
/// the lock was lost meanwhile (there is nothing left to unlock).
async fn drain(shared: &Shared, pg: &PgSettings, session: &LockSession) -> bool {
    // A drain timeout too long for the clock waits for the work, however long.
    let deadline = Instant::now()
        .checked_add(pg.drain_timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
    loop {
        let names = shared.in_flight().names();
        if names.is_empty() {
            return true;
        }
        tracing::debug!(key = %pg.key, running = ?names, "draining before the lock is given up");
        tokio::select! {
            biased;
            () = shared.in_flight().drained() => return true,
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    key = %pg.key,
                    running = ?shared.in_flight().names(),
                    drain_timeout = ?pg.drain_timeout,
                    "work still running at the drain timeout; the lock is given up anyway"
                );
                return true;
            }
            // The session stays checked while the work drains, so that the server's bound on
            // a silent session never ends it, and a lost lock is seen.
            () = tokio::time::sleep(pg.interval) => {
                match session.check(pg.interval).await {
                    Ok(Check::Holds) => {}
                    other => {
                        tracing::warn!(key = %pg.key, cause = %LossCause::from_check(other), "the lock was lost while draining");
                        return false;
                    }
                }
            }
        }
    }
}

/// Unlocks, bounded, and closes the session; `led` says whether a term was held on it.
async fn unlock(pg: &PgSettings, session: Box<LockSession>, led: bool) {
    // `timeout` runs on its own timer, not on the (cancelled) shutdown token.
    match timeout(RELEASE_BOUND, session.unlock(RELEASE_BOUND)).await {
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

/// The local lease: the server cannot free the lock within 4·I of the last check's
/// send time; one I of that is kept as a margin.
fn lease_length(interval: Duration) -> Duration {
    3 * interval
}

/// The session of a running election. If `run` is dropped or unwinds while leading, the
/// session is closed without an unlock, since it may be mid-query.
struct Held<'a> {
    shared: &'a Shared,
    pg: &'a PgSettings,
    session: Option<Box<LockSession>>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared
                .demote(TermEnd::LeadershipLost, Change::Abandoned);
            drop(session);
            tracing::warn!(key = %self.pg.key, "lock abandoned: run was dropped or panicked while leading; closing its session frees the lock");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Elector, LockKey};
    use pg_elector_harness::{FaultProxy, PgServer, serial};

    /// A machine suspend moves the lease's clock (`CLOCK_BOOTTIME`) but not tokio's timers, so
    /// a check in flight across it would not time out for up to I. The test makes the lease
    /// run out while a check hangs in a partition, and wants the term over within the watch's
    /// poll, not at the check's timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_term_ends_when_the_lease_runs_out_during_a_check_not_when_the_check_times_out() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let interval = Duration::from_secs(1);
        let elector = Elector::builder(db.pool_via(proxy.addr(), 2), LockKey::new(10, 10))
            .check_interval(interval)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        // Promoted at t; the first check goes out at t + I and, in the partition, hangs until
        // its bound at t + 2·I.
        let term = elector.wait_for_leadership().await;
        tokio::time::sleep(interval / 2).await;
        proxy.blackhole();
        tokio::time::sleep(interval).await;
        assert!(term.is_leader(), "the check is still in flight");
        let expired = Instant::now();
        elector.shared.lease().hold_until(now_ms());
        tokio::time::timeout(interval / 4, term.cancelled())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the token was still live {:?} after the lease ran out",
                    interval / 4
                )
            });
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        eprintln!(
            "token cancelled {:?} after the lease ran out mid-check",
            expired.elapsed()
        );
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }

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
