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

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::{Interval, timeout};
use tokio_util::sync::CancellationToken;

use super::sql::{self, TryError, View};
use crate::in_flight::InFlight;
use crate::lease::{deadline_after, now_ms};
use crate::metrics::Change;
use crate::postgres::give_back::drain_checked;
use crate::postgres::lead::watch;
use crate::postgres::lease_length;
use crate::postgres::loss::{Loss, POOLER};
use crate::postgres::repeats::{Repeats, loud_or_debug};
use crate::postgres::session::LockSession;
use crate::postgres::settings::{PgSettings, RELEASE_BOUND};
use crate::postgres::standby::SETTLE;
use crate::shards::assign::assign;
use crate::shards::group::{Inner, MEMBER_OBJECT};
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};

const LOCK_TABLE_FULL: &str = "the server's shared lock table is full, so shards this member should own stay unowned; raise max_locks_per_transaction (the table holds max_locks_per_transaction × (max_connections + max_prepared_transactions) locks, shared by the whole server)";

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
    Drained(u32),
    Tick,
}

/// A member on its lock session. Dropped with the session still held (`run` dropped or
/// panicking), it ends every term and closes the session without an unlock.
pub(super) struct Member<'a> {
    inner: &'a Inner,
    pg: &'a PgSettings,
    session: Option<Box<LockSession>>,
    /// When the granting try was sent: the membership's first lease counts from it.
    joined_at: u64,
    /// The shards whose terms are live.
    owned: Vec<bool>,
    /// The shards whose terms ended because they moved, draining before their unlock.
    draining: Vec<bool>,
    drains: JoinSet<u32>,
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
            session: Some(session),
            joined_at,
            owned: vec![false; count],
            draining: vec![false; count],
            drains: JoinSet::new(),
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
        let deadline = deadline_after(self.joined_at, lease_length(self.pg.interval));
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
                    Event::Drained(shard) => {
                        if let Err(loss) = self.unlock_moved(shard).await {
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
            Some(Ok(shard)) = self.drains.join_next() => Event::Drained(shard),
            _ = ticks.tick() => Event::Tick,
        }
    }

    /// One check, and what it calls for.
    async fn round(&mut self) -> Result<(), Loss> {
        let interval = self.pg.interval;
        let Some(session) = self.session.as_deref() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let lease = self.inner.member.shared.lease();
        let sent_at = now_ms();
        let view = tokio::select! {
            biased;
            cause = watch(lease, session) => return Err(Loss::of(cause)),
            view = sql::check(session, self.inner.class, MEMBER_OBJECT, interval) => view,
        }
        .map_err(|e| Loss::from_check(Err(e)))?;
        if !view.ours {
            tracing::error!(key = %self.pg.key, "{POOLER}: the member's check ran on a server session that is not its lock session, or that another elector's try reached");
            return Err(Loss::of(LossCause::Pooler));
        }
        if !view.members.contains(&view.pid) {
            return Err(Loss::of(LossCause::LockGone));
        }
        // A late answer does not revive a lease that ran out.
        if !lease.is_live() {
            return Err(Loss::of(LossCause::LeaseExpired));
        }
        let deadline = deadline_after(sent_at, lease_length(interval));
        lease.hold_until(deadline);
        self.follow(&view);
        let held = self.renew_or_lose(&view, deadline);
        self.release_moved();
        let mut gained = self.settle_strays(&held).await?;
        gained.extend(self.try_targets(&held).await?);
        if !gained.is_empty() {
            self.start(gained, sent_at).await;
        }
        Ok(())
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
            self.shard(i).demote(TermEnd::Resigned, Change::Resigned);
            self.owned[i] = false;
            self.draining[i] = true;
            moved += 1;
            let shared: Arc<Shared> = self.inner.shards[i].shared.clone();
            let (drain, key) = (self.pg.drain_timeout, self.pg.key);
            let index = i as u32;
            self.drains.spawn(async move {
                if timeout(drain, shared.in_flight().drained()).await.is_err() {
                    tracing::warn!(key = %key, shard = index, still_running = ?shared.in_flight().names(), drain_timeout = ?drain, "a moved shard's work did not finish within the drain timeout; unlocking it anyway");
                }
                index
            });
        }
        if moved > 0 {
            tracing::debug!(key = %self.pg.key, shards = moved, "shards moved to other members; draining before their unlock");
        }
    }

    /// Locks the session holds without a term (a try whose statement failed part way):
    /// this member's become terms, the others are unlocked.
    async fn settle_strays(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let mut adopted = Vec::new();
        for (i, &holds) in held.iter().enumerate() {
            if !holds || self.owned[i] || self.draining[i] {
                continue;
            }
            if self.mine[i] {
                adopted.push(i as u32);
            } else {
                self.unlock(i as u32).await?;
            }
        }
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
        match sql::try_lock(session, self.inner.class, &want, self.pg.interval).await {
            Ok(granted) => Ok(granted),
            Err(TryError::LockTableFull(e)) => {
                let loud = self.repeats.loud("lock table");
                loud_or_debug!(loud, error, key = %self.pg.key, error = %crate::error::chain(&e), "{LOCK_TABLE_FULL}");
                Ok(Vec::new())
            }
            Err(TryError::Session(e)) => Err(Loss::from_check(Err(e))),
        }
    }

    /// Starts the terms of `gained` (granted by a statement sent at `sent_at`), after the
    /// settle wait and, with fencing, each shard's epoch bump.
    async fn start(&mut self, gained: Vec<u32>, sent_at: u64) {
        // A lock freed by a session that ended under its owner: that owner steps down within
        // the watch's poll; this gives it the single elector's settle to do so.
        tokio::time::sleep(SETTLE).await;
        let deadline = deadline_after(sent_at, lease_length(self.pg.interval));
        let mut started = 0;
        for shard in gained {
            let Some(epoch) = self.bump(shard).await else {
                let _ = self.unlock(shard).await;
                continue;
            };
            if now_ms() >= deadline {
                let _ = self.unlock(shard).await;
                continue;
            }
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

    /// The shard's new epoch with fencing (`Some(None)` without); `None` when the bump failed.
    async fn bump(&mut self, shard: u32) -> Option<Option<u64>> {
        let Some(table) = &self.pg.fencing else {
            return Some(None);
        };
        let session = self.session.as_deref()?;
        let key = crate::LockKey::new(self.inner.class, shard as i32);
        let interval = self.pg.interval;
        let bumped = timeout(
            2 * interval,
            table.bump(session.client(), key, &self.pg.identity, interval),
        )
        .await;
        match bumped {
            Ok(Ok(epoch)) => Some(Some(epoch)),
            Ok(Err(e)) => {
                let loud = self.repeats.loud("bump");
                loud_or_debug!(loud, warn, key = %key, table = table.name(), error = %e, "cannot bump the shard's fencing epoch; the shard is given back");
                None
            }
            Err(_) => {
                tracing::warn!(key = %key, table = table.name(), "the shard's fencing epoch bump got no answer in time; the shard is given back");
                None
            }
        }
    }

    /// Unlocks one shard this member holds without a term.
    async fn unlock(&mut self, shard: u32) -> Result<(), Loss> {
        let Some(session) = self.session.as_deref() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        match sql::unlock(session, self.inner.class, shard, RELEASE_BOUND).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(key = %self.pg.key, shard, "the unlock found the shard not held");
                Ok(())
            }
            Err(e) => Err(Loss::from_check(Err(e))),
        }
    }

    /// The unlock of a moved shard whose work has drained.
    async fn unlock_moved(&mut self, shard: u32) -> Result<(), Loss> {
        self.draining[shard as usize] = false;
        self.unlock(shard).await?;
        self.count_moves("moved", 1);
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

    /// Ends every live term with `end`; returns how many there were.
    fn end_all(&mut self, end: TermEnd, change: Change) -> usize {
        let mut ended = 0;
        for i in 0..self.owned.len() {
            if std::mem::take(&mut self.owned[i]) {
                self.inner.shards[i].shared.demote(end, change);
                ended += 1;
            }
        }
        self.drains.abort_all();
        self.draining.fill(false);
        ended
    }

    /// Shutdown: every term ends, the work on every shard drains (up to the drain timeout),
    /// then every lock is unlocked in one statement.
    async fn leave(&mut self) {
        let had: Vec<usize> = (0..self.owned.len())
            .filter(|&i| self.owned[i] || self.draining[i])
            .collect();
        let released = self.end_all(TermEnd::Shutdown, Change::Released);
        let work: Vec<&InFlight> = had
            .iter()
            .map(|&i| self.inner.shards[i].shared.in_flight())
            .collect();
        let held = match self.session.as_deref() {
            Some(session) => {
                let (inner, pg) = (self.inner, self.pg);
                drain_checked(pg, &work, || async {
                    let view = sql::check(session, inner.class, MEMBER_OBJECT, pg.interval).await;
                    match view {
                        Ok(view) if view.ours && view.members.contains(&view.pid) => Ok(()),
                        Ok(_) => Err(Loss::of(LossCause::LockGone)),
                        Err(e) => Err(Loss::from_check(Err(e))),
                    }
                })
                .await
            }
            None => false,
        };
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
