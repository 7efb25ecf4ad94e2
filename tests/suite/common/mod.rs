//! Helpers shared by the integration tests: replicas, polling, and looking at `pg_locks`.
#![allow(dead_code, unused_imports, unreachable_pub)]

pub mod background;
pub mod capture;
pub mod failover;
pub mod handover;
pub mod roles;
pub mod schedules;
pub mod shards;

use std::future::Future;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use pg_elector::{Elector, Error, LockKey};
pub use pg_elector_testkit::replicas::{serial, timing};
pub use pg_elector_testkit::{FaultProxy, PgServer, TestDb};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The short interval most tests use.
pub const I: Duration = Duration::from_millis(200);

/// How long a test's `request_handover` may wait for its connection and its answers.
pub const ASK: Duration = Duration::from_secs(5);

pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "pg_elector=debug".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A fresh database on the process's shared server.
pub async fn fresh_db() -> TestDb {
    init_tracing();
    let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    server
        .create_database()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A private server of this test's own (one it may restart or stop), and a fresh database on it.
pub async fn private_server() -> (Arc<PgServer>, TestDb) {
    init_tracing();
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::spawn)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let db = server.create_database().await.unwrap();
    (server, db)
}

/// One replica: an elector whose `run` is a task.
pub struct Replica {
    pub elector: Elector,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), Error>>,
}

impl Replica {
    pub fn start(pool: Pool, key: LockKey, interval: Duration) -> Self {
        let elector = Elector::builder(pool, key)
            .check_interval(interval)
            .build()
            .expect("valid elector");
        Self::run(elector)
    }

    pub fn run(elector: Elector) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        Self {
            elector,
            shutdown,
            task,
        }
    }

    /// Like [`Replica::run`], with every event of the election recorded in `capture`.
    pub fn run_captured(elector: Elector, capture: &capture::Capture) -> Self {
        use tracing::instrument::WithSubscriber;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            {
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move { elector.run(shutdown).await }
            }
            .with_subscriber(capture.dispatch()),
        );
        Self {
            elector,
            shutdown,
            task,
        }
    }

    /// Cancels the shutdown token and waits for `run` to return.
    pub async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.task.await.expect("run does not panic")
    }
}

/// One replica per pool, named `replica-<n>`, checking every I, with or without fast takeover.
pub fn replicas_on(pools: Vec<Pool>, key: LockKey, fast: bool) -> Vec<Replica> {
    replica_electors(pools, key, fast)
        .map(Replica::run)
        .collect()
}

/// Like [`replicas_on`], with every event of the elections recorded in `capture`.
pub fn replicas_captured(
    pools: Vec<Pool>,
    key: LockKey,
    fast: bool,
    capture: &capture::Capture,
) -> Vec<Replica> {
    replica_electors(pools, key, fast)
        .map(|elector| Replica::run_captured(elector, capture))
        .collect()
}

fn replica_electors(pools: Vec<Pool>, key: LockKey, fast: bool) -> impl Iterator<Item = Elector> {
    pools.into_iter().enumerate().map(move |(n, pool)| {
        Elector::builder(pool, key)
            .check_interval(I)
            .identity(format!("replica-{n}"))
            .fast_takeover(fast)
            .build()
            .expect("a valid elector")
    })
}

/// A fault proxy in front of the process's shared server.
pub async fn shared_server_proxy() -> FaultProxy {
    FaultProxy::start(PgServer::shared().unwrap().addr())
        .await
        .unwrap()
}

/// Waits up to 3·I for `leader` to lead (or panics saying "a leader"), then starts the fault
/// proxy the replicas beside it are to reach the shared server through.
pub async fn proxy_beside(leader: &Replica) -> FaultProxy {
    wait_for(3 * I, || leader.elector.is_leader())
        .await
        .expect("a leader");
    shared_server_proxy().await
}

/// An elector with fencing on `pool`, checking every `interval`, named `identity`.
pub fn fenced_elector(pool: Pool, key: LockKey, identity: &str, interval: Duration) -> Elector {
    Elector::builder(pool, key)
        .check_interval(interval)
        .identity(identity)
        .fencing(true)
        .build()
        .expect("valid elector")
}

