//! What a member's check calls for before its tries: its live mark, the others' marks heard,
//! the warning of another shard count, and the assignment it follows.

use super::*;

impl Member<'_> {
    /// Takes this member's live mark, after its first passed check; whether it did. The others
    /// count it in the assignment once it has started a statement after the mark (its next
    /// round's check), so a join cut off before that, even right after the mark's grant, moves
    /// no shard.
    pub(super) async fn mark_live(&mut self) -> Result<bool, Loss> {
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
    pub(super) async fn ask_heard(&mut self, pids: Vec<i32>) -> Result<(), Loss> {
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
    pub(super) fn warn_other_counts(&mut self, view: &View) {
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
        loud_or_debug!(loud, error, key = %self.pg.key, other_counts = ?other, count, "members of this group run another shard count than this member's; each count's members share the shards among themselves only, so the shards below both counts go to whichever takes them first and the load is uneven until every member runs one count (see the shards guide, \"Changing the count\")");
    }

    /// The members that count (`members`, sorted, this one's pid among them once it is live),
    /// and the shards they make this member's, given who holds which shard now (`holders`,
    /// from the check): the ledger's targets ([`Follow`]).
    pub(super) fn follow(&mut self, members: Vec<i32>, holders: &[(u32, i32)]) {
        let Some(followed) = self.assignment.follow(self.pid, members, holders) else {
            return;
        };
        let share = self.ledger.retarget(followed.targets);
        if followed.members_changed {
            let members = self.assignment.members().len();
            tracing::debug!(key = %self.pg.key, members, share, "the member list changed");
        }
    }
}
