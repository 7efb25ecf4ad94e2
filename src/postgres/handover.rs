//! The handover marker: how a new leader tells a lock handed over by a graceful unlock (whose
//! leader stepped down before it let go) from a lock freed by a session that ended under a
//! leader that may not have noticed yet. Only the second kind makes the new term wait
//! ([`super::SETTLE`]).
//!
//! The marker is a bigint advisory lock derived from the key ([`LockKey::handover_marker`]).
//!
//! # Invariants
//!
//! - Only a session that holds the key takes the marker (shared), in the statement that
//!   unlocks the key ([`unlock`]); when that unlock granted the key to another session, it keeps
//!   the marker until that session asks for it, at most [`LINGER`], and lets it go before it
//!   answers.
//! - A grant counts as handed over only if it found the marker held and then took it
//!   exclusively, which waits for the unlocking statement to let it go ([`took_over`]): in the
//!   statement that waited for the key, or right after the try that was granted it.
//! - So when a grant answers "handed over", no session holds the marker any more: a later grant,
//!   after the session of this grant has ended (a terminate, a reset), finds none and waits, even
//!   within [`LINGER`] of the graceful unlock before it.

use std::sync::LazyLock;
use std::time::Duration;

use tokio_postgres::types::Type;

use crate::LockKey;

/// The longest time an unlocking statement keeps the marker for a grantee that has not asked
/// for it (a standby of an older version, or one frozen right after its grant).
pub(super) const LINGER: Duration = Duration::from_millis(50);

/// How often the unlocking statement looks whether the grantee has asked for the marker, in
/// seconds (server side, `pg_sleep`).
const LOOK_EVERY_S: &str = "0.0005";

/// The electing database, as `pg_locks` names it.
pub(super) const THIS_DATABASE: &str = "(SELECT oid FROM pg_catalog.pg_database \
     WHERE datname = pg_catalog.current_database())";

/// The graceful unlock: takes the marker (shared, never waited for), unlocks the key, keeps the
/// marker as the invariants say, then lets it go. Answers whether the key was held.
///
/// The session the unlock granted the key to (if any: a waiting session is granted it inside
/// the unlock) is read from `pg_locks` once, right after the unlock. The loop then asks
/// `pg_blocking_pids` of that session at every turn whether it waits for a lock this one holds
/// (the marker: the only lock left here): a scalar call, evaluated afresh at every turn, where
/// a scan of `pg_locks` inside the loop would be read once and rewound.
///
/// $1, $2: the key (int4); $3: the marker (int8); $4, $5: the key as `pg_locks` shows it;
/// $6: [`LINGER`] in seconds.
static UNLOCK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT CASE WHEN pg_catalog.pg_try_advisory_lock_shared($3::int8) IS NOT NULL THEN \
           CASE WHEN pg_catalog.pg_advisory_unlock($1::int4, $2::int4) \
           THEN (WITH RECURSIVE linger(grantee, more) AS ( \
                   SELECT grantee, grantee IS NOT NULL FROM (SELECT ( \
                     SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
                     AND classid = $4 AND objid = $5 AND objsubid = 2 AND granted \
                     AND pid <> pg_catalog.pg_backend_pid() AND database = {THIS_DATABASE} \
                     LIMIT 1) AS grantee) AS granted \
                   UNION ALL \
                   SELECT grantee, CASE WHEN pg_catalog.pg_sleep({LOOK_EVERY_S}) IS NOT NULL \
                     THEN pg_catalog.clock_timestamp() < pg_catalog.statement_timestamp() \
                            + pg_catalog.make_interval(secs => $6::float8) \
                      AND NOT pg_catalog.pg_backend_pid() \
                            = ANY (pg_catalog.pg_blocking_pids(grantee)) END \
                   FROM linger WHERE more) \
                 SELECT count(*) FROM linger) > 0 \
             AND pg_catalog.pg_advisory_unlock_shared($3::int8) \
           ELSE NOT pg_catalog.pg_advisory_unlock_shared($3::int8) END END"
    )
});

/// Runs the graceful unlock of `key` on `client`: `true` when the key was held.
pub(super) async fn unlock(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<bool, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            &UNLOCK,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&key.handover_marker(), Type::INT8),
                (&key.class_oid(), Type::OID),
                (&key.object_oid(), Type::OID),
                (&LINGER.as_secs_f64(), Type::FLOAT8),
            ],
        )
        .await?;
    Ok(match rows.first() {
        Some(row) => row.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
        None => false,
    })
}

