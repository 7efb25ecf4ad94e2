//! [`ShardMembers`](crate::ShardMembers): a test's replicas of a service that spreads its work
//! over a group of shards, each replica a member of the group through a fault proxy of its own.

use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::shards::{Shards, ShardsBuilder};
use pg_elector::{Elector, LockKey};
use tokio_util::sync::CancellationToken;

use crate::builder::MembersBuilder;
use crate::members::sealed::Sealed;
use crate::members::{BoxFuture, Leading, Member, Members, identity, member_parts};
use crate::{KitError, TestDb};

/// What a member's service is handed.
#[derive(Clone, Debug)]
pub struct ShardMember {
    /// Its index among the [`ShardMembers`](crate::ShardMembers).
    pub index: usize,
    /// Its membership of the group (identity `replica-<index>`), not yet running.
    pub shards: Shards,
    /// Its pool, through its fault proxy: the group's pool, for the service's work too.
    pub pool: Pool,
    /// Cancelled when the member is stopped: the service's shutdown.
    pub shutdown: CancellationToken,
}

/// The group every member joins, and its number of shards.
#[doc(hidden)]
#[derive(Debug)]
pub struct ShardSpec {
    group: String,
    shards: u32,
}

impl Member for ShardMember {
    type Builder = ShardsBuilder;

    member_parts!();
}

impl Sealed for ShardMember {
    type Spec = ShardSpec;

    fn builder(spec: &ShardSpec, pool: Pool, interval: Duration, index: usize) -> ShardsBuilder {
        Shards::builder(pool, spec.group.as_str(), spec.shards)
            .check_interval(interval)
            .identity(identity(index))
    }

    fn build(builder: ShardsBuilder, index: usize, pool: Pool) -> Result<Self, KitError> {
        let shards = builder
            .build()
            .map_err(|e| KitError::Elector(e.to_string()))?;
        Ok(ShardMember {
            index,
            shards,
            pool,
            shutdown: CancellationToken::new(),
        })
    }

    /// Each shard's key (the lanes), then the membership's.
    fn keys(_spec: &ShardSpec, first: Option<&Self>) -> Result<(Vec<LockKey>, usize), KitError> {
        let Some(first) = first else {
            return Err(KitError::Elector("a group of shards needs a member".into()));
        };
        let mut keys: Vec<LockKey> = first.shards.all().map(|s| s.key()).collect();
        let lanes = keys.len();
        keys.push(LockKey::new(keys[0].class(), -1));
        Ok((keys, lanes))
    }

    fn renew_shutdown(&mut self) {
        self.shutdown = CancellationToken::new();
    }

    fn lanes(&self) -> Vec<Elector> {
        let shards = &self.shards;
        shards
            .all()
            .filter_map(|s| shards.elector(s).cloned())
            .collect()
    }

    fn leads(&self, lane: usize) -> bool {
        let shards = &self.shards;
        shards
            .shard(lane as u32)
            .is_some_and(|s| shards.is_owner(s))
    }

    fn run_alone(self) -> BoxFuture {
        Box::pin(async move {
            if let Err(e) = self.shards.run(self.shutdown.clone()).await {
                tracing::error!(replica = self.index, error = %e, "the group's run failed");
            }
        })
    }
}

/// Builds [`ShardMembers`](crate::ShardMembers); from [`ShardMembers::builder`](Members::builder).
pub type ShardMembersBuilder<'a> = MembersBuilder<'a, ShardMember>;

impl ShardMembersBuilder<'_> {
    /// How many members (default 3).
    pub fn members(mut self, count: usize) -> Self {
        self.count = count;
        self
    }
}

impl Members<ShardMember> {
    /// Members of the group `group` of `shards` shards in `db`: 3 by default, at
    /// 200 ms.
    pub fn builder(db: &TestDb, group: impl Into<String>, shards: u32) -> ShardMembersBuilder<'_> {
        let group = group.into();
        MembersBuilder::new(db, ShardSpec { group, shards })
    }

    /// How many shards the group has.
    pub fn shard_count(&self) -> u32 {
        self.keys.len() as u32 - 1
    }

    /// Member `index` (its `Shards`, pool and shutdown).
    ///
    /// # Panics
    ///
    /// When there is no member `index`.
    pub fn member(&self, index: usize) -> &ShardMember {
        &self.members[index].role
    }

    /// The members that own shard `shard` now (one, when all is well).
    pub fn owners(&self, shard: u32) -> Vec<usize> {
        self.lane_leaders(shard as usize)
    }

    /// The one member that owns shard `shard` now, if exactly one does.
    pub fn owner(&self, shard: u32) -> Option<usize> {
        self.lane_leader(shard as usize)
    }

    /// The shards member `index` owns now, by index.
    pub fn owned_by(&self, index: usize) -> Vec<u32> {
        let shards = &self.member(index).shards;
        shards.owned().iter().map(|s| s.index()).collect()
    }

    /// Waits until exactly one member owns `shard`, and it is not `old` (any member, with
    /// `None`).
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when none did within `limit`.
    pub async fn wait_for_owner(
        &self,
        shard: u32,
        old: Option<usize>,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        self.wait_lane(shard as usize, old, limit).await
    }

    /// Waits until exactly one member owns `shard` in a term that began after the last fault
    /// (see [`Replicas::wait_for_next_term`](Members::wait_for_next_term)).
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when no term of the shard began within `limit`.
    pub async fn wait_for_next_owner(
        &self,
        shard: u32,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        self.wait_lane_next(shard as usize, limit).await
    }

    /// Waits until every shard has exactly one owner and each of the N running members (see
    /// [`running`](Members::running)) owns ⌊S/N⌋ or ⌈S/N⌉ of the S shards; how long that took.
    /// A running member cut off from the server keeps it from being so.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when it was not so within `limit`, with each member's share.
    pub async fn wait_for_balance(&self, limit: Duration) -> Result<Duration, KitError> {
        self.wait_until(
            limit,
            || self.balanced(),
            || {
                let shares: Vec<usize> = (0..self.len()).map(|i| self.owned_by(i).len()).collect();
                format!("not balanced: shares {shares:?}")
            },
        )
        .await
    }

    fn balanced(&self) -> bool {
        let count = self.shard_count() as usize;
        let members = self.running();
        if members.is_empty() || (0..count as u32).any(|s| self.owners(s).len() != 1) {
            return false;
        }
        let (low, high) = (count / members.len(), count.div_ceil(members.len()));
        members
            .iter()
            .all(|&i| (low..=high).contains(&self.owned_by(i).len()))
    }
}
