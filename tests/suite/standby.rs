//! E3 and E4: the standby's tries, and a leader that never stacks the lock.

use crate::common;

use std::time::Duration;

use common::*;
use pg_elector::{Elector, LockKey};

async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut out = Vec::new();
    let handles: Vec<_> = futures.collect();
    for f in handles {
        out.push(f.await);
    }
    out
}

/// Transactions committed in the database: every try is one.
async fn commits(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Whether the application gets both connections of its two-connection pool within I.
async fn both_connections(pool: &deadpool_postgres::Pool) -> bool {
    tokio::time::timeout(I, async {
        let first = pool.get().await.unwrap();
        let second = pool.get().await.unwrap();
        (first, second)
    })
    .await
    .is_ok()
}

mod e3 {
    use super::*;
    use pg_elector_testkit::PgServer;
    use tokio::task::block_in_place;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_thousand_refused_tries_open_no_new_backend() {
        // Forty standbys trying as fast as they may keep more than a core busy: alone.
        let _serial = serial();
        let db = fresh_db().await;
        let key = LockKey::new(3, 10_000);
        let leader = Replica::start(db.pool(1), key, I);
        // Forty standbys at the smallest interval share one pool of eight connections, and
        // every connection they use goes through the proxy, which counts them.
        let proxy = proxy_beside(&leader).await;
        let pool = db.pool_via(proxy.addr(), 8);
        // Open the pool's eight connections first: a connection still being opened when a try's
        // 10 ms wait runs out is dropped half-made, which is churn of the pool, not of the tries.
        let warm: Vec<_> = futures_join_all((0..8).map(|_| pool.get())).await;
        drop(warm);
        let standbys: Vec<_> = (0..40)
            .map(|_| Replica::start(pool.clone(), key, Duration::from_millis(10)))
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let opened = proxy.accepted();
        assert_eq!(opened, 8, "{opened} connections for a pool of 8");

        let client = db.connect().await.unwrap();
        let start = commits(&client).await;
        wait_for_async(Duration::from_secs(90), || async {
            client
                .query("SELECT pg_stat_clear_snapshot()", &[])
                .await
                .unwrap();
            commits(&client).await - start >= 10_000
        })
        .await
        .expect("10 000 tries within 90 s");

        assert_eq!(
            leaders(&standbys),
            Vec::<usize>::new(),
            "every try was refused"
        );
        assert!(leader.elector.is_leader());
        assert_eq!(
            proxy.accepted(),
            opened,
            "10 000 refused tries opened no new backend"
        );
        let status = pool.status();
        assert_eq!(
            status.size, 8,
            "refused tries gave their connections back: {status:?}"
        );
        // (A try cut off by shutdown closes its connection instead: its lock state is unknown.)
        for standby in standbys {
            standby.stop().await.unwrap();
        }
        leader.stop().await.unwrap();
    }

    /// A replica leading `key` on a pool of its own, and beside it a standby with prepared
    /// statements on, whose log is captured, on a one-connection pool (returned for
    /// [`prepared_tries`]).
    async fn prepared_standby_beside_a_leader(
        db: &TestDb,
        key: LockKey,
    ) -> (
        Replica,
        Replica,
        deadpool_postgres::Pool,
        common::capture::Capture,
    ) {
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        let pool = db.pool(1);
        let capture = common::capture::Capture::default();
        let elector = Elector::builder(pool.clone(), key)
            .check_interval(I)
            .prepared_statements(true)
            .build()
            .unwrap();
        let standby = Replica::run_captured(elector, &capture);
        (leader, standby, pool, capture)
    }

    /// E3: with prepared statements on, a refused try is a statement prepared once on its pool
    /// connection, not one parsed and planned again at every try.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_try_is_prepared_once_per_connection() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_000);
        let (leader, standby, pool, capture) = prepared_standby_beside_a_leader(&db, key).await;
        tokio::time::sleep(6 * I).await;
        assert_eq!(
            prepared_tries(&pool).await,
            1,
            "one prepared try on the standby's only connection after six tries"
        );
        assert!(!standby.elector.is_leader());
        assert!(leader.elector.is_leader());
        let warnings = capture.at(tracing::Level::WARN, key);
        assert!(warnings.is_empty(), "{warnings:?}");
        let unnamed: Vec<String> = capture
            .at(tracing::Level::INFO, key)
            .into_iter()
            .filter(|line| line.contains("unnamed from now on"))
            .collect();
        assert!(
            unnamed.is_empty(),
            "prepared statements stayed on: {unnamed:?}"
        );
        standby.stop().await.unwrap();
        leader.stop().await.unwrap();
    }

    /// E3: with prepared statements on, a try whose prepared statement the server session no
    /// longer has (`DEALLOCATE ALL`, as a pooler may run) is still refused cleanly, without a
    /// warning, and the standby still leads once the lock is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_whose_prepared_statement_is_gone_falls_back() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_001);
        let (leader, standby, pool, capture) = prepared_standby_beside_a_leader(&db, key).await;
        tokio::time::sleep(3 * I).await;
        assert_eq!(prepared_tries(&pool).await, 1, "the try was prepared");
        for _ in 0..3 {
            // Between two tries, on the standby's only connection.
            pool.get()
                .await
                .unwrap()
                .batch_execute("DEALLOCATE ALL")
                .await
                .unwrap();
            tokio::time::sleep(2 * I).await;
        }
        assert!(!standby.elector.is_leader());
        let warnings = capture.at(tracing::Level::WARN, key);
        assert!(warnings.is_empty(), "{warnings:?}");
        leader.stop().await.unwrap();
        wait_for(2 * I, || standby.elector.is_leader())
            .await
            .expect("the standby leads within 2·I of the release");
        // PostgreSQL 13 has no idle_session_timeout, which a new leader says once at WARN.
        let warnings: Vec<String> = capture
            .at(tracing::Level::WARN, key)
            .into_iter()
            .filter(|w| !w.starts_with("the server has no idle_session_timeout"))
            .collect();
        assert!(warnings.is_empty(), "{warnings:?}");
        standby.stop().await.unwrap();
    }

    /// E3: by default, on a pool connection that reaches the server directly, a refused try is
    /// prepared once, as with the opt-in, and nothing says prepared statements were turned off.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_default_a_direct_connections_try_is_prepared_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_002);
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        let pool = db.pool(1);
        let capture = common::capture::Capture::default();
        let elector = Elector::builder(pool.clone(), key)
            .check_interval(I)
            .build()
            .unwrap();
        let standby = Replica::run_captured(elector, &capture);
        tokio::time::sleep(6 * I).await;
        assert!(!standby.elector.is_leader());
        assert_eq!(
            prepared_tries(&pool).await,
            1,
            "one prepared try on the standby's only connection after six tries"
        );
        let said: Vec<String> = capture
            .at(tracing::Level::INFO, key)
            .into_iter()
            .filter(|line| line.contains("unnamed from now on"))
            .collect();
        assert!(said.is_empty(), "prepared statements stayed on: {said:?}");
        standby.stop().await.unwrap();
        leader.stop().await.unwrap();
    }

    /// E3: by default the leader's check is prepared on a direct connection too: on a private
    /// server that logs every statement, the leader's checks are executed by name, none unnamed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_default_a_direct_leaders_check_is_prepared() {
        let _timing = timing();
        init_tracing();
        let server = block_in_place(PgServer::spawn).unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        db.connect()
            .await
            .unwrap()
            .batch_execute(&format!(
                "ALTER DATABASE {} SET log_min_duration_statement = 0",
                db.name()
            ))
            .await
            .unwrap();
        let key = LockKey::new(3, 2_003);
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        tokio::time::sleep(4 * I).await;
        assert!(leader.elector.is_leader());
        let log = server.log_tail(100_000);
        const CHECK: &str = ": SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks";
        let checks = |how: &str| {
            log.lines()
                .filter(|l| l.contains(CHECK) && l.contains(how))
                .count()
        };
        let (named, unnamed) = (checks("execute s"), checks("execute <unnamed>"));
        leader.stop().await.unwrap();
        assert!(
            named >= 3,
            "{named} checks executed by name in 4·I\n{}",
            server.log_tail(30)
        );
        assert_eq!(unnamed, 0, "checks executed unnamed");
    }

    /// E3: with prepared statements turned off, six refused tries leave no prepared statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn turned_off_refused_tries_prepare_nothing() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_007);
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        let pool = db.pool(1);
        let elector = Elector::builder(pool.clone(), key)
            .check_interval(I)
            .prepared_statements(false)
            .build()
            .unwrap();
        let standby = Replica::run(elector);
        tokio::time::sleep(6 * I).await;
        assert!(!standby.elector.is_leader());
        assert_eq!(prepared_tries(&pool).await, 0, "no prepared try");
        standby.stop().await.unwrap();
        leader.stop().await.unwrap();
    }

    /// A session outside the elector that holds `key` shared: every try's question finds the
    /// lock free, and its full try is refused.
    async fn hold_shared(db: &TestDb, key: LockKey) -> tokio_postgres::Client {
        let foreign = db.connect().await.unwrap();
        foreign
            .query_one(
                "SELECT pg_advisory_lock_shared($1::int4, $2::int4)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        foreign
    }

    /// [`hold_shared`]'s hold let go.
    async fn let_go_shared(foreign: &tokio_postgres::Client, key: LockKey) {
        foreign
            .query_one(
                "SELECT pg_advisory_unlock_shared($1::int4, $2::int4)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
    }

    /// E3: a try on a pool connection the application left inside a transaction is not granted
    /// there (the lock session would keep that transaction open, where the server's
    /// `idle_session_timeout` does not apply): it closes that connection, and the next try, on
    /// a new one, leads from a session that is not inside a transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_on_a_connection_left_in_a_transaction_leads_from_a_fresh_one() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_005);
        let pool = db.pool(1);
        pool.get()
            .await
            .unwrap()
            .batch_execute("BEGIN")
            .await
            .unwrap();
        let standby = Replica::start(pool.clone(), key, I);
        wait_for(3 * I, || standby.elector.is_leader())
            .await
            .expect("the standby leads within 3·I");
        let admin = db.connect().await.unwrap();
        let holder = holders(&admin, key).await;
        assert_eq!(holder.len(), 1, "one holder: {holder:?}");
        let state: Option<String> = admin
            .query_one(
                "SELECT state FROM pg_catalog.pg_stat_activity WHERE pid = $1",
                &[&holder[0]],
            )
            .await
            .unwrap()
            .get(0);
        assert_ne!(
            state.as_deref(),
            Some("idle in transaction"),
            "the lock session is inside the application's transaction"
        );
        standby.stop().await.unwrap();
    }

    /// E3: a try that found the lock free but was refused closes its connection, so that a
    /// connection the application gave back to a shared pool inside an open transaction does
    /// not keep the question's momentary hold, which would refuse every other standby for as
    /// long as that transaction stays open. Here a foreign session holds the key shared: the
    /// question finds it free, the full try is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_refused_after_asking_closes_a_connection_left_in_a_transaction() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_003);
        let foreign = hold_shared(&db, key).await;
        // The application's pool of one: its only connection goes back inside a transaction.
        let shared_pool = db.pool(1);
        shared_pool
            .get()
            .await
            .unwrap()
            .batch_execute("BEGIN")
            .await
            .unwrap();
        let first = Replica::start(shared_pool.clone(), key, I);
        // Stopped between two tries (a try cut mid-way closes its connection).
        tokio::time::sleep(2 * I + I / 2).await;
        assert!(
            !first.elector.is_leader(),
            "a foreign session holds the key"
        );
        first.stop().await.unwrap();
        let other = Replica::start(db.pool(1), key, I);
        let_go_shared(&foreign, key).await;
        wait_for(3 * I, || other.elector.is_leader())
            .await
            .expect("another standby leads within 3·I once the foreign hold is gone");
        other.stop().await.unwrap();
        drop(shared_pool);
    }

    /// E3 (and preferences' "a handover costs the other standbys no logins"): a try whose
    /// question found the lock free but whose full try was refused, on a connection outside any
    /// transaction, gives that connection back: the question's hold ended with its statement.
    /// Here a foreign session holds the key shared, so every try asks, finds it free and is
    /// refused; before, each such try closed its connection and the pool opened a new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_refused_after_asking_gives_a_clean_connection_back() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_006);
        let foreign = hold_shared(&db, key).await;
        let proxy = shared_server_proxy().await;
        let standby = Replica::start(db.pool_via(proxy.addr(), 1), key, I);
        // Ten tries or so, each refused after its question found the lock free.
        tokio::time::sleep(10 * I).await;
        assert!(
            !standby.elector.is_leader(),
            "a foreign session holds the key"
        );
        assert_eq!(
            proxy.accepted(),
            1,
            "one connection for all the tries refused after asking"
        );
        let_go_shared(&foreign, key).await;
        wait_for(3 * I, || standby.elector.is_leader())
            .await
            .expect("the standby leads within 3·I once the foreign hold is gone");
        standby.stop().await.unwrap();
    }

    /// A standby's ask holds the key shared for one statement; nobody who looks for the leader
    /// takes such a hold for one: here a session holds it shared in an open transaction, and
    /// `current_leader` finds no leader, then the elector that leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_hold_of_the_key_is_no_leader() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 2_004);
        let mut asking = db.connect().await.unwrap();
        let admin = db.connect().await.unwrap();
        let transaction = asking.transaction().await.unwrap();
        transaction
            .query_one(
                "SELECT pg_try_advisory_xact_lock_shared($1::int4, $2::int4)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let who = pg_elector::current_leader(&admin, key).await.unwrap();
        assert!(who.is_none(), "a shared hold read as a leader: {who:?}");
        transaction.rollback().await.unwrap();
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        let who = pg_elector::current_leader(&admin, key).await.unwrap();
        assert!(who.is_some(), "the elector that leads is found");
        leader.stop().await.unwrap();
    }

    /// A pool that recycles with `DISCARD ALL` opens no backend in a thousand refused tries.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_discard_all_pool_opens_no_backend_in_1000_refused_tries() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 1_000);
        let leader = Replica::start(db.pool(1), key, I);
        // DISCARD ALL on every return to the pool forgets any prepared statement on the session:
        // a try that relied on one would fail on every other borrow, and each failure closes its
        // connection (its lock state is unknown), so the pool would open a backend per failure.
        let proxy = proxy_beside(&leader).await;
        let manager = deadpool_postgres::Manager::from_config(
            db.config_via(proxy.addr()),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Custom("DISCARD ALL".into()),
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(4)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap();
        let warm: Vec<_> = futures_join_all((0..4).map(|_| pool.get())).await;
        drop(warm);
        let opened = proxy.accepted();
        assert_eq!(opened, 4);
        let standbys: Vec<_> = (0..10)
            .map(|_| Replica::start(pool.clone(), key, Duration::from_millis(10)))
            .collect();

        // Each refused try is one transaction, and each recycle (DISCARD ALL) another.
        let client = db.connect().await.unwrap();
        let start = commits(&client).await;
        wait_for_async(Duration::from_secs(60), || async {
            client
                .query("SELECT pg_stat_clear_snapshot()", &[])
                .await
                .unwrap();
            commits(&client).await - start >= 2_000
        })
        .await
        .expect("1 000 tries within 60 s");
        assert_eq!(
            leaders(&standbys),
            Vec::<usize>::new(),
            "every try was refused"
        );
        assert_eq!(
            proxy.accepted(),
            opened,
            "refused tries on a DISCARD ALL pool opened no new backend"
        );
        for standby in standbys {
            standby.stop().await.unwrap();
        }
        leader.stop().await.unwrap();
    }

    /// An unreachable server leaves the replica standby, and it leads once the server is back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_server_leaves_it_standby_until_it_is_back() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        proxy.blackhole();
        let replica = Replica::start(db.pool_via(proxy.addr(), 2), LockKey::new(3, 1), I);

        tokio::time::sleep(4 * I).await;
        assert!(!replica.elector.is_leader());
        assert!(
            !replica.task.is_finished(),
            "run goes on through failed tries"
        );

        proxy.pass();
        // The next try starts within one I; a try cut off by the blackhole may still wait out
        // its own bound (I for the connection, I for the query) first.
        wait_for(3 * I + I / 2, || replica.elector.is_leader())
            .await
            .expect("leads once the server is reachable");
        replica.stop().await.unwrap();
    }

    /// An exhausted pool leaves the replica standby, and it leads once a connection is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exhausted_pool_leaves_it_standby_until_one_is_free() {
        let _timing = timing();
        let db = fresh_db().await;
        let pool = db.pool(1);
        let hog = pool.get().await.unwrap();
        let replica = Replica::start(pool.clone(), LockKey::new(3, 2), I);

        tokio::time::sleep(4 * I).await;
        assert!(!replica.elector.is_leader());
        assert!(
            !replica.task.is_finished(),
            "run goes on through an exhausted pool"
        );

        drop(hog);
        wait_for(2 * I + I / 2, || replica.elector.is_leader())
            .await
            .expect("leads once the pool has a connection");
        // The winning connection left the pool for good; the pool may open another.
        assert_eq!(pool.status().size, 0, "{:?}", pool.status());
        replica.stop().await.unwrap();
    }

    /// A server answering in three and a half intervals costs a backend per several ticks, not one
    /// per tick.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_in_3_5_intervals_cost_a_backend_per_several_ticks() {
        let _timing = timing();
        let db = fresh_db().await;
        let interval = Duration::from_millis(100);
        let proxy = shared_server_proxy().await;
        // Every answer of the server, the connection's start-up included, comes 3.5·I late.
        proxy.delay(interval * 7 / 2);
        let replica = Replica::start(db.pool_via(proxy.addr(), 2), LockKey::new(3, 35), interval);
        tokio::time::sleep(20 * interval).await;
        let opened = proxy.accepted();
        eprintln!("server answering in 3.5·I: {opened} connections in 20 ticks");
        // A connect slower than I goes on in the background instead of being abandoned every I,
        // and a grant answered late is checked (which, this slow, times out) instead of being
        // thrown away at once: each cycle (connect, try, check) takes several ticks.
        assert!(
            opened <= 6,
            "{opened} connections in 20 ticks: a backend per tick is churn"
        );
        assert!(!replica.elector.is_leader(), "no check answers within I");
        replica.stop().await.unwrap();
    }

    /// A grant answered between two and three intervals after the try is checked at once, and its
    /// term lasts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_answered_in_2_to_3_intervals_is_checked_at_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        let pool = db.pool_via(proxy.addr(), 2);
        drop(pool.get().await.unwrap()); // a warm connection: only the try is slow
        proxy.delay(Duration::from_secs(60));
        let elector = pg_elector::Elector::builder(pool, LockKey::new(3, 36))
            .check_interval(I)
            .build()
            .unwrap();
        let mut leadership = elector.subscribe();
        let replica = Replica::run(elector);
        // The first try goes out at once; its answer is released at 2.2·I, after which the server
        // answers at once again.
        tokio::time::sleep(I * 11 / 5).await;
        proxy.delay(Duration::ZERO);
        wait_for(I, || replica.elector.is_leader())
            .await
            .expect("leads once the late grant is checked");
        // A lease counted from the try's send time would run out at 3·I, before the first
        // regular check at 3.2·I; counted from the check at the grant it lasts.
        tokio::time::sleep(5 * I).await;
        assert!(replica.elector.is_leader(), "still leading 5·I later");
        assert_eq!(
            leadership.borrow_and_update().changes,
            1,
            "one promotion, no demotion"
        );
        replica.stop().await.unwrap();
    }

    /// An answer the try does not know closes the connection and frees the lock granted on it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_answer_to_the_try_closes_its_connection() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 7);
        let admin = db.connect().await.unwrap();
        let proxy = shared_server_proxy().await;
        let pool = db.pool_via(proxy.addr(), 2);
        drop(pool.get().await.unwrap()); // the pool's one connection, idle
        assert_eq!((proxy.accepted(), pool.status().size), (1, 1));
        // The server grants the lock, and the replica hears "GRANTED", which it does not know:
        // the session may hold the lock, so it must not go back to the pool.
        proxy.rewrite_answers(b"granted", b"GRANTED").unwrap();
        let interval = Duration::from_secs(1);
        let elector = Elector::builder(pool.clone(), key)
            .check_interval(interval)
            .build()
            .unwrap();
        let capture = capture::Capture::default();
        let replica = Replica::run_captured(elector, &capture);
        // The first try goes out at once, the next one interval later.
        wait_for(interval / 2, || {
            !capture.events("acquire lock connection").is_empty()
        })
        .await
        .expect("the unknown answer is logged within I/2");
        let logged = capture.events("acquire lock connection");
        assert_eq!(logged[0].level, tracing::Level::WARN, "{logged:?}");
        // "GRANTED", or "GRANTED_unbounded" from a server without `idle_session_timeout` (13).
        let answer = logged[0].field("error");
        assert!(
            answer.contains("\"GRANTED\"") || answer.contains("\"GRANTED_unbounded\""),
            "the log names the answer: {logged:?}"
        );
        assert!(!replica.elector.is_leader());
        // Not back in the pool, and closed: the server frees the lock it granted on it.
        assert_eq!(pool.status().size, 0, "{:?}", pool.status());
        wait_for_async(interval / 4, || async {
            holders(&admin, key).await.is_empty()
        })
        .await
        .expect("the lock granted on the closed session is free within I/4");
        wait_for(interval / 4, || proxy.open() == 0)
            .await
            .expect("no connection left open within I/4");

        // Answers the replica knows again: its next try opens a new connection and leads.
        proxy.stop_rewriting();
        wait_for(2 * interval, || replica.elector.is_leader())
            .await
            .expect("leads at its next try");
        assert_eq!(proxy.accepted(), 2, "one new connection for the next try");
        replica.stop().await.unwrap();
    }

    /// E3: a try whose borrow could not finish in time (the application holds the whole pool)
    /// leaves that borrow under way, to be picked up by the next try. When the standby leads in
    /// between (its waiting session is granted), no next try comes for the whole term: the borrow
    /// must not keep the connection it gets, or a two-connection pool loses half of itself to the
    /// election while this replica leads.
    /// A borrow left under way gives its connection back when the standby leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_borrow_left_under_way_gives_its_connection_back() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(3, 0x5);
        let fast = |pool, name: &str| {
            Elector::builder(pool, key)
                .check_interval(I)
                .identity(name)
                .fast_takeover(true)
                .build()
                .unwrap()
        };
        let leader = Replica::run(fast(db.pool(2), "leader"));
        wait_for(3 * I, || leader.elector.is_leader())
            .await
            .expect("the first replica leads");
        let pool = db.pool(2);
        let standby = Replica::run(fast(pool.clone(), "standby"));
        // Its waiting session is out of the pool, which has its two connections for the rest.
        session_waiting(&admin, key, "standby", 10 * I).await;
        let held = (pool.get().await.unwrap(), pool.get().await.unwrap());
        // A try or two find no connection within I; the last borrow stays under way.
        tokio::time::sleep(3 * I).await;
        leader.stop().await.unwrap();
        wait_for(10 * I, || standby.elector.is_leader())
            .await
            .expect("the waiting session takes over");
        drop(held);
        tokio::time::sleep(2 * I).await;
        assert!(
            both_connections(&pool).await,
            "the application cannot have both connections of its pool while the standby leads: {:?}",
            pool.status()
        );
        assert!(standby.elector.is_leader());
        standby.stop().await.unwrap();
    }

    /// A borrow left under way gives its connection back when the standby resigns: no try
    /// comes during its cooldown to take the connection the borrow got.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_borrow_left_under_way_ends_at_a_resign() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(3, 0x6);
        let poll = |pool| {
            Elector::builder(pool, key)
                .check_interval(I)
                .build()
                .unwrap()
        };
        let leader = Replica::run(poll(db.pool(2)));
        wait_for(3 * I, || leader.elector.is_leader())
            .await
            .expect("the first replica leads");
        let pool = db.pool(2);
        let standby = Replica::run(poll(pool.clone()));
        let held = (pool.get().await.unwrap(), pool.get().await.unwrap());
        // A try or two find no connection within I; the last borrow stays under way.
        tokio::time::sleep(3 * I).await;
        assert!(!standby.elector.resign(Duration::from_secs(60)).await);
        tokio::time::sleep(2 * I).await;
        drop(held);
        tokio::time::sleep(2 * I).await;
        assert!(
            both_connections(&pool).await,
            "the application cannot have both connections of its pool while the standby cools \
             down: {:?}",
            pool.status()
        );
        standby.stop().await.unwrap();
        leader.stop().await.unwrap();
    }
}

