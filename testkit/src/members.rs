//! [`Members`]: what [`Replicas`](crate::Replicas) and [`ShardMembers`](crate::ShardMembers)
//! share: members in this process, each behind a fault proxy of its own, running the test's
//! service, watched by a [`Timeline`], with the waiting helpers. The faults are in `faults.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use pg_elector::{Elector, LockKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Timeline;
use crate::recorder::{Seen, ServerView, Span};
use crate::{FaultProxy, KitError, TestDb};

/// The check interval members get unless told otherwise: short, so that a failover takes a
/// fraction of a second, and long enough for a loaded 2-core machine.
pub(crate) const TEST_INTERVAL: Duration = Duration::from_millis(200);

/// The `idle_in_transaction_session_timeout` of the members' pools unless told otherwise.
pub(crate) const TEST_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(1);

/// Connections in each member's pool unless told otherwise: the election's two and two for
/// the service's work.
pub(crate) const TEST_POOL_SIZE: usize = 4;

pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
pub(crate) type Service<C> = Arc<dyn Fn(C) -> BoxFuture + Send + Sync>;

pub(crate) mod sealed {
    use std::time::Duration;

    use deadpool_postgres::Pool;
    use pg_elector::{Elector, LockKey};

    use super::{BoxFuture, Member};
    use crate::KitError;

    /// What the kit does with a member and a test does not: a private supertrait of
    /// [`Member`], so that no crate but this one implements it.
    pub trait Sealed: Clone + Send + Sync + 'static {
        /// What every member's election is built from: the key, or the group and its shards.
        type Spec: std::fmt::Debug + Send + Sync;
        /// A new shutdown token, for a restart.
        fn renew_shutdown(&mut self);
        /// The electors a timeline watches, one per key (per shard).
        fn lanes(&self) -> Vec<Elector>;
        /// Whether it leads (owns) the key of `lane` now.
        fn leads(&self, lane: usize) -> bool;
        /// What the member runs when the test gave no service: its election alone.
        fn run_alone(self) -> BoxFuture;
        /// The builder the kit makes for member `index`, before the test's `configure`.
        fn builder(
            spec: &Self::Spec,
            pool: Pool,
            interval: Duration,
            index: usize,
        ) -> <Self as Member>::Builder
        where
            Self: Member;
        /// Builds member `index` from its builder.
        fn build(
            builder: <Self as Member>::Builder,
            index: usize,
            pool: Pool,
        ) -> Result<Self, KitError>
        where
            Self: Member;
        /// Every key a member's lock session may hold, and how many of the first are the
        /// timeline's lanes; `first` is the first member, if there is one.
        fn keys(spec: &Self::Spec, first: Option<&Self>)
        -> Result<(Vec<LockKey>, usize), KitError>;
    }
}

/// What a member's service is handed: [`Replica`](crate::replicas::Replica) or
/// [`ShardMember`](crate::replicas::ShardMember). Sealed: not implemented outside this crate.
pub trait Member: sealed::Sealed {
    /// The builder of a member's election, as a test's
    /// [`configure`](crate::replicas::MembersBuilder::configure) sees it.
    type Builder;
    /// Its index among the members.
    fn index(&self) -> usize;
    /// Its pool, through its fault proxy.
    fn pool(&self) -> &Pool;
    /// Its shutdown.
    fn shutdown(&self) -> &CancellationToken;
}

/// The [`Member`] methods of a member's `index`, `pool` and `shutdown` fields, which both
/// kinds of member have.
macro_rules! member_parts {
    () => {
        fn index(&self) -> usize {
            self.index
        }

        fn pool(&self) -> &Pool {
            &self.pool
        }

        fn shutdown(&self) -> &CancellationToken {
            &self.shutdown
        }
    };
}
pub(crate) use member_parts;

/// The settings every member shares, before its election is built.
#[derive(Debug)]
pub(crate) struct Common {
    pub(crate) interval: Duration,
    pub(crate) pool_size: usize,
    pub(crate) idle_in_transaction: Option<Duration>,
}

impl Default for Common {
    fn default() -> Self {
        Self {
            interval: TEST_INTERVAL,
            pool_size: TEST_POOL_SIZE,
            idle_in_transaction: Some(TEST_IDLE_IN_TRANSACTION),
        }
    }
}

