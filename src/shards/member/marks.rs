//! Which live marks count: plain state and the rule, no I/O.
//!
//! A live mark in `pg_locks` shows that the server granted it, not that its member heard the
//! grant: a link cut between the grant and its answer leaves a mark that the server keeps
//! until it ends the session (about 4·I), held by a member that will never try a shard. So a
//! mark counts only once its holder has been seen to start another statement after it (its
//! backend's latest statement, read after the check that saw the mark, is no longer the one
//! that took it): it heard the mark's answer. A member takes its mark in one round and speaks
//! again at its next check, half an interval later, so a join cut off before that never
//! counts. A holder once heard counts while it holds its mark; the activity is read only for
//! holders not yet heard, in a statement of its own after the check (which reads `pg_locks`
//! alone, so that it runs when the shared lock table is full).
//!
//! Where the server hides other sessions' activity (another role without `pg_read_all_stats`,
//! or `track_activities` off) this is unknown, and a mark counts as soon as it is seen: a join
//! cut off right after its mark can then leave the others' share of it unowned until the
//! server ends the cut session.

use std::collections::HashSet;

/// A live mark as a member's check saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    /// The backend that holds it.
    pub(super) pid: i32,
    /// Its object, which tells the holder's shard count.
    pub(super) object: i32,
}

/// The holders of this member's count's live marks that were heard: they count.
#[derive(Debug, Default)]
pub(super) struct Marks {
    heard: HashSet<i32>,
}

impl Marks {
    /// The holders of a mark of `object` among `members` (sorted), this member (`me`) aside.
    fn holders(me: i32, object: i32, marks: &[Mark], members: &[i32]) -> Vec<i32> {
        let mut pids: Vec<i32> = marks
            .iter()
            .filter(|m| m.object == object && m.pid != me && members.contains(&m.pid))
            .map(|m| m.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Takes in one check's marks and returns the holders whose activity to read: those not
    /// heard yet. A holder whose mark is gone is forgotten (its pid may come back as another
    /// backend).
    pub(super) fn unheard(
        &mut self,
        me: i32,
        object: i32,
        marks: &[Mark],
        members: &[i32],
    ) -> Vec<i32> {
        let holders = Self::holders(me, object, marks, members);
        self.heard.retain(|pid| holders.contains(pid));
        holders
            .into_iter()
            .filter(|pid| !self.heard.contains(pid))
            .collect()
    }

    /// Takes in what the activity read answered: `Some(true)` heard, `Some(false)` not yet
    /// (or gone), `None` hidden by the server, which counts.
    pub(super) fn hear(&mut self, answers: &[(i32, Option<bool>)]) {
        for &(pid, heard) in answers {
            if heard != Some(false) {
                self.heard.insert(pid);
            }
        }
    }

    /// The members that count, sorted: this member itself (`me`, which knows it heard its own
    /// mark) when it holds its mark, and every holder heard.
    pub(super) fn counted(
        &self,
        me: i32,
        object: i32,
        marks: &[Mark],
        members: &[i32],
    ) -> Vec<i32> {
        let mut live: Vec<i32> = Self::holders(me, object, marks, members)
            .into_iter()
            .filter(|pid| self.heard.contains(pid))
            .collect();
        if marks.contains(&Mark { pid: me, object }) && members.contains(&me) {
            live.push(me);
        }
        live.sort_unstable();
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECT: i32 = 7;
    const ME: i32 = 100;

    fn mark(pid: i32) -> Mark {
        Mark {
            pid,
            object: OBJECT,
        }
    }

    #[test]
    fn a_member_counts_itself_and_is_never_asked_about() {
        let mut m = Marks::default();
        let marks = [mark(ME)];
        assert_eq!(m.unheard(ME, OBJECT, &marks, &[ME]), Vec::<i32>::new());
        assert_eq!(m.counted(ME, OBJECT, &marks, &[ME]), vec![ME]);
    }

    #[test]
    fn a_holder_counts_once_heard_and_is_not_asked_again() {
        let mut m = Marks::default();
        let members = [ME, 5, 6];
        let marks = [mark(ME), mark(5), mark(6)];
        assert_eq!(m.unheard(ME, OBJECT, &marks, &members), vec![5, 6]);
        m.hear(&[(5, Some(false)), (6, Some(true))]);
        assert_eq!(m.counted(ME, OBJECT, &marks, &members), vec![6, ME]);
        assert_eq!(m.unheard(ME, OBJECT, &marks, &members), vec![5]);
        m.hear(&[(5, Some(true))]);
        assert_eq!(m.counted(ME, OBJECT, &marks, &members), vec![5, 6, ME]);
        assert_eq!(m.unheard(ME, OBJECT, &marks, &members), Vec::<i32>::new());
    }

    #[test]
    fn a_holder_that_never_speaks_again_never_counts() {
        let mut m = Marks::default();
        let (members, marks) = ([ME, 5], [mark(ME), mark(5)]);
        for _ in 0..10 {
            assert_eq!(m.unheard(ME, OBJECT, &marks, &members), vec![5]);
            m.hear(&[(5, Some(false))]);
            assert_eq!(m.counted(ME, OBJECT, &marks, &members), vec![ME]);
        }
    }

    #[test]
    fn a_hidden_activity_counts_the_mark() {
        let mut m = Marks::default();
        let (members, marks) = ([ME, 5], [mark(ME), mark(5)]);
        m.unheard(ME, OBJECT, &marks, &members);
        m.hear(&[(5, None)]);
        assert_eq!(m.counted(ME, OBJECT, &marks, &members), vec![5, ME]);
    }

    #[test]
    fn a_pid_whose_mark_went_away_must_be_heard_again() {
        let mut m = Marks::default();
        let members = [ME, 5];
        m.unheard(ME, OBJECT, &[mark(5)], &members);
        m.hear(&[(5, Some(true))]);
        assert_eq!(m.counted(ME, OBJECT, &[mark(5)], &members), vec![5]);
        assert_eq!(m.unheard(ME, OBJECT, &[], &members), Vec::<i32>::new());
        // The same pid, a new backend: asked about again, not counted until heard.
        assert_eq!(m.unheard(ME, OBJECT, &[mark(5)], &members), vec![5]);
        assert_eq!(
            m.counted(ME, OBJECT, &[mark(5)], &members),
            Vec::<i32>::new()
        );
    }

    #[test]
    fn a_mark_of_another_count_or_of_no_member_does_not_count() {
        let mut m = Marks::default();
        let other = Mark {
            pid: 6,
            object: OBJECT + 1,
        };
        let marks = [mark(5), other];
        assert_eq!(m.unheard(ME, OBJECT, &marks, &[ME, 6]), Vec::<i32>::new());
        m.hear(&[(6, Some(true))]);
        assert_eq!(m.counted(ME, OBJECT, &marks, &[ME, 6]), Vec::<i32>::new());
    }
}
