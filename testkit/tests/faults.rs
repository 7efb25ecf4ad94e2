//! Each fault of the kit, put in place on real replicas of a real server: it returns once the
//! fault is in place, it does to the replicas what its docs say, and the timeline shows no two
//! leaders at once. Intervals are short (`I`); bounds are multiples of it with slack for a
//! loaded 2-core machine.

use std::sync::Arc;
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::replicas::{ReplicasBuilder, identity};
use pg_elector_testkit::server::sql::lock_sessions;
use pg_elector_testkit::{PgServer, Replicas, TestDb, Who};

const I: Duration = Duration::from_millis(200);

/// Time for the first replica to lead: its pool opens its first connection.
const STARTUP: Duration = Duration::from_secs(5);

async fn db() -> TestDb {
    PgServer::shared()
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a test database")
}

async fn leading(db: &TestDb, count: usize) -> (Replicas, usize) {
    let replicas = Replicas::builder(db, LockKey::new(21, 1))
        .count(count)
        .check_interval(I)
        .start()
        .await
        .expect("replicas start");
    let first = replicas
        .wait_for_leader(STARTUP)
        .await
        .expect("a first leader");
    (replicas, first.replica)
}

async fn no_overlap(replicas: Replicas) {
    replicas.finish().await.assert_no_two_leaders();
}

#[tokio::test]
async fn kill_session_moves_the_lead_within_one_interval() {
    let _timing = timing();
    let db = db().await;
    let (replicas, old) = leading(&db, 3).await;
    let killed = replicas.kill_session(Who::Leader).await.unwrap();
    assert_eq!(killed, old);
    let admin = db.connect().await.unwrap();
    let left = lock_sessions(&admin, replicas.key()).await.unwrap();
    assert!(
        left.iter().all(|s| s.name != identity(old) || !s.granted),
        "the killed session still holds the lock: {left:?}"
    );
    // The old leader hears its closed connection at once; the next try (its own or a
    // standby's) begins the next term.
    let next = replicas
        .wait_for_next_term(3 * I)
        .await
        .expect("a term ≤ 3·I");
    assert!(next.took <= 3 * I, "the next term after {:?}", next.took);
    let seen = replicas.seen();
    let terms = &seen.leaders;
    assert!(terms.len() >= 2, "{terms:?}");
    assert_eq!(terms[0].replica, old);
    assert!(terms[0].to.is_some(), "the old term ended: {terms:?}");
    assert_eq!(terms.last().unwrap().replica, next.replica);
    no_overlap(replicas).await;
}

#[tokio::test]
async fn kill_session_of_a_poll_standby_is_an_error() {
    let db = db().await;
    let (replicas, old) = leading(&db, 2).await;
    // A poll-mode standby holds no session between tries (each try is one short statement):
    // the call says so rather than pretending.
    let standby = 1 - old;
    let err = replicas.kill_session(standby).await.unwrap_err();
    assert!(err.to_string().contains("no lock session"), "{err}");
    assert_eq!(replicas.leader(), Some(old));
    let err = replicas.kill_session(7).await.unwrap_err();
    assert!(err.to_string().contains("no replica 7"), "{err}");
    no_overlap(replicas).await;
}

