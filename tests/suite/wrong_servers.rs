//! E16: wrong servers. A hot standby (read replica) never yields leadership; a
//! transaction-mode pooler (PgBouncer) is detected and never lets a replica lead for longer
//! than one check; a session-mode pooler works like a direct connection.

use crate::common;

use std::time::{Duration, Instant};

use common::capture::Capture;
use common::*;
use deadpool_postgres::Pool;
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::server::pooler::{Pgbouncer, PoolMode};
use tokio::task::block_in_place;

/// A replica at interval `I` whose `run` logs into `capture`.
fn captured(pool: Pool, key: LockKey, capture: &Capture) -> Replica {
    captured_fast(pool, key, capture, false)
}

/// The same, with fast takeover or without.
fn captured_fast(pool: Pool, key: LockKey, capture: &Capture, fast: bool) -> Replica {
    let elector = Elector::builder(pool, key)
        .check_interval(I)
        .fast_takeover(fast)
        .build()
        .expect("valid elector");
    Replica::run_captured(elector, capture)
}

/// leadership at a stretch, and how many samples saw two or more leaders.
async fn watch_leadership(electors: &[&Elector], span: Duration) -> (Duration, usize, usize) {
    let start = Instant::now();
    let mut since: Vec<Option<Instant>> = vec![None; electors.len()];
    let mut longest = Duration::ZERO;
    let mut both = 0;
    let mut terms = 0;
    while start.elapsed() < span {
        let now = Instant::now();
        let mut leading = 0;
        for (i, elector) in electors.iter().enumerate() {
            if elector.is_leader() {
                leading += 1;
                let began = *since[i].get_or_insert_with(|| {
                    terms += 1;
                    now
                });
                longest = longest.max(now - began);
            } else {
                since[i] = None;
            }
        }
        if leading > 1 {
            both += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (longest, both, terms)
}

// ---------------------------------------------------------------------------------------------
// Read replicas.

mod e16 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_elector_on_a_read_replica_never_leads_and_says_why() {
        on_a_read_replica(false).await;
    }

    /// With fast takeover no session waits on the replica either: its tries never find the lock
    /// held by another session, which is what starts a waiting session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fast_takeover_on_a_read_replica_never_leads_nor_waits() {
        on_a_read_replica(true).await;
    }

    async fn on_a_read_replica(fast: bool) {
        let _timing = timing();
        init_tracing();
        let primary = block_in_place(PgServer::spawn).unwrap_or_else(|e| panic!("{e}"));
        // The database exists before the copy, so the standby has it too.
        let db = primary.create_database().await.unwrap();
        let standby = block_in_place(|| primary.spawn_standby()).unwrap_or_else(|e| panic!("{e}"));
        assert!(block_in_place(|| standby.is_in_recovery()).unwrap());
        let key = LockKey::new(16, 1);
        let capture = Capture::default();

        // Alone: nobody holds the lock anywhere, and still the standby's elector never leads.
        let on_replica = captured_fast(db.pool_via(standby.addr(), 2), key, &capture, fast);
        let (longest, _, _) = watch_leadership(&[&on_replica.elector], 5 * I).await;
        assert_eq!(longest, Duration::ZERO, "an elector on a read replica led");
        let errors = capture.errors(key);
        assert_eq!(
            errors.len(),
            1,
            "one ERROR, then its repeats at DEBUG for a minute: {errors:?}"
        );
        assert!(
            errors
                .iter()
                .all(|m| m.contains("in recovery") && m.contains("read replica")),
            "the error says why: {errors:?}"
        );
        let repeats = capture.at(tracing::Level::DEBUG, key);
        assert!(
            repeats.iter().filter(|m| m.contains("in recovery")).count() >= 3,
            "every try over 5·I says it, at DEBUG after the first: {repeats:?}"
        );

        // With a leader on the primary, still standby (and no lock taken on the replica).
        let on_primary = captured(db.pool(2), key, &capture);
        wait_for(2 * I, || on_primary.elector.is_leader())
            .await
            .expect("the primary-side elector leads");
        let (longest, _, _) = watch_leadership(&[&on_replica.elector], 3 * I).await;
        assert_eq!(longest, Duration::ZERO);
        let (replica_client, conn) = db
            .config_via(standby.addr())
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        assert_eq!(
            waiting(&replica_client, key).await,
            vec![],
            "no session waits for the lock on the read replica"
        );
        on_primary.stop().await.unwrap();

        // Promoted, the former replica is a primary of its own: the elector leads there.
        let promoted = Instant::now();
        block_in_place(|| standby.promote()).unwrap_or_else(|e| panic!("{e}"));
        let took = wait_for(2 * I + I / 2, || on_replica.elector.is_leader())
            .await
            .unwrap_or_else(|| {
                panic!(
                    "no leadership within 2·I of the promotion\n{}",
                    standby.log_tail(20)
                )
            });
        let (promoted_client, conn) = db
            .config_via(standby.addr())
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        assert_eq!(holders(&promoted_client, key).await.len(), 1);
        eprintln!(
            "read replica: {} errors logged while in recovery; led {took:?} after the promotion \
         ({:?} including pg_ctl promote)",
            errors.len(),
            promoted.elapsed()
        );
        on_replica.stop().await.unwrap();
        drop(standby);
        drop(db);
    }

    // ---------------------------------------------------------------------------------------------
    // Poolers.

    /// Three electors behind PgBouncer in transaction mode, started a third of I apart; watched for
    /// 10·I.
    async fn through_a_transaction_pooler(pool_size: usize, key: LockKey) {
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = fresh_db().await;
        let bouncer = block_in_place(|| Pgbouncer::start(server, PoolMode::Transaction, pool_size))
            .unwrap_or_else(|e| panic!("{e}"));
        let capture = Capture::default();
        let electors: Vec<Elector> = (0..3)
            .map(|_| {
                Elector::builder(bouncer.pool_for(&db, 2), key)
                    .check_interval(I)
                    .build()
                    .unwrap()
            })
            .collect();
        // Watched from before the first start, so that every term is seen whole.
        let watched: Vec<&Elector> = electors.iter().collect();
        let (replicas, (longest, both, terms)) = tokio::join!(
            async {
                let mut replicas = Vec::new();
                for elector in &electors {
                    replicas.push(Replica::run_captured(elector.clone(), &capture));
                    tokio::time::sleep(I / 3).await;
                }
                replicas
            },
            watch_leadership(&watched, 11 * I),
        );
        let errors = capture.errors(key);
        let pooler_errors = errors
            .iter()
            .filter(|m| m.contains("transaction-mode pooler"))
            .count();
        eprintln!(
            "transaction pooler, pool size {pool_size}: {terms} terms, longest {longest:?}, \
         {both} samples with two leaders, {pooler_errors} pooler errors in the log"
        );
        for replica in replicas {
            replica.stop().await.unwrap();
        }
        assert!(
            longest <= I + I / 2,
            "a replica led for {longest:?} behind a transaction pooler (pool size {pool_size}); \
         one check is {I:?}"
        );
        assert_eq!(both, 0, "two leaders at once (pool size {pool_size})");
        assert!(
            pooler_errors > 0,
            "the log names the transaction-mode pooler (pool size {pool_size}): {errors:?}\n{}",
            bouncer.log_tail(20)
        );
        drop(bouncer);
    }

    /// E16: behind a transaction pooler (pool size 1), with a standby whose own key another
    /// session holds beside a leader of another key: that leader steps down within one check,
    /// and the standby's log names the pooler, though its key is never free. The standby's
    /// question answers true on a server session an elector's lock session marked, so that the
    /// try which follows reports the pooler and leaves the visit (without that, the leader led
    /// for the whole window).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_of_another_key_finds_the_shared_session() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = fresh_db().await;
        let bouncer = block_in_place(|| Pgbouncer::start(server, PoolMode::Transaction, 1))
            .unwrap_or_else(|e| panic!("{e}"));
        let (key_a, key_b) = (LockKey::new(16, 9), LockKey::new(16, 10));
        let direct = Replica::start(db.pool(1), key_b, I);
        wait_a_leads(&direct).await;
        let capture = Capture::default();
        let behind_a = captured(bouncer.pool_for(&db, 2), key_a, &capture);
        let behind_b = captured(bouncer.pool_for(&db, 2), key_b, &capture);
        let (longest, _, terms) = watch_leadership(&[&behind_a.elector], 8 * I).await;
        let errors = capture.errors(key_b);
        behind_b.stop().await.unwrap();
        behind_a.stop().await.unwrap();
        direct.stop().await.unwrap();
        assert!(
            longest <= I + I / 2,
            "key A's elector led for {longest:?} behind a transaction pooler ({terms} terms); \
             one check is {I:?}"
        );
        assert!(
            errors.iter().any(|m| m.contains("transaction-mode pooler")),
            "key B's standby names the pooler: {errors:?}"
        );
        drop(bouncer);
    }

    /// Through a transaction pooler no replica leads longer than one check, and the log names the
    /// pooler.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_a_transaction_pooler_none_leads_over_one_check() {
        let _timing = timing();
        // Pool size 1: every client gets the same server session, on which every try would succeed
        // (advisory locks are re-entrant per session) were it not for the session marks.
        through_a_transaction_pooler(1, LockKey::new(16, 2)).await;
        // Pool size 3: the sessions of consecutive statements differ.
        through_a_transaction_pooler(3, LockKey::new(16, 3)).await;
    }

    /// Standbys behind PgBouncer in `mode` (three server sessions), the leader connected
    /// directly: for 8·I every try is refused without a warning or an error, whether the server
    /// session a try lands on has its prepared statement or not. With `prepared` (the opt-in),
    /// behind a session pooler no standby turns prepared statements off, and behind a
    /// transaction pooler each says so at most once.
    async fn standbys_behind_a_pooler_are_refused_cleanly(
        mode: PoolMode,
        key: LockKey,
        prepared: bool,
    ) {
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = fresh_db().await;
        let bouncer =
            block_in_place(|| Pgbouncer::start(server, mode, 3)).unwrap_or_else(|e| panic!("{e}"));
        let leader = Replica::start(db.pool(1), key, I);
        wait_a_leads(&leader).await;
        let capture = Capture::default();
        let standbys: Vec<Replica> = (0..3)
            .map(|_| {
                let elector = Elector::builder(bouncer.pool_for(&db, 2), key)
                    .check_interval(I)
                    .prepared_statements(prepared)
                    .build()
                    .expect("valid elector");
                Replica::run_captured(elector, &capture)
            })
            .collect();
        let electors: Vec<&Elector> = standbys.iter().map(|r| &r.elector).collect();
        let (_, _, terms) = watch_leadership(&electors, 8 * I).await;
        assert_eq!(terms, 0, "{mode:?}: a standby led");
        assert!(
            leader.elector.is_leader(),
            "{mode:?}: the leader kept leading"
        );
        let warnings = capture.at(tracing::Level::WARN, key);
        let errors = capture.errors(key);
        assert!(
            warnings.is_empty() && errors.is_empty(),
            "{mode:?}: {warnings:?} {errors:?}\n{}",
            bouncer.log_tail(20)
        );
        let turned_off = capture
            .at(tracing::Level::INFO, key)
            .iter()
            .filter(|line| line.contains("does not keep prepared statements"))
            .count();
        // A session pooler keeps each client on one server session: nothing to turn off there.
        let most = if prepared && mode == PoolMode::Transaction {
            standbys.len()
        } else {
            0
        };
        assert!(
            turned_off <= most,
            "{mode:?}, prepared {prepared}: {turned_off} standbys turned prepared statements off"
        );
        for standby in standbys {
            standby.stop().await.unwrap();
        }
        leader.stop().await.unwrap();
        drop(bouncer);
    }

    /// E16, E3: behind each PgBouncer mode the suite runs, refused tries stay clean (each
    /// statement unnamed, the default).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn behind_each_pooler_mode_refused_tries_are_clean() {
        let _timing = timing();
        for (mode, object) in [(PoolMode::Session, 5), (PoolMode::Transaction, 6)] {
            standbys_behind_a_pooler_are_refused_cleanly(mode, LockKey::new(16, object), false)
                .await;
        }
    }

    /// E16, E3: the same with prepared statements turned on: where the server session keeps
    /// them (session mode) they are used; where it does not (transaction mode on a PgBouncer
    /// without prepared-statement support), a try falls back to unnamed statements, and stays
    /// clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_prepared_statements_behind_each_pooler_mode_refused_tries_are_clean() {
        let _timing = timing();
        for (mode, object) in [(PoolMode::Session, 7), (PoolMode::Transaction, 8)] {
            standbys_behind_a_pooler_are_refused_cleanly(mode, LockKey::new(16, object), true)
                .await;
        }
    }

    /// A standby through `bouncer` (one server session) on a pool of one connection, with
    /// prepared statements as `prepared` says (`None`: the default), beside the leader of `key`:
    /// the tries it prepared on that server session after 4·I.
    async fn tries_prepared_through(
        bouncer: &Pgbouncer,
        db: &TestDb,
        key: LockKey,
        prepared: Option<bool>,
    ) -> i64 {
        let pool = bouncer.pool_for(db, 1);
        let mut builder = Elector::builder(pool.clone(), key).check_interval(I);
        if let Some(on) = prepared {
            builder = builder.prepared_statements(on);
        }
        let standby = Replica::run(builder.build().expect("valid elector"));
        tokio::time::sleep(4 * I).await;
        assert!(!standby.elector.is_leader(), "the standby stayed one");
        // The pool's one connection: in session mode the standby's server session, in
        // transaction mode the only one there is.
        let tries = prepared_tries(&pool).await;
        standby.stop().await.unwrap();
        drop(pool);
        tries
    }

    /// E16, E3: by default a standby behind PgBouncer (either mode) prepares nothing on the
    /// server session its tries land on: the pooler's cancel keys are not the server's. The
    /// same standby with prepared statements turned on prepares its try there (so the count
    /// can see them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_default_behind_each_pooler_mode_nothing_is_prepared() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = fresh_db().await;
        for (mode, object) in [(PoolMode::Session, 11), (PoolMode::Transaction, 12)] {
            let key = LockKey::new(16, object);
            let bouncer = block_in_place(|| Pgbouncer::start(server, mode, 1))
                .unwrap_or_else(|e| panic!("{e}"));
            let leader = Replica::start(db.pool(1), key, I);
            wait_a_leads(&leader).await;
            let by_default = tries_prepared_through(&bouncer, &db, key, None).await;
            assert_eq!(by_default, 0, "{mode:?}: by default nothing is prepared");
            let turned_on = tries_prepared_through(&bouncer, &db, key, Some(true)).await;
            assert!(turned_on >= 1, "{mode:?}: turned on, the try is prepared");
            leader.stop().await.unwrap();
            drop(bouncer);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_a_session_pooler_election_works() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = fresh_db().await;
        let bouncer = block_in_place(|| Pgbouncer::start(server, PoolMode::Session, 10))
            .unwrap_or_else(|e| panic!("{e}"));
        // The pooler's first server connection to this fresh database is logged in before the
        // replicas start: on a loaded machine that first login (the database's first backend
        // builds its caches) took longer than I, and the bound below is on the election.
        drop(
            bouncer
                .pool_for(&db, 1)
                .get()
                .await
                .expect("a connection through the pooler"),
        );
        let key = LockKey::new(16, 4);
        let capture = Capture::default();
        let mut replicas: Vec<Replica> = (0..3)
            .map(|_| captured(bouncer.pool_for(&db, 2), key, &capture))
            .collect();
        let electors: Vec<&Elector> = replicas.iter().map(|r| &r.elector).collect();
        wait_for(2 * I, || {
            electors.iter().filter(|e| e.is_leader()).count() == 1
        })
        .await
        .expect("one leader within 2·I");
        let leader = electors.iter().position(|e| e.is_leader()).unwrap();
        let (longest, both, terms) = watch_leadership(&electors, 5 * I).await;
        assert_eq!(terms, 1, "the leadership stays with one replica");
        assert!(longest >= 4 * I, "the leader kept leading: {longest:?}");
        assert_eq!(both, 0);
        assert!(electors[leader].is_leader());
        let admin = db.connect().await.unwrap();
        assert_eq!(holders(&admin, key).await.len(), 1);
        assert!(capture.errors(key).is_empty(), "{:?}", capture.errors(key));

        // Graceful shutdown hands over.
        let old = replicas.remove(leader);
        old.stop().await.expect("shutdown returns Ok");
        let released = Instant::now();
        let took = wait_for(I + I / 2, || replicas.iter().any(|r| r.elector.is_leader()))
            .await
            .expect("a standby leads within one I of the release");
        assert_eq!(replicas.iter().filter(|r| r.elector.is_leader()).count(), 1);
        eprintln!(
            "session pooler: graceful handover in {took:?} ({:?} after the release)",
            released.elapsed()
        );
        for replica in replicas {
            replica.stop().await.unwrap();
        }
        assert!(holders(&admin, key).await.is_empty());
        drop(bouncer);
    }
}
