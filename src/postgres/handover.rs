//! The handover marker: how a new leader tells a lock handed over by a graceful unlock (whose
//! leader stepped down before it let go) from a lock freed by a session that ended under a
//! leader that may not have noticed yet. Only the second kind makes the new term wait
//! ([`super::standby::SETTLE`]).
//!
//! Two kinds of bigint advisory lock, both held shared by the unlocking session:
//! - the key's *unlocking* lock ([`LockKey::handover_marker`]), held only while the unlock
//!   statement runs;
//! - a *grantee's* marker: the key's [`grantee half`](LockKey::handover_grantee_half) in the
//!   high 32 bits, the granted session's pid in the low ones, taken for the session that the
//!   unlock granted the key to, and held until the unlocking session closes.
//!
//! # Invariants
//!
//! - Only a session that holds the key takes the unlocking lock, in the statement that unlocks
//!   the key ([`unlock`]); in that statement, after the unlock, it takes the marker of each
//!   session then holding the key (the waiting session the unlock granted it to, if any), and
//!   only then lets the unlocking lock go. It never waits for anything.
//! - A grant counts as handed over only if, once no unlocking statement is under way (it takes
//!   the unlocking lock exclusively, waiting for one that is), it finds the marker of its own
//!   session held ([`took_over`]): in the statement that waited for the key, or right after the
//!   try that was granted it.
//! - So a marker names the one session a graceful unlock handed the key to: a later grant, after
//!   that session has ended (a terminate, a reset), is another session, finds no marker of its
//!   own and waits, however soon after the graceful unlock it comes. (A later session with the
//!   same pid within the linger would be taken for it: the server would have to reuse a pid
//!   within 50 ms.)

use std::sync::LazyLock;
use std::time::Duration;

use tokio_postgres::types::Type;

use crate::LockKey;

/// How long the unlocking session stays open after it named a grantee, holding its marker for
/// the grantee to see (it looks right after its grant); not at all when it named none.
pub(super) const LINGER: Duration = Duration::from_millis(50);

/// The electing database, as `pg_locks` names it.
pub(super) const THIS_DATABASE: &str = "(SELECT oid FROM pg_catalog.pg_database \
     WHERE datname = pg_catalog.current_database())";

/// The graceful unlock: takes the unlocking lock, unlocks the key, marks the session that now
/// holds the key, lets the unlocking lock go, in that order (the subquery, kept apart by
/// `OFFSET 0`, runs before the outer column). Answers -1 when the key was not held, else how
/// many sessions it marked (0, or 1: the waiting session the unlock granted the key to, or a
/// try that was granted it since).
///
/// $1, $2: the key (int4); $3: the unlocking lock (int8); $4, $5: the key as `pg_locks` shows
/// it; $6: the key's grantee half.
const UNLOCK: &str = "SELECT outcome, pg_catalog.pg_advisory_unlock_shared($3::int8) FROM ( \
     SELECT CASE WHEN pg_catalog.pg_try_advisory_lock_shared($3::int8) IS NOT NULL THEN \
       CASE WHEN pg_catalog.pg_advisory_unlock($1::int4, $2::int4) \
       THEN (SELECT count(CASE WHEN pg_catalog.pg_try_advisory_lock_shared( \
                                    ($6::int8 << 32) | l.pid::int8) THEN 1 END) \
             FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.classid = $4 \
             AND l.objid = $5 AND l.objsubid = 2 AND l.granted AND l.mode = 'ExclusiveLock' \
             AND l.pid <> pg_catalog.pg_backend_pid() \
             AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                               WHERE datname = pg_catalog.current_database())) \
       ELSE -1 END END AS outcome OFFSET 0) AS unlock";

/// What a graceful unlock did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unlocked {
    /// The key was held (and is unlocked now).
    pub(crate) held: bool,
    /// It named the session it granted the key to: keep this session open for [`LINGER`].
    pub(crate) named: bool,
}

