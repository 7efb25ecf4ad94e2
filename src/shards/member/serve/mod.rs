//! One member of a group of shards, on its lock session: every interval one check (alive,
//! ours, the shards it holds, the members), then the few statements the check calls for:
//! tries of the shards it should own, unlocks of those it gave up after their drain.
//!
//! # Invariants
//!
//! - A shard's term is live only while this session holds the shard's lock: it starts after
//!   a granted try (or a check that lists the lock), and ends before the unlock, at a check
//!   that no longer lists it, or when the session is lost.
//! - No try asks for a shard this session holds: every try follows, in the same round and with
//!   nothing in between, a check that listed what the session holds.
//! - Only this loop promotes and demotes the shards' states, so the ledger's owned shards
//!   ([`super::ledger`]) are what they say.
//! - Every statement on the session ends by 2·I after the last check that proved it, and runs
//!   beside a watch of the connection and the lease: a partition or a closed connection ends
//!   every term within the single elector's bounds, whatever statement it meets.
//! - A gained shard whose epoch bump did not happen stays locked without a term; the next
//!   round adopts it (as any lock held without a term) and bumps it again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Interval, timeout};
use tokio_util::sync::CancellationToken;

use super::drains::{Drained, Drains};
use super::follow::Follow;
use super::ledger::Ledger;
use super::marks::Marks;
use super::sql::{self, Unlocked, View};
use crate::in_flight::InFlight;
use crate::lease::{deadline_after, now_ms};
use crate::metrics::Change;
use crate::postgres::give_back::drain_checked;
use crate::postgres::lead::{renew, watch};
use crate::postgres::lease_length;
use crate::postgres::lock_table;
use crate::postgres::loss::{Loss, POOLER, Statement, proven};
use crate::postgres::repeats::{Repeats, loud_or_debug};
use crate::postgres::session::{Check, LockSession, SessionError};
use crate::postgres::settings::{PgSettings, RELEASE_BOUND};
use crate::postgres::standby::SETTLE;
use crate::shards::group::{Inner, MEMBER_OBJECT, count_of_live, live_object};
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};

mod check;
mod leave;
mod terms;

/// How serving as a member ended.
pub(super) enum Served {
    /// Shutdown: every shard drained and unlocked.
    Shutdown,
    /// The session was lost; the member joins again at the next interval.
    Lost,
}

/// What the member waits for between two checks.
enum Event {
    Shutdown,
    Lost(LossCause),
    Drained(Drained),
    Tick,
}

/// What a round did.
enum Round {
    /// It took the live mark: the next check, which proves to the others that this member
    /// heard the mark's answer, comes half an interval later.
    Marked,
    /// It checked, and did what the check called for.
    Checked,
}

/// A member on its lock session. Dropped with the session still held (`run` dropped or
/// panicking), it ends every term and closes the session without an unlock.
pub(super) struct Member<'a> {
    inner: &'a Inner,
    pg: &'a PgSettings,
    /// Shared with the statements of a round, which run beside a watch of it.
    session: Option<Arc<LockSession>>,
    /// When the last check that proved the session was sent (at first, the granting try):
    /// every statement ends by 2·I after it, so that a partition ends the terms within 2·I
    /// whatever statement it hits.
    proved_at: u64,
    /// The backend of the lock session, once a check proved it ours alone.
    pid: Option<i32>,
    /// The other members' live marks heard: those that count.
    marks: Marks,
    /// Each shard: owned, draining before its unlock, or free; and whether the members of
    /// the last check make it this member's.
    ledger: Ledger,
    drains: Drains,
    /// The assignment this member follows, and the members of the last check.
    assignment: Follow,
    /// The member's complaints (a full lock table, a failed bump), across its sessions.
    repeats: &'a mut Repeats,
}

impl<'a> Member<'a> {
    pub(super) fn join(
        inner: &'a Inner,
        pg: &'a PgSettings,
        session: Box<LockSession>,
        joined_at: u64,
        repeats: &'a mut Repeats,
    ) -> Self {
        let count = inner.shards.len();
        Self {
            inner,
            pg,
            session: Some(Arc::from(session)),
            proved_at: joined_at,
            pid: None,
            marks: Marks::default(),
            ledger: Ledger::new(count),
            drains: Drains::default(),
            assignment: Follow::new(inner.class as u32 as u64, count as u32),
            repeats,
        }
    }

    fn shard(&self, index: usize) -> &Shared {
        &self.inner.shards[index].shared
    }

    fn member(&self) -> &Shared {
        &self.inner.member.shared
    }

    /// Serves until shutdown (a graceful leave) or until the session is lost.
    pub(super) async fn serve(
        &mut self,
        shutdown: &CancellationToken,
        ticks: &mut Interval,
    ) -> Served {
        let deadline = deadline_after(self.proved_at, lease_length(self.pg.interval));
        self.member()
            .promote(|lease| lease.hold_until(deadline), None, None);
        tracing::info!(key = %self.pg.key, "joined the group");
        // The first round at once: a joining member takes its live mark without waiting for I
        // (and its shards from the next round, half an interval later).
        ticks.reset();
        loop {
            match self.round().await {
                // The check that proves the mark heard comes half an interval after it.
                Ok(Round::Marked) => ticks.reset_after(self.pg.interval / 2),
                Ok(Round::Checked) => {}
                Err(loss) => {
                    self.lose_all_then_end_pooled(&loss).await;
                    return Served::Lost;
                }
            }
            self.inner.publish(self.assignment.members().len());
            loop {
                match self.next_event(shutdown, ticks).await {
                    Event::Tick => break,
                    Event::Shutdown => {
                        self.leave().await;
                        return Served::Shutdown;
                    }
                    Event::Lost(cause) => {
                        self.lose_all(&Loss::of(cause));
                        return Served::Lost;
                    }
                    Event::Drained(first) => {
                        // With it, every other drain that has ended by now: one unlock for all
                        // (a join moves a fair share of the shards at once).
                        let mut shards = Vec::new();
                        for Drained { shard, failure } in
                            std::iter::once(first).chain(self.drains.ended())
                        {
                            if let Some(e) = failure {
                                // Its grace ended with the task: the shard is unlocked all the
                                // same, rather than kept without a term until the session ends.
                                tracing::error!(key = %self.pg.key, shard, error = %e, "a moved shard's drain failed; unlocking it anyway");
                            }
                            shards.push(shard);
                        }
                        let unlocked = self.watched(|m| Box::pin(m.unlock_moved(shards))).await;
                        if let Err(loss) = unlocked {
                            self.lose_all_then_end_pooled(&loss).await;
                            return Served::Lost;
                        }
                        self.inner.publish(self.assignment.members().len());
                    }
                }
            }
        }
    }

