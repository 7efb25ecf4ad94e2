//! [`Replicas`]: a test's replicas of one service, in this process, each electing on one key
//! through a fault proxy of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use pg_elector::{Elector, ElectorBuilder, LockKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::timeline::{Seen, ServerView, Timeline};
use crate::{FaultProxy, KitError, TestDb};

/// The check interval replicas get unless told otherwise: short, so that a failover takes a
/// fraction of a second, and long enough for a loaded 2-core machine.
pub const TEST_INTERVAL: Duration = Duration::from_millis(200);

/// The `idle_in_transaction_session_timeout` of the replicas' pools unless told otherwise.
pub const TEST_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(1);

/// Connections in each replica's pool unless told otherwise: the elector's two and two for the
/// service's work.
pub const TEST_POOL_SIZE: usize = 4;

type Configure = Arc<dyn Fn(usize, ElectorBuilder) -> ElectorBuilder + Send + Sync>;
type Service = Arc<dyn Fn(Replica) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

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

/// Builds [`Replicas`]; from [`Replicas::builder`].
#[must_use = "a builder does nothing until `start` is called"]
pub struct ReplicasBuilder<'a> {
    db: &'a TestDb,
    key: LockKey,
    count: usize,
    interval: Duration,
    fast: bool,
    pool_size: usize,
    idle_in_transaction: Option<Duration>,
    configure: Option<Configure>,
    service: Option<Service>,
}

impl std::fmt::Debug for ReplicasBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicasBuilder")
            .field("key", &self.key)
            .field("count", &self.count)
            .field("interval", &self.interval)
            .field("fast", &self.fast)
            .finish_non_exhaustive()
    }
}

impl<'a> ReplicasBuilder<'a> {
    /// How many replicas (default 3).
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// Every elector's check interval (default [`TEST_INTERVAL`]).
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.interval = every;
        self
    }

    /// Fast takeover on every elector (default off).
    pub fn fast_takeover(mut self, on: bool) -> Self {
        self.fast = on;
        self
    }

    /// Connections in each replica's pool (default [`TEST_POOL_SIZE`]).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// The `idle_in_transaction_session_timeout` of every replica's pool (default
    /// [`TEST_IDLE_IN_TRANSACTION`]; `None`: the server's). A leader partitioned or frozen in
    /// the middle of a fenced transaction leaves it open, holding the epoch row that the next
    /// term must take: as in production, the server's timeout is what ends it.
    pub fn idle_in_transaction_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_in_transaction = timeout;
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
    /// and a [`Timeline`] over them. Needs a tokio runtime.
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
        let electors: Vec<Elector> = members.iter().map(|m| m.replica.elector.clone()).collect();
        let view = ServerView {
            config: self.db.config(),
            key: self.key,
            identities: (0..self.count).map(identity).collect(),
        };
        let timeline = Timeline::start(&electors, Some(view));
        let mut replicas = Replicas {
            key: self.key,
            interval: self.interval,
            admin: self.db.config(),
            members,
            timeline,
            service: self.service,
            terms_before_fault: std::sync::Mutex::new(None),
        };
        for index in 0..replicas.members.len() {
            replicas.launch(index);
        }
        Ok(replicas)
    }

    async fn member(&self, index: usize) -> Result<Member, KitError> {
        let proxy = FaultProxy::start(self.db.server_addr())
            .await
            .map_err(|e| KitError::io("starting a replica's fault proxy", e))?;
        let mut config = self.db.config_via(proxy.addr());
        if let Some(timeout) = self.idle_in_transaction {
            let options = config.get_options().unwrap_or_default().to_owned();
            config.options(format!(
                "{options} -c idle_in_transaction_session_timeout={}",
                timeout.as_millis().max(1)
            ));
        }
        let pool = crate::pool_from_config(config, self.pool_size);
        let mut builder = Elector::builder(pool.clone(), self.key)
            .check_interval(self.interval)
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
        Ok(Member {
            proxy,
            replica,
            task: None,
        })
    }
}

/// A replica's identity: `replica-<index>`.
pub fn identity(index: usize) -> String {
    format!("replica-{index}")
}

#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) proxy: FaultProxy,
    pub(crate) replica: Replica,
    task: Option<JoinHandle<()>>,
}

/// A leader found by a waiting helper, and how long the wait took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leading {
    /// The replica that leads.
    pub replica: usize,
    /// How long after the call it was first seen leading.
    pub took: Duration,
}

/// A test's replicas of one service: in this process, one elector each on one key, each with a
/// pool of its own through a [`FaultProxy`] of its own, each running the service the test gave
/// ([`ReplicasBuilder::service`]). The faults ([`kill_session`](Self::kill_session),
/// [`partition`](Self::partition), ...) act on one replica, or on whoever leads; the waiting
/// helpers say when a leader leads; [`seen`](Self::seen) tells who led when, and whether two
/// ever overlapped.
///
/// Dropping it aborts every replica (as a crash would) without waiting.
pub struct Replicas {
    key: LockKey,
    interval: Duration,
    pub(crate) admin: tokio_postgres::Config,
    pub(crate) members: Vec<Member>,
    timeline: Timeline,
    service: Option<Service>,
    /// How many terms the timeline had seen when the last fault began.
    terms_before_fault: std::sync::Mutex<Option<usize>>,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("key", &self.key)
            .field("interval", &self.interval)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl Replicas {
    /// Replicas electing on `key` in `db`: 3 by default, at [`TEST_INTERVAL`].
    pub fn builder(db: &TestDb, key: LockKey) -> ReplicasBuilder<'_> {
        ReplicasBuilder {
            db,
            key,
            count: 3,
            interval: TEST_INTERVAL,
            fast: false,
            pool_size: TEST_POOL_SIZE,
            idle_in_transaction: Some(TEST_IDLE_IN_TRANSACTION),
            configure: None,
            service: None,
        }
    }

