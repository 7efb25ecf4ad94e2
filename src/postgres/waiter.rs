//! Fast takeover's waiting session: a standby's own connection, out of the pool, blocked in
//! `pg_advisory_lock` so that the server hands it the lock the moment the holder's session
//! lets go of it.
//!
//! The session gets everything a lock session needs *before* it waits, in a first statement:
//! the bounds of [`SessionBounds`] (so that a grant to a standby that is frozen or gone is
//! ended by the server within 4·I, as for any silent lock session), the replica's identity,
//! and no statement, lock or transaction timeout of the pool's that would cut the wait short.
//! The second statement waits; once granted it marks the session as the try does, and reads
//! the bounds back. Both statements check for a read replica and for a transaction pooler
//! (another elector's mark on the session, or the two statements landing on two server
//! sessions), so a grant there is refused as a try's would be.
//!
//! The connection is never given back to a pool: the task that owns it closes it on any
//! outcome but a grant, and when it is dropped (the standby stops waiting: shutdown, a grant
//! by the standby's own try, a cooldown), so a wait the server grants after the client gave
//! up frees the lock as soon as the server notices the closed connection.

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::time::timeout;
use tokio_postgres::types::Type;
use tokio_util::task::AbortOnDropHandle;

use super::handover;
use super::session::{
    Answer, Attempt, LockSession, Prepared, SessionBounds, SessionError, answer_of, bounded,
    session_mark,
};
use crate::LockKey;
use crate::lease::now_ms;
use crate::pooled::Borrowed;

/// How many standbys may wait for a key at once. The server's queue for the key then stays
/// this short whatever the size of the fleet: every session that waits on a lock runs
/// PostgreSQL's deadlock check once after `deadlock_timeout` (1 s by default, settable only by
/// a superuser), and that check holds the whole lock table while it walks the queue, so a
/// thousand waiting sessions on one key stall the server (measured: the leader's check then
/// took up to 2.5 s, and leadership moved 7 to 9 times a minute). The other standbys only try.
pub(crate) const WAITING_SLOTS: u8 = 3;

/// Readies a session to wait: checks that it is a primary's and not shared, takes one of the
/// key's waiting slots ($9, $10, $11: bigint advisory locks, tried without waiting), marks the
/// session as this waiter's ($1), and sets the bounds (as [`super::session`]'s try does at a
/// grant), the identity ($7), and no statement, lock or transaction timeout. On PostgreSQL 14
/// and later `client_connection_check_interval` ($8 ms) makes the server notice, while it
/// waits, a client that has closed the connection. Answers `armed<slot>`, or `full` when every
/// slot is taken (then nothing was changed on the session), `recovery` or `marked`.
static ARM: LazyLock<String> = LazyLock::new(|| {
    let settings = "pg_catalog.set_config('pg_elector.waiter', $1::text, false) = $1::text \
      AND pg_catalog.set_config('statement_timeout', '0', false) IS NOT NULL \
      AND pg_catalog.set_config('lock_timeout', '0', false) IS NOT NULL \
      AND pg_catalog.set_config('idle_in_transaction_session_timeout', '0', false) IS NOT NULL \
      AND pg_catalog.set_config('application_name', $7::text, false) IS NOT NULL \
      AND pg_catalog.set_config('tcp_user_timeout', $3::text, false) IS NOT NULL \
      AND pg_catalog.set_config('tcp_keepalives_idle', $4::text, false) IS NOT NULL \
      AND pg_catalog.set_config('tcp_keepalives_interval', $5::text, false) IS NOT NULL \
      AND pg_catalog.set_config('tcp_keepalives_count', $6::text, false) IS NOT NULL \
      AND CASE WHEN pg_catalog.current_setting('server_version_num')::int < 140000 THEN true \
               ELSE pg_catalog.set_config('idle_session_timeout', $2::text, false) IS NOT NULL \
                AND pg_catalog.set_config('client_connection_check_interval', $8::text, false) \
                    IS NOT NULL END \
      AND CASE WHEN pg_catalog.current_setting('server_version_num')::int < 170000 THEN true \
               ELSE pg_catalog.set_config('transaction_timeout', '0', false) IS NOT NULL END";
    let slots: String = (0..WAITING_SLOTS)
        .map(|n| {
            format!(
                "WHEN pg_catalog.pg_try_advisory_lock(${}::int8) THEN CASE WHEN {settings} \
                 THEN 'armed{n}' END ",
                9 + n
            )
        })
        .collect();
    format!(
        "SELECT CASE \
         WHEN pg_catalog.pg_is_in_recovery() THEN 'recovery' \
         WHEN coalesce(pg_catalog.current_setting('pg_elector.session', true), '') <> '' THEN \
           CASE WHEN pg_catalog.set_config('pg_elector.visited', $1::text, false) = $1::text \
                THEN 'marked' END \
         {slots}ELSE 'full' END"
    )
});

