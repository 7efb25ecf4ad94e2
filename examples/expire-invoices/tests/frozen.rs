//! The invoice sweep in real processes: the leader's process is frozen (SIGSTOP, as a long GC
//! pause or a stolen VM would), another replica takes over while it is stopped, and when it
//! runs again its stale sweep must not send anything.
//!
//! Each replica is this test binary run again as the ignored test `replica_child`, which runs
//! the service through `Fleet::serve_child`.
#![cfg(unix)]

use std::time::Duration;

use expire_invoices::{SCHEMA, serve};
use pg_elector::LockKey;
use pg_elector_testkit::replicas::serial;
use pg_elector_testkit::{FencedWrites, Fleet, PgServer};

const CHILD: &[&str] = &["replica_child", "--exact", "--ignored", "--nocapture"];
const I: Duration = Duration::from_millis(200);
const INVOICES: i64 = 150;

#[test]
#[ignore = "a replica process that the tests of this file start; does nothing on its own"]
fn replica_child() {
    Fleet::serve_child(|r| serve(r.elector, r.pool, r.shutdown, Duration::from_millis(50)));
}

#[tokio::test]
async fn a_frozen_leader_sends_nothing_when_it_runs_again() {
    let _serial = serial(); // a fleet of processes, one of them frozen: the machine to itself
    let db = PgServer::shared().unwrap().create_database().await.unwrap();
    let admin = db.connect().await.unwrap();
    admin.batch_execute(SCHEMA).await.unwrap();
    admin
        .execute(
            "INSERT INTO invoices (id, due_at) \
             SELECT n, now() + n * interval '20 ms' FROM generate_series(1, $1::bigint) n",
            &[&INVOICES],
        )
        .await
        .unwrap();
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);

    let mut fleet = Fleet::builder(CHILD, db.url(), LockKey::new(7, 2), I)
        .fenced(true)
        .build();
    for _ in 0..3 {
        fleet.spawn(None);
    }
    let old = fleet
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap()
        .replica;
    tokio::time::sleep(Duration::from_millis(300)).await; // in the middle of the sweep
    fleet.freeze(old).await.unwrap();
    if version >= 140_000 {
        // The server ends the frozen leader's silent session at 4·I; a standby then leads.
        let next = fleet.wait_for_other_leader(old, 10 * I).await.unwrap();
        println!(
            "replica {} leads {:?} after the freeze",
            next.replica, next.took
        );
    } else {
        eprintln!(
            "PostgreSQL 13 keeps a frozen leader's session: nobody else can lead until it thaws"
        );
        tokio::time::sleep(5 * I).await;
    }
    fleet.thaw(old).await.unwrap();

    let mut left = i64::MAX;
    for _ in 0..200 {
        left = admin
            .query_one("SELECT count(*) FROM invoices WHERE NOT sent", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "invoices never sent");
    let twice = admin
        .query(
            "SELECT invoice_id FROM outbox GROUP BY 1 HAVING count(*) > 1",
            &[],
        )
        .await
        .unwrap();
    assert!(twice.is_empty(), "invoices sent twice");
    let sends = FencedWrites::query(
        &admin,
        "SELECT epoch, invoice_id::text, queued_at FROM outbox ORDER BY queued_at",
    )
    .await
    .unwrap();
    sends.assert_not_interleaved();
    if version >= 140_000 {
        assert!(
            sends.terms().len() >= 2,
            "the sends of one term only: {:?}",
            sends.terms()
        );
    }
    for replica in 0..fleet.len() {
        fleet.stop(replica).await;
    }
}
