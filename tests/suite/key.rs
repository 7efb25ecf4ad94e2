//! E1: the lock key as `pg_locks` shows it, and keys from names (`LockKey::from_name`) as the
//! server computes them in SQL.

use crate::common;

use common::*;
use pg_elector::LockKey;

mod e1 {
    use super::*;

    /// Among several electors, the lock row shows the two-int4 key and one holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_lock_row_shows_the_two_int4_key_and_one_holder() {
        let _timing = timing();
        let db = fresh_db().await;
        // A negative class: pg_locks shows the oid (unsigned) form.
        let key = LockKey::new(-7, 42);
        let replicas: Vec<_> = (0..3).map(|_| Replica::start(db.pool(2), key, I)).collect();
        one_leader(&replicas, 3 * I).await;

        let client = db.connect().await.unwrap();
        let rows = client
            .query(
                "SELECT classid::int8, objid::int8, objsubid::int4, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "exactly one advisory lock in the database");
        let (class, object, subid): (i64, i64, i32) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
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
    async fn a_bigint_lock_whose_halves_equal_the_key_does_not_collide() {
        let _timing = timing();
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

        let subids: Vec<i16> = first_column(
            &client,
            "SELECT objsubid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND mode = 'ExclusiveLock' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             ORDER BY objsubid",
        )
        .await;
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

    /// Names for the SQL comparisons: halves of both signs, an empty name, and non-ASCII text.
    const NAMES: [&str; 6] = [
        "billing/invoice-sweep", // both halves negative
        "orders/expire",         // class positive, object negative
        "Zürich/Ablauf",         // both positive; non-ASCII
        "監視/掃除",             // class negative; non-ASCII
        "",
        "it's a \"name\"; with\nodd characters",
    ];

    /// The SQL of `LockKey::from_name`'s docs, on `$1`: the two halves as `int4`, the same on
    /// the name's UTF-8 bytes (`convert_to`), and the halves as `int8` for `pg_locks`.
    const KEY_IN_SQL: &str = "SELECT ('x' || substr(md5($1), 1, 8))::bit(32)::int4, \
     ('x' || substr(md5($1), 9, 8))::bit(32)::int4, \
     ('x' || substr(md5(convert_to($1, 'UTF8')), 1, 8))::bit(32)::int4, \
     ('x' || substr(md5(convert_to($1, 'UTF8')), 9, 8))::bit(32)::int4, \
     ('x' || substr(md5($1), 1, 8))::bit(32)::int8, \
     ('x' || substr(md5($1), 9, 8))::bit(32)::int8";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_from_a_name_is_the_key_the_server_computes_from_it() {
        let db = fresh_db().await;
        let client = db.connect().await.unwrap();
        let encoding: String = client
            .query_one("SHOW server_encoding", &[])
            .await
            .unwrap()
            .get(0);
        for name in NAMES {
            let key = LockKey::from_name(name);
            let row = client.query_one(KEY_IN_SQL, &[&name]).await.unwrap();
            let (class, object): (i32, i32) = (row.get(0), row.get(1));
            let (utf8_class, utf8_object): (i32, i32) = (row.get(2), row.get(3));
            let (class_oid, object_oid): (i64, i64) = (row.get(4), row.get(5));
            assert_eq!(
                LockKey::new(utf8_class, utf8_object),
                key,
                "md5(convert_to(name, 'UTF8')) for {name:?}"
            );
            // md5(text) hashes the database's encoding: the UTF-8 bytes in a UTF8 database.
            if encoding == "UTF8" || name.is_ascii() {
                assert_eq!(LockKey::new(class, object), key, "md5(name) for {name:?}");
            }
            assert_eq!(
                (class_oid, object_oid),
                (
                    i64::from(key.class() as u32),
                    i64::from(key.object() as u32)
                ),
                "the int8 form reads the halves unsigned, as pg_locks shows them, for {name:?}"
            );
        }
        let key = LockKey::from_name(NAMES[0]);
        assert!(key.class() < 0 && key.object() < 0, "{key}");

        // The first query of `LockKey::from_name`'s docs, as written there.
        let row = client
        .query_one(
            "SELECT ('x' || substr(md5('billing/invoice-sweep'), 1, 8))::bit(32)::int4 AS class,
       ('x' || substr(md5('billing/invoice-sweep'), 9, 8))::bit(32)::int4 AS object;",
            &[],
        )
        .await
        .unwrap();
        let (class, object): (i32, i32) = (row.get("class"), row.get("object"));
        assert_eq!(
            (class, object),
            (-706_710_220, -1_111_794_608),
            "as the docs say"
        );
        assert_eq!(LockKey::new(class, object), key);
    }

    /// An elector on a named key shows in `pg_locks` under the key computed in SQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_named_key_shows_in_pg_locks_as_computed_in_sql() {
        let _timing = timing();
        let db = fresh_db().await;
        // Both halves negative: pg_locks shows them unsigned.
        let key = LockKey::from_name("billing/invoice-sweep");
        let replicas: Vec<_> = (0..2).map(|_| Replica::start(db.pool(2), key, I)).collect();
        one_leader(&replicas, 3 * I).await;

        // The pg_locks query of `LockKey::from_name`'s docs, as written there.
        let client = db.connect().await.unwrap();
        let pids: Vec<i32> = first_column(
            &client,
            "SELECT l.pid FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' AND l.objsubid = 2
  AND l.classid::int8 = ('x' || substr(md5('billing/invoice-sweep'), 1, 8))::bit(32)::int8
  AND l.objid::int8 = ('x' || substr(md5('billing/invoice-sweep'), 9, 8))::bit(32)::int8
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());",
        )
        .await;
        assert_eq!(pids.len(), 1, "one backend holds the named key: {pids:?}");
        assert_eq!(
            holders(&client, key).await,
            pids,
            "the same backend as the key computed in Rust"
        );
        for r in replicas {
            r.stop().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_a_latin1_database_a_non_ascii_name_needs_convert_to() {
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let latin1 = format!("{}_latin1", db.name());
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{latin1}\" TEMPLATE template0 ENCODING 'LATIN1' \
             LC_COLLATE 'C' LC_CTYPE 'C'"
            ))
            .await
            .unwrap();
        let mut config = db.config();
        config.dbname(&latin1);
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        let connection = tokio::spawn(connection);

        let name = "Zürich/Ablauf";
        let key = LockKey::from_name(name);
        let row = client.query_one(KEY_IN_SQL, &[&name]).await.unwrap();
        let (class, object): (i32, i32) = (row.get(0), row.get(1));
        let (utf8_class, utf8_object): (i32, i32) = (row.get(2), row.get(3));
        assert_eq!(LockKey::new(utf8_class, utf8_object), key, "convert_to");
        assert_ne!(
            LockKey::new(class, object),
            key,
            "md5(text) hashes the LATIN1 bytes"
        );

        drop(client);
        connection.await.unwrap().unwrap();
        admin
            .batch_execute(&format!("DROP DATABASE \"{latin1}\""))
            .await
            .unwrap();
    }
}
