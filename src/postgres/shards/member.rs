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
//! - Only this loop promotes and demotes the shards' states, so `owned` is what they say.
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
use super::sql::{self, View};
use crate::in_flight::InFlight;
use crate::lease::{deadline_after, now_ms};
use crate::metrics::Change;
use crate::postgres::give_back::drain_checked;
use crate::postgres::lead::{renew, watch};
use crate::postgres::lease_length;
use crate::postgres::lock_table;
use crate::postgres::loss::{Loss, proven};
use crate::postgres::repeats::{Repeats, loud_or_debug};
use crate::postgres::session::{LockSession, SessionError};
use crate::postgres::settings::{PgSettings, RELEASE_BOUND};
use crate::postgres::standby::SETTLE;
use crate::shards::assign::assign;
use crate::shards::group::{Inner, MEMBER_OBJECT};
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};

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
    /// The shards whose terms are live.
    owned: Vec<bool>,
    /// The shards whose terms ended because they moved, draining before their unlock.
    draining: Vec<bool>,
    drains: Drains,
    /// The members of the last check, sorted, and the shards they make this member's.
    members: Vec<i32>,
    mine: Vec<bool>,
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
            owned: vec![false; count],
            draining: vec![false; count],
            drains: Drains::default(),
            members: Vec::new(),
            mine: vec![false; count],
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
        // The first round at once: a joining member takes its shards without waiting for I.
        ticks.reset();
        loop {
            if let Err(loss) = self.round().await {
                self.lose_all(&loss);
                return Served::Lost;
            }
            self.inner.publish(self.members.len());
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
                            self.lose_all(&loss);
                            return Served::Lost;
                        }
                        self.inner.publish(self.members.len());
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
    async fn round(&mut self) -> Result<(), Loss> {
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
        let deadline = renew(lease, sent_at, self.pg)?;
        self.proved_at = sent_at;
        self.follow(&view);
        let held = self.renew_or_lose(&view, deadline);
        self.release_moved();
        self.watched(|m| Box::pin(m.act(held, sent_at))).await
    }

    /// What a check calls for: the strays settled, the targets tried, the gained shards'
    /// terms started.
    async fn act(&mut self, held: Vec<bool>, sent_at: u64) -> Result<(), Loss> {
        let mut gained = self.settle_strays(&held).await?;
        gained.extend(self.try_targets(&held).await?);
        if !gained.is_empty() {
            self.start(gained, sent_at).await;
        }
        Ok(())
    }

    /// Runs `step` (statements on the session) beside a watch of the session: a connection
    /// that closes or a lease that runs out ends it at once, as between rounds.
    async fn watched<F>(&mut self, step: F) -> Result<(), Loss>
    where
        F: for<'m> FnOnce(
            &'m mut Self,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<(), Loss>> + Send + 'm>>,
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

    /// The member list of `view`, and the shards it makes this member's.
    fn follow(&mut self, view: &View) {
        let mut members = view.members.clone();
        members.sort_unstable();
        members.dedup();
        if members == self.members {
            return;
        }
        let owner = assign(
            self.inner.class as u32 as u64,
            self.inner.shards.len() as u32,
            &members,
        );
        let me = members.iter().position(|&pid| pid == view.pid);
        self.mine = owner.iter().map(|&m| Some(m) == me).collect();
        tracing::debug!(
            key = %self.pg.key,
            members = members.len(),
            share = self.mine.iter().filter(|&&m| m).count(),
            "the member list changed"
        );
        self.members = members;
    }

    /// Renews the lease of every owned shard the check lists, and ends the term of one it no
    /// longer lists. Returns which shards the session holds.
    fn renew_or_lose(&mut self, view: &View, deadline: u64) -> Vec<bool> {
        let mut held = vec![false; self.owned.len()];
        for &s in &view.held {
            if let Some(h) = held.get_mut(s as usize) {
                *h = true;
            }
        }
        let mut lost = 0;
        for (i, &holds) in held.iter().enumerate() {
            if !self.owned[i] {
                continue;
            }
            if holds {
                self.shard(i).lease().hold_until(deadline);
            } else {
                self.shard(i)
                    .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::LockGone));
                self.owned[i] = false;
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::warn!(key = %self.pg.key, shards = lost, "the session no longer holds some shards; their terms ended");
            self.count_moves(LossCause::LockGone.as_str(), lost);
        }
        held
    }

    /// Ends the term of every owned shard that is no longer this member's, and drains it
    /// before its unlock.
    fn release_moved(&mut self) {
        let mut moved = 0;
        for i in 0..self.owned.len() {
            if !self.owned[i] || self.mine[i] {
                continue;
            }
            let grace = self
                .shard(i)
                .demote_to_drain(TermEnd::Resigned, Change::Resigned);
            self.owned[i] = false;
            self.draining[i] = true;
            moved += 1;
            let shared: Arc<Shared> = self.inner.shards[i].shared.clone();
            let (drain, key) = (self.pg.drain_timeout, self.pg.key);
            let index = i as u32;
            self.drains.spawn(index, async move {
                if timeout(drain, shared.in_flight().drained()).await.is_err() {
                    tracing::warn!(key = %key, shard = index, still_running = ?shared.in_flight().names(), drain_timeout = ?drain, "a moved shard's work did not finish within the drain timeout; unlocking it anyway");
                }
                // Its fenced writes end here, before the unlock.
                drop(grace);
            });
        }
        if moved > 0 {
            tracing::debug!(key = %self.pg.key, shards = moved, "shards moved to other members; draining before their unlock");
        }
    }

    /// Locks the session holds without a term (a try whose statement failed part way):
    /// this member's become terms, the others are unlocked.
    async fn settle_strays(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let (mut adopted, mut strays) = (Vec::new(), Vec::new());
        for (i, &holds) in held.iter().enumerate() {
            if !holds || self.owned[i] || self.draining[i] {
                continue;
            }
            if self.mine[i] {
                adopted.push(i as u32);
            } else {
                strays.push(i as u32);
            }
        }
        self.unlock(&strays).await?;
        Ok(adopted)
    }

    /// Tries every shard this member should own and does not hold.
    async fn try_targets(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let want: Vec<i32> = (0..held.len())
            .filter(|&i| self.mine[i] && !held[i] && !self.draining[i])
            .map(|i| i as i32)
            .collect();
        let Some(session) = self.session.as_deref() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        if want.is_empty() {
            return Ok(Vec::new());
        }
        let bound = self.bound(self.pg.interval);
        let e = match sql::try_lock(session, self.inner.class, &want, bound).await {
            Ok(granted) => return Ok(granted),
            Err(e) => e,
        };
        // The session goes on with what it holds: the shards that do not fit stay unowned.
        let Some(raise) = lock_table::full(&e) else {
            return Err(Loss::from_check(Err(e)));
        };
        let loud = self.repeats.loud("lock table");
        loud_or_debug!(loud, error, key = %self.pg.key, error = %e, "the server's shared lock table is full, so shards this member should own stay unowned; {raise}");
        Ok(Vec::new())
    }

    /// Starts the terms of `gained` (granted by a statement sent at `sent_at`), after the
    /// settle wait and, with fencing, the epoch bump of each. A shard whose bump did not
    /// happen (its row held by an old term's fenced transaction, the statement failed, the
    /// lease too short by then) stays locked without a term: the next round adopts it and
    /// bumps it again.
    async fn start(&mut self, gained: Vec<u32>, sent_at: u64) {
        // A lock freed by a session that ended under its owner: that owner steps down within
        // the watch's poll; this gives it the single elector's settle to do so.
        tokio::time::sleep(SETTLE).await;
        let deadline = deadline_after(sent_at, lease_length(self.pg.interval));
        let epochs = self.bump(&gained).await;
        if now_ms() >= deadline {
            return;
        }
        let mut started = 0;
        for (shard, epoch) in gained.into_iter().zip(epochs) {
            let Some(epoch) = epoch else { continue };
            let elector = &self.inner.shards[shard as usize];
            let fence = elector.pg().and_then(PgSettings::fence_target);
            elector
                .shared
                .promote(|lease| lease.hold_until(deadline), epoch, fence);
            self.owned[shard as usize] = true;
            started += 1;
        }
        if started > 0 {
            tracing::debug!(key = %self.pg.key, shards = started, "shards gained");
            self.count_moves("gained", started);
        }
    }

    /// Each shard's new epoch with fencing, in one statement (`Some(None)` each without
    /// fencing); `None` for a shard whose bump did not happen.
    async fn bump(&mut self, gained: &[u32]) -> Vec<Option<Option<u64>>> {
        let Some(table) = &self.pg.fencing else {
            return vec![Some(None); gained.len()];
        };
        let Some(session) = self.session.clone() else {
            return vec![None; gained.len()];
        };
        let objects: Vec<i32> = gained.iter().map(|&s| s as i32).collect();
        let bound = self.bound(self.pg.interval);
        let bumped = timeout(
            bound,
            table.bump_free(
                session.client(),
                self.inner.class,
                &objects,
                &self.pg.identity,
            ),
        )
        .await;
        let bumped = match bumped {
            Ok(Ok(bumped)) => bumped,
            Ok(Err(e)) => {
                let loud = self.repeats.loud("bump");
                loud_or_debug!(loud, warn, key = %self.pg.key, table = table.name(), error = %e, "cannot bump the gained shards' fencing epochs; they are tried again at the next check");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(key = %self.pg.key, table = table.name(), ?bound, "the gained shards' fencing epoch bump got no answer in time; they are tried again at the next check");
                Vec::new()
            }
        };
        if bumped.len() < gained.len() {
            tracing::debug!(key = %self.pg.key, busy = gained.len() - bumped.len(), "some gained shards' epoch rows are held by an older term's fenced transactions; their terms wait for the next check");
        }
        let bumped: std::collections::HashMap<i32, u64> = bumped.into_iter().collect();
        gained
            .iter()
            .map(|&s| bumped.get(&(s as i32)).map(|&epoch| Some(epoch)))
            .collect()
    }

    /// Unlocks shards this member holds without a term, in one statement.
    async fn unlock(&mut self, shards: &[u32]) -> Result<(), Loss> {
        if shards.is_empty() {
            return Ok(());
        }
        let Some(session) = self.session.as_deref() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let bound = self.bound(RELEASE_BOUND);
        match sql::unlock(session, self.inner.class, shards, bound).await {
            Ok(not_held) if not_held.is_empty() => Ok(()),
            Ok(not_held) => {
                tracing::warn!(key = %self.pg.key, shards = ?not_held, "the unlock found shards not held");
                Ok(())
            }
            Err(e) => Err(Loss::from_check(Err(e))),
        }
    }

    /// The unlock of moved shards whose work has drained.
    async fn unlock_moved(&mut self, shards: Vec<u32>) -> Result<(), Loss> {
        for &shard in &shards {
            self.draining[shard as usize] = false;
        }
        self.unlock(&shards).await?;
        self.count_moves("moved", shards.len());
        Ok(())
    }

    /// Ends every term, closes the session without an unlock (the server frees every lock
    /// with it).
    fn lose_all(&mut self, loss: &Loss) {
        let lost = self.end_all(TermEnd::LeadershipLost, Change::Lost(loss.cause));
        self.member()
            .demote(TermEnd::LeadershipLost, Change::Lost(loss.cause));
        self.session = None;
        self.inner.publish(0);
        self.count_moves(loss.cause.as_str(), lost);
        tracing::warn!(key = %self.pg.key, cause = %loss, shards = lost, "membership lost; every shard's term ended");
    }

    /// Ends every live term with `end`, and gives up the drains of moved shards; returns how
    /// many shards this member thus gave up (the moved ones still draining included, so that
    /// the moves counter adds up to the owned gauge).
    fn end_all(&mut self, end: TermEnd, change: Change) -> usize {
        let mut ended = 0;
        for i in 0..self.owned.len() {
            if std::mem::take(&mut self.owned[i]) {
                self.inner.shards[i].shared.demote(end, change);
                ended += 1;
            }
            if std::mem::take(&mut self.draining[i]) {
                ended += 1;
            }
        }
        self.drains.abort_all();
        ended
    }

    /// Shutdown: every term ends, the work on every shard drains (up to the drain timeout),
    /// then every lock is unlocked in one statement.
    async fn leave(&mut self) {
        let had: Vec<usize> = (0..self.owned.len())
            .filter(|&i| self.owned[i] || self.draining[i])
            .collect();
        let graces: Vec<_> = (0..self.owned.len())
            .filter(|&i| std::mem::take(&mut self.owned[i]))
            .map(|i| {
                self.inner.shards[i]
                    .shared
                    .demote_to_drain(TermEnd::Shutdown, Change::Released)
            })
            .collect();
        let mut released = graces.len();
        let work: Vec<&InFlight> = had
            .iter()
            .map(|&i| self.inner.shards[i].shared.in_flight())
            .collect();
        let held = match self.session.as_deref() {
            Some(session) => {
                let (inner, pg) = (self.inner, self.pg);
                drain_checked(pg, &work, || async {
                    let view = sql::check(session, inner.class, MEMBER_OBJECT, pg.interval).await;
                    proves_membership(view, pg).map(drop)
                })
                .await
            }
            None => false,
        };
        // The moved shards still draining, and their tasks, end with the others.
        released += self.end_all(TermEnd::Shutdown, Change::Released);
        // The terms' fenced writes end here, before the unlock.
        drop(graces);
        if !held {
            // The session is gone and the server freed every lock with it: nothing to unlock.
            self.session = None;
        }
        if let Some(session) = self.session.take() {
            match timeout(RELEASE_BOUND, sql::unlock_all(&session, RELEASE_BOUND)).await {
                Ok(Ok(())) => {
                    tracing::info!(key = %self.pg.key, shards = released, "left the group; every shard unlocked")
                }
                _ => {
                    tracing::warn!(key = %self.pg.key, "the unlock at shutdown failed or timed out; closing the session frees every lock")
                }
            }
        }
        self.member().demote(TermEnd::Shutdown, Change::Released);
        self.inner.publish(0);
        self.count_moves("released", released);
    }

    fn count_moves(&self, cause: &str, shards: usize) {
        if let (Some(metrics), true) = (&self.inner.metrics, shards > 0) {
            metrics.count_move(cause, shards);
        }
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
