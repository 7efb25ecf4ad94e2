//! A member's shard terms: renewed or lost at each check, moved shards drained, strays
//! settled, targets tried, gained shards bumped and started.

use super::*;

impl Member<'_> {
    /// Renews the lease of every owned shard the check lists, and ends the term of one it no
    /// longer lists. Returns which shards the session holds.
    pub(super) fn renew_or_lose(&mut self, view: &View, deadline: u64) -> Vec<bool> {
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
    pub(super) fn release_moved(&mut self) {
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
    pub(super) async fn settle_strays(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
        let strays = self.ledger.strays(held);
        self.unlock(&strays.unlock).await?;
        Ok(strays.adopt)
    }

    /// Tries every shard this member should own and does not hold.
    pub(super) async fn try_targets(&mut self, held: &[bool]) -> Result<Vec<u32>, Loss> {
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
    pub(super) async fn start(&mut self, gained: Vec<u32>, sent_at: u64) -> usize {
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
    pub(super) async fn bump(&mut self, gained: &[u32]) -> Vec<Option<Option<u64>>> {
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
}