#[tokio::test]
async fn partition_demotes_the_leader_before_another_leads() {
    let _timing = timing();
    let db = db().await;
    let (replicas, old) = leading(&db, 3).await;
    replicas.partition(Who::Leader).unwrap();
    // Next check, and its timeout: 2·I.
    let demoted = tokio::time::timeout(3 * I, async {
        while replicas.replica(old).elector.is_leader() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        demoted.is_ok(),
        "the partitioned leader still led after 3·I"
    );
    let admin = db.connect().await.unwrap();
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    if version >= 140_000 {
        // The server ends the silent session at 4·I; the next try then wins.
        let next = replicas
            .wait_for_other_leader(old, 8 * I)
            .await
            .expect("a new leader ≤ 8·I");
        assert_ne!(next.replica, old);
    } else {
        eprintln!(
            "PostgreSQL 13 has no idle_session_timeout: the silent session keeps the lock, so \
             this test checks the demotion only"
        );
    }
    replicas.heal(old);
    no_overlap(replicas).await;
}

#[tokio::test]
async fn reset_connections_ends_the_term_and_a_leader_follows() {
    let _timing = timing();
    let db = db().await;
    let (replicas, old) = leading(&db, 3).await;
    let accepted = replicas.proxy(old).accepted();
    replicas.reset_connections(Who::Leader).await.unwrap();
    assert!(
        replicas.proxy(old).open() == 0 || replicas.proxy(old).accepted() > accepted,
        "the reset returned with the old connections open"
    );
    replicas.wait_for_no_leader(I).await.unwrap();
    let next = replicas
        .wait_for_leader(3 * I)
        .await
        .expect("a leader ≤ 3·I");
    assert!(next.took <= 3 * I, "a new leader after {:?}", next.took);
    no_overlap(replicas).await;
}

#[tokio::test]
async fn a_slow_server_makes_the_leader_step_down() {
    let _timing = timing();
    let db = db().await;
    let (replicas, old) = leading(&db, 3).await;
    // Answers 3·I late: the leader's check cannot finish within its bound.
    replicas.slow(Who::Leader, 3 * I).unwrap();
    assert_eq!(replicas.proxy(old).current_delay(), 3 * I);
    let demoted = tokio::time::timeout(4 * I, async {
        while replicas.replica(old).elector.is_leader() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        demoted.is_ok(),
        "the leader of a slow server still led after 4·I"
    );
    replicas.slow(old, Duration::ZERO).unwrap();
    replicas
        .wait_for_leader(10 * I)
        .await
        .expect("a leader once the server is quick again");
    no_overlap(replicas).await;
}

#[tokio::test]
async fn a_slightly_slow_server_keeps_its_leader() {
    let _timing = timing();
    let db = db().await;
    let (replicas, old) = leading(&db, 2).await;
    replicas.slow_server(I / 10);
    tokio::time::sleep(5 * I).await;
    assert_eq!(replicas.leader(), Some(old), "20 ms answers moved the lead");
    no_overlap(replicas).await;
}

#[tokio::test]
async fn an_exhausted_pool_keeps_its_replica_from_taking_over() {
    let _timing = timing();
    let db = db().await;
    let (mut replicas, old) = leading(&db, 2).await;
    let standby = 1 - old;
    let hold = replicas.exhaust_pool(standby).await.unwrap();
    let status = replicas.replica(standby).pool.status();
    assert_eq!(
        (status.available, status.size),
        (0, status.max_size),
        "{status:?}"
    );
    assert_eq!(hold.len(), status.max_size);
    // The leader dies; the standby cannot borrow a connection to try, so nobody leads.
    replicas.crash(old).await;
    tokio::time::sleep(3 * I).await;
    assert_eq!(replicas.leaders(), Vec::<usize>::new());
    drop(hold);
    let next = replicas
        .wait_for_leader(3 * I)
        .await
        .expect("a leader once the pool lends");
    assert_eq!(next.replica, standby);
    no_overlap(replicas).await;
}

#[tokio::test]
async fn crash_frees_the_lock_for_the_next_try() {
    let _timing = timing();
    let db = db().await;
    let (mut replicas, old) = leading(&db, 3).await;
    replicas.crash(old).await;
    let next = replicas
        .wait_for_other_leader(old, 3 * I)
        .await
        .expect("a leader ≤ 3·I");
    assert!(next.took <= 3 * I, "a new leader after {:?}", next.took);
    // It comes back as a standby.
    replicas.restart(old);
    tokio::time::sleep(2 * I).await;
    assert_eq!(replicas.leader(), Some(next.replica));
    no_overlap(replicas).await;
}

#[tokio::test]
async fn stop_hands_over_gracefully() {
    let _timing = timing();
    let db = db().await;
    let (mut replicas, old) = leading(&db, 2).await;
    replicas.stop(old).await;
    let next = replicas
        .wait_for_other_leader(old, 2 * I)
        .await
        .expect("a leader ≤ 2·I");
    assert_eq!(next.replica, 1 - old);
    no_overlap(replicas).await;
}

#[tokio::test]
async fn restart_server_ends_every_term_and_a_leader_follows() {
    let _timing = timing();
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::spawn)
            .await
            .unwrap()
            .expect("a private server"),
    );
    let db = server.create_database().await.unwrap();
    let (replicas, _) = leading(&db, 2).await;
    replicas.restart_server(&server).await.unwrap();
    db.connect()
        .await
        .expect("the server accepts connections once the call returns");
    // A leader again within an interval of the server accepting, with slack.
    replicas
        .wait_for_leader(3 * I)
        .await
        .expect("a leader ≤ 3·I after the restart");
    no_overlap(replicas).await;
    drop(db);
}

