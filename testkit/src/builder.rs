//! [`MembersBuilder`]: the one builder of a [`Members`], for [`Replicas`](crate::Replicas)
//! ([`ReplicasBuilder`](crate::replicas::ReplicasBuilder)) and
//! [`ShardMembers`](crate::ShardMembers)
//! ([`ShardMembersBuilder`](crate::replicas::ShardMembersBuilder)). What differs between the
//! two (the key, or the group and its shards; how a member's election is built) is the
//! [`Member`]'s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::members::{Common, Member, Members, Service, Slot};
use crate::{KitError, TestDb};

type Configure<B> = Arc<dyn Fn(usize, B) -> B + Send + Sync>;

/// Builds a [`Members`]; from [`Replicas::builder`](Members::builder) or
/// [`ShardMembers::builder`](Members::builder).
#[must_use = "a builder does nothing until `start` is called"]
pub struct MembersBuilder<'a, R: Member> {
    pub(crate) db: &'a TestDb,
    pub(crate) spec: R::Spec,
    pub(crate) count: usize,
    pub(crate) common: Common,
    configure: Option<Configure<R::Builder>>,
    service: Option<Service<R>>,
}

impl<R: Member> std::fmt::Debug for MembersBuilder<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembersBuilder")
            .field("spec", &self.spec)
            .field("count", &self.count)
            .field("common", &self.common)
            .finish_non_exhaustive()
    }
}

impl<'a, R: Member> MembersBuilder<'a, R> {
    /// Three members of `spec` in `db`, at a check interval of 200 ms.
    pub(crate) fn new(db: &'a TestDb, spec: R::Spec) -> Self {
        Self {
            db,
            spec,
            count: 3,
            common: Common::default(),
            configure: None,
            service: None,
        }
    }

    /// Every member's check interval (default 200 ms).
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.common.interval = every;
        self
    }

    /// Connections in each member's pool (default 4).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.common.pool_size = size;
        self
    }

    /// The `idle_in_transaction_session_timeout` of every member's pool (default 1 s; `None`:
    /// the server's).
    /// A leader partitioned or frozen in the middle of a fenced transaction leaves it open,
    /// holding the epoch row that the next term must take: as in production, the server's
    /// timeout is what ends it.
    pub fn idle_in_transaction_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.common.idle_in_transaction = timeout;
        self
    }

    /// Sets what else each member's election is built with (fencing, a drain timeout, ...):
    /// called with the member's index and the builder the kit made (an
    /// [`ElectorBuilder`](pg_elector::ElectorBuilder) for a replica, a
    /// [`ShardsBuilder`](pg_elector::shards::ShardsBuilder) for a shard member).
    pub fn configure(
        mut self,
        f: impl Fn(usize, R::Builder) -> R::Builder + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// The service each member runs, as its `main` would: it gets what the member's `main`
    /// would build for itself (its elector or its `Shards`, its pool and its shutdown), and
    /// runs the election itself (`elector.run`, `shards.run`, or a `Supervisor` with
    /// `.election`). Without it, each member only runs its election.
    pub fn service<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(R) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.service = Some(Arc::new(move |role| Box::pin(f(role))));
        self
    }

    /// Starts a fault proxy, a pool and an election per member, then every member's service,
    /// and a [`Timeline`](crate::Timeline) with a lane per key (per shard). Needs a tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// [`KitError::Io`] when a proxy cannot listen, [`KitError::Elector`] when the settings
    /// are refused (an interval below the crate's minimum, say), or a group of shards has no
    /// member.
    pub async fn start(self) -> Result<Members<R>, KitError> {
        let mut members = Vec::with_capacity(self.count);
        for index in 0..self.count {
            members.push(self.member(index).await?);
        }
        let first = members.first().map(|m| &m.role);
        let (keys, lanes) = R::keys(&self.spec, first)?;
        Ok(Members::launch_all(
            self.db,
            keys,
            lanes,
            self.common.interval,
            members,
            self.service,
        ))
    }

    async fn member(&self, index: usize) -> Result<Slot<R>, KitError> {
        let (proxy, pool) = self.common.proxy_and_pool(self.db).await?;
        let mut builder = R::builder(&self.spec, pool.clone(), self.common.interval, index);
        if let Some(configure) = &self.configure {
            builder = configure(index, builder);
        }
        Ok(Slot::new(proxy, R::build(builder, index, pool)?))
    }
}