impl Common {
    /// A fault proxy in front of `db`'s server and a pool through it.
    pub(crate) async fn proxy_and_pool(&self, db: &TestDb) -> Result<(FaultProxy, Pool), KitError> {
        let proxy = FaultProxy::start(db.server_addr())
            .await
            .map_err(|e| KitError::io("starting a member's fault proxy", e))?;
        let mut config = db.config_via(proxy.addr());
        if let Some(timeout) = self.idle_in_transaction {
            let options = config.get_options().unwrap_or_default().to_owned();
            config.options(format!(
                "{options} -c idle_in_transaction_session_timeout={}",
                timeout.as_millis().max(1)
            ));
        }
        Ok((
            proxy,
            crate::database::pool_from_config(config, self.pool_size),
        ))
    }
}

/// A member's identity (`application_name` of its lock session) unless the test's
/// `configure` sets another: `replica-<index>`.
pub fn identity(index: usize) -> String {
    format!("replica-{index}")
}

/// The `application_name` the server shows for `role`'s lock session: its election's identity
/// (the kit's [`identity`], or the one `configure` set), cut as PostgreSQL cuts it, to 63
/// bytes. (An identity with characters outside printable ASCII, which the server rewrites,
/// is not matched.)
pub(crate) fn server_name<C: Member>(role: &C) -> String {
    let named = role
        .lanes()
        .first()
        .and_then(|e| e.identity().map(str::to_owned));
    let mut name = named.unwrap_or_else(|| identity(role.index()));
    let mut cut = name.len().min(63);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    name
}

#[derive(Debug)]
pub(crate) struct Slot<C> {
    pub(crate) proxy: FaultProxy,
    pub(crate) role: C,
    task: Option<JoinHandle<()>>,
}

impl<C> Slot<C> {
    pub(crate) fn new(proxy: FaultProxy, role: C) -> Self {
        Self {
            proxy,
            role,
            task: None,
        }
    }
}

/// A leader (or owner) found by a waiting helper, and how long the wait took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leading {
    /// The member that leads.
    pub replica: usize,
    /// How long after the call it was first seen leading (for the `wait_for_next_*` helpers:
    /// after the last fault).
    pub took: Duration,
}

/// Where the timeline stood as a fault began: how many terms it had seen, and when.
#[derive(Clone, Copy, Debug)]
struct FaultMark {
    terms: usize,
    at: Duration,
}

/// Members of one service in this process, each behind a fault proxy of its own: see
/// [`Replicas`](crate::Replicas) (one elector each) and [`ShardMembers`](crate::ShardMembers)
/// (a member of a group of shards each).
///
/// Dropping it aborts every member (as a crash would) without waiting.
pub struct Members<C> {
    /// Every key a member's lock session may hold (for a shard member: each shard's and the
    /// membership's); the lanes of the timeline are the first `lanes` of them.
    pub(crate) keys: Vec<LockKey>,
    pub(crate) interval: Duration,
    pub(crate) admin: tokio_postgres::Config,
    pub(crate) members: Vec<Slot<C>>,
    timeline: Timeline,
    service: Option<Service<C>>,
    last_fault: Mutex<Option<FaultMark>>,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Members<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field("keys", &self.keys.len())
            .field("interval", &self.interval)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl<C: Member> Members<C> {
    /// Starts every member's service and a timeline over them, on one lane per key of
    /// `lanes` (the first keys of `keys`).
    pub(crate) fn launch_all(
        db: &TestDb,
        keys: Vec<LockKey>,
        lanes: usize,
        interval: Duration,
        members: Vec<Slot<C>>,
        service: Option<Service<C>>,
    ) -> Self {
        let electors: Vec<Vec<Elector>> = members.iter().map(|m| m.role.lanes()).collect();
        let view = ServerView {
            config: db.config(),
            keys: keys[..lanes].to_vec(),
            identities: members.iter().map(|m| server_name(&m.role)).collect(),
        };
        let timeline = Timeline::builder_lanes(electors).server(view).start();
        let mut group = Self {
            keys,
            interval,
            admin: db.config(),
            members,
            timeline,
            service,
            last_fault: Mutex::new(None),
        };
        for index in 0..group.members.len() {
            group.launch(index);
        }
        group
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Their check interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Member `index`'s fault proxy, for a fault the kit has no call for.
    ///
    /// # Panics
    ///
    /// When there is no member `index`.
    pub fn proxy(&self, index: usize) -> &FaultProxy {
        &self.members[index].proxy
    }

    /// Who led (owned) what when so far, as `is_leader()` and the server said (see
    /// [`Seen::overlaps`]).
    pub fn seen(&self) -> Seen {
        self.timeline.seen()
    }

    /// Stops member `index` gracefully: cancels its shutdown and waits for its service to
    /// return (a leader drains its work and unlocks, as at a deploy).
    pub async fn stop(&mut self, index: usize) {
        self.fault_begins();
        let member = &mut self.members[index];
        member.role.shutdown().cancel();
        if let Some(task) = member.task.take() {
            if let Err(e) = task.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
    }

    /// Crashes member `index`: its service's task is aborted (nothing in it runs again) and
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

    /// Starts member `index` again after [`stop`](Self::stop) or [`crash`](Self::crash),
    /// with a new shutdown token and the same election and pool (a restarted process with the
    /// same settings).
    pub fn restart(&mut self, index: usize) {
        self.members[index].role.renew_shutdown();
        self.launch(index);
    }

    /// Stops every member gracefully, then returns who led when.
    pub async fn finish(mut self) -> Seen {
        for index in 0..self.len() {
            self.stop(index).await;
        }
        self.timeline.seen()
    }

    fn launch(&mut self, index: usize) {
        let member = &mut self.members[index];
        let role = member.role.clone();
        let task = match &self.service {
            Some(service) => tokio::spawn(service(role)),
            None => tokio::spawn(role.run_alone()),
        };
        member.task = Some(task);
    }

    /// The members whose service runs (neither stopped nor crashed, nor returned).
    pub fn running(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| {
                self.members[i]
                    .task
                    .as_ref()
                    .is_some_and(|t| !t.is_finished())
            })
            .collect()
    }

    /// The members whose elector of `lane` leads now.
    pub(crate) fn lane_leaders(&self, lane: usize) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.members[i].role.leads(lane))
            .collect()
    }

