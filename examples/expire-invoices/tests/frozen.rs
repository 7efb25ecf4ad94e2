//! The invoice sweep in real processes: the leader's process is frozen (SIGSTOP, as a long GC
//! pause or a stolen VM would), another replica takes over while it is stopped, and when it
//! runs again its stale sweep must not send anything.
//!
//! Each replica is this test binary run again as the ignored test `replica_child`, which runs
//! the service through `replica::child_with`.
#![cfg(unix)]

mod common;

use std::time::Duration;

use common::{add_invoices, sends_not_interleaved, sent_twice, unsent_after_polling};
use expire_invoices::serve;
use pg_elector::LockKey;
use pg_elector_testkit::replica::{self, Fleet};
use pg_elector_testkit::{PgServer, serial};

const CHILD: &[&str] = &["replica_child", "--exact", "--ignored", "--nocapture"];
const I: Duration = Duration::from_millis(200);

#[test]
#[ignore = "a replica process that the tests of this file start; does nothing on its own"]
fn replica_child() {
    if std::env::var(replica::ENV_URL).is_ok() {
        replica::child_with(|r| serve(r.elector, r.pool, r.shutdown, Duration::from_millis(50)));
    }
}

#[tokio::test]
async fn a_frozen_leader_sends_nothing_when_it_runs_again() {
    let _serial = serial();
    let db = PgServer::shared().unwrap().create_database().await.unwrap();
    let admin = db.connect().await.unwrap();
    add_invoices(&admin, Duration::from_millis(20)).await;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);

    let mut fleet = Fleet::new(CHILD, db.url(), LockKey::new(7, 2), I);
    fleet.fenced = true;
    for _ in 0..3 {
        fleet.spawn(None);
    }
    let old = fleet
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // in the middle of the sweep
    fleet.freeze(old).await.unwrap();
    if version >= 140_000 {
        // The server ends the frozen leader's silent session at 4·I; a standby then leads.
        let next = fleet.wait_for_new_leader(old, 10 * I).await.unwrap();
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

    assert_eq!(
        unsent_after_polling(&admin, 200).await,
        0,
        "invoices never sent"
    );
    assert!(sent_twice(&admin).await.is_empty(), "invoices sent twice");
    let sends = sends_not_interleaved(&admin).await;
    if version >= 140_000 {
        assert!(
            sends.terms().len() >= 2,
            "the sends of one term only: {:?}",
            sends.terms()
        );
    }
    for replica in 0..fleet.procs.len() {
        fleet.stop(replica).await.unwrap();
    }
}
