//! The standby: tries the lock every tick (and, with fast takeover, keeps a session waiting
//! for it) until it is granted.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::borrower::Borrower;
use super::candidates::{self, Backoff, StayAway};
use super::lock_table;
use super::loss::POOLER;
use super::repeats::{Repeats, loud_or_debug};
use super::session::{
    AppliedBounds, Attempt, LockMode, LockSession, MIN_TRY_BOUND, SessionBounds, SessionError,
    Tried, TryFor, try_acquire,
};
use super::settings::PgSettings;
use super::waiter::{self, WaitSpec, Waiter};
use crate::key::LockKey;
use crate::state::Shared;
use alive::{Alive, outranked};

mod alive;

const RECOVERY: &str = "the server is in recovery (a read replica): its advisory locks are local to it, so this replica stays standby; point the pool at the primary";

const SHARED_TRY: &str = "this try ran on a server session that another elector holds the lock on; this replica stays standby";

/// How long a try under way when the waiting session is granted may go on, so that its pool
/// connection goes back rather than closed: its remaining statements take a round trip or two,
/// and the lock they meet is this replica's own. The term waits for it at most this long.
const TRY_GRACE: Duration = Duration::from_millis(20);

/// How long a term whose lock was not handed over gracefully waits before it starts, counted
/// from the grant. Such a lock was freed by a session that ended: its leader may be alive and
/// not know yet (`pg_terminate_backend`, a proxy reset), and a leader notices its closed
/// connection within [`WATCH_POLL`](super::session::WATCH_POLL) in either mode; this gives it five times that to step down
/// first, so that no instant has two leaders, whether the new leader was granted the lock by its
/// waiting session at once or by a try that happened to land right after the session ended.
/// A lock handed over by a graceful unlock needs no wait: that leader stepped down before it
/// unlocked (see [`handover`](super::handover)).
pub(crate) const SETTLE: Duration = Duration::from_millis(5);

/// A granted try.
pub(super) struct Grant {
    pub(super) session: Box<LockSession>,
    /// When the try was sent ([`now_ms`](crate::lease::now_ms)).
    pub(super) sent_at: u64,
    /// The server has no `idle_session_timeout`.
    pub(super) unbounded: bool,
    pub(super) applied: AppliedBounds,
    /// A grant that was not handed over gracefully: the term starts no earlier than this.
    pub(super) settle_until: Option<Instant>,
    /// The grant came from a graceful unlock.
    pub(super) handed_over: bool,
    /// The grant came to the waiting session.
    pub(super) from_wait: bool,
}

impl Grant {
    /// The grant an [`Attempt::Granted`] is (`from_wait`: to the waiting session); `None` for
    /// any other attempt.
    fn of(attempt: Attempt, from_wait: bool) -> Option<Self> {
        let Attempt::Granted {
            session,
            sent_at,
            unbounded,
            applied,
            handed_over,
        } = attempt
        else {
            return None;
        };
        Some(Self {
            session,
            sent_at,
            unbounded,
            applied,
            // A graceful unlock came after the old leader stepped down: no wait.
            settle_until: (!handed_over).then(|| Instant::now() + SETTLE),
            from_wait,
            handed_over,
        })
    }
}

/// What a standby runs with, for as long as `run` runs.
pub(super) struct Standby<'a> {
    pub(super) shared: &'a Shared,
    pub(super) pg: &'a PgSettings,
    pub(super) bounds: SessionBounds,
    pub(super) shutdown: &'a CancellationToken,
    pub(super) borrower: Borrower,
    /// This replica just left the lock to another (a yield, or a grant given back for a
    /// preferred standby): the next try waits for the next tick, even with fast takeover.
    pub(super) hold_off: bool,
    /// Another live standby outranks this one, as of this standby's last try: it keeps no
    /// waiting session.
    pub(super) outranked: bool,
    /// How long this standby stays quiet after a lead it could not keep.
    pub(super) backoff: Backoff,
    /// Its last try got an answer that a replica able to lead gets.
    pub(super) tried_well: bool,
    /// It handed over on request, and stays away while its target may still lead.
    pub(super) stay_away: Option<StayAway>,
}

