//! [`Replicas`]: a test's replicas of one service, in this process, each electing on one key
//! through a fault proxy of its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::{Elector, ElectorBuilder, LockKey};
use tokio_util::sync::CancellationToken;

use crate::group::{BoxFuture, Common, Group, Leading, Member, Role, Service, identity};
use crate::{KitError, TestDb};

type Configure = Arc<dyn Fn(usize, ElectorBuilder) -> ElectorBuilder + Send + Sync>;

/// A test's replicas of one service: in this process, one elector each on one key, each with a
/// pool of its own through a [`FaultProxy`](crate::FaultProxy) of its own, each running the
/// service the test gave ([`ReplicasBuilder::service`]). The faults
/// ([`kill_session`](Group::kill_session), [`partition`](Group::partition), ...) act on one
/// replica, or on whoever leads; the waiting helpers say when a leader leads;
/// [`seen`](Group::seen) tells who led when, and whether two ever overlapped.
///
/// Dropping it aborts every replica (as a crash would) without waiting.
pub type Replicas = Group<Replica>;

/// What a replica's service is handed: what a replica's `main` would build for itself.
#[derive(Clone, Debug)]
pub struct Replica {
    /// Its index among the [`Replicas`].
    pub index: usize,
    /// Its elector (identity `replica-<index>`), not yet running.
    pub elector: Elector,
    /// Its pool, through its fault proxy: the elector's pool, for the service's work too.
    pub pool: Pool,
    /// Cancelled when the replica is stopped: the service's shutdown.
    pub shutdown: CancellationToken,
}

impl Role for Replica {
    fn index(&self) -> usize {
        self.index
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }

    fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
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

/// Builds [`Replicas`]; from [`Replicas::builder`](Group::builder).
#[must_use = "a builder does nothing until `start` is called"]
pub struct ReplicasBuilder<'a> {
    db: &'a TestDb,
    key: LockKey,
    count: usize,
    fast: bool,
    common: Common,
    configure: Option<Configure>,
    service: Option<Service<Replica>>,
}

impl std::fmt::Debug for ReplicasBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicasBuilder")
            .field("key", &self.key)
            .field("count", &self.count)
            .field("common", &self.common)
            .field("fast", &self.fast)
            .finish_non_exhaustive()
    }
}

impl ReplicasBuilder<'_> {
    /// How many replicas (default 3).
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// Every elector's check interval (default [`TEST_INTERVAL`](crate::TEST_INTERVAL)).
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.common.interval = every;
        self
    }

    /// Fast takeover on every elector (default off).
    pub fn fast_takeover(mut self, on: bool) -> Self {
        self.fast = on;
        self
    }

    /// Connections in each replica's pool (default [`TEST_POOL_SIZE`](crate::TEST_POOL_SIZE)).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.common.pool_size = size;
        self
    }

    /// The `idle_in_transaction_session_timeout` of every replica's pool (default
    /// [`TEST_IDLE_IN_TRANSACTION`](crate::TEST_IDLE_IN_TRANSACTION); `None`: the server's).
    /// A leader partitioned or frozen in the middle of a fenced transaction leaves it open,
    /// holding the epoch row that the next term must take: as in production, the server's
    /// timeout is what ends it.
    pub fn idle_in_transaction_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.common.idle_in_transaction = timeout;
        self
    }

    /// Sets what else each replica's elector is built with (fencing, a drain timeout, ...);
    /// called with the replica's index and the builder the kit made.
    pub fn configure(
        mut self,
        f: impl Fn(usize, ElectorBuilder) -> ElectorBuilder + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// The service each replica runs, as its `main` would: it gets the replica's elector, pool
    /// and shutdown, and runs the election itself (`elector.run`, or a `Supervisor` with
    /// `.election`). Without it, each replica only runs `elector.run(shutdown)`.
    pub fn service<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Replica) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.service = Some(Arc::new(move |replica| Box::pin(f(replica))));
        self
    }

    /// Starts a fault proxy, a pool and an elector per replica, then every replica's service,
    /// and a [`Timeline`](crate::Timeline) over them. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`KitError::Io`] when a proxy cannot listen, [`KitError::Elector`] when an elector's
    /// settings are refused (an interval below the crate's minimum, say).
    pub async fn start(self) -> Result<Replicas, KitError> {
        let mut members = Vec::with_capacity(self.count);
        for index in 0..self.count {
            members.push(self.member(index).await?);
        }
        let interval = self.common.interval;
        Ok(Group::launch_all(
            self.db,
            vec![self.key],
            1,
            interval,
            members,
            self.service,
        ))
    }

    async fn member(&self, index: usize) -> Result<Member<Replica>, KitError> {
        let (proxy, pool) = self.common.proxy_and_pool(self.db).await?;
        let mut builder = Elector::builder(pool.clone(), self.key)
            .check_interval(self.common.interval)
            .identity(identity(index))
            .fast_takeover(self.fast);
        if let Some(configure) = &self.configure {
            builder = configure(index, builder);
        }
        let elector = builder
            .build()
            .map_err(|e| KitError::Elector(e.to_string()))?;
        let replica = Replica {
            index,
            elector,
            pool,
            shutdown: CancellationToken::new(),
        };
        Ok(Member::new(proxy, replica))
    }
}

impl Group<Replica> {
    /// Replicas electing on `key` in `db`: 3 by default, at
    /// [`TEST_INTERVAL`](crate::TEST_INTERVAL).
    pub fn builder(db: &TestDb, key: LockKey) -> ReplicasBuilder<'_> {
        ReplicasBuilder {
            db,
            key,
            count: 3,
            fast: false,
            common: Common::default(),
            configure: None,
            service: None,
        }
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
    /// leader, which has not noticed yet: see [`wait_for_next_leader`](Self::wait_for_next_leader)).
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
    pub async fn wait_for_new_leader(
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
    pub async fn wait_for_next_leader(&self, limit: Duration) -> Result<Leading, KitError> {
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
