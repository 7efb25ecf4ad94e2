//! Design §7: pitfalls seen in other implementations, each shown not to happen here.

use crate::common;

use std::time::Duration;

use common::*;
use pg_elector::LockKey;

/// A pool of one connection through a proxy to the shared server, opened and idle; the proxy
/// then blackholes it.
async fn one_blackholed_connection(db: &TestDb) -> (FaultProxy, deadpool_postgres::Pool) {
    let proxy = shared_server_proxy().await;
    let pool = db.pool_via(proxy.addr(), 1);
    drop(pool.get().await.unwrap());
    assert_eq!(pool.status().size, 1);
    proxy.blackhole();
    (proxy, pool)
}

/// A try cut off by shutdown closes its connection instead of returning it to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cut_off_by_shutdown_is_closed_not_returned() {
    let _timing = timing();
    let db = fresh_db().await;
    let (_proxy, pool) = one_blackholed_connection(&db).await;
    let replica = Replica::start(pool.clone(), LockKey::new(70, 1), I);
    tokio::time::sleep(I / 2).await; // the first try is in flight, unanswered
    replica.stop().await.unwrap();
    // Its lock state is unknown (the server may have granted it), so it must not go back.
    assert_eq!(pool.status().size, 0, "{:?}", pool.status());
}

/// A timed-out try closes its connection, and the next try uses a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_try_is_closed_and_the_next_uses_a_fresh_one() {
    let _timing = timing();
    let db = fresh_db().await;
    let (proxy, pool) = one_blackholed_connection(&db).await;
    let replica = Replica::start(pool.clone(), LockKey::new(70, 2), I);
    // The try's bound is max(I, 1 s).
    wait_for(Duration::from_millis(1500), || pool.status().size == 0)
        .await
        .expect("the timed-out try's connection is closed, not returned");
    assert!(!replica.elector.is_leader());
    proxy.pass();
    wait_for(4 * I + Duration::from_secs(1), || {
        replica.elector.is_leader()
    })
    .await
    .expect("leads on a fresh connection once the server answers");
    replica.stop().await.unwrap();
}

/// Draining and closing the pool leaves the lock connection alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_pool_leaves_the_lock_connection_alone() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(70, 3);
    let pool = db.pool(2);
    let a = Replica::start(pool.clone(), key, I);
    wait_a_leads(&a).await;
    let admin = db.connect().await.unwrap();
    let pid = holders(&admin, key).await;

    // What a pool's lifetime limit or recycling does to its connections, all at once.
    pool.retain(|_, _| false);
    pool.close();
    tokio::time::sleep(3 * I).await;
    assert!(
        a.elector.is_leader(),
        "the lock connection is out of the pool"
    );
    assert_eq!(
        holders(&admin, key).await,
        pid,
        "the same session holds the lock"
    );
    a.stop().await.unwrap();
    assert!(
        holders(&admin, key).await.is_empty(),
        "shutdown still unlocks"
    );
}
