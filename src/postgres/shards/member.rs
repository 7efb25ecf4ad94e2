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
use crate::shards::assign::assign;
use crate::shards::group::{Inner, MEMBER_OBJECT, count_of_live, live_object};
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
    /// The members of the last check, sorted.
    members: Vec<i32>,
    /// The members and the holders (by shard) the targets were last assigned from.
    assigned_from: Option<(Vec<i32>, Vec<Option<i32>>)>,
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
            members: Vec::new(),
            assigned_from: None,
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
                            self.lose_all_then_end_pooled(&loss).await;
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

    /// Takes this member's live mark, after its first passed check; whether it did. The others
    /// count it in the assignment once it has started a statement after the mark (its next
    /// round's check), so a join cut off before that, even right after the mark's grant, moves
    /// no shard.
    async fn mark_live(&mut self) -> Result<bool, Loss> {
        let Some(session) = self.session.clone() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let bound = self.bound(self.pg.interval);
        let e = match sql::mark_live(&session, self.inner.class, self.live_object(), bound).await {
            Ok(true) => return Ok(true),
            Ok(false) => return proven(Ok(Check::SharedSession), self.pg.key).map(|()| false),
            Err(e) => e,
        };
        // The member stays in the group, not yet counted, and takes its mark at a later check.
        let Some(raise) = lock_table::full(&e) else {
            return Err(Loss::failed(Statement::LiveMark, e));
        };
        let loud = self.repeats.loud("lock table");
        loud_or_debug!(loud, error, key = %self.pg.key, error = %e, fix = raise, "the server's shared lock table is full, so this member cannot take its live mark and owns no shard yet");
        Ok(false)
    }

    /// Reads whether the holders `pids` of live marks not yet heard have spoken since they took
    /// their marks: those that have count from now on. A read refused for a full lock table
    /// (it may look role memberships up in a shared catalog) counts nobody new, ends nothing,
    /// and is tried again next round; a read refused for good (no right to
    /// `pg_stat_get_activity`, say) counts them all, as activity the server hides does; a
    /// read with no answer in time ends the session, as every statement on it does.
    async fn ask_heard(&mut self, pids: Vec<i32>) -> Result<(), Loss> {
        let Some(session) = self.session.clone() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let bound = self.bound(self.pg.interval);
        match sql::heard(&session, &pids, bound).await {
            Ok(answers) => self.marks.hear(&answers),
            Err(e) if lock_table::full(&e).is_some() => {
                let loud = self.repeats.loud("activity");
                loud_or_debug!(loud, warn, key = %self.pg.key, error = %e, "the server's shared lock table is full, so this member cannot read whether members that just took their live mark hear the server; they do not count here until it can");
            }
            Err(SessionError::Query(e)) if e.as_db_error().is_some() => {
                let loud = self.repeats.loud("activity");
                loud_or_debug!(loud, warn, key = %self.pg.key, error = %e, "cannot read whether members that just took their live mark hear the server; they count at once, so a join cut off right after its mark can leave shards unowned until the server ends its session");
                let hidden: Vec<(i32, Option<bool>)> =
                    pids.iter().map(|&pid| (pid, None)).collect();
                self.marks.hear(&hidden);
            }
            Err(e) => return Err(Loss::failed(Statement::Heard, e)),
        }
        Ok(())
    }

    /// Says at ERROR (once a minute) that members of the group run other shard counts: each
    /// count's members assign the shards among themselves alone, by other rules.
    fn warn_other_counts(&mut self, view: &View) {
        let other: Vec<u32> = view
            .other_marks(self.live_object())
            .into_iter()
            .filter_map(count_of_live)
            .collect();
        if other.is_empty() {
            return;
        }
        let loud = self.repeats.loud("shard count");
        let count = self.inner.shards.len();
        loud_or_debug!(loud, error, key = %self.pg.key, "members of this group run another shard count ({other:?}) than this member's {count}; each count's members share the shards among themselves only, so the shards below both counts go to whichever takes them first and the load is uneven until every member runs one count (see the README on changing the count)");
    }

    /// The members that count (`members`, sorted, this one's pid among them once it is live),
    /// and the shards they make this member's, given who holds which shard now (`holders`,
    /// from the check). A member not yet live owns nothing.
    fn follow(&mut self, members: Vec<i32>, holders: &[(u32, i32)]) {
        let count = self.inner.shards.len();
        let mut by_shard: Vec<Option<i32>> = vec![None; count];
        for &(shard, pid) in holders {
            if let Some(holder) = by_shard.get_mut(shard as usize) {
                // Two holders of one exclusive lock cannot be: the first is kept.
                holder.get_or_insert(pid);
            }
        }
        // Unchanged holders and members (the steady state) leave the targets as they are: the
        // assignment sorts the free shards' pairs, S·N of them at most.
        let input = (members.clone(), by_shard);
        if self.assigned_from.as_ref() == Some(&input) {
            return;
        }
        let owner = assign(
            self.inner.class as u32 as u64,
            count as u32,
            &input.0,
            &input.1,
        );
        self.assigned_from = Some(input);
        let me = self
            .pid
            .and_then(|me| members.iter().position(|&pid| pid == me));
        let share = self.ledger.retarget(owner.iter().map(|&m| Some(m) == me));
        if members != self.members {
            tracing::debug!(
                key = %self.pg.key,
                members = members.len(),
                share,
                "the member list changed"
            );
            self.members = members;
        }
    }

    /// Renews the lease of every owned shard the check lists, and ends the term of one it no
    /// longer lists. Returns which shards the session holds.
    fn renew_or_lose(&mut self, view: &View, deadline: u64) -> Vec<bool> {
        let held = self.ledger.held(&view.held);
        let renewal = self.ledger.renew_or_lose(&held);
        for &i in &renewal.renew {
            self.shard(i).lease().hold_until(deadline);
        }
        for &i in &renewal.lost {
            self.shard(i)
                .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::LockGone));
        }
        let lost = renewal.lost.len();
        if lost > 0 {
            tracing::warn!(key = %self.pg.key, shards = lost, "the session no longer holds some shards; their terms ended");
            self.count_moves(LossCause::LockGone.as_str(), lost);
        }
        held
    }

    /// Ends the term of every owned shard that is no longer this member's, and drains it
    /// before its unlock.
    fn release_moved(&mut self) {
        let moved = self.ledger.start_draining();
        for &i in &moved {
            let grace = self.shard(i).demote_to_drain(TermEnd::Moved, Change::Moved);
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
        if !moved.is_empty() {
            tracing::debug!(key = %self.pg.key, shards = moved.len(), "shards moved to other members; draining before their unlock");
        }
    }

    /// Locks the session holds without a term (a try whose statement failed part way):
    /// this member's become terms, the others are unlocked.
    async fn settle_strays(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let strays = self.ledger.strays(held);
        self.unlock(&strays.unlock).await?;
        Ok(strays.adopt)
    }

    /// Tries every shard this member should own and does not hold.
    async fn try_targets(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let want = self.ledger.to_try(held);
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
            return Err(Loss::failed(Statement::Try, e));
        };
        let loud = self.repeats.loud("lock table");
        loud_or_debug!(loud, error, key = %self.pg.key, error = %e, fix = raise, "the server's shared lock table is full, so shards this member should own stay unowned");
        Ok(Vec::new())
    }

    /// Starts the terms of `gained` (granted by a statement sent at `sent_at`), after the
    /// settle wait and, with fencing, the epoch bump of each. A shard whose bump did not
    /// happen (its row held by an old term's fenced transaction, the statement failed, the
    /// lease too short by then) stays locked without a term: the next round adopts it and
    /// bumps it again. Returns how many of `gained` stay locked without a term.
    async fn start(&mut self, gained: Vec<u32>, sent_at: u64) -> usize {
        // A lock freed by a session that ended under its owner: that owner steps down within
        // the watch's poll; this gives it the single elector's settle to do so.
        tokio::time::sleep(SETTLE).await;
        let deadline = deadline_after(sent_at, lease_length(self.pg.interval));
        let epochs = self.bump(&gained).await;
        if now_ms() >= deadline {
            return gained.len();
        }
        let count = gained.len();
        let mut started = 0;
        for (shard, epoch) in gained.into_iter().zip(epochs) {
            let Some(epoch) = epoch else { continue };
            if !self.ledger.gain(shard as usize) {
                continue;
            }
            let elector = &self.inner.shards[shard as usize];
            let fence = elector.pg().and_then(PgSettings::fence_target);
            elector
                .shared
                .promote(|lease| lease.hold_until(deadline), epoch, fence);
            started += 1;
        }
        if started > 0 {
            tracing::debug!(key = %self.pg.key, shards = started, "shards gained");
            self.count_moves("gained", started);
        }
        count - started
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
                // Each on its own clock, as the elector's: a missing table right after a busy
                // row's WARN is still said at ERROR.
                let operator = e.needs_an_operator();
                let loud = self
                    .repeats
                    .loud(if operator { "bump: no table" } else { "bump" });
                if operator {
                    loud_or_debug!(loud, error, key = %self.pg.key, table = table.name(), error = %e, "cannot bump the gained shards' fencing epochs; they are tried again at the next check");
                } else {
                    loud_or_debug!(loud, warn, key = %self.pg.key, table = table.name(), error = %e, "cannot bump the gained shards' fencing epochs; they are tried again at the next check");
                }
                return vec![None; gained.len()];
            }
            Err(_) => {
                tracing::warn!(key = %self.pg.key, table = table.name(), ?bound, "the gained shards' fencing epoch bump got no answer in time; they are tried again at the next check");
                return vec![None; gained.len()];
            }
        };
        if bumped.len() < gained.len() {
            let busy = gained.len() - bumped.len();
            let loud = self.repeats.loud("busy epoch rows");
            loud_or_debug!(loud, warn, key = %self.pg.key, table = table.name(), "{busy} gained shards stay locked but unowned: an older term's fenced transaction still holds their epoch rows (idle in transaction?); set idle_in_transaction_session_timeout on the application's pool. Tried again at every check");
        }
        let bumped: std::collections::HashMap<i32, u64> = bumped.into_iter().collect();
        gained
            .iter()
            .map(|&s| bumped.get(&(s as i32)).map(|&epoch| Some(epoch)))
            .collect()
    }

    /// Unlocks shards this member holds without a term, in one statement, on a session proven
    /// ours in that statement: one a transaction pooler shares is lost, nothing unlocked.
    async fn unlock(&mut self, shards: &[u32]) -> Result<(), Loss> {
        if shards.is_empty() {
            return Ok(());
        }
        let Some(session) = self.session.as_deref() else {
            return Err(Loss::of(LossCause::Abandoned));
        };
        let bound = self.bound(RELEASE_BOUND);
        match sql::unlock(session, self.inner.class, shards, bound).await {
            Ok(Unlocked::Done(not_held)) if not_held.is_empty() => Ok(()),
            Ok(Unlocked::Done(not_held)) => {
                tracing::warn!(key = %self.pg.key, shards = ?not_held, "the unlock found shards not held");
                Ok(())
            }
            Ok(Unlocked::NotOurs) => proven(Ok(Check::SharedSession), self.pg.key),
            Err(e) => Err(Loss::failed(Statement::Unlock, e)),
        }
    }

    /// The unlock of moved shards whose work has drained. They stay draining until the unlock
    /// answered, so that a session lost meanwhile counts them with the rest.
    async fn unlock_moved(&mut self, shards: Vec<u32>) -> Result<(), Loss> {
        self.unlock(&shards).await?;
        let moved = shards
            .iter()
            .filter(|&&shard| self.ledger.unlocked(shard as usize))
            .count();
        self.count_moves("moved", moved);
        Ok(())
    }

    /// Ends every term, then, when the loss was a transaction pooler found sharing the
    /// session, ends the server session of this member's locks (which the pooler would keep
    /// open, locks and all, until its `server_lifetime`). The terms end first: once that
    /// server session is gone another member may take the shards at once, and this member's
    /// terms must be over by then.
    async fn lose_all_then_end_pooled(&mut self, loss: &Loss) {
        let pooled = match (loss.cause, self.pid, self.session.clone()) {
            (LossCause::Pooler, Some(pid), Some(session)) => Some((pid, session)),
            _ => None,
        };
        self.lose_all(loss);
        let Some((pid, session)) = pooled else {
            return;
        };
        let bound = self.pg.interval.min(RELEASE_BOUND);
        match sql::end_backend(&session, self.inner.class, MEMBER_OBJECT, pid, bound).await {
            Ok(true) => {
                tracing::warn!(key = %self.pg.key, pid, "ended the server session of this member's locks, which the transaction pooler would have kept open")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(key = %self.pg.key, pid, error = %e, "cannot end the server session of this member's locks behind the transaction pooler; they stay held until the pooler closes it (server_lifetime)")
            }
        }
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
        let ended = self.ledger.end_all();
        for &i in &ended.owned {
            self.inner.shards[i].shared.demote(end, change);
        }
        self.drains.abort_all();
        ended.count()
    }

    /// Shutdown: every term ends, the work on every shard drains (up to the drain timeout),
    /// then every lock is unlocked in one statement.
    async fn leave(&mut self) {
        let had = self.ledger.owned_or_draining();
        let graces: Vec<_> = self
            .ledger
            .lose_owned()
            .into_iter()
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
            let unlocked = sql::unlock_group(&session, self.inner.class, RELEASE_BOUND);
            match timeout(RELEASE_BOUND, unlocked).await {
                Ok(Ok(Unlocked::Done(_))) => {
                    tracing::info!(key = %self.pg.key, shards = released, "left the group; every shard unlocked")
                }
                Ok(Ok(Unlocked::NotOurs)) => {
                    tracing::error!(key = %self.pg.key, "{POOLER}: the unlock at shutdown ran on a server session that is not the lock session, so it unlocked nothing")
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