impl<'a> Standby<'a> {
    /// A standby of `pg`'s key that has not tried yet.
    pub(super) fn new(
        shared: &'a Shared,
        pg: &'a PgSettings,
        shutdown: &'a CancellationToken,
        borrower: Borrower,
    ) -> Self {
        Self {
            shared,
            pg,
            bounds: SessionBounds::for_interval(pg.interval),
            shutdown,
            borrower,
            hold_off: false,
            outranked: false,
            backoff: Backoff::default(),
            tried_well: true,
            stay_away: None,
        }
    }

    /// Drops this standby's row of the candidates table, if it has a preference (it writes
    /// one), within `bound`: it is no standby any more, or not for a while.
    pub(super) async fn withdraw(&self, bound: Duration) {
        let pg = self.pg;
        if pg.preference.is_some() {
            candidates::withdraw(&pg.pool, &pg.candidates, pg.key, &pg.identity, bound).await;
        }
    }
}

/// The standby's failures, for [`Repeats`]: the tries', and the waiting session's apart (a
/// refused try clears the tries' record, and would make a waiting session's failure loud
/// every interval).
#[derive(Default)]
struct Records {
    tries: Repeats,
    wait: Repeats,
    alive: Alive,
}

/// The waiting session of fast takeover, and what starts one.
struct Waiting {
    spec: Option<WaitSpec>,
    waiter: Option<Waiter>,
}

impl Waiting {
    /// The outcome of the waiting session, if there is one; pending forever otherwise.
    async fn outcome(&mut self) -> waiter::Outcome {
        match &mut self.waiter {
            Some(waiter) => waiter.outcome().await,
            None => std::future::pending().await,
        }
    }

    /// After a try that the lock refused: a waiting session, unless one waits already or
    /// another live standby outranks this one (its waiting session would only take a waiting
    /// slot from the standby it would leave the lock to).
    fn start_after(&mut self, attempt: &Result<Attempt, SessionError>, outranked: bool) {
        if outranked {
            return;
        }
        if let (Ok(Attempt::Refused), Some(spec), None) = (attempt, &self.spec, &self.waiter) {
            self.waiter = Some(Waiter::start(spec));
        }
    }
}

