//! What [`Replicas`](crate::Replicas) and [`ShardMembers`](crate::ShardMembers) are made of:
//! the members in this process ([`Members`]), what each member's service is handed
//! ([`Replica`], [`ShardMember`]), their builders, the defaults they start with, and what the
//! waiting helpers and faults return ([`Leading`], [`PoolHold`]); what a test reads of them
//! ([`timeline`], [`fenced`]); replicas as processes ([`processes`]); and [`serial`] and
//! [`timing`], how many timing-sensitive tests run at once.

use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::{Elector, ElectorBuilder, LockKey};
use tokio_util::sync::CancellationToken;

use crate::members::sealed::Sealed;
use crate::members::{BoxFuture, member_parts};
use crate::{KitError, TestDb};

pub use crate::builder::MembersBuilder;
pub use crate::faults::PoolHold;
pub use crate::members::{Leading, Member, Members, identity};
pub use crate::shard_members::{ShardMember, ShardMembersBuilder};
pub use crate::slots::{SerialGuard, serial, timing};

/// What a [`Timeline`](crate::Timeline) saw: who led when, as `is_leader()` and the server
/// said, and the overlaps found in it.
pub mod timeline {
    pub use crate::recorder::{
        Overlap, SAMPLE_EVERY, SERVER_EVERY, Seen, ServerView, Span, TimelineBuilder,
    };
}

/// The writes a [`FencedWrites`](crate::FencedWrites) read, and why one could not be
/// recorded.
pub mod fenced {
    pub use crate::fenced_writes::{Interleaving, RecordError, Write};
}

/// Replicas as child processes (feature `replica`, on by default): a
/// [`Fleet`](crate::Fleet) of the running test binary started again, which can be frozen
/// (SIGSTOP), thawed and killed. See the crate's documentation, "Replicas as processes".
#[cfg(feature = "replica")]
pub mod processes {
    pub use crate::fleet::{Event, Fleet, FleetBuilder, What, child, child_with, is_child};
}

/// What a replica's service is handed: what a replica's `main` would build for itself.
#[derive(Clone, Debug)]
pub struct Replica {
    /// Its index among the [`Replicas`](crate::Replicas).
    pub index: usize,
    /// Its elector (identity `replica-<index>`), not yet running.
    pub elector: Elector,
    /// Its pool, through its fault proxy: the elector's pool, for the service's work too.
    pub pool: Pool,
    /// Cancelled when the replica is stopped: the service's shutdown.
    pub shutdown: CancellationToken,
}

/// The key every replica elects on, and whether with fast takeover.
#[doc(hidden)]
#[derive(Debug)]
pub struct ReplicaSpec {
    key: LockKey,
    fast: bool,
}

impl Member for Replica {
    type Builder = ElectorBuilder;

    member_parts!();
}

impl Sealed for Replica {
    type Spec = ReplicaSpec;

    fn builder(spec: &ReplicaSpec, pool: Pool, interval: Duration, index: usize) -> ElectorBuilder {
        Elector::builder(pool, spec.key)
            .check_interval(interval)
            .identity(identity(index))
            .fast_takeover(spec.fast)
    }

    fn build(builder: ElectorBuilder, index: usize, pool: Pool) -> Result<Self, KitError> {
        let elector = builder
            .build()
            .map_err(|e| KitError::Elector(e.to_string()))?;
        Ok(Replica {
            index,
            elector,
            pool,
            shutdown: CancellationToken::new(),
        })
    }

    fn keys(spec: &ReplicaSpec, _first: Option<&Self>) -> Result<(Vec<LockKey>, usize), KitError> {
        Ok((vec![spec.key], 1))
    }

    fn renew_shutdown(&mut self) {
        self.shutdown = CancellationToken::new();
    }

    fn lanes(&self) -> Vec<Elector> {
        vec![self.elector.clone()]
    }

    fn leads(&self, _lane: usize) -> bool {
        self.elector.is_leader()
    }

    fn run_alone(self) -> BoxFuture {
        Box::pin(async move {
            if let Err(e) = self.elector.run(self.shutdown.clone()).await {
                tracing::error!(replica = self.index, error = %e, "the election failed");
            }
        })
    }
}

/// Builds [`Replicas`](crate::Replicas); from [`Replicas::builder`](Members::builder).
pub type ReplicasBuilder<'a> = MembersBuilder<'a, Replica>;

impl ReplicasBuilder<'_> {
    /// How many replicas (default 3).
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// Fast takeover on every elector (default off).
    pub fn fast_takeover(mut self, on: bool) -> Self {
        self.spec.fast = on;
        self
    }
}

impl Members<Replica> {
    /// Replicas electing on `key` in `db`: 3 by default, at
    /// 200 ms.
    pub fn builder(db: &TestDb, key: LockKey) -> ReplicasBuilder<'_> {
        MembersBuilder::new(db, ReplicaSpec { key, fast: false })
    }

    /// The key they elect on.
    pub fn key(&self) -> LockKey {
        self.keys[0]
    }

    /// Replica `index` (its elector, pool and shutdown).
    ///
    /// # Panics
    ///
    /// When there is no replica `index`.
    pub fn replica(&self, index: usize) -> &Replica {
        &self.members[index].role
    }

    /// The replicas whose `is_leader()` is true now.
    pub fn leaders(&self) -> Vec<usize> {
        self.lane_leaders(0)
    }

    /// The one replica that leads now, if exactly one does.
    pub fn leader(&self) -> Option<usize> {
        self.lane_leader(0)
    }

    /// Waits until exactly one replica leads (right after a fault this can still be the old
    /// leader, which has not noticed yet: see [`wait_for_next_term`](Self::wait_for_next_term)).
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when none (or more than one) did within `limit`.
    pub async fn wait_for_leader(&self, limit: Duration) -> Result<Leading, KitError> {
        self.wait_lane(0, None, limit).await
    }

    /// Waits until exactly one replica leads and it is not `old`.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when none did within `limit`.
    pub async fn wait_for_other_leader(
        &self,
        old: usize,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        self.wait_lane(0, Some(old), limit).await
    }

    /// Waits for the next term: until exactly one replica leads in a term that began after
    /// the last fault was put in place (or after this call, when there was none), the same
    /// replica as before or another. What to wait for after a fault that may leave the old
    /// leader leading for a moment before it notices, and after which it may win again. Its
    /// `took` is from the fault (or the call) to the term's first sample on the timeline.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when no term began within `limit`.
    pub async fn wait_for_next_term(&self, limit: Duration) -> Result<Leading, KitError> {
        self.wait_lane_next(0, limit).await
    }

    /// Waits until no replica leads; how long that took.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when one still led after `limit`.
    pub async fn wait_for_no_leader(&self, limit: Duration) -> Result<Duration, KitError> {
        self.wait_until(
            limit,
            || self.leaders().is_empty(),
            || format!("replicas {:?} still lead", self.leaders()),
        )
        .await
    }
}
