//! Which shards the members of the last check make this member's: the assignment
//! ([`assign`]) of the group's shards among the members that count, given who holds which
//! shard, computed again only when the members or the holders changed. Plain state, no I/O:
//! the member ([`super::serve`]) hands it each check's findings and retargets its ledger
//! with the answer.

use crate::shards::assign::assign;

/// The assignment a member follows, and what it was last computed from.
#[derive(Debug)]
pub(super) struct Follow {
    /// The group's salt (its class) and shard count, which the assignment depends on.
    salt: u64,
    count: u32,
    /// The members of the last check, sorted.
    members: Vec<i32>,
    /// The members and the holders (by shard) the targets were last assigned from.
    assigned_from: Option<(Vec<i32>, Vec<Option<i32>>)>,
}

/// What changed at a check: the shards that are now this member's (by index), and whether
/// the member list changed.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Followed {
    pub(super) targets: Vec<bool>,
    pub(super) members_changed: bool,
}

impl Follow {
    pub(super) fn new(salt: u64, count: u32) -> Self {
        Self {
            salt,
            count,
            members: Vec::new(),
            assigned_from: None,
        }
    }

    /// The members of the last check, sorted.
    pub(super) fn members(&self) -> &[i32] {
        &self.members
    }

    /// The members that count (`members`, sorted, `me` among them once this member is live)
    /// and who holds which shard (`holders`, `(shard, pid)`, from the check): the shards they
    /// make this member's, or `None` when neither changed since the last call (the steady
    /// state, which then costs no assignment: it sorts the free shards' pairs, S·N at most).
    /// A member not yet live (`me` not among them) owns nothing. Of two holders of one shard,
    /// which cannot be for an exclusive lock, the first is kept.
    pub(super) fn follow(
        &mut self,
        me: Option<i32>,
        members: Vec<i32>,
        holders: &[(u32, i32)],
    ) -> Option<Followed> {
        let mut by_shard: Vec<Option<i32>> = vec![None; self.count as usize];
        for &(shard, pid) in holders {
            if let Some(holder) = by_shard.get_mut(shard as usize) {
                holder.get_or_insert(pid);
            }
        }
        let input = (members, by_shard);
        if self.assigned_from.as_ref() == Some(&input) {
            return None;
        }
        let owner = assign(self.salt, self.count, &input.0, &input.1);
        let mine = me.and_then(|me| input.0.iter().position(|&pid| pid == me));
        let targets = owner.iter().map(|&m| Some(m) == mine).collect();
        let members_changed = input.0 != self.members;
        if members_changed {
            self.members.clone_from(&input.0);
        }
        self.assigned_from = Some(input);
        Some(Followed {
            targets,
            members_changed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(followed: &Followed) -> usize {
        followed.targets.iter().filter(|&&t| t).count()
    }

    #[test]
    fn the_same_members_and_holders_are_not_assigned_again() {
        let mut follow = Follow::new(7, 8);
        let first = follow
            .follow(Some(10), vec![10, 20], &[])
            .expect("a first assignment");
        assert!(first.members_changed);
        assert_eq!(shares(&first), 4, "half of eight shards: {first:?}");
        assert_eq!(follow.follow(Some(10), vec![10, 20], &[]), None);
        assert_eq!(follow.members(), [10, 20]);
    }

    #[test]
    fn a_new_holder_reassigns_without_a_member_change() {
        let mut follow = Follow::new(7, 4);
        follow.follow(Some(10), vec![10, 20], &[]).unwrap();
        let again = follow.follow(Some(10), vec![10, 20], &[(0, 20)]).unwrap();
        assert!(!again.members_changed);
        assert_eq!(shares(&again), 2);
    }

    #[test]
    fn a_member_not_yet_live_owns_nothing() {
        let mut follow = Follow::new(7, 4);
        let followed = follow.follow(Some(30), vec![10, 20], &[]).unwrap();
        assert_eq!(shares(&followed), 0);
        let followed = follow.follow(None, vec![10, 20, 30], &[]).unwrap();
        assert_eq!(shares(&followed), 0);
    }

    #[test]
    fn the_only_member_owns_every_shard_and_out_of_range_holders_are_ignored() {
        let mut follow = Follow::new(7, 3);
        let followed = follow
            .follow(Some(10), vec![10], &[(9, 20), (1, 10)])
            .unwrap();
        assert_eq!(followed.targets, [true, true, true]);
    }
}