/// A fresh database with `ddl` (the tables a test writes to) run in it.
pub async fn fresh_db_with(ddl: &str) -> TestDb {
    let db = fresh_db().await;
    db.connect()
        .await
        .unwrap()
        .batch_execute(ddl)
        .await
        .unwrap();
    db
}

/// Takes a timing slot, then makes a [`fresh_db_with`] `ddl`.
pub async fn timing_db_with(ddl: &str) -> (pg_elector_testkit::replicas::SerialGuard, TestDb) {
    let timing = timing();
    (timing, fresh_db_with(ddl).await)
}

/// The `bigint` in the first column of the one row `sql` (no parameters) answers, such as a
/// `count(*)`.
pub async fn query_i64(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
}

/// Hands a connection of `pool` back inside a transaction (an application bug): `BEGIN` and
/// then `sql` on it, without a `COMMIT`. Returns its backend's pid and what `sql` answered (a
/// statement that fails leaves the transaction aborted, as an application's would).
pub async fn leave_in_transaction(
    pool: &deadpool_postgres::Pool,
    sql: &str,
) -> (i64, Result<(), tokio_postgres::Error>) {
    let object = pool.get().await.unwrap();
    let pid = query_i64(&object, "SELECT pg_backend_pid()::int8").await;
    object.batch_execute("BEGIN").await.unwrap();
    (pid, object.batch_execute(sql).await)
}

/// Whether `sql` (no parameters) answers a row; false too when it fails (a table not there yet).
pub async fn finds_row(client: &tokio_postgres::Client, sql: &str) -> bool {
    client
        .query_opt(sql, &[])
        .await
        .is_ok_and(|row| row.is_some())
}