/// Waits for the lock on the armed session ($3 is the waiter's mark, which becomes the lock
/// session's), gives its waiting slot ($6) back once granted, then answers as the try does,
/// with the same columns: `moved` when this statement runs on another server session than
/// [`ARM`] did (a transaction pooler). The last column says whether a graceful unlock handed the
/// lock over ([`handover::handed_over`], with the unlocking lock $7, its halves $4, $5, and the
/// key's grantee half $8).
static WAIT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT answer, \
     pg_catalog.current_setting('idle_session_timeout', true), \
     pg_catalog.current_setting('tcp_user_timeout', true), \
     pg_catalog.current_setting('tcp_keepalives_idle', true), \
     pg_catalog.current_setting('tcp_keepalives_interval', true), \
     pg_catalog.current_setting('tcp_keepalives_count', true), \
     {handed_over} \
   FROM (SELECT CASE \
     WHEN pg_catalog.pg_is_in_recovery() THEN 'recovery' \
     WHEN coalesce(pg_catalog.current_setting('pg_elector.waiter', true), '') <> $3::text \
       THEN 'moved' \
     WHEN coalesce(pg_catalog.current_setting('pg_elector.session', true), '') <> '' THEN \
       CASE WHEN pg_catalog.set_config('pg_elector.visited', $3::text, false) = $3::text \
            THEN 'marked' END \
     WHEN pg_catalog.pg_advisory_lock($1::int4, $2::int4) IS NOT NULL THEN \
       CASE WHEN pg_catalog.pg_advisory_unlock($6::int8) IS NOT NULL \
             AND pg_catalog.set_config('pg_elector.session', $3::text, false) = $3::text \
       THEN CASE WHEN pg_catalog.current_setting('server_version_num')::int < 140000 \
                 THEN 'granted_unbounded' ELSE 'granted' END END \
     END AS answer OFFSET 0) AS wait",
        handed_over = handover::handed_over(7, 4, 5, 8),
    )
});

/// How a waiting session fared; what [`Waiter::outcome`] returns.
pub(crate) type Outcome = Result<Attempt, SessionError>;

/// A waiting session, in a task of its own. Dropping the waiter aborts the task and closes
/// the connection.
pub(crate) struct Waiter {
    task: AbortOnDropHandle<Outcome>,
}

/// What a waiting session is made with.
pub(crate) struct WaitSpec {
    pub(crate) pool: Pool,
    pub(crate) key: LockKey,
    pub(crate) identity: String,
    pub(crate) bounds: SessionBounds,
    pub(crate) interval: Duration,
    /// The bound on getting a connection and on the first statement.
    pub(crate) setup_bound: Duration,
    /// How the check of a session granted the lock sends it: the standby's tries' way.
    pub(crate) prepared: Prepared,
}

impl Waiter {
    /// Opens a waiting session in the background.
    pub(crate) fn start(spec: &WaitSpec) -> Self {
        let task = tokio::spawn(wait(
            spec.pool.clone(),
            spec.key,
            spec.identity.clone(),
            spec.bounds,
            spec.interval,
            spec.setup_bound,
            spec.prepared.clone(),
        ));
        Self {
            task: AbortOnDropHandle::new(task),
        }
    }

    /// The waiting session's outcome: a grant, a refusal (a read replica or a pooler), or why
    /// it ended. Cancel safe: the wait goes on until the waiter is dropped.
    pub(crate) async fn outcome(&mut self) -> Outcome {
        match (&mut self.task).await {
            Ok(outcome) => outcome,
            // A panic in the pool (a hook of the application's) unwinds through `run`.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(SessionError::WaitAborted),
        }
    }
}