impl Standby<'_> {
    /// After a lead this replica could not keep (a grant given back, a term lost soon after it
    /// began): with a preference, it stays quiet for a while and its row goes, so that no
    /// leader hands over to it again at once (see [`Backoff`]). A resign's cooldown is no
    /// such failure.
    pub(super) async fn could_not_keep(&mut self) {
        let pg = self.pg;
        if pg.preference.is_none() || self.shared.cooling_down() {
            return;
        }
        self.backoff.failed(Instant::now(), pg.interval);
        tracing::info!(key = %pg.key, "this replica could not keep the lead it was given; it stays quiet for a while, so that no leader hands over to it meanwhile");
        candidates::withdraw(
            &pg.pool,
            &pg.candidates,
            pg.key,
            &pg.identity,
            pg.interval.max(MIN_TRY_BOUND),
        )
        .await;
    }

    /// Whether this replica still stays away after a handover asked of it: it looks at the
    /// target once a tick (see [`StayAway`]), and stands by again, said at INFO, once the time
    /// asked is over or the target can no longer lead.
    async fn staying_away(&mut self) -> bool {
        let Some(away) = &mut self.stay_away else {
            return false;
        };
        let pg = self.pg;
        let bound = pg.interval.max(MIN_TRY_BOUND);
        let looked = tokio::select! {
            biased;
            // The loop's next select returns at once.
            () = self.shutdown.cancelled() => return true,
            looked = candidates::target_seen(&pg.pool, &pg.candidates, pg.key, away.target(), bound) => looked,
        };
        let seen = match looked {
            Ok(seen) => Some(seen),
            Err(e) => {
                tracing::debug!(key = %pg.key, error = %e, "cannot see the handover's target; staying away");
                None
            }
        };
        if away.still(Instant::now(), seen) {
            return true;
        }
        tracing::info!(key = %pg.key, target = away.target(), "the stay-away after a handover is over (its time is up, or its target is gone or lost its term); this replica stands by again");
        self.stay_away = None;
        false
    }

    /// Tries the lock every tick until it is granted (`Some`) or shutdown comes (`None`).
    /// During a resign's cooldown it does not try; a resign asked of a standby is answered at
    /// once.
    ///
    /// With fast takeover, a try refused because another session holds the lock also starts a
    /// waiting session, unless one is waiting already; the tries go on every tick all the same,
    /// so a waiting session that breaks only leaves the standby trying as without it until the
    /// next refused try starts another. Whichever is granted first wins; the other is closed.
    pub(super) async fn wait_for_grant(
        &mut self,
        ticks: &mut Interval,
        resigns: &mut watch::Receiver<u64>,
    ) -> Option<Grant> {
        let pg = self.pg;
        let mut waiting = self.waiting();
        let mut records = Records::default();
        // With fast takeover the first try is at once, not at the next tick: a replica that has
        // just stopped leading gets its waiting session within a round trip rather than within
        // I, so that a second failover soon after the first still finds a session waiting.
        let mut try_now = waiting.spec.is_some() && !std::mem::take(&mut self.hold_off);
        loop {
            let waited = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return None,
                () = std::future::ready(()), if std::mem::take(&mut try_now) => None,
                Ok(()) = resigns.changed() => {
                    // No session may wait for the lock during the cooldown the resign set,
                    // and no leader may hand over to this replica meanwhile.
                    waiting.waiter = None;
                    self.borrower.let_go();
                    self.withdraw(pg.interval.max(MIN_TRY_BOUND)).await;
                    self.shared.resign_handled();
                    continue;
                }
                outcome = waiting.outcome() => Some(outcome),
                _ = ticks.tick() => None,
            };
            let (attempt, from_wait) = match waited {
                Some(outcome) => {
                    waiting.waiter = None;
                    (outcome, true)
                }
                None if self.shared.cooling_down() || self.staying_away().await => {
                    // No session may wait for the lock while this replica stays away from it,
                    // and no borrow of an earlier try may hold a pool connection meanwhile.
                    waiting.waiter = None;
                    self.borrower.let_go();
                    continue;
                }
                None => self.try_once(&mut waiting, &mut records.alive).await?,
            };
            match attempt {
                Ok(granted @ Attempt::Granted { .. }) => {
                    // The waiting session, if the try won, is closed with the waiter; a borrow
                    // of a try that the waiting session beat gives its connection back.
                    self.borrower.let_go();
                    return Grant::of(granted, from_wait);
                }
                other => self.report(other, from_wait, &mut records),
            }
        }
    }

    /// The waiting session of fast takeover, not yet set up (none without fast takeover).
    fn waiting(&self) -> Waiting {
        let pg = self.pg;
        Waiting {
            spec: pg.fast_takeover.then(|| WaitSpec {
                pool: pg.pool.clone(),
                key: pg.key,
                identity: pg.identity.clone(),
                bounds: self.bounds,
                interval: pg.interval,
                setup_bound: pg.interval.max(MIN_TRY_BOUND),
                prepared: self.borrower.prepared.clone(),
            }),
            waiter: None,
        }
    }

    /// One try, unless the waiting session is granted first; `None` at shutdown. Says whether
    /// the outcome is the waiting session's. Before the try, the standby learns whether a live
    /// standby outranks it ([`outranked`]); if so it keeps no waiting session.
    async fn try_once(
        &mut self,
        waiting: &mut Waiting,
        alive: &mut Alive,
    ) -> Option<(Result<Attempt, SessionError>, bool)> {
        let pg = self.pg;
        // A standby without a preference reads the table while it holds a waiting slot, and
        // while it is outranked (it would otherwise take a slot again at its next refused try).
        let reads = waiting.waiter.is_some() || self.outranked;
        // A standby whose last try failed says nothing of itself: others would leave the lock
        // to a replica that cannot take it (a full lock table, a try that times out).
        let quiet = self.backoff.quiet(Instant::now()) || !self.tried_well;
        let borrower = &mut self.borrower;
        let bounds = &self.bounds;
        let (outranked, tried) = {
            let trying = async {
                let outranked = outranked(pg, reads, quiet, alive).await;
                let asked = TryFor {
                    key: pg.key,
                    mode: LockMode::Exclusive,
                    identity: &pg.identity,
                    bounds,
                    interval: pg.interval,
                    defer_as: Some(pg.own_preference()),
                    candidates: &pg.candidates,
                };
                (outranked, try_acquire(borrower, &asked).await)
            };
            let mut trying = std::pin::pin!(trying);
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return None,
                // A grant to the waiting session while the try (or what comes before it) is under
                // way: the lock now refuses the try, which gets [`TRY_GRACE`] to end so that its
                // connection goes back to the pool (a try dropped mid-way closes it: a login at
                // every handover that lands during a try); past that it is dropped.
                outcome = waiting.outcome() => {
                    waiting.waiter = None;
                    if matches!(outcome, Ok(Attempt::Granted { .. })) {
                        let _ = tokio::time::timeout(TRY_GRACE, trying.as_mut()).await;
                    }
                    return Some((outcome, true));
                }
                tried = trying.as_mut() => tried,
            }
        };
        self.outranked = outranked;
        let tried = self.count(tried);
        if outranked && waiting.waiter.take().is_some() {
            tracing::debug!(key = %pg.key, "a live standby outranks this one; its waiting session is closed, freeing its slot");
        }
        waiting.start_after(&tried, outranked);
        Some((tried, false))
    }

    /// Counts a try for the backoff: whether it got an answer a replica able to lead gets,
    /// and whether it failed once the lock was free. Returns its attempt.
    fn count(&mut self, tried: Tried) -> Result<Attempt, SessionError> {
        let Tried {
            attempt: tried,
            granting,
        } = tried;
        self.tried_well = matches!(
            tried,
            Ok(Attempt::Granted { .. } | Attempt::Refused | Attempt::Deferred | Attempt::QueueFull)
        );
        let now = Instant::now();
        if self.tried_well {
            self.backoff.tried_well(now);
        }
        // A try that failed once the lock was free and not left to another standby (most
        // often one that then timed out, as for a replica far from the server) is a lead this
        // replica could not take when it was handed to it: otherwise a leader would hand over
        // to it, it would fail to take the lock, fall silent, come back once refused, and so
        // on. A failed borrow or question came nowhere near the lock: it only makes the next
        // try quiet (`tried_well`), so that a cut link or a restarted server costs a
        // preferred standby nothing once they are back.
        if granting && self.pg.preference.is_some() {
            self.backoff.failed(now, self.pg.interval);
        }
        tried
    }

    /// Logs an attempt that was not granted; a repeated failure at DEBUG in between.
    fn report(
        &self,
        attempt: Result<Attempt, SessionError>,
        from_wait: bool,
        records: &mut Records,
    ) {
        let key = self.pg.key;
        match attempt {
            // A waiting session that could not get a pool connection: the tries, which use the
            // same pool, say so at their level.
            Err(e @ SessionError::PoolTimeout(_)) if from_wait => {
                tracing::debug!(key = %key, error = %e, "no pool connection for a waiting session; this standby only tries meanwhile")
            }
            Err(e) if from_wait => {
                loud_or_debug!(records.wait.loud("wait"), warn, key = %key, error = %e, "the waiting session ended; this standby tries every interval until it waits again")
            }
            tried => report_try(key, tried, &mut records.tries),
        }
    }
}

