//! Tests of the harness against real servers.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pg_elector_testkit::replicas::{SerialGuard, timing};
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_testkit::server::pooler::{Pgbouncer, PoolMode};
use pg_elector_testkit::{FaultProxy, KitError, PgServer, TestDb};
use tokio::time::timeout;

fn shared() -> &'static PgServer {
    match PgServer::shared() {
        Ok(s) => s,
        Err(e) => panic!("no test server: {e}"),
    }
}

async fn query_one_i64(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

async fn try_lock(client: &tokio_postgres::Client, key: i64) -> bool {
    client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await
        .unwrap()
        .get(0)
}

/// Takes a timing slot, then makes a fresh database on the shared server and a
/// [`FaultProxy`] in front of that server.
async fn proxied_db() -> (SerialGuard, TestDb, FaultProxy) {
    let timing = timing();
    let server = shared();
    let db = server.create_database().await.unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    (timing, db, proxy)
}

/// A client through `proxy`, its connection driven by a spawned task.
async fn client_via(db: &TestDb, proxy: &FaultProxy) -> tokio_postgres::Client {
    connect(db.config_via(proxy.addr())).await
}

async fn connect(config: tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// Waits (2 s at the most) until `direct` can take the advisory lock `key`: the
/// server ended the session a reset killed.
async fn wait_lock_free_after_reset(direct: &tokio_postgres::Client, key: i64) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !try_lock(direct, key).await {
        assert!(
            Instant::now() < deadline,
            "server kept the session after reset"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `path` no longer exists.
fn wait_gone(path: &std::path::Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[tokio::test]
async fn spawn_connect_query_and_cleanup() {
    let t = Instant::now();
    let server = PgServer::spawn().unwrap();
    eprintln!("spawn: {:?}", t.elapsed());
    assert!(server.is_private());
    assert_eq!(server.addr().ip().to_string(), "127.0.0.1");
    assert!(server.url().contains(&server.addr().port().to_string()));
    assert!(server.bin_dir().unwrap().join("postgres").is_file());
    let data_dir = server.data_dir().unwrap().to_path_buf();
    assert!(data_dir.join("PG_VERSION").is_file());

    let db = server.create_database().await.unwrap();
    let client = db.connect().await.unwrap();
    let version = query_one_i64(
        &client,
        "SELECT current_setting('server_version_num')::bigint",
    )
    .await;
    assert!(version >= 130000, "server version {version}");
    let row = client
        .query_one("SELECT current_user::text, current_database()::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "postgres");
    assert_eq!(row.get::<_, String>(1), db.name());
    assert_eq!(
        query_one_i64(&client, "SELECT current_setting('max_connections')::bigint").await,
        300
    );
    assert!(server.log_tail(50).contains("connection authorized"));

    drop(client);
    drop(db);
    let root = data_dir.parent().unwrap().to_path_buf();
    let t = Instant::now();
    drop(server);
    eprintln!("drop: {:?}", t.elapsed());
    assert!(!root.exists(), "{} left behind", root.display());
}

#[tokio::test]
async fn databases_are_isolated() {
    let server = shared();
    let a = server.create_database().await.unwrap();
    let b = server.create_database().await.unwrap();
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with("pg_elector_t_"));

    let ca = a.connect().await.unwrap();
    let cb = b.connect().await.unwrap();
    let ca2 = a.connect().await.unwrap();
    // Advisory locks are per database.
    assert!(try_lock(&ca, 42).await);
    assert!(!try_lock(&ca2, 42).await);
    assert!(try_lock(&cb, 42).await);

    // Through a pool too.
    let pool = b.pool(2);
    let conn = pool.get().await.unwrap();
    let row = conn
        .query_one("SELECT current_database()::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), b.name());
    drop(conn);

    // Dropping a TestDb drops the database, even with sessions open.
    let name = a.name().to_owned();
    drop(a);
    let admin = b.connect().await.unwrap();
    let n = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(n, 0, "database {name} still exists");
    assert!(ca.simple_query("SELECT 1").await.is_err());
}

#[test]
fn shared_is_one_instance_from_any_thread_or_runtime() {
    let threads: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(|| shared() as *const PgServer as usize))
        .collect();
    let ptrs: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(ptrs.iter().all(|p| *p == ptrs[0]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let in_rt = rt.block_on(async { shared() as *const PgServer as usize });
    assert_eq!(in_rt, ptrs[0]);
    assert!(std::ptr::eq(shared(), PgServer::shared().unwrap()));
}

#[tokio::test]
async fn restart_stop_and_start_keep_the_port() {
    let server = PgServer::spawn().unwrap();
    let addr = server.addr();
    let db = server.create_database().await.unwrap();

    for mode in [ShutdownMode::Fast, ShutdownMode::Immediate] {
        let client = db.connect().await.unwrap();
        let t = Instant::now();
        server.restart(mode).unwrap();
        eprintln!("restart {mode:?}: {:?}", t.elapsed());
        assert_eq!(server.addr(), addr);
        assert!(client.simple_query("SELECT 1").await.is_err());
        let client = db.connect().await.unwrap();
        client.simple_query("SELECT 1").await.unwrap();
    }

    server.stop(ShutdownMode::Fast).unwrap();
    assert!(db.connect().await.is_err());
    let t = Instant::now();
    server.start_again().unwrap();
    eprintln!("start_again: {:?}", t.elapsed());
    let client = db.connect().await.unwrap();
    client.simple_query("SELECT 1").await.unwrap();
}

#[tokio::test]
async fn external_server_is_usable_but_not_controllable() {
    let server = shared();
    let external = PgServer::external(&server.url()).unwrap();
    assert!(!external.is_private());
    assert_eq!(external.addr(), server.addr());
    assert!(external.data_dir().is_none());
    assert!(matches!(
        external.restart(ShutdownMode::Fast),
        Err(KitError::NotPrivate)
    ));
    let db = external.create_database().await.unwrap();
    db.connect()
        .await
        .unwrap()
        .simple_query("SELECT 1")
        .await
        .unwrap();

    let err = PgServer::external("postgres://postgres@127.0.0.1:1/postgres").unwrap_err();
    assert!(err.to_string().contains("DATABASE_URL"), "{err}");
}

#[tokio::test]
async fn proxy_pass_forwards() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    assert_eq!(query_one_i64(&client, "SELECT 7::bigint").await, 7);
    assert_eq!(proxy.accepted(), 1);
    assert_eq!(proxy.open(), 1);

    let pool = db.pool_via(proxy.addr(), 2);
    let a = pool.get().await.unwrap();
    let b = pool.get().await.unwrap();
    assert_eq!(query_one_i64(&a, "SELECT 1::bigint").await, 1);
    assert_eq!(query_one_i64(&b, "SELECT 2::bigint").await, 2);
    assert_eq!(proxy.accepted(), 3);
    assert_eq!(proxy.open(), 3);

    drop(client);
    drop((a, b));
    drop(pool);
    let deadline = Instant::now() + Duration::from_secs(2);
    while proxy.open() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.open(), 0);
}

#[tokio::test]
async fn proxy_blackhole_then_pass() {
    let (_timing, db, proxy) = proxied_db().await;
    let pool = db.pool_via(proxy.addr(), 4);
    let old = pool.get().await.unwrap();
    old.simple_query("SELECT 1").await.unwrap();

    proxy.blackhole();
    assert!(proxy.is_blackholed());
    let r = timeout(Duration::from_millis(500), old.simple_query("SELECT 1")).await;
    assert!(r.is_err(), "query went through a blackhole");
    assert_eq!(proxy.open(), 1);
    assert!(!old.is_closed());

    // A new connection is accepted but goes nowhere.
    let r = timeout(
        Duration::from_millis(500),
        db.config_via(proxy.addr()).connect(tokio_postgres::NoTls),
    )
    .await;
    assert!(r.is_err(), "connected through a blackhole");
    assert_eq!(proxy.accepted(), 2);

    proxy.pass();
    let fresh = db.pool_via(proxy.addr(), 1);
    let c = timeout(Duration::from_secs(2), fresh.get())
        .await
        .unwrap()
        .unwrap();
    c.simple_query("SELECT 1").await.unwrap();
    // The old connection survived the partition.
    timeout(Duration::from_secs(2), old.simple_query("SELECT 2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(proxy.accepted(), 3);
}

#[tokio::test]
async fn proxy_reset_kills_connections_on_both_sides() {
    let (_timing, db, proxy) = proxied_db().await;
    let (client, conn) = db
        .config_via(proxy.addr())
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    assert!(try_lock(&client, 99).await);
    let direct = db.connect().await.unwrap();
    assert!(!try_lock(&direct, 99).await);

    let t = Instant::now();
    proxy.reset();
    let r = timeout(Duration::from_secs(1), client.simple_query("SELECT 1"))
        .await
        .expect("query after reset hung");
    let err = r.expect_err("query succeeded after reset");
    eprintln!("after reset ({:?}): {err}", t.elapsed());
    let conn_result = timeout(Duration::from_secs(1), conn)
        .await
        .unwrap()
        .unwrap();
    assert!(conn_result.is_err() || client.is_closed());

    // The server saw the RST: the session ended and released its lock.
    wait_lock_free_after_reset(&direct, 99).await;
    eprintln!("lock free after reset: {:?}", t.elapsed());

    // New connections work in pass mode; the count goes on.
    let pool = db.pool_via(proxy.addr(), 1);
    pool.get()
        .await
        .unwrap()
        .simple_query("SELECT 1")
        .await
        .unwrap();
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.open(), 1);
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let (_timing, db, proxy) = proxied_db().await;
    let addr = proxy.addr();
    let client = client_via(&db, &proxy).await;
    client.simple_query("SELECT 1").await.unwrap();
    drop(proxy);
    let r = timeout(Duration::from_secs(1), client.simple_query("SELECT 1")).await;
    assert!(matches!(r, Ok(Err(_))), "connection outlived the proxy");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// The delay the delay tests set on the proxy.
const DELAY: Duration = Duration::from_millis(300);
/// Slack on top of [`DELAY`] for a loaded 2-core CI machine.
const SLACK: Duration = Duration::from_millis(250);

#[tokio::test]
async fn proxy_delay_adds_latency_per_answer() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    client.simple_query("SELECT 1").await.unwrap();

    proxy.delay(DELAY);
    assert_eq!(proxy.current_delay(), DELAY);
    let t = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    let took = t.elapsed();
    eprintln!("SELECT 1 with a {DELAY:?} delay: {took:?}");
    assert!(took >= DELAY, "answered in {took:?}, before the delay");
    assert!(took < DELAY + SLACK, "answered in {took:?}");

    // New connections are delayed too, startup answers included.
    let t = Instant::now();
    let fresh = client_via(&db, &proxy).await;
    eprintln!("connect with a {DELAY:?} delay: {:?}", t.elapsed());
    assert!(t.elapsed() >= DELAY, "connected in {:?}", t.elapsed());
    let t = Instant::now();
    fresh.simple_query("SELECT 1").await.unwrap();
    assert!(t.elapsed() >= DELAY, "answered in {:?}", t.elapsed());
}

#[tokio::test]
async fn proxy_delay_is_per_chunk_not_cumulative() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    client.simple_query("SELECT 1").await.unwrap();

    proxy.delay(DELAY);
    // Pipelined: both queries go out at once. The server answers the second
    // GAP after the first, so the proxy surely reads two chunks; each is
    // DELAY late: about DELAY and DELAY + GAP, where a delay that added up
    // would give the second 2 * DELAY.
    const GAP: Duration = Duration::from_millis(50);
    let t = Instant::now();
    let (a, b) = tokio::join!(
        async {
            let r = client.simple_query("SELECT 1").await;
            (r, t.elapsed())
        },
        async {
            let r = client.simple_query("SELECT pg_sleep(0.05)").await;
            (r, t.elapsed())
        },
    );
    eprintln!(
        "two pipelined queries with a {DELAY:?} delay: {:?}, {:?}",
        a.1, b.1
    );
    a.0.unwrap();
    b.0.unwrap();
    assert!(
        a.1 >= DELAY,
        "first answered in {:?}, before the delay",
        a.1
    );
    assert!(
        b.1 >= DELAY + GAP,
        "second answered in {:?}, before the delay",
        b.1
    );
    for took in [a.1, b.1] {
        assert!(
            took < DELAY + SLACK,
            "answered in {took:?}: the delay adds up"
        );
    }
}

#[tokio::test]
async fn proxy_delay_zero_turns_it_off() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    proxy.delay(DELAY);
    let t = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    assert!(t.elapsed() >= DELAY, "answered in {:?}", t.elapsed());

    proxy.delay(Duration::ZERO);
    assert_eq!(proxy.current_delay(), Duration::ZERO);
    let t = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    let took = t.elapsed();
    eprintln!("SELECT 1 after delay(0): {took:?}");
    assert!(took < Duration::from_millis(100), "answered in {took:?}");

    // Answers already waiting go out as soon as the delay is lifted; a delay
    // too long for `Instant` holds them until then.
    proxy.delay(Duration::MAX);
    let t = Instant::now();
    let query = client.simple_query("SELECT 1");
    tokio::pin!(query);
    assert!(
        timeout(Duration::from_millis(200), &mut query)
            .await
            .is_err(),
        "answered through an endless delay"
    );
    proxy.delay(Duration::ZERO);
    timeout(Duration::from_secs(1), query)
        .await
        .expect("a waiting answer stayed held after delay(0)")
        .unwrap();
    eprintln!("lifted an endless delay after {:?}", t.elapsed());
}

#[tokio::test]
async fn proxy_blackhole_holds_delayed_answers() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    client.simple_query("SELECT 1").await.unwrap();
    proxy.delay(DELAY);

    // Blackhole while the answer waits in the proxy: it must not come out
    // when its delay is over, only once the partition heals.
    let t = Instant::now();
    let query = client.simple_query("SELECT 1");
    tokio::pin!(query);
    assert!(
        timeout(DELAY / 3, &mut query).await.is_err(),
        "answered before the delay"
    );
    proxy.blackhole();
    assert!(
        timeout(DELAY + 2 * SLACK, &mut query).await.is_err(),
        "answered through a blackhole"
    );
    assert_eq!(proxy.open(), 1);
    assert!(!client.is_closed());

    // A query sent into the blackhole is held too.
    let t2 = Instant::now();
    let second = client.simple_query("SELECT 2");
    tokio::pin!(second);
    assert!(
        timeout(DELAY + SLACK, &mut second).await.is_err(),
        "answered through a blackhole"
    );

    proxy.pass();
    let heal = Instant::now();
    timeout(DELAY + SLACK, &mut query)
        .await
        .expect("the held answer did not come after the partition healed")
        .unwrap();
    eprintln!(
        "held answer delivered {:?} after pass ({:?} after the query)",
        heal.elapsed(),
        t.elapsed()
    );
    // Its delay was long over: it went out at once.
    assert!(heal.elapsed() < SLACK, "{:?}", heal.elapsed());
    timeout(DELAY + SLACK, &mut second)
        .await
        .expect("the second answer did not come")
        .unwrap();
    assert!(t2.elapsed() >= DELAY, "{:?}", t2.elapsed());
}

#[tokio::test]
async fn proxy_reset_works_while_delayed() {
    let (_timing, db, proxy) = proxied_db().await;
    let client = client_via(&db, &proxy).await;
    assert!(try_lock(&client, 77).await);
    let direct = db.connect().await.unwrap();
    assert!(!try_lock(&direct, 77).await);

    proxy.delay(DELAY);
    let query = client.simple_query("SELECT 1");
    tokio::pin!(query);
    assert!(timeout(DELAY / 3, &mut query).await.is_err());
    let t = Instant::now();
    proxy.reset();
    let r = timeout(DELAY / 2, &mut query)
        .await
        .expect("the reset waited for the delay");
    r.expect_err("query succeeded after reset");
    // The server saw the RST: the session ended and released its lock.
    wait_lock_free_after_reset(&direct, 77).await;
    eprintln!("lock free after reset: {:?}", t.elapsed());
}

/// Runs this test binary again with one test selected and extra env vars.
fn rerun(test: &str, envs: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Reruns `test` with `envs`, waits for it, and returns the stdout line it printed from
/// `prefix` on (prefix included).
fn rerun_printed_line(test: &str, envs: &[(&str, &str)], prefix: &str) -> String {
    let out = rerun(test, envs).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find(prefix).map(|i| l[i..].to_owned()))
        .unwrap_or_else(|| panic!("no error printed: {stdout}"));
    eprintln!("{line}");
    line
}

/// Starts `test` (left running) and reads from its stdout the path it prints after `prefix`;
/// panics with "child printed no {what}" when it prints none.
fn rerun_printed_path(test: &str, prefix: &str, what: &str) -> (std::process::Child, PathBuf) {
    let mut child = rerun(test, &[]);
    let stdout = child.stdout.take().unwrap();
    let path = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.find(prefix)
                .map(|i| PathBuf::from(&l[i + prefix.len()..]))
        })
        .unwrap_or_else(|| panic!("child printed no {what}"));
    (child, path)
}

#[test]
#[ignore = "helper run by missing_binaries_message"]
fn child_print_spawn_error() {
    let err = PgServer::spawn().unwrap_err();
    println!("SPAWN-ERROR: {err}");
}

#[test]
fn missing_binaries_message() {
    let line = rerun_printed_line(
        "child_print_spawn_error",
        &[("PG_BINDIR", "/nonexistent")],
        "SPAWN-ERROR: ",
    );
    for needle in [
        "PG_BINDIR",
        "/nonexistent",
        "apt-get install postgresql",
        "DATABASE_URL",
    ] {
        assert!(line.contains(needle), "{needle:?} missing from {line}");
    }
}

#[test]
#[ignore = "helper run by killed_process_leaves_nothing_behind"]
fn child_spawn_and_hang() {
    let server = PgServer::spawn().unwrap();
    println!("DATA-DIR: {}", server.data_dir().unwrap().display());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn killed_process_leaves_nothing_behind() {
    let (mut child, data_dir) =
        rerun_printed_path("child_spawn_and_hang", "DATA-DIR: ", "data dir");
    assert!(data_dir.join("postmaster.pid").exists());
    child.kill().unwrap(); // SIGKILL: no destructor runs.
    child.wait().unwrap();
    let root = data_dir.parent().unwrap();
    assert!(
        wait_gone(root, Duration::from_secs(15)),
        "{} left behind",
        root.display()
    );
    // No postmaster of that data dir is left.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let needle = data_dir.to_string_lossy();
    assert!(
        !ps.lines().any(|l| l.contains(&*needle)),
        "a process still uses {needle}"
    );
}

#[tokio::test]
async fn standby_replicates_refuses_writes_and_promotes() {
    let primary = PgServer::spawn().unwrap();
    let db = primary.create_database().await.unwrap();
    let writer = db.connect().await.unwrap();
    writer
        .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let t = Instant::now();
    let standby = primary.spawn_standby().unwrap();
    eprintln!("spawn_standby: {:?}", t.elapsed());
    assert_ne!(standby.addr(), primary.addr());
    assert!(standby.is_in_recovery().unwrap());
    assert!(!primary.is_in_recovery().unwrap());
    let version = primary.version_num().unwrap();
    assert!(version >= 130000, "{version}");
    assert_eq!(standby.version_num().unwrap(), version);

    // The cold copy (no pg_basebackup) restarts the primary: reconnect.
    let writer = db.connect().await.unwrap();
    writer
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .unwrap();
    let reader = connect(db.config_via(standby.addr())).await;
    let mut rows = 0;
    for _ in 0..500 {
        rows = query_one_i64(&reader, "SELECT count(*) FROM t").await;
        if rows == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows, 2, "the standby streams the primary's changes");
    assert!(
        reader
            .batch_execute("INSERT INTO t VALUES (3)")
            .await
            .is_err()
    );

    let t = Instant::now();
    standby.promote().unwrap();
    eprintln!("promote: {:?}", t.elapsed());
    assert!(!standby.is_in_recovery().unwrap());
    reader
        .batch_execute("INSERT INTO t VALUES (3)")
        .await
        .unwrap();
    let dir = standby.data_dir().unwrap().to_path_buf();
    drop(reader);
    drop(standby);
    assert!(wait_gone(&dir, Duration::from_secs(10)));
    assert!(matches!(
        PgServer::external(&shared().url()).unwrap().spawn_standby(),
        Err(KitError::NotPrivate)
    ));
}

async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// PgBouncer in transaction mode hands one server session to two clients; in session mode it
/// does not.
#[tokio::test]
async fn pgbouncer_transaction_mode_shares_a_session() {
    let server = shared();
    let db = server.create_database().await.unwrap();

    let bouncer = Pgbouncer::start(server, PoolMode::Transaction, 1).unwrap();
    assert_eq!(bouncer.mode(), PoolMode::Transaction);
    assert_eq!(bouncer.pool_size(), 1);
    let pool = bouncer.pool_for(&db, 2);
    let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    assert_eq!(backend_pid(&a).await, backend_pid(&b).await);
    // The same server session: a's session lock is b's too.
    assert!(try_lock(&a, 7).await);
    assert!(try_lock(&b, 7).await);
    let dir = bouncer.dir().to_path_buf();
    drop((a, b, pool));
    drop(bouncer);
    assert!(!dir.exists());

    let bouncer = Pgbouncer::start(server, PoolMode::Session, 4).unwrap();
    let (a, b) = (
        connect(bouncer.config_for(&db)).await,
        connect(bouncer.config_for(&db)).await,
    );
    assert_ne!(backend_pid(&a).await, backend_pid(&b).await);
    assert!(try_lock(&a, 7).await);
    assert!(!try_lock(&b, 7).await);
    assert!(bouncer.log_tail(50).contains("listening on"));
}

#[test]
#[ignore = "helper run by missing_pgbouncer_message"]
fn child_print_pgbouncer_error() {
    let err = Pgbouncer::start(shared(), PoolMode::Session, 1).unwrap_err();
    println!("PGBOUNCER-ERROR: {err}");
}

#[test]
fn missing_pgbouncer_message() {
    let line = rerun_printed_line(
        "child_print_pgbouncer_error",
        &[("PGBOUNCER", "/nonexistent")],
        "PGBOUNCER-ERROR: ",
    );
    assert!(line.contains("apt-get install pgbouncer"), "{line}");
    assert!(line.contains("/nonexistent"), "{line}");
}

#[test]
#[ignore = "helper run by a_killed_process_leaves_no_pgbouncer_behind"]
fn child_start_pgbouncer_and_hang() {
    let bouncer = Pgbouncer::start(shared(), PoolMode::Transaction, 1).unwrap();
    println!("PGBOUNCER-DIR: {}", bouncer.dir().display());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_killed_process_leaves_no_pgbouncer_behind() {
    let (mut child, dir) = rerun_printed_path(
        "child_start_pgbouncer_and_hang",
        "PGBOUNCER-DIR: ",
        "pgbouncer dir",
    );
    let ini = dir.join("pgbouncer.ini");
    let running = || {
        let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .any(|l| l.contains("pgbouncer") && l.contains(&*ini.to_string_lossy()))
    };
    assert!(running(), "pgbouncer runs while the test process lives");
    child.kill().unwrap(); // SIGKILL: no destructor runs.
    child.wait().unwrap();
    assert!(
        wait_gone(&dir, Duration::from_secs(15)),
        "{} left behind",
        dir.display()
    );
    assert!(!running(), "pgbouncer outlived the test process");
}
