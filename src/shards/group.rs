//! A group's shared state: the membership's and every shard's electors, the owned set's
//! channel and the metrics; and the shard's and the owned set's public types. It imports
//! neither the handle nor the member's loop, which both build on it.

use tokio::sync::watch;

use crate::{Elector, LockKey};

/// The object of the group's member key (the shared lock every member holds); shards are
/// `0..count`.
pub(crate) const MEMBER_OBJECT: i32 = -1;

/// The class of every key of `group`.
pub(crate) fn group_class(group: &str) -> i32 {
    LockKey::from_name(&format!("pg_elector/shards/{group}")).class()
}

/// The object of a member's live mark, a second shared lock of the group's class that a
/// member takes once its first check passed: only members holding it count in the
/// assignment, once they have been seen to start another statement after it. Its object
/// tells the member's shard count, so that members running different counts see it: −2 for
/// one shard, down to −1 − 16 384.
pub(crate) fn live_object(count: u32) -> i32 {
    -1 - count as i32
}

/// The shard count a live mark's `object` tells ([`live_object`]); `None` for an object that
/// is no live mark (a count beyond what a group may have is someone else's lock).
pub(crate) fn count_of_live(object: i32) -> Option<u32> {
    u32::try_from(-1i64 - i64::from(object))
        .ok()
        .filter(|&c| c > 0 && c <= crate::shards::assign::MAX_SHARDS)
}

/// One shard of a group: its index (`0..count`) and its lock key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShardId {
    pub(crate) index: u32,
    pub(crate) key: LockKey,
}

impl ShardId {
    /// The shard's index, `0..count`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The advisory lock its owner holds: the group's class and the shard's index.
    pub fn key(&self) -> LockKey {
        self.key
    }
}

impl PartialOrd for ShardId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ShardId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.key.class(), self.index).cmp(&(other.key.class(), other.index))
    }
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.index)
    }
}

/// What this replica owns, as [`Shards::subscribe`](super::Shards::subscribe) reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ownership {
    /// The shards this replica owns, in index order.
    pub owned: Vec<ShardId>,
    /// How many members count in the last check's assignment (0 while this replica is not a
    /// member, and in the half interval after it joins, before it counts itself).
    pub members: usize,
    /// How many times the owned set changed since the group was built.
    pub changes: u64,
}

pub(crate) struct Inner {
    pub(crate) group: String,
    pub(crate) class: i32,
    /// The membership: its settings (the group's member key, the interval, the identity,
    /// fencing, the drain timeout), its lease and its `run` slot.
    pub(crate) member: Elector,
    /// One handle per shard, over the same state machine as a single elector's.
    pub(crate) shards: Vec<Elector>,
    pub(crate) ownership: watch::Sender<Ownership>,
    pub(crate) metrics: Option<crate::metrics::ShardMetrics>,
}

impl Inner {
    /// Tells subscribers of the owned set, when it changed.
    pub(crate) fn publish(&self, members: usize) {
        let owned: Vec<ShardId> = (0..self.shards.len() as u32)
            .filter(|&i| self.shards[i as usize].is_leader())
            .map(|index| ShardId {
                index,
                key: LockKey::new(self.class, index as i32),
            })
            .collect();
        if let Some(metrics) = &self.metrics {
            metrics.set_owned(owned.len());
        }
        self.ownership.send_if_modified(|now| {
            let changed = now.owned != owned || now.members != members;
            if now.owned != owned {
                now.changes += 1;
            }
            now.owned = owned;
            now.members = members;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_mark_tells_its_count_and_is_no_shard_nor_the_member_key() {
        for count in [1, 2, 48, crate::shards::assign::MAX_SHARDS] {
            let object = live_object(count);
            assert!(object < MEMBER_OBJECT, "{count}: {object}");
            assert_eq!(count_of_live(object), Some(count));
        }
        assert_eq!(count_of_live(MEMBER_OBJECT), None);
        assert_eq!(count_of_live(0), None);
        assert_eq!(count_of_live(i32::MIN), None, "a count no group can have");
    }
}
