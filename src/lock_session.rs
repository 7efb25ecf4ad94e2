//! The database side of the election: the try on a borrowed connection, and the session that
//! holds the lock once it is granted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{ClientWrapper, Object, Pool, PoolError};
use tokio::time::timeout;

use crate::LockKey;
use crate::lease::now_ms;

/// The try (E1, E3), in one statement so that even a transaction pooler runs it on one
/// server session, and so that a granted lock never exists on a session without its bounds.
/// It answers:
/// - `recovery`: the server is a hot standby (E16), whose advisory locks are local to it, so a
///   lock granted there proves nothing;
/// - `marked`: this server session already carries some elector's mark, so it is shared by a
///   transaction-mode pooler (E16); the try leaves a visit mark for that elector to find;
/// - `granted`: the lock is ours; the session now carries our mark ($3) and
///   `idle_session_timeout` = $4 ms (E13), and its TCP timeouts are the system's (E14, see
///   [`LockSession`]);
/// - `granted_unbounded`: the same on a server without `idle_session_timeout` (before 14);
/// - `refused`: another session holds the lock.
///
/// Setting the bounds in the granting statement matters: if the answer is lost (a partition
/// right after the grant), the server still ends the silent session after 4·I.
const TRY_LOCK: &str = "SELECT CASE \
     WHEN pg_catalog.pg_is_in_recovery() THEN 'recovery' \
     WHEN coalesce(pg_catalog.current_setting('pg_elector.session', true), '') <> '' THEN \
       CASE WHEN pg_catalog.set_config('pg_elector.visited', $3::text, false) = $3::text \
            THEN 'marked' END \
     WHEN pg_catalog.pg_try_advisory_lock($1::int4, $2::int4) THEN \
       CASE WHEN pg_catalog.set_config('pg_elector.session', $3::text, false) = $3::text \
             AND pg_catalog.set_config('tcp_user_timeout', '0', false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_idle', '0', false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_interval', '0', false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_count', '0', false) IS NOT NULL \
       THEN CASE WHEN pg_catalog.current_setting('server_version_num')::int < 140000 \
                 THEN 'granted_unbounded' \
                 WHEN pg_catalog.set_config('idle_session_timeout', $4::text, false) IS NOT NULL \
                 THEN 'granted' END END \
     ELSE 'refused' END";

/// The leader check (E5): the session answers, still holds the lock, and is still ours alone
/// (E16): it carries our mark and no other elector's visit.
const CHECK: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
     WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND granted AND pid = pg_catalog.pg_backend_pid() \
     AND database = (SELECT oid FROM pg_catalog.pg_database \
                     WHERE datname = pg_catalog.current_database())), \
     coalesce(pg_catalog.current_setting('pg_elector.session', true), '') = $3::text, \
     coalesce(pg_catalog.current_setting('pg_elector.visited', true), '') = ''";

const UNLOCK: &str = "SELECT pg_catalog.pg_advisory_unlock($1::int4, $2::int4)";

/// How often the leader looks at its connection and its lease between checks (F2, E18): a
/// closed socket, or a lease that expired while the process was frozen, is noticed within this
/// time rather than at the next check.
pub(crate) const WATCH_POLL: Duration = Duration::from_millis(20);