pub(super) async fn wait(
    pool: Pool,
    key: LockKey,
    identity: String,
    bounds: SessionBounds,
    interval: Duration,
    setup_bound: Duration,
    prepared: Prepared,
) -> Outcome {
    let object = timeout(interval, pool.get())
        .await
        .map_err(|_| SessionError::PoolTimeout(interval))?
        .map_err(SessionError::Pool)?;
    // Until it is armed, the connection goes back to the pool unchanged (every slot taken, a
    // shared session), or is closed on any other outcome: it may hold a slot, or it reached a
    // server in recovery, which the next try must not ask again (see `try_acquire`).
    let borrowed = Borrowed::new(object);
    let mark = session_mark();
    let slot = match arm(
        &borrowed,
        key,
        &identity,
        &mark,
        bounds,
        interval,
        setup_bound,
    )
    .await?
    {
        Armed::Slot(slot) => slot,
        Armed::Refused(attempt @ Attempt::InRecovery) => return Ok(attempt),
        Armed::Refused(attempt) => {
            borrowed.give_back();
            return Ok(attempt);
        }
    };
    // Out of the pool for good: the pool's size does not count it, and no outcome gives it
    // back. Dropped, it is closed (and the server frees its slot).
    wait_on(Object::take(borrowed.keep()), key, mark, slot, prepared).await
}

/// What arming a session came to: the waiting slot it took, or a refusal (the connection then
/// goes back to the pool unchanged, but from a server in recovery).
enum Armed {
    Slot(i64),
    Refused(Attempt),
}

/// The first statement ([`ARM`]), within `setup_bound`.
async fn arm(
    borrowed: &Borrowed,
    key: LockKey,
    identity: &str,
    mark: &str,
    bounds: SessionBounds,
    interval: Duration,
    setup_bound: Duration,
) -> Result<Armed, SessionError> {
    let [idle, user, k_idle, k_interval, k_count] = bounds.as_settings();
    let check = client_check_ms(interval).to_string();
    let slots: Vec<i64> = (0..WAITING_SLOTS).map(|n| key.waiting_slot(n)).collect();
    let armed = bounded(setup_bound, async {
        let mut params: Vec<(&(dyn tokio_postgres::types::ToSql + Sync), Type)> = vec![
            (&mark, Type::TEXT),
            (&idle, Type::TEXT),
            (&user, Type::TEXT),
            (&k_idle, Type::TEXT),
            (&k_interval, Type::TEXT),
            (&k_count, Type::TEXT),
            (&identity, Type::TEXT),
            (&check, Type::TEXT),
        ];
        params.extend(slots.iter().map(|slot| (slot as _, Type::INT8)));
        let rows = borrowed.client().query_typed(ARM.as_str(), &params).await?;
        rows.first()
            .map(|row| row.try_get::<_, Option<String>>(0))
            .transpose()
            .map(Option::flatten)
    })
    .await?;
    match Answer::parse(armed.as_deref()) {
        Some(Answer::Armed(slot)) if slot < WAITING_SLOTS => {
            Ok(Armed::Slot(slots[usize::from(slot)]))
        }
        Some(Answer::Full) => Ok(Armed::Refused(Attempt::QueueFull)),
        Some(Answer::Recovery) => Ok(Armed::Refused(Attempt::InRecovery)),
        Some(Answer::Marked) => Ok(Armed::Refused(Attempt::SharedSession)),
        _ => Err(SessionError::Unexpected(armed)),
    }
}

/// The second statement ([`WAIT`]) on the armed session, out of the pool: waits for the lock
/// in `slot`, then marks the session and reads its bounds back.
async fn wait_on(
    client: deadpool_postgres::ClientWrapper,
    key: LockKey,
    mark: String,
    slot: i64,
    prepared: Prepared,
) -> Outcome {
    let marker = key.handover_marker();
    let (marker_class, marker_object) = handover::halves(marker);
    let sent_at = now_ms();
    // No bound: the wait lasts as long as the lock is held elsewhere. It ends with a grant,
    // or with an error when the server ends the session (a restart, a terminate).
    let rows = client
        .query_typed(
            &WAIT,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&mark, Type::TEXT),
                (&marker_class, Type::OID),
                (&marker_object, Type::OID),
                (&slot, Type::INT8),
                (&marker, Type::INT8),
                (&key.handover_grantee_half(), Type::OID),
            ],
        )
        .await
        .map_err(SessionError::Query)?;
    let (row, answer) = answer_of(rows)?;
    match Answer::parse(answer.as_deref()) {
        Some(granted @ (Answer::Granted | Answer::GrantedUnbounded)) => {
            let session = LockSession::new(client, key, mark, prepared);
            let handed_over = row.try_get::<_, Option<bool>>(6).ok().flatten();
            Ok(Attempt::granted(
                session,
                &row,
                granted,
                sent_at,
                handed_over.unwrap_or(false),
            ))
        }
        Some(Answer::Recovery) => Ok(Attempt::InRecovery),
        Some(Answer::Marked | Answer::Moved) => Ok(Attempt::SharedSession),
        // Dropping `client` closes the connection, whatever the server did.
        _ => Err(SessionError::Unexpected(answer)),
    }
}