/// Whether the lock this session was just granted was handed over gracefully, as an SQL
/// expression: when the marker is held, it takes it exclusively (waiting, with no
/// `lock_timeout`, for the unlocking statement to let go, which it does as soon as it sees this
/// request) and gives it back at once.
///
/// `$marker` is the marker (int8); `$class`, `$object` its halves as `pg_locks` shows them.
fn took_over(marker: u8, class: u8, object: u8) -> String {
    format!(
        "CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
             AND objsubid = 1 AND classid = ${class} AND objid = ${object} \
             AND mode = 'ShareLock' AND granted AND database = {THIS_DATABASE}) \
         THEN pg_catalog.set_config('lock_timeout', '0', true) IS NOT NULL \
           AND pg_catalog.pg_advisory_lock(${marker}::int8) IS NOT NULL \
           AND pg_catalog.pg_advisory_unlock(${marker}::int8) \
         ELSE false END"
    )
}

/// [`took_over`] as a column of the statement that waits for the lock (its answer in the column
/// `answer`): evaluated only when the wait was granted.
pub(super) fn handed_over(marker: u8, class: u8, object: u8) -> String {
    format!(
        "CASE WHEN answer IN ('granted', 'granted_unbounded') THEN {} ELSE false END",
        took_over(marker, class, object)
    )
}

/// [`took_over`] as a statement of its own, run on a session a try was just granted the lock
/// on: a refused try, by far the most frequent statement of a fleet, is then not planned with
/// it.
static TOOK_OVER: LazyLock<String> = LazyLock::new(|| format!("SELECT {}", took_over(1, 2, 3)));