/// Why a try or a check failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("no pool connection within {0:?}")]
    PoolTimeout(Duration),
    #[error("{0}")]
    Pool(#[source] PoolError),
    #[error("{0}")]
    Query(#[source] tokio_postgres::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What a try found.
pub(crate) enum Attempt {
    /// The lock is ours, on this session; `sent_at` is when the try was sent ([`now_ms`]).
    Granted {
        session: Box<LockSession>,
        sent_at: u64,
        /// The server has no `idle_session_timeout` (PostgreSQL 13 and older).
        unbounded: bool,
    },
    /// Another session holds the lock.
    Refused,
    /// The server is a hot standby (or recovering): it must never yield leadership.
    InRecovery,
    /// The server session carries another elector's mark: a transaction pooler shares it.
    SharedSession,
}

/// What a leader check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The session holds the lock and is ours alone.
    Holds,
    /// The session no longer holds the lock.
    Lost,
    /// The check ran on a server session without our mark, or one another elector's try has
    /// visited: the connection goes through a transaction-mode pooler.
    SharedSession,
}

/// Tries the lock once on a connection borrowed from `pool`, waiting at most `wait` for the
/// connection and `bound` for the query.
///
/// A refused try gives the connection back to the pool unchanged. A granted one takes it out
/// of the pool for good. Any other outcome (an error, a timeout, or this future being dropped
/// mid-way) closes the connection instead of returning it, because the lock may have been
/// granted on it without our hearing of it.
pub(crate) async fn try_acquire(
    pool: &Pool,
    key: LockKey,
    idle_session_timeout: Duration,
    wait: Duration,
    bound: Duration,
) -> Result<Attempt, SessionError> {
    let object = timeout(wait, pool.get())
        .await
        .map_err(|_| SessionError::PoolTimeout(wait))?
        .map_err(SessionError::Pool)?;
    let borrowed = Borrowed(Some(object));
    let mark = session_mark();
    let idle_ms = idle_session_timeout.as_millis().to_string();
    let sent_at = now_ms();
    let answer: String = bounded(bound, async {
        let client = borrowed.client();
        let statement = client.prepare_cached(TRY_LOCK).await?;
        let row = client
            .query_one(&statement, &[&key.class(), &key.object(), &mark, &idle_ms])
            .await?;
        row.try_get(0)
    })
    .await?;
    let attempt = match answer.as_str() {
        granted @ ("granted" | "granted_unbounded") => {
            return Ok(Attempt::Granted {
                unbounded: granted == "granted_unbounded",
                session: Box::new(LockSession {
                    client: Object::take(borrowed.keep()),
                    key,
                    mark,
                }),
                sent_at,
            });
        }
        "refused" => Attempt::Refused,
        "recovery" => Attempt::InRecovery,
        _ => Attempt::SharedSession,
    };
    borrowed.give_back();
    Ok(attempt)
}

/// The connection that holds the lock, out of the pool. Dropping it closes the connection,
/// and the server frees the lock with the session.
///
/// The session's `tcp_user_timeout` and keepalives are reset to the system's when it is
/// granted: a short server-side TCP timeout could end a partitioned session, and free the lock,
/// before the old leader has demoted itself (≤ 2·I), which would break the self-fencing order
/// (E14). `idle_session_timeout` (4·I) stays the server's only bound on a silent session.
pub(crate) struct LockSession {
    client: ClientWrapper,
    key: LockKey,
    /// This grant's mark on the server session (E16).
    mark: String,
}

impl LockSession {
    /// The leader check (E5, E16).
    pub(crate) async fn check(&self, bound: Duration) -> Result<Check, SessionError> {
        let (holds, ours, unvisited): (bool, bool, bool) = bounded(bound, async {
            let statement = self.client.prepare_cached(CHECK).await?;
            let row = self
                .client
                .query_one(
                    &statement,
                    &[&self.key.class_oid(), &self.key.object_oid(), &self.mark],
                )
                .await?;
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        })
        .await?;
        Ok(if !(ours && unvisited) {
            Check::SharedSession
        } else if holds {
            Check::Holds
        } else {
            Check::Lost
        })
    }

    /// Gives the lock up (E6): `Ok(true)` when it was held.
    pub(crate) async fn unlock(&self, bound: Duration) -> Result<bool, SessionError> {
        bounded(bound, async {
            let row = self
                .client
                .query_one(UNLOCK, &[&self.key.class(), &self.key.object()])
                .await?;
            row.try_get(0)
        })
        .await
    }

    /// Whether the connection has closed (F2). tokio-postgres notices a FIN or RST as soon as
    /// it arrives, because its connection task always reads; the client only exposes that as a
    /// flag, which the leader polls every [`WATCH_POLL`].
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// A mark unique to one grant: process, time, and a counter.
fn session_mark() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{nanos:x}-{n}", std::process::id())
}

async fn bounded<T>(
    bound: Duration,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SessionError> {
    timeout(bound, query)
        .await
        .map_err(|_| SessionError::Timeout(bound))?
        .map_err(SessionError::Query)
}

/// A pooled connection on which a try is in flight. Unless it is given back or kept, dropping
/// it closes the connection: its lock state is unknown.
struct Borrowed(Option<Object>);

impl Borrowed {
    fn client(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a borrowed connection is present until it is let go")
    }

    /// Back to the pool, unchanged.
    fn give_back(mut self) {
        drop(self.0.take());
    }

    /// Out of the guard, to be taken from the pool.
    fn keep(mut self) -> Object {
        self.0
            .take()
            .expect("a borrowed connection is present until it is let go")
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(Object::take(object));
        }
    }
}