/// Runs the graceful unlock of `key` on `client`.
pub(super) async fn unlock(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<Unlocked, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            UNLOCK,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&key.handover_marker(), Type::INT8),
                (&key.class_oid(), Type::OID),
                (&key.object_oid(), Type::OID),
                (&i64::from(key.handover_grantee_half()), Type::INT8),
            ],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(Unlocked {
            held: false,
            named: false,
        });
    };
    let outcome = row.try_get::<_, Option<i64>>(0)?.unwrap_or(-1);
    Ok(Unlocked {
        held: outcome >= 0,
        named: outcome > 0,
    })
}

/// Whether the lock this session was just granted was handed over gracefully, as an SQL
/// expression: once no unlocking statement of the key is under way (it takes the unlocking
/// lock exclusively, with no `lock_timeout`, waiting for one that is, which never waits
/// itself), whether the marker of this session is held.
///
/// `$unlocking` is the unlocking lock (int8), `$class`, `$object` its halves as `pg_locks`
/// shows them; `$half` the key's grantee half (oid).
fn took_over(unlocking: u8, class: u8, object: u8, half: u8) -> String {
    format!(
        "CASE WHEN CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
                     WHERE locktype = 'advisory' AND objsubid = 1 AND classid = ${class} \
                     AND objid = ${object} AND granted AND database = {THIS_DATABASE}) \
                   THEN pg_catalog.set_config('lock_timeout', '0', true) IS NOT NULL \
                     AND pg_catalog.pg_advisory_lock(${unlocking}::int8) IS NOT NULL \
                     AND pg_catalog.pg_advisory_unlock(${unlocking}::int8) \
                   ELSE true END \
         THEN EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
                AND objsubid = 1 AND classid = ${half} \
                AND objid = pg_catalog.pg_backend_pid()::oid AND mode = 'ShareLock' \
                AND granted AND database = {THIS_DATABASE}) \
         ELSE false END"
    )
}

/// [`took_over`] as a column of the statement that waits for the lock (its answer in the column
/// `answer`): evaluated only when the wait was granted.
pub(super) fn handed_over(unlocking: u8, class: u8, object: u8, half: u8) -> String {
    format!(
        "CASE WHEN answer IN ('granted', 'granted_unbounded') THEN {} ELSE false END",
        took_over(unlocking, class, object, half)
    )
}

/// [`took_over`] as a statement of its own, run on a session a try was just granted the lock
/// on: a refused try, by far the most frequent statement of a fleet, is then not planned with
/// it.
static TOOK_OVER: LazyLock<String> = LazyLock::new(|| format!("SELECT {}", took_over(1, 2, 3, 4)));