/// Logs a try that was not granted; a repeated failure at DEBUG in between. Shard members
/// report their membership tries here too.
pub(crate) fn report_try(
    key: LockKey,
    attempt: Result<Attempt, SessionError>,
    repeats: &mut Repeats,
) {
    match attempt {
        Ok(Attempt::Granted { .. }) => {}
        Ok(Attempt::Refused) => {
            repeats.clear();
            tracing::trace!(key = %key, "lock held by another session")
        }
        Ok(Attempt::Deferred) => {
            tracing::trace!(key = %key, "the lock is free, and left to a live standby that should have it")
        }
        Ok(Attempt::QueueFull) => {
            tracing::trace!(key = %key, "every waiting slot is taken; this standby only tries")
        }
        Ok(Attempt::InRecovery) => {
            loud_or_debug!(repeats.loud("recovery"), error, key = %key, "{RECOVERY}")
        }
        Ok(Attempt::SharedSession) => {
            loud_or_debug!(repeats.loud("pooler"), error, key = %key, "{POOLER}: {SHARED_TRY}")
        }
        Err(e) => match lock_table::full(&e) {
            Some(raise) => {
                loud_or_debug!(repeats.loud("lock table"), error, key = %key, error = %e, fix = raise, "the server's shared lock table is full, so this replica cannot take the lock")
            }
            None => {
                loud_or_debug!(repeats.loud("acquire"), warn, key = %key, error = %e, "acquire lock connection")
            }
        },
    }
}