#[tokio::test]
async fn a_leader_is_needed_for_who_leader() {
    let db = db().await;
    let replicas = Replicas::builder(&db, LockKey::new(21, 2))
        .count(0)
        .start()
        .await
        .unwrap();
    let err = replicas.partition(Who::Leader).unwrap_err();
    assert!(err.to_string().contains("no single leader"), "{err}");
    let err = replicas.wait_for_leader(I).await.unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
}

#[tokio::test]
async fn an_interval_the_crate_refuses_is_a_typed_error() {
    let db = db().await;
    let err = Replicas::builder(&db, LockKey::new(21, 3))
        .check_interval(Duration::from_millis(1))
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(err, pg_elector_testkit::KitError::Elector(_)),
        "{err}"
    );
}

/// A service whose every tick holds a fenced transaction open, idle, for 2 s: a leader cut off
/// in the middle of it leaves the transaction open on the server, holding the epoch row.
fn stuck_in_transaction(db: &TestDb, key: LockKey, idle: Option<Duration>) -> ReplicasBuilder<'_> {
    use pg_elector::background::{LeaderTicker, Supervisor};
    Replicas::builder(db, key)
        .count(2)
        .check_interval(I)
        .idle_in_transaction_timeout(idle)
        .configure(|_, elector| elector.fencing(true))
        .service(|r| async move {
            let ticker = LeaderTicker::new("stuck", &r.elector, I);
            let pool = r.pool.clone();
            Supervisor::new()
                .election(&r.elector)
                .ticker(ticker, move |term| {
                    let pool = pool.clone();
                    async move {
                        let mut client = pool.get().await.map_err(|e| e.to_string())?;
                        let tx = client.transaction().await.map_err(|e| e.to_string())?;
                        term.fence(&tx).await.map_err(|e| e.to_string())?;
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        tx.commit().await.map_err(|e| e.to_string())
                    }
                })
                .run(r.shutdown)
                .await
        })
}

async fn has_idle_session_timeout(db: &TestDb) -> bool {
    let version: i32 = db
        .connect()
        .await
        .unwrap()
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    if version < 140_000 {
        eprintln!(
            "PostgreSQL 13 has no idle_session_timeout: a partitioned leader's session is never ended"
        );
    }
    version >= 140_000
}

/// A leader cut off inside a fenced transaction holds the next term back, unless its pool sets
/// `idle_in_transaction_session_timeout`.
#[tokio::test]
async fn cut_off_mid_transaction_holds_the_next_term_back() {
    let _timing = timing();
    let db = db().await;
    // PostgreSQL 13 has no idle_session_timeout: the silent lock session is never ended, and
    // nobody leads after the partition with the transaction's timeout or without.
    let frees = has_idle_session_timeout(&db).await;
    for (i, (idle, next_leads)) in [(None, false), (Some(Duration::from_secs(1)), frees)]
        .into_iter()
        .enumerate()
    {
        let key = LockKey::new(21, 10 + i as i32);
        let replicas = stuck_in_transaction(&db, key, idle).start().await.unwrap();
        let old = replicas.wait_for_leader(STARTUP).await.unwrap().replica;
        // Inside the first tick's transaction.
        tokio::time::sleep(I).await;
        replicas.partition(old).unwrap();
        // The server frees the lock at 4·I; with the timeout the transaction ends 1 s after its
        // fence, and the next term begins at the standby's next try.
        let next = replicas.wait_for_other_leader(old, 12 * I).await;
        assert_eq!(
            next.is_ok(),
            next_leads,
            "idle_in_transaction_session_timeout {idle:?}: {next:?}"
        );
        replicas.heal(old);
        no_overlap(replicas).await;
    }
}

/// A test that gives its replicas identities of its own (through `configure`) still finds
/// their lock sessions: the kit looks for each replica's own identity on the server. (Before,
/// it looked for `replica-<index>` only, and `kill_session` failed with "no lock session".)
#[tokio::test]
async fn kill_session_finds_a_replica_by_the_identity_it_was_given() {
    let _timing = timing();
    let db = db().await;
    let replicas = Replicas::builder(&db, LockKey::new(21, 9))
        .count(2)
        .check_interval(I)
        .configure(|index, builder| builder.identity(format!("billing-worker-{index}")))
        .start()
        .await
        .expect("replicas start");
    let old = replicas
        .wait_for_leader(STARTUP)
        .await
        .expect("a first leader")
        .replica;
    let killed = replicas
        .kill_session(Who::Leader)
        .await
        .expect("the leader's lock session is found by its own identity");
    assert_eq!(killed, old);
    replicas
        .wait_for_next_term(3 * I)
        .await
        .expect("a term ≤ 3·I");
    no_overlap(replicas).await;
}