/// A leader never tries again on its session, so one unlock frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_a_leader_never_tries_again_so_one_unlock_frees_it() {
    let _timing = timing();
    // The server log is read, so an external server (DATABASE_URL) will not do: then this
    // test starts a private one.
    let shared = PgServer::shared().unwrap();
    let own = (!shared.is_private()).then(|| PgServer::spawn().unwrap_or_else(|e| panic!("{e}")));
    let server = own.as_ref().unwrap_or(shared);
    let db = server
        .create_database()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let log = server
        .log_file()
        .expect("a private server logs to a file")
        .to_owned();
    let admin = db.connect().await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET log_statement = 'all'",
            db.name()
        ))
        .await
        .unwrap();

    let key = LockKey::new(4, 4);
    let interval = Duration::from_millis(20);
    let elector = Elector::builder(db.pool(1), key)
        .check_interval(interval)
        .build()
        .unwrap();
    let replica = Replica::run(elector);
    // One term that holds for a second (some 50 leader checks). At I = 20 ms its lease is
    // 60 ms: on a loaded machine a starved process can lose a term to its own lease and take
    // the lock again on another session; then the measure starts over on the new term.
    let mut attempts = 0;
    let (term, pid) = loop {
        attempts += 1;
        wait_for(10 * interval, || replica.elector.is_leader())
            .await
            .expect("a leader");
        let term = replica.elector.term();
        let pid = holders(&admin, key).await[0];
        tokio::time::sleep(Duration::from_secs(1)).await;
        if term.is_leader() {
            break (term, pid);
        }
        assert!(
            attempts < 5,
            "no term held for a second in {attempts} attempts"
        );
        eprintln!(
            "the term ended meanwhile ({:?}); measured again",
            term.end()
        );
    };
    replica.stop().await.unwrap();
    assert_eq!(term.end(), Some(pg_elector::TermEnd::Shutdown));

    let tag = format!("[{pid}]");
    // The key's unlock (the try's statement also unlocks the handover marker, a bigint).
    let unlock = "pg_advisory_unlock($1::int4";
    let lines: Vec<String> = wait_for_log(&log, &tag, unlock).await;
    let count = |needle: &str| {
        lines
            .iter()
            .filter(|line| line.contains(needle) && line.contains("execute"))
            .count()
    };
    assert_eq!(
        count("pg_try_advisory_lock($1"),
        1,
        "one try on the lock session"
    );
    assert!(count("pg_locks") >= 20, "{} checks", count("pg_locks"));
    assert_eq!(count(unlock), 1);
    assert!(holders(&admin, key).await.is_empty());
}

/// The log lines of one backend, once `last` shows among them.
async fn wait_for_log(path: &std::path::Path, tag: &str, last: &str) -> Vec<String> {
    let mut lines = Vec::new();
    wait_for(Duration::from_secs(5), || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        lines = text
            .lines()
            .filter(|line| line.contains(tag))
            .map(str::to_owned)
            .collect();
        lines.iter().any(|line| line.contains(last))
    })
    .await
    .unwrap_or_else(|| panic!("the server log shows no {last:?} for {tag}"));
    lines
}