/// Whether the lock `client`'s session was just granted on was handed over gracefully.
pub(super) async fn taken_over(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<bool, tokio_postgres::Error> {
    let unlocking = key.handover_marker();
    let (class, object) = halves(unlocking);
    let row = client
        .query_typed(
            &TOOK_OVER,
            &[
                (&unlocking, Type::INT8),
                (&class, Type::OID),
                (&object, Type::OID),
                (&key.handover_grantee_half(), Type::OID),
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
    use crate::postgres::session::{Attempt, LockSession, Prepared, SessionBounds};
    use crate::postgres::waiter::{Outcome, wait};
    use pg_elector_testkit::replicas::{serial, timing};
    use pg_elector_testkit::{PgServer, TestDb};
    use tokio::time::Instant;

    const INTERVAL: Duration = Duration::from_millis(200);

    /// A waiting session's outcome, in the background.
    fn waiter(db: &TestDb, key: LockKey) -> tokio::task::JoinHandle<Outcome> {
        let bounds = SessionBounds::for_interval(INTERVAL);
        tokio::spawn(wait(
            db.pool(1),
            key,
            "w".into(),
            bounds,
            INTERVAL,
            INTERVAL,
            Prepared::new(Some(false)),
        ))
    }

    /// A fresh database, an admin connection, and a connection holding `key`.
    async fn held(key: LockKey) -> (TestDb, tokio_postgres::Client, tokio_postgres::Client) {
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let admin = db.connect().await.unwrap();
        let holder = db.connect().await.unwrap();
        lock(&holder, key).await;
        (db, admin, holder)
    }

    async fn lock(client: &tokio_postgres::Client, key: LockKey) {
        client
            .execute(
                "SELECT pg_advisory_lock($1, $2)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
    }

    /// Waits until `n` sessions wait for `key`.
    async fn until_waiting(admin: &tokio_postgres::Client, key: LockKey, n: i64) {
        let start = Instant::now();
        loop {
            let waiting: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
                     AND classid = $1 AND objid = $2 AND NOT granted",
                    &[&key.class_oid(), &key.object_oid()],
                )
                .await
                .unwrap()
                .get(0);
            if waiting >= n {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no {n} waiting");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether some session holds the key's unlocking lock.
    async fn unlocking(admin: &tokio_postgres::Client, key: LockKey) -> bool {
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

    fn granted(outcome: Outcome) -> (bool, Box<LockSession>) {
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

    /// The unlock marks the waiting session it granted the key to, and never waits for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_granted_by_a_graceful_unlock_knows_it() {
        // Alone: the unlock's answer is bounded by LINGER (50 ms), one round trip.
        let _serial = serial();
        let key = LockKey::new(0xf1, 0x3c);
        let (db, admin, holder) = held(key).await;
        let waiting = waiter(&db, key);
        until_waiting(&admin, key, 1).await;
        let started = Instant::now();
        let unlocked = unlock(&holder, key).await.unwrap();
        let took = started.elapsed();
        assert_eq!(
            unlocked,
            Unlocked {
                held: true,
                named: true
            }
        );
        let (handed, _session) = granted(waiting.await.unwrap());
        assert!(handed, "a graceful unlock hands the lock over");
        assert!(
            !unlocking(&admin, key).await,
            "the unlocking lock is let go"
        );
        assert!(took < LINGER, "the unlock answered after {took:?}");
    }

    /// A marker names the session the unlock granted the key to: when that session ends (a
    /// terminate, a reset) right after, the next waiting session is not told the lock was
    /// handed over, however soon it is granted, although the unlocking session still holds the
    /// first one's marker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_after_the_grantee_ended_is_not_handed_over() {
        let _timing = timing();
        let key = LockKey::new(0xf1, 0x3d);
        let (db, admin, holder) = held(key).await;
        let first = waiter(&db, key);
        until_waiting(&admin, key, 1).await;
        let second = waiter(&db, key);
        until_waiting(&admin, key, 2).await;
        assert!(unlock(&holder, key).await.unwrap().named);
        let (handed, session) = granted(first.await.unwrap());
        assert!(handed, "the first waiter was handed the lock");
        drop(session);
        let (handed, _session) = granted(second.await.unwrap());
        assert!(!handed, "the second grant came from a session that ended");
    }

    /// The statement a try runs after its grant finds the marker of its session, and only that
    /// session does, while the unlocking session is open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_granted_session_finds_its_marker_after_the_fact() {
        let _timing = timing();
        let key = LockKey::new(0xf1, 0x3f);
        let (db, admin, holder) = held(key).await;
        let grantee = std::sync::Arc::new(db.connect().await.unwrap());
        let granted = tokio::spawn({
            let grantee = grantee.clone();
            async move { lock(&grantee, key).await }
        });
        until_waiting(&admin, key, 1).await;
        assert!(unlock(&holder, key).await.unwrap().named);
        granted.await.unwrap();
        assert!(taken_over(&grantee, key).await.unwrap(), "handed over");
        assert!(
            !taken_over(&admin, key).await.unwrap(),
            "no other session's marker"
        );
        drop(holder);
        let start = Instant::now();
        while taken_over(&grantee, key).await.unwrap() {
            assert!(start.elapsed() < Duration::from_secs(5), "the marker stays");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A graceful unlock with nobody waiting marks nobody (so its session need not stay).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unlock_with_nobody_waiting_names_nobody() {
        let _timing = timing();
        let key = LockKey::new(0xf1, 0x3e);
        let (_db, admin, holder) = held(key).await;
        assert_eq!(
            unlock(&holder, key).await.unwrap(),
            Unlocked {
                held: true,
                named: false
            }
        );
        assert!(!unlocking(&admin, key).await);
        assert_eq!(
            unlock(&holder, key).await.unwrap(),
            Unlocked {
                held: false,
                named: false
            },
            "no longer held"
        );
        assert!(!unlocking(&admin, key).await, "nor after a refused unlock");
    }
}