/// The first column of each row `sql` (no parameters) answers.
pub async fn first_column<T, C>(client: &tokio_postgres::Client, sql: &str) -> C
where
    T: tokio_postgres::types::FromSqlOwned,
    C: FromIterator<T>,
{
    client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Waits up to 3·I for replica `a` to lead (or panics saying "a leads").
pub async fn wait_a_leads(a: &Replica) {
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
}

/// A replica at interval `I` on a pool of two, once it leads (within 3·I).
pub async fn leading_replica(db: &TestDb, key: LockKey) -> Replica {
    let replica = Replica::start(db.pool(2), key, I);
    wait_for(3 * I, || replica.elector.is_leader())
        .await
        .expect("the first replica leads within 3·I");
    replica
}

/// Waits for `term` to end once `is_leader()` has turned false, and returns how it ended. A
/// demotion clears the lease first, so that whoever the term's token wakes already reads
/// `is_leader() == false`: a poll of `is_leader()` can see the demotion a moment before the term
/// records its end. 100 ms covers that moment on a loaded machine.
pub async fn term_end(term: &pg_elector::Term) -> Option<pg_elector::TermEnd> {
    tokio::time::timeout(Duration::from_millis(100), term.cancelled())
        .await
        .expect("the term ends right after is_leader() turns false");
    term.end()
}

/// Polls `cond` every 2 ms until it holds or `limit` passes; returns how long it took.
pub async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Like [`wait_for`], with an async condition.
pub async fn wait_for_async<F: Future<Output = bool>>(
    limit: Duration,
    mut cond: impl FnMut() -> F,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond().await {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Indices of the replicas that say they lead.
pub fn leaders(replicas: &[Replica]) -> Vec<usize> {
    replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| r.elector.is_leader())
        .map(|(i, _)| i)
        .collect()
}

/// Waits until exactly one replica leads; returns its index.
pub async fn one_leader(replicas: &[Replica], limit: Duration) -> usize {
    wait_for(limit, || leaders(replicas).len() == 1)
        .await
        .unwrap_or_else(|| panic!("no single leader within {limit:?}: {:?}", leaders(replicas)));
    leaders(replicas)[0]
}

/// The backends that hold `key` (two-int4 form) in this database, per `pg_locks` (the kit's
/// reader).
pub async fn holders(client: &tokio_postgres::Client, key: LockKey) -> Vec<i32> {
    pg_elector_testkit::server::sql::holders(client, key)
        .await
        .expect("pg_locks query")
}

/// What a test that needs the server's bound on a silent session says on PostgreSQL 13.
pub const NO_IDLE_SESSION_TIMEOUT: &str = "PostgreSQL 13 has no idle_session_timeout: the server \
     keeps a silent lock session, and its lock, until TCP gives up, so no standby can take over; \
     this test checks that instead of the takeover";

/// Whether the server has `idle_session_timeout` (PostgreSQL 14 and newer), the bound on an
/// orphaned lock session (E13). Says so on stderr when it has not.
pub async fn has_idle_session_timeout(db: &TestDb) -> bool {
    let client = db.connect().await.unwrap();
    let version: String = client
        .query_one("SHOW server_version_num", &[])
        .await
        .unwrap()
        .get(0);
    let has = version.parse::<i32>().unwrap() >= 140_000;
    if !has {
        eprintln!("{NO_IDLE_SESSION_TIMEOUT}");
    }
    has
}

/// Terminates the backend that holds `key`, as an operator or a failover would, and waits
/// until it is gone.
pub async fn terminate_holder(db: &TestDb, key: LockKey) {
    let admin = db.connect().await.unwrap();
    let pid = holders(&admin, key).await[0];
    assert!(
        pg_elector_testkit::server::sql::terminate(&admin, pid)
            .await
            .unwrap(),
        "backend {pid} outlived pg_terminate_backend"
    );
}

/// When the current term of `key` began, by the server's clock: the `since` of its epoch row.
pub async fn epoch_since(client: &tokio_postgres::Client, key: LockKey) -> std::time::SystemTime {
    client
        .query_one(
            "SELECT since FROM pg_elector_epochs WHERE class = $1 AND object = $2",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap()
        .get(0)
}

/// A replica at interval `I` whose gauge goes to a registry of its own.
pub fn replica_with_gauge(pool: Pool, key: LockKey) -> (Replica, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let elector = Elector::builder(pool, key)
        .check_interval(I)
        .registry(&registry)
        .build()
        .expect("valid elector");
    (Replica::run(elector), registry)
}

/// The gauge's value in `registry`.
pub fn gauge(registry: &prometheus::Registry, name: &str) -> Option<i64> {
    registry
        .gather()
        .iter()
        .find(|family| family.name() == name)
        .map(|family| family.get_metric()[0].get_gauge().value() as i64)
}

/// The backends waiting for `key` in this database: (pid, application_name).
pub async fn waiting(client: &tokio_postgres::Client, key: LockKey) -> Vec<(i32, String)> {
    pg_elector_testkit::server::sql::lock_sessions(client, key)
        .await
        .expect("pg_locks query")
        .into_iter()
        .filter(|s| !s.granted)
        .map(|s| (s.pid, s.name))
        .collect()
}

/// Waits until a session named `name` waits for `key`; returns its pid.
pub async fn session_waiting(
    client: &tokio_postgres::Client,
    key: LockKey,
    name: &str,
    limit: Duration,
) -> i32 {
    let start = Instant::now();
    loop {
        if let Some((pid, _)) = waiting(client, key)
            .await
            .into_iter()
            .find(|(_, n)| n == name)
        {
            return pid;
        }
        assert!(
            start.elapsed() < limit,
            "no session of {name} waits for the lock within {limit:?}: {:?}",
            waiting(client, key).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The statements prepared on a pool connection that try the lock (found by their text:
/// `pg_try_advisory_lock` or `pg_try_advisory_xact_lock_shared`).
pub async fn prepared_tries(pool: &deadpool_postgres::Pool) -> i64 {
    let client = pool.get().await.unwrap();
    client
        .query_typed(
            "SELECT count(*) FROM pg_catalog.pg_prepared_statements \
             WHERE statement LIKE '%pg\\_try\\_advisory\\_%lock%(%' AND NOT from_sql",
            &[],
        )
        .await
        .unwrap()[0]
        .get(0)
}
