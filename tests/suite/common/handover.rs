//! Helpers of the graceful-handover tests (`drain`, `resign`): two replicas with a 2 s drain
//! timeout where one leads, and a table of writes that shows, by the server's clock, whose work
//! landed first.

use std::time::{Duration, SystemTime};

use pg_elector::{Elector, LockKey};
use pg_elector_testkit::TestDb;

use super::{I, Replica, wait_a_leads};

/// Replicas `a` and `b` at interval `I` on pools of two, with a drain timeout of 2 s: `a` starts
/// first and leads (within 3·I), then `b` starts, a standby. Returns `(a, b)`.
pub async fn a_leads_b_stands_by(db: &TestDb, key: LockKey) -> (Replica, Replica) {
    let build = || {
        Elector::builder(db.pool(2), key)
            .check_interval(I)
            .drain_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let a = Replica::run(build());
    wait_a_leads(&a).await;
    let b = Replica::run(build());
    (a, b)
}

/// Creates the table `writes`: who wrote, at which server time.
pub async fn writes_table(db: &TestDb) {
    db.connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE writes (replica text NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

/// One write of `replica` into `writes`, on `pool`.
pub async fn write(pool: &deadpool_postgres::Pool, replica: &str) {
    pool.get()
        .await
        .unwrap()
        .execute("INSERT INTO writes (replica) VALUES ($1)", &[&replica])
        .await
        .unwrap();
}

/// Every write, oldest first, by the server's clock.
pub async fn writes(db: &TestDb) -> Vec<(String, SystemTime)> {
    db.connect()
        .await
        .unwrap()
        .query("SELECT replica, at FROM writes ORDER BY at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}