/// Whether the lock `client`'s session was just granted on was handed over gracefully.
pub(super) async fn taken_over(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<bool, tokio_postgres::Error> {
    let marker = key.handover_marker();
    let (class, object) = halves(marker);
    let row = client
        .query_typed(
            &TOOK_OVER,
            &[
                (&marker, Type::INT8),
                (&class, Type::OID),
                (&object, Type::OID),
            ],
        )
        .await?;
    Ok(row
        .first()
        .map(|row| row.try_get::<_, Option<bool>>(0))
        .transpose()?
        .flatten()
        .unwrap_or(false))
}

/// The two halves of a bigint advisory lock as `pg_locks` shows them (`classid`, `objid`).
pub(super) fn halves(lock: i64) -> (u32, u32) {
    let lock = lock as u64;
    ((lock >> 32) as u32, lock as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::session::{Attempt, SessionBounds};
    use crate::postgres::waiter::wait;
    use pg_elector_harness::{PgServer, TestDb, serial};
    use tokio::time::Instant;

    const INTERVAL: Duration = Duration::from_millis(200);

    /// A waiting session's outcome, in the background.
    fn waiter(db: &TestDb, key: LockKey) -> tokio::task::JoinHandle<super::super::waiter::Outcome> {
        let bounds = SessionBounds::for_interval(INTERVAL);
        tokio::spawn(wait(
            db.pool(1),
            key,
            "w".into(),
            bounds,
            INTERVAL,
            INTERVAL,
        ))
    }

    /// The sessions waiting for `key`, seen by `admin`.
    async fn waiting(admin: &tokio_postgres::Client, key: LockKey) -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
                 AND classid = $1 AND objid = $2 AND NOT granted",
                &[&key.class_oid(), &key.object_oid()],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn until_waiting(admin: &tokio_postgres::Client, key: LockKey, n: i64) {
        let start = Instant::now();
        while waiting(admin, key).await < n {
            assert!(start.elapsed() < Duration::from_secs(10), "no {n} waiting");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether some session holds the key's marker.
    async fn marker_held(admin: &tokio_postgres::Client, key: LockKey) -> bool {
        let (class, object) = halves(key.handover_marker());
        admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                 AND objsubid = 1 AND classid = $1 AND objid = $2)",
                &[&class, &object],
            )
            .await
            .unwrap()
            .get(0)
    }

    fn handed_over(
        outcome: super::super::waiter::Outcome,
    ) -> (bool, Box<super::super::session::LockSession>) {
        match outcome {
            Ok(Attempt::Granted {
                handed_over,
                session,
                ..
            }) => (handed_over, session),
            Ok(_) => panic!("refused"),
            Err(e) => panic!("{e}"),
        }
    }

    /// The grantee asks for the marker at once, so the unlock answers within milliseconds, not
    /// after the whole linger; and once the grantee has answered, the marker is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_granted_by_a_graceful_unlock_knows_it_and_the_marker_is_gone_when_it_answers() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(0xf1, 0x3c);
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let waiting = waiter(&db, key);
        until_waiting(&admin, key, 1).await;
        let started = Instant::now();
        assert!(unlock(&holder, key).await.unwrap(), "the key was held");
        let took = started.elapsed();
        let (handed, _session) = handed_over(waiting.await.unwrap());
        assert!(handed, "a graceful unlock hands the lock over");
        assert!(!marker_held(&admin, key).await, "the marker is gone");
        assert!(took < LINGER, "the unlock kept the marker {took:?}");
        eprintln!("the graceful unlock answered after {took:?}");
    }

    /// The marker of a graceful unlock is for the grant it made only: when that grantee's
    /// session ends (a terminate, a reset) right after, the next waiting session is not told
    /// the lock was handed over, however soon it is granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_grant_after_a_handed_over_session_that_ended_is_not_handed_over() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(0xf1, 0x3d);
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let first = waiter(&db, key);
        until_waiting(&admin, key, 1).await;
        let second = waiter(&db, key);
        until_waiting(&admin, key, 2).await;
        assert!(unlock(&holder, key).await.unwrap());
        let (handed, session) = handed_over(first.await.unwrap());
        assert!(handed, "the first waiter was handed the lock");
        // Its session ends at once (the holder is still connected: nothing it holds may count).
        drop(session);
        let (handed, _session) = handed_over(second.await.unwrap());
        assert!(!handed, "the second grant came from a session that ended");
    }

    /// The statement a try runs after its grant: a session granted the key by a graceful unlock
    /// asks for the marker there, which ends the unlock's linger at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_granted_by_a_graceful_unlock_takes_the_marker_over_after_the_fact() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(0xf1, 0x3f);
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let grantee = std::sync::Arc::new(db.connect().await.unwrap());
        let granted = tokio::spawn({
            let grantee = grantee.clone();
            async move {
                grantee
                    .execute(
                        "SELECT pg_advisory_lock($1, $2)",
                        &[&key.class(), &key.object()],
                    )
                    .await
                    .unwrap();
                taken_over(&grantee, key).await.unwrap()
            }
        });
        until_waiting(&admin, key, 1).await;
        let started = Instant::now();
        assert!(unlock(&holder, key).await.unwrap());
        let took = started.elapsed();
        assert!(granted.await.unwrap(), "handed over");
        assert!(took < LINGER, "the unlock kept the marker {took:?}");
        assert!(!marker_held(&admin, key).await, "the marker is gone");
        assert!(
            !taken_over(&grantee, key).await.unwrap(),
            "and cannot be taken twice"
        );
    }

    /// A grantee that never asks for the marker (a standby of an older version) holds the
    /// unlock up to its linger, not longer, and the marker is gone when the unlock answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unlock_whose_grantee_never_asks_keeps_the_marker_for_its_linger_only() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(0xf1, 0x40);
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let grantee = db.connect().await.unwrap();
        let granted = tokio::spawn(async move {
            grantee
                .execute(
                    "SELECT pg_advisory_lock($1, $2)",
                    &[&key.class(), &key.object()],
                )
                .await
                .unwrap();
            grantee
        });
        until_waiting(&admin, key, 1).await;
        let started = Instant::now();
        assert!(unlock(&holder, key).await.unwrap());
        let took = started.elapsed();
        let _grantee = granted.await.unwrap();
        assert!(took >= LINGER, "the unlock kept the marker only {took:?}");
        assert!(took < 4 * LINGER, "the unlock kept the marker {took:?}");
        assert!(!marker_held(&admin, key).await, "the marker is gone");
    }

    /// A graceful unlock with nobody waiting keeps nothing: the statement answers at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unlock_with_nobody_waiting_does_not_linger() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let key = LockKey::new(0xf1, 0x3e);
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let started = Instant::now();
        assert!(unlock(&holder, key).await.unwrap());
        let took = started.elapsed();
        assert!(took < LINGER, "took {took:?}");
        assert!(!marker_held(&admin, key).await);
        assert!(!unlock(&holder, key).await.unwrap(), "no longer held");
        assert!(
            !marker_held(&admin, key).await,
            "nor the marker after a refused unlock"
        );
    }
}
