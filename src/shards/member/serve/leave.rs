//! A member's unlocks and ends: moved shards unlocked after their drain, every term ended at
//! a loss, and the graceful leave at shutdown.

use super::*;

impl Member<'_> {
    /// Unlocks shards this member holds without a term, in one statement, on a session proven
    /// ours in that statement: one a transaction pooler shares is lost, nothing unlocked.
    pub(super) async fn unlock(&mut self, shards: &[u32]) -> Result<(), Loss> {
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
    pub(super) async fn unlock_moved(&mut self, shards: Vec<u32>) -> Result<(), Loss> {
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
    pub(super) async fn lose_all_then_end_pooled(&mut self, loss: &Loss) {
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
    pub(super) fn lose_all(&mut self, loss: &Loss) {
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
    pub(super) fn end_all(&mut self, end: TermEnd, change: Change) -> usize {
        let ended = self.ledger.end_all();
        for &i in &ended.owned {
            self.inner.shards[i].shared.demote(end, change);
        }
        self.drains.abort_all();
        ended.count()
    }

    /// Shutdown: every term ends, the work on every shard drains (up to the drain timeout),
    /// then every lock is unlocked in one statement.
    pub(super) async fn leave(&mut self) {
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

    pub(super) fn count_moves(&self, cause: &str, shards: usize) {
        if let (Some(metrics), true) = (&self.inner.metrics, shards > 0) {
            metrics.count_move(cause, shards);
        }
    }
}