    /// The one member that leads `lane` now, if exactly one does.
    pub(crate) fn lane_leader(&self, lane: usize) -> Option<usize> {
        match self.lane_leaders(lane)[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Waits until exactly one member leads `lane`, and it is not `old`.
    pub(crate) async fn wait_lane(
        &self,
        lane: usize,
        old: Option<usize>,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        let found = poll_until(limit, || self.lane_leader(lane).filter(|&r| Some(r) != old)).await;
        found
            .map(|(replica, took)| Leading { replica, took })
            .ok_or_else(|| {
                let other = old
                    .map(|o| format!(" other than replica {o}"))
                    .unwrap_or_default();
                KitError::Timeout(format!(
                    "no single leader{other} of key {:?} within {limit:?} (leading now: {:?})",
                    self.keys[lane],
                    self.lane_leaders(lane)
                ))
            })
    }

    /// Waits until exactly one member leads `lane` in a term that began after the last fault
    /// (or after this call, when there was none).
    pub(crate) async fn wait_lane_next(
        &self,
        lane: usize,
        limit: Duration,
    ) -> Result<Leading, KitError> {
        let mark = *self.last_fault.lock().unwrap_or_else(|p| p.into_inner());
        let mark = mark.unwrap_or_else(|| self.fault_mark());
        let next_term = || {
            let seen = self.timeline.seen();
            let newest: Span = *seen.leaders[mark.terms.min(seen.leaders.len())..]
                .iter()
                .rev()
                .find(|span| span.lane == lane)?;
            let live = newest.to.is_none() && self.lane_leader(lane) == Some(newest.replica);
            live.then_some(newest)
        };
        match poll_until(limit, next_term).await {
            Some((span, _)) => Ok(Leading {
                replica: span.replica,
                took: span.from.saturating_sub(mark.at),
            }),
            None => Err(KitError::Timeout(format!(
                "no term of key {:?} began within {limit:?} (leading now: {:?})",
                self.keys[lane],
                self.lane_leaders(lane)
            ))),
        }
    }

    /// Waits until `done` holds; how long that took, or a timeout saying `what`.
    pub(crate) async fn wait_until(
        &self,
        limit: Duration,
        mut done: impl FnMut() -> bool,
        what: impl FnOnce() -> String,
    ) -> Result<Duration, KitError> {
        match poll_until(limit, || done().then_some(())).await {
            Some(((), took)) => Ok(took),
            None => Err(KitError::Timeout(format!("{} after {limit:?}", what()))),
        }
    }

    /// Notes where the timeline stands as a fault begins (see the `wait_for_next_*` helpers).
    pub(crate) fn fault_begins(&self) {
        let mark = self.fault_mark();
        *self.last_fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(mark);
    }

    fn fault_mark(&self) -> FaultMark {
        let seen = self.timeline.seen();
        FaultMark {
            terms: seen.leaders.len(),
            at: seen.elapsed,
        }
    }
}

impl<C> Drop for Members<C> {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(task) = member.task.take() {
                task.abort();
            }
        }
    }
}

/// Calls `f` every millisecond until it finds something or `limit` passes; what it found and
/// how long that took.
async fn poll_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(found) = f() {
            return Some((found, start.elapsed()));
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
