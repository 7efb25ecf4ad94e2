//! The invoice sweep under real faults: three replicas of the service, a fault on whoever leads
//! in the middle of the sweep, then every invoice must have been sent exactly once, no two
//! replicas may ever have led at once, and no deposed leader's send may come after a later
//! leader's.

use std::time::Duration;

use expire_invoices::{SCHEMA, serve};
use pg_elector::LockKey;
use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::{FencedWrites, PgServer, Replicas, TestDb, Who};

const INVOICES: i64 = 150;
/// The sweep's period: 150 invoices, 10 a tick, take about 15 ticks.
const TICK: Duration = Duration::from_millis(50);
const KEY: LockKey = LockKey::new(7, 1);

/// A fresh database with the service's tables and `INVOICES` invoices falling due over the
/// next second.
async fn invoices_db(server: &PgServer) -> TestDb {
    let db = server.create_database().await.expect("a test database");
    let client = db.connect().await.unwrap();
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .execute(
            "INSERT INTO invoices (id, due_at) \
             SELECT n, now() + n * interval '7 ms' FROM generate_series(1, $1::bigint) n",
            &[&INVOICES],
        )
        .await
        .unwrap();
    db
}

/// Three replicas of the service, fenced, once one of them leads.
async fn service(db: &TestDb) -> Replicas {
    let replicas = Replicas::builder(db, KEY)
        .count(3)
        .configure(|_, elector| elector.fencing(true))
        .service(|replica| serve(replica.elector, replica.pool, replica.shutdown, TICK))
        .start()
        .await
        .unwrap();
    replicas
        .wait_for_leader(Duration::from_secs(5))
        .await
        .unwrap();
    replicas
}

/// Waits until every invoice is sent, then stops the replicas and checks what happened.
async fn every_invoice_sent_once(db: &TestDb, replicas: Replicas) {
    let client = db.connect().await.unwrap();
    let mut left = i64::MAX;
    for _ in 0..300 {
        left = client
            .query_one("SELECT count(*) FROM invoices WHERE NOT sent", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = replicas.finish().await;
    assert_eq!(left, 0, "invoices never sent; leaders: {:?}", seen.leaders);
    seen.assert_no_two_leaders();

    let twice: Vec<i64> = client
        .query(
            "SELECT invoice_id FROM outbox GROUP BY 1 HAVING count(*) > 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(twice.is_empty(), "invoices sent twice: {twice:?}");
    let sends = FencedWrites::query(
        &client,
        "SELECT epoch, invoice_id::text, queued_at FROM outbox ORDER BY queued_at",
    )
    .await
    .unwrap();
    assert_eq!(sends.writes.len() as i64, INVOICES);
    sends.assert_not_interleaved();
}

#[tokio::test]
async fn the_leaders_session_is_killed() {
    let _timing = timing(); // a few timing-sensitive tests of one binary run at once
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // in the middle of the sweep
    replicas.kill_session(Who::Leader).await.unwrap();
    // The next term (the old leader may win it again), within an interval and a bit.
    let next = replicas
        .wait_for_next_term(Duration::from_secs(1))
        .await
        .unwrap();
    println!(
        "replica {} leads, {:?} after the kill",
        next.replica, next.took
    );
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn no_fault() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leader_is_partitioned() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = replicas.partition(Who::Leader).unwrap();
    // Long enough for the partitioned leader to step down and the server to free its lock.
    tokio::time::sleep(Duration::from_secs(2)).await;
    replicas.heal(cut);
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leaders_connections_are_reset() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    replicas.reset_connections(Who::Leader).await.unwrap();
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_server_is_slow_for_the_leader() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let slow = replicas
        .slow(Who::Leader, Duration::from_millis(500))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    replicas.slow(slow, Duration::ZERO).unwrap();
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leaders_pool_is_exhausted_then_it_crashes() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let mut replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hold = replicas.exhaust_pool(Who::Leader).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas.crash(hold.replica).await;
    drop(hold);
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leader_crashes_mid_sweep() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let mut replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = replicas.resolve(Who::Leader).unwrap();
    replicas.crash(leader).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leader_is_deployed_away() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let mut replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = replicas.resolve(Who::Leader).unwrap();
    replicas.stop(leader).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_server_restarts() {
    let _timing = timing();
    let server = std::sync::Arc::new(
        tokio::task::spawn_blocking(PgServer::spawn)
            .await
            .unwrap()
            .unwrap(),
    );
    let db = invoices_db(&server).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    replicas.restart_server(&server).await.unwrap();
    every_invoice_sent_once(&db, replicas).await;
}
