//! E1: the lock key as `pg_locks` shows it.

mod common;

use common::*;
use pg_elector::LockKey;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e1_lock_row_shows_the_two_int4_key_and_one_holder_among_several_electors() {
    let _serial = serial();
    let db = fresh_db().await;
    // A negative class: pg_locks shows the oid (unsigned) form.
    let key = LockKey::new(-7, 42);
    let replicas: Vec<_> = (0..3).map(|_| Replica::start(db.pool(2), key, I)).collect();
    one_leader(&replicas, 3 * I).await;

    let client = db.connect().await.unwrap();
    let rows = client
        .query(
            "SELECT classid::int8, objid::int8, objsubid::int4, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "exactly one advisory lock in the database");
    let (class, object, subid): (i64, i64, i32) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!(
        class,
        i64::from(-7i32 as u32),
        "classid is the class as oid"
    );
    assert_eq!(object, 42);
    assert_eq!(subid, 2, "the two-int4 form shows objsubid = 2");

    // Steady state over several intervals: one leader, one holder, the same backend.
    let pid: i32 = rows[0].get(3);
    for _ in 0..10 {
        tokio::time::sleep(I / 2).await;
        assert_eq!(leaders(&replicas).len(), 1);
        assert_eq!(holders(&client, key).await, vec![pid]);
    }
    for r in replicas {
        r.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e1_a_bigint_lock_whose_halves_equal_the_key_does_not_collide() {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0x7377_6570, 1);
    let bigint = (i64::from(key.class()) << 32) | i64::from(key.object());
    let client = db.connect().await.unwrap();

    // The bigint lock first: the elector still leads.
    let took: bool = client
        .query_one("SELECT pg_try_advisory_lock($1::int8)", &[&bigint])
        .await
        .unwrap()
        .get(0);
    assert!(took);
    let replica = Replica::start(db.pool(2), key, I);
    wait_for(3 * I, || replica.elector.is_leader())
        .await
        .expect("the elector leads beside a bigint lock with the same halves");

    let subids: Vec<i16> = client
        .query(
            "SELECT objsubid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             ORDER BY objsubid",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        subids,
        vec![1, 2],
        "the bigint form (1) and the two-int4 form (2)"
    );

    // And the other way round: a second bigint try succeeds on a fresh session while the
    // elector leads.
    let other = db.connect().await.unwrap();
    let took: bool = other
        .query_one("SELECT pg_try_advisory_lock($1::int8)", &[&(bigint + 1)])
        .await
        .unwrap()
        .get(0);
    assert!(took);
    assert!(replica.elector.is_leader());
    replica.stop().await.unwrap();
}
