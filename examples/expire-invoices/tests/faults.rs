//! The invoice sweep under real faults: three replicas of the service, a fault on whoever leads
//! in the middle of the sweep, then every invoice must have been sent exactly once, no two
//! replicas may ever have led at once, and no deposed leader's send may come after a later
//! leader's.

mod common;

use std::time::Duration;

use common::{INVOICES, add_invoices, sends_not_interleaved, sent_twice, unsent_after_polling};
use expire_invoices::serve;
use pg_elector::LockKey;
use pg_elector_testkit::{PgServer, Replicas, TestDb, Who, serial};

/// The sweep's period: 150 invoices, 10 a tick, take about 15 ticks.
const TICK: Duration = Duration::from_millis(50);
const KEY: LockKey = LockKey::new(7, 1);

/// A fresh database with the service's tables and `INVOICES` invoices falling due over the
/// next second.
async fn invoices_db(server: &PgServer) -> TestDb {
    let db = server.create_database().await.expect("a test database");
    add_invoices(&db.connect().await.unwrap(), Duration::from_millis(7)).await;
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
    let left = unsent_after_polling(&client, 300).await;
    let seen = replicas.finish().await;
    assert_eq!(left, 0, "invoices never sent; leaders: {:?}", seen.leaders);
    assert!(
        seen.overlaps().is_empty(),
        "two leaders at once: {:?}",
        seen.overlaps()
    );

    let twice = sent_twice(&client).await;
    assert!(twice.is_empty(), "invoices sent twice: {twice:?}");
    let sends = sends_not_interleaved(&client).await;
    assert_eq!(sends.writes.len() as i64, INVOICES);
}

#[tokio::test]
async fn the_leaders_session_is_killed() {
    let _serial = serial(); // timing-sensitive tests of one binary run one at a time
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // in the middle of the sweep
    replicas.kill_session(Who::Leader).await.unwrap();
    // The next term (the old leader may win it again), within an interval and a bit.
    let next = replicas
        .wait_for_next_leader(Duration::from_secs(1))
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
    let _serial = serial();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leader_is_partitioned() {
    let _serial = serial();
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
    let _serial = serial();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    replicas.reset_connections(Who::Leader).await.unwrap();
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_server_is_slow_for_the_leader() {
    let _serial = serial();
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
    let _serial = serial();
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
    let _serial = serial();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let mut replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = replicas.resolve(Who::Leader).unwrap();
    replicas.crash(leader).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_leader_is_deployed_away() {
    let _serial = serial();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let mut replicas = service(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = replicas.resolve(Who::Leader).unwrap();
    replicas.stop(leader).await;
    every_invoice_sent_once(&db, replicas).await;
}

#[tokio::test]
async fn the_server_restarts() {
    let _serial = serial();
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