/// How often the server looks, while the session waits, whether its client has gone (a
/// `poll` of the socket, so cheap even for a thousand waiting sessions): one interval, at
/// least 100 ms and at most 1 s. A waiting session that its standby gave up (a resign, a
/// shutdown, a grant to its try) thus leaves the server's queue within a second.
fn client_check_ms(interval: Duration) -> u64 {
    (interval.as_millis() as u64).clamp(100, 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_elector_testkit::PgServer;
    use pg_elector_testkit::replicas::timing;

    fn describe(outcome: &Outcome) -> String {
        match outcome {
            Ok(Attempt::Granted { .. }) => "granted".into(),
            Ok(Attempt::Refused) => "refused".into(),
            Ok(Attempt::InRecovery) => "recovery".into(),
            Ok(Attempt::SharedSession) => "shared".into(),
            Ok(Attempt::QueueFull) => "full".into(),
            Ok(Attempt::Deferred) => "deferred".into(),
            Err(e) => format!("error: {e}"),
        }
    }

    fn spec_bounds() -> (SessionBounds, Duration) {
        let interval = Duration::from_millis(200);
        (SessionBounds::for_interval(interval), interval)
    }

    /// A session that already carries an elector's mark is one a transaction pooler shares:
    /// the waiter refuses it as the try does, and leaves a visit mark for that elector.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_with_an_electors_mark_is_refused_before_it_waits() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let pool = db.pool(1);
        {
            let client = pool.get().await.unwrap();
            client
                .execute(
                    "SELECT set_config('pg_elector.session', 'other', false)",
                    &[],
                )
                .await
                .unwrap();
        }
        let (bounds, interval) = spec_bounds();
        let key = LockKey::new(0xf1, 0x3a);
        let outcome = wait(
            pool.clone(),
            key,
            "w".into(),
            bounds,
            interval,
            interval,
            Prepared::new(None),
        )
        .await;
        assert_eq!(describe(&outcome), "shared");
    }

    /// The wait refuses to run on another server session than the one armed (what a
    /// transaction pooler may do between two statements).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_on_a_session_armed_for_another_waiter_answers_moved() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let client = db.connect().await.unwrap();
        client
            .execute(
                "SELECT set_config('pg_elector.waiter', 'someone-else', false)",
                &[],
            )
            .await
            .unwrap();
        let row = client
            .query_typed(
                &WAIT,
                &[
                    (&1i32, Type::INT4),
                    (&2i32, Type::INT4),
                    (&"mine", Type::TEXT),
                    (&0u32, Type::OID),
                    (&0u32, Type::OID),
                    (&0i64, Type::INT8),
                    (&0i64, Type::INT8),
                    (&0u32, Type::OID),
                ],
            )
            .await
            .unwrap();
        let answer: Option<String> = row[0].get(0);
        assert_eq!(Answer::parse(answer.as_deref()), Some(Answer::Moved));
        let held = pg_elector_testkit::server::sql::own_advisory_locks(&client)
            .await
            .unwrap();
        assert_eq!(held, 0, "no lock taken");
    }

    /// On a read replica the waiter never waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_read_replica_the_waiter_answers_recovery_and_never_waits() {
        let _timing = timing();
        let primary =
            tokio::task::block_in_place(PgServer::spawn).unwrap_or_else(|e| panic!("{e}"));
        let db = primary.create_database().await.unwrap();
        let standby = tokio::task::block_in_place(|| primary.spawn_standby())
            .unwrap_or_else(|e| panic!("{e}"));
        let (bounds, interval) = spec_bounds();
        let key = LockKey::new(0xf1, 0x3b);
        let outcome = timeout(
            Duration::from_secs(10),
            wait(
                db.pool_via(standby.addr(), 1),
                key,
                "w".into(),
                bounds,
                interval,
                interval,
                Prepared::new(None),
            ),
        )
        .await
        .expect("no wait on a read replica");
        assert_eq!(describe(&outcome), "recovery");
    }
}