    /// How many replicas there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The key they elect on.
    pub fn key(&self) -> LockKey {
        self.key
    }

    /// Their check interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Replica `index` (its elector, pool and shutdown).
    ///
    /// # Panics
    ///
    /// When there is no replica `index`.
    pub fn replica(&self, index: usize) -> &Replica {
        &self.members[index].replica
    }

    /// Replica `index`'s fault proxy, for a fault the kit has no call for.
    pub fn proxy(&self, index: usize) -> &FaultProxy {
        &self.members[index].proxy
    }

    /// The replicas whose `is_leader()` is true now.
    pub fn leaders(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.members[i].replica.elector.is_leader())
            .collect()
    }

    /// The one replica that leads now, if exactly one does.
    pub fn leader(&self) -> Option<usize> {
        match self.leaders()[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Waits until exactly one replica leads.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when none (or more than one) did within `limit`.
    pub async fn wait_for_leader(&self, limit: Duration) -> Result<Leading, KitError> {
        self.wait_for_leader_other_than(None, limit).await
    }

    /// Waits until exactly one replica leads and it is not `old`: a new leader after a fault.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when none did within `limit`.
    pub async fn wait_for_new_leader(
        &self,
        old: usize,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        self.wait_for_leader_other_than(Some(old), limit).await
    }

    async fn wait_for_leader_other_than(
        &self,
        old: Option<usize>,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        let start = Instant::now();
        loop {
            if let Some(replica) = self.leader().filter(|&r| Some(r) != old) {
                return Ok(Leading {
                    replica,
                    took: start.elapsed(),
                });
            }
            if start.elapsed() > limit {
                let other = old
                    .map(|o| format!(" other than replica {o}"))
                    .unwrap_or_default();
                return Err(KitError::Timeout(format!(
                    "no single leader{other} within {limit:?} (leading now: {:?})",
                    self.leaders()
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits for the next term: until exactly one replica leads in a term that began after
    /// the last fault was put in place (or after this call, when there was none), the same
    /// replica as before or another. What to wait for after a fault that may leave the old
    /// leader leading for a moment before it notices, and after which it may win again.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when no term began within `limit`.
    pub async fn wait_for_next_leader(&self, limit: Duration) -> Result<Leading, KitError> {
        let start = Instant::now();
        let mark = *self
            .terms_before_fault
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = mark.unwrap_or_else(|| self.timeline.seen().leaders.len());
        loop {
            let seen = self.timeline.seen();
            let newest = seen.leaders.last().filter(|span| span.to.is_none());
            if let Some(span) = newest.filter(|_| seen.leaders.len() > before) {
                if self.leader() == Some(span.replica) {
                    return Ok(Leading {
                        replica: span.replica,
                        took: start.elapsed(),
                    });
                }
            }
            if start.elapsed() > limit {
                return Err(KitError::Timeout(format!(
                    "no term began within {limit:?} (leading now: {:?})",
                    self.leaders()
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits until no replica leads; how long that took.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`] when one still led after `limit`.
    pub async fn wait_for_no_leader(&self, limit: Duration) -> Result<Duration, KitError> {
        let start = Instant::now();
        while !self.leaders().is_empty() {
            if start.elapsed() > limit {
                return Err(KitError::Timeout(format!(
                    "replicas {:?} still lead after {limit:?}",
                    self.leaders()
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(start.elapsed())
    }

    /// Notes where the timeline stands as a fault begins (see
    /// [`wait_for_next_leader`](Self::wait_for_next_leader)).
    pub(crate) fn fault_begins(&self) {
        let terms = self.timeline.seen().leaders.len();
        *self
            .terms_before_fault
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(terms);
    }

    /// Who led when so far, as `is_leader()` and the server said (see [`Seen::overlaps`]).
    pub fn seen(&self) -> Seen {
        self.timeline.seen()
    }

    /// Stops replica `index` gracefully: cancels its shutdown and waits for its service to
    /// return (a leader drains its work and unlocks, as at a deploy).
    pub async fn stop(&mut self, index: usize) {
        self.fault_begins();
        let member = &mut self.members[index];
        member.replica.shutdown.cancel();
        if let Some(task) = member.task.take() {
            if let Err(e) = task.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
    }

    /// Crashes replica `index`: its service's task is aborted (nothing in it runs again) and
    /// every one of its connections is reset, as when its process dies. Returns when the
    /// task is gone.
    pub async fn crash(&mut self, index: usize) {
        self.fault_begins();
        let member = &mut self.members[index];
        if let Some(task) = member.task.take() {
            task.abort();
            let _ = task.await;
        }
        member.proxy.reset();
    }

    /// Starts replica `index` again after [`stop`](Self::stop) or [`crash`](Self::crash),
    /// with a new shutdown token, the same elector and pool (a restarted process with the
    /// same settings).
    pub fn restart(&mut self, index: usize) {
        self.members[index].replica.shutdown = CancellationToken::new();
        self.launch(index);
    }

    /// Stops every replica gracefully, then returns who led when.
    pub async fn finish(mut self) -> Seen {
        for index in 0..self.len() {
            self.stop(index).await;
        }
        self.timeline.seen()
    }

    fn launch(&mut self, index: usize) {
        let member = &mut self.members[index];
        let replica = member.replica.clone();
        let task = match &self.service {
            Some(service) => tokio::spawn(service(replica)),
            None => tokio::spawn(async move {
                if let Err(e) = replica.elector.run(replica.shutdown.clone()).await {
                    tracing::error!(replica = replica.index, error = %e, "the election failed");
                }
            }),
        };
        member.task = Some(task);
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(task) = member.task.take() {
                task.abort();
            }
        }
    }
}