    async fn next_event(&mut self, shutdown: &CancellationToken, ticks: &mut Interval) -> Event {
        let Some(session) = self.session.as_deref() else {
            return Event::Lost(LossCause::Abandoned);
        };
        let lease = self.inner.member.shared.lease();
        tokio::select! {
            biased;
            () = shutdown.cancelled() => Event::Shutdown,
            cause = watch(lease, session) => Event::Lost(cause),
            Some(drained) = self.drains.next() => Event::Drained(drained),
            _ = ticks.tick() => Event::Tick,
        }
    }

    /// One check, and what it calls for.
    async fn round(&mut self) -> Result<Round, Loss> {
        let interval = self.pg.interval;
        let Some(session) = self.session.clone() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let lease = self.inner.member.shared.lease();
        let sent_at = now_ms();
        let bound = self.bound(interval);
        let view = tokio::select! {
            biased;
            cause = watch(lease, &session) => return Err(Loss::of(cause)),
            view = sql::check(&session, self.inner.class, MEMBER_OBJECT, bound) => view,
        };
        let view = proves_membership(view, self.pg)?;
        self.pid = Some(view.pid);
        let deadline = renew(lease, sent_at, self.pg)?;
        self.proved_at = sent_at;
        // The round that takes the mark moves nothing: the others count this member only once
        // it has started a statement after its mark (see `marks`), its next round's check half
        // an interval later, so a join cut off before that never counts.
        let marking = !view.is_live(self.live_object());
        let round = if marking && self.watched(|m| Box::pin(m.mark_live())).await? {
            Round::Marked
        } else {
            Round::Checked
        };
        self.warn_other_counts(&view);
        if !marking {
            let object = self.live_object();
            let ask = self
                .marks
                .unheard(view.pid, object, &view.marks, &view.members);
            if !ask.is_empty() {
                self.watched(|m| Box::pin(m.ask_heard(ask))).await?;
            }
            let live = self
                .marks
                .counted(view.pid, object, &view.marks, &view.members);
            self.follow(live, &view.holders);
        }
        let held = self.renew_or_lose(&view, deadline);
        self.release_moved();
        self.watched(|m| Box::pin(m.act(held, sent_at))).await?;
        Ok(round)
    }

    /// What a check calls for: the strays settled, the targets tried, the gained shards'
    /// terms started.
    async fn act(&mut self, held: Vec<bool>, sent_at: u64) -> Result<(), Loss> {
        let mut gained = self.settle_strays(&held).await?;
        gained.extend(self.try_targets(&held).await?);
        let unowned = if gained.is_empty() {
            0
        } else {
            self.start(gained, sent_at).await
        };
        if let Some(metrics) = &self.inner.metrics {
            metrics.set_held_unowned(unowned);
        }
        Ok(())
    }

    /// Runs `step` (statements on the session) beside a watch of the session: a connection
    /// that closes or a lease that runs out ends it at once, as between rounds.
    async fn watched<T, F>(&mut self, step: F) -> Result<T, Loss>
    where
        F: for<'m> FnOnce(
            &'m mut Self,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<T, Loss>> + Send + 'm>>,
    {
        let Some(session) = self.session.clone() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let lease = self.inner.member.shared.lease();
        tokio::select! {
            biased;
            cause = watch(lease, &session) => Err(Loss::of(cause)),
            done = step(self) => done,
        }
    }

    /// `at_most`, cut to what is left until 2·I after the last proof of the session.
    fn bound(&self, at_most: Duration) -> Duration {
        let cutoff = self
            .proved_at
            .saturating_add(2 * self.pg.interval.as_millis() as u64);
        at_most.min(Duration::from_millis(cutoff.saturating_sub(now_ms())))
    }

    /// This member's live mark: the object tells its shard count.
    fn live_object(&self) -> i32 {
        live_object(self.inner.shards.len() as u32)
    }
}

/// The check's `view`, when it proves the session still the member's: its own session (not
/// one a transaction pooler handed out), still holding the membership lock, read as a leader's
/// check is. The rule of a round's check and of the leave's drain alike.
fn proves_membership(view: Result<View, SessionError>, pg: &PgSettings) -> Result<View, Loss> {
    let view = view.map_err(|e| Loss::from_check(Err(e)))?;
    proven(Ok(view.check()), pg.key)?;
    Ok(view)
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        if self.session.is_some() {
            let lost = self.end_all(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
            self.member()
                .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
            self.session = None;
            self.inner.publish(0);
            tracing::warn!(key = %self.pg.key, shards = lost, "locks abandoned: run was dropped or panicked while a member; closing its session frees them");
        }
    }
}
