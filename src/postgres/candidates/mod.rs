//! Preferred leaders: the candidates table, where standbys that set a preference say they are
//! alive, and where a handover is asked from outside.
//!
//! One row per key and identity, in `pg_elector_candidates` (created when first needed):
//! - a standby built with a preference upserts its row at each try, on a connection of the
//!   pool it tries from, with `live_until` two intervals ahead; a standby that stops trying
//!   (stopped, frozen, cut off) stops counting two intervals after its last try. A row is
//!   live while `live_until` has not passed and `heard_at`, when it was written, is not
//!   ahead of the server's clock: a step of that clock backwards (a VM restored, NTP) makes
//!   the rows written before it dead until their standbys write again (within an interval),
//!   rather than keep a dead standby live for the step's length; a step forwards ends every
//!   row early, and live standbys write theirs again within an interval;
//! - the leader's check also asks whether the table exists (a catalog lookup); once it does,
//!   the leader reads the most preferred live standby and any handover asked, after each
//!   check, on its lock session, and drops its own row there ([`look`]);
//! - a grant is kept only if no live standby should have it instead ([`should_defer`]): the
//!   target of a handover asked from outside, or else a strictly more preferred one. A grant
//!   given back that way is unlocked gracefully, so that a waiting session of fast takeover
//!   gets it at once, and the next in line asks the same.
//!
//! A replica without a preference never writes the table and counts as preference 0; it still
//! defers, and hands over, once the table exists.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::session_error::{SessionError, bounded};
use crate::pooled::Borrowed;
use crate::{Error, LockKey};

pub(crate) mod rule;

pub(crate) use rule::{
    Backoff, Look, Request, SHORT_TERM_INTERVALS, Standing, StayAway, TargetSeen, Yield,
};

/// The statement that creates the table, for a migration or an administrator.
pub(crate) const CANDIDATES_DDL: &str = "CREATE TABLE IF NOT EXISTS pg_elector_candidates (\
     class int4 NOT NULL, object int4 NOT NULL, identity text NOT NULL, \
     preference numeric(20,0) NOT NULL, live_until timestamptz NOT NULL, \
     live_since timestamptz NOT NULL, waits bool NOT NULL, \
     requested_until timestamptz, stay_away_ms bigint, heard_at timestamptz, \
     PRIMARY KEY (class, object, identity)); \
     ALTER TABLE pg_elector_candidates ADD COLUMN IF NOT EXISTS heard_at timestamptz";

/// Whether the table exists, as one column of the leader's check (a catalog lookup).
pub(crate) const EXISTS: &str = "pg_catalog.to_regclass('pg_elector_candidates') IS NOT NULL";

/// The first CTE of every statement that writes the table: its commit waits for no
/// synchronous standby and no local flush (`synchronous_commit = off`, for this transaction).
/// A row says only who is alive now, and a backend waiting for a standby that stopped
/// confirming keeps its locks (the lock session's advisory lock among them) even after its
/// client has gone. Each statement reads `bound`, so that the setting is made.
macro_rules! no_wait {
    () => {
        "WITH bound AS MATERIALIZED (\
           SELECT pg_catalog.set_config('synchronous_commit', 'off', true) AS s), "
    };
}

/// Whether the statement runs inside a transaction [`PROBE`] marked: one the application left
/// open on the pool connection.
macro_rules! open {
    () => {
        "coalesce(pg_catalog.current_setting('pg_elector.probe', true), '') = 'open'"
    };
}

/// The first CTEs of every statement that writes the table on a pool connection, which the
/// application may have left inside a transaction (a `BEGIN` without its `COMMIT`): `open`,
/// whether it is (see [`PROBE`]), and [`no_wait!`]'s setting, made only when it is not. The
/// statement writes nothing inside such a transaction, and the connection is closed, which
/// ends it: the crate never changes a transaction it did not open.
macro_rules! no_wait_outside_transactions {
    () => {
        concat!(
            "WITH open AS MATERIALIZED (SELECT ",
            open!(),
            " AS yes), \
             bound AS MATERIALIZED (SELECT CASE WHEN NOT (SELECT yes FROM open) THEN \
               pg_catalog.set_config('synchronous_commit', 'off', true) END AS s), "
        )
    };
}

/// Sent in the same round trip before a statement on a pool connection: it marks the
/// transaction it runs in. Outside a transaction block that is its own, over at once, and the
/// statement after it reads no mark; inside a transaction the application left open, the
/// statement reads it ([`open!`]).
const PROBE: &str = "SELECT pg_catalog.set_config('pg_elector.probe', 'open', true)";

/// Whether [`PROBE`]'s mark is still there: the statements ran inside a transaction the
/// application left open.
const STILL_MARKED: &str = concat!("SELECT ", open!());

/// `query` on `client`, a pool connection, between [`PROBE`] and [`STILL_MARKED`] (one round
/// trip): its answer, and whether it ran inside a transaction the application left open. A
/// mark that cannot be read (a statement failed inside such a transaction, which aborts it)
/// counts as open: the connection is then closed.
async fn probed<T>(
    client: &tokio_postgres::Client,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<(T, bool), tokio_postgres::Error> {
    // `join!` polls them first in this order, and each sends its statement when first polled.
    let (marked, answer, still) = tokio::join!(
        client.query_typed(PROBE, &[]),
        query,
        client.query_typed(STILL_MARKED, &[])
    );
    marked?;
    let open = still.map_or(true, |rows| {
        rows.first()
            .and_then(|row| row.try_get::<_, bool>(0).ok())
            .unwrap_or(true)
    });
    Ok((answer?, open))
}

/// Whether the lock of `$1, $2`, free or just granted to identity `$3` of preference `$4`,
/// should go to another live standby: the live target of the newest handover asked (one
/// target at a time, however many requests raced), or else (no live target) a more preferred
/// one.
///
/// Time is the statement's (`statement_timestamp`), not its transaction's: a pool connection
/// the application left inside a transaction would otherwise read the time it began.
macro_rules! defer {
    () => {
        "SELECT EXISTS (SELECT 1 FROM pg_elector_candidates c \
         WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity <> $3::text \
         AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp() \
         AND coalesce(c.identity = (SELECT r.identity FROM pg_elector_candidates r \
                WHERE r.class = $1::int4 AND r.object = $2::int4 \
                AND r.live_until > pg_catalog.statement_timestamp() AND r.heard_at <= pg_catalog.statement_timestamp() \
                AND r.requested_until > pg_catalog.statement_timestamp() \
                ORDER BY r.requested_until DESC, r.identity DESC LIMIT 1), \
              c.preference > $4::text::numeric))"
    };
}

/// A standby's row: its preference, live for `$5` ms more, whether it keeps a session waiting
/// for the lock (`$6`, fast takeover), and since when it has been live without a break. A
/// handover asked of it stays. Answers whether another live standby outranks it (see
/// [`defer!`]): such a standby keeps no waiting session, which would only take a waiting slot
/// from the one it would leave the lock to.
///
/// `$7` is the `live_until` this replica wrote at its last upsert (in microseconds since 1970;
/// NULL when it knows none): a live row whose `live_until` is another was written since by
/// another replica of the same key and identity, whose rows overwrite each other's (the last
/// column says so).
const REGISTER: &str = concat!(
    no_wait_outside_transactions!(),
    "prev AS (SELECT live_until, heard_at FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text), \
     up AS (INSERT INTO pg_elector_candidates AS c \
       (class, object, identity, preference, live_until, live_since, waits, heard_at) \
       SELECT $1::int4, $2::int4, $3::text, $4::text::numeric, \
               pg_catalog.statement_timestamp() + $5::int8 * interval '1 millisecond', pg_catalog.statement_timestamp(), $6::bool, \
               pg_catalog.statement_timestamp() \
       WHERE NOT (SELECT yes FROM open) \
       ON CONFLICT (class, object, identity) DO UPDATE \
       SET preference = EXCLUDED.preference, live_until = EXCLUDED.live_until, \
           waits = EXCLUDED.waits, heard_at = EXCLUDED.heard_at, \
           live_since = CASE WHEN c.live_until < pg_catalog.statement_timestamp() \
                                  OR c.heard_at > pg_catalog.statement_timestamp() THEN pg_catalog.statement_timestamp() \
                             ELSE c.live_since END \
       RETURNING (extract(epoch FROM live_until) * 1000000)::int8 AS written) \
     SELECT d.yes, (SELECT yes FROM open), (SELECT written FROM up), \
       coalesce($7::int8 <> (SELECT (extract(epoch FROM live_until) * 1000000)::int8 FROM prev) \
                AND (SELECT live_until > pg_catalog.statement_timestamp() \
                     AND heard_at <= pg_catalog.statement_timestamp() FROM prev), false) \
     FROM (",
    defer!(),
    ") AS d(yes), bound"
);

/// [`defer!`] on a free lock, before a try would take it; and whether this session still
/// holds the key's shared lock of the question the try asked first (see the try's `ASK`): it
/// does only inside a transaction the application left open on the pool connection, where
/// that hold lasts until the transaction ends.
const DEFER: &str = concat!(
    defer!(),
    ", EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
       AND pid = pg_catalog.pg_backend_pid() AND mode = 'ShareLock' \
       AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2), ",
    open!()
);

/// [`defer!`] after a grant, and whether the grantee's own row carries a handover asked to it.
/// Its row stays until its first look ([`LOOK`]), after its term's first check, or until it
/// unlocks, whichever comes first ([`drop_own_row`]): until the target of a handover has begun
/// a term that held, its request stands, so that the replica that handed over stays away
/// only while the target may still lead.
const CLAIM: &str = concat!(
    "SELECT (",
    defer!(),
    "), coalesce((SELECT requested_until > pg_catalog.statement_timestamp() \
       FROM pg_elector_candidates WHERE class = $1::int4 AND object = $2::int4 \
       AND identity = $3::text), false)"
);

/// A standby's row, when it stops: nobody waits for it any more.
const WITHDRAW: &str = concat!(
    no_wait_outside_transactions!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text \
       AND NOT (SELECT yes FROM open) RETURNING 1) \
     SELECT (SELECT s FROM bound), (SELECT count(*) FROM gone), (SELECT yes FROM open)"
);

/// The leader's look: its own row dropped (it is no standby), and rows dead for ten minutes
/// (replicas gone for good); then the most preferred live standby that is ready to take the
/// lock, the stay-away and the target of the newest handover asked to a live standby (none if
/// that is this leader, whose own row the snapshot still shows), and whether its own row
/// carried a handover asked to it, and whether a live row of its identity was there (after a
/// term's first look, only another replica of that identity writes one). A leader that took
/// the lead on request withdraws, at its first look, every other request of the key, which
/// raced it and lost: it is done.
///
/// A standby with fast takeover is ready once its session waits for the lock (the server
/// hands the lock to it at the unlock, in milliseconds), or after it has been live for `$4`
/// ms (one of the leader's intervals: every waiting slot may be taken, and its tries get the
/// lock within its interval all the same); one without is ready at once.
const LOOK: &str = concat!(
    no_wait!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 \
       AND (identity = $3::text OR live_until < pg_catalog.statement_timestamp() - interval '10 minutes') \
       RETURNING identity = $3::text AND requested_until > pg_catalog.statement_timestamp() AS asked, \
         identity = $3::text AND live_until > pg_catalog.statement_timestamp() AND heard_at <= pg_catalog.statement_timestamp() AS live_own), \
     done AS (UPDATE pg_elector_candidates SET requested_until = NULL, stay_away_ms = NULL \
       WHERE class = $1::int4 AND object = $2::int4 AND identity <> $3::text \
       AND requested_until IS NOT NULL AND coalesce((SELECT bool_or(asked) FROM gone), false) \
       RETURNING 1) \
     SELECT (SELECT max(c.preference)::text FROM pg_elector_candidates c \
               WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity <> $3::text \
               AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp() \
               AND (NOT c.waits \
                    OR c.live_since <= pg_catalog.statement_timestamp() - $4::int8 * interval '1 millisecond' \
                    OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
                       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                       WHERE l.locktype = 'advisory' AND NOT l.granted \
                       AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid \
                       AND l.objsubid = 2 AND a.application_name = c.identity))), \
            n.stay_away, n.target, \
            coalesce((SELECT bool_or(asked) FROM gone), false), (SELECT s FROM bound), \
            coalesce((SELECT bool_or(live_own) FROM gone), false) \
     FROM (SELECT 1) AS one LEFT JOIN ( \
       SELECT coalesce(r.stay_away_ms, 0) AS stay_away, r.identity AS target \
       FROM pg_elector_candidates r \
       WHERE r.class = $1::int4 AND r.object = $2::int4 \
       AND r.live_until > pg_catalog.statement_timestamp() AND r.heard_at <= pg_catalog.statement_timestamp() \
       AND r.requested_until > pg_catalog.statement_timestamp() \
       ORDER BY r.requested_until DESC, r.identity DESC LIMIT 1) AS n ON n.target <> $3::text"
);

/// A handover asked of `$1, $2`'s leader (identity `$3`): to the live standby named `$4`, or
/// with `$4` NULL to the most preferred live one; valid for a minute, or until that standby
/// leads. Any other standby's request is withdrawn. Answers the target, or no row.
const REQUEST: &str = "WITH target AS (SELECT identity FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity <> $3::text \
       AND live_until > pg_catalog.statement_timestamp() AND heard_at <= pg_catalog.statement_timestamp() AND ($4::text IS NULL OR identity = $4::text) \
       ORDER BY preference DESC, live_until DESC, identity LIMIT 1) \
     UPDATE pg_elector_candidates c SET \
       requested_until = CASE WHEN c.identity = t.identity \
         THEN pg_catalog.statement_timestamp() + interval '1 minute' END, \
       stay_away_ms = CASE WHEN c.identity = t.identity THEN $5::int8 END \
     FROM target t WHERE c.class = $1::int4 AND c.object = $2::int4 \
       AND (c.identity = t.identity OR c.requested_until IS NOT NULL) \
     RETURNING c.identity, c.identity = t.identity";

/// Why a standby could not say it is alive.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("no pool connection within {0:?}")]
    NoConnection(Duration),
    #[error(
        "the candidates table is missing and this role may not create it ({source}); run: {CANDIDATES_DDL}"
    )]
    CannotCreate { source: SessionError },
    #[error("{0}")]
    Session(#[from] SessionError),
    #[error(
        "the pool connection was inside a transaction the application left open; nothing was written, and the connection was closed, which ends that transaction"
    )]
    InTransaction,
}

impl RegisterError {
    /// Only an operator can fix it: an ERROR, not a WARN.
    pub(crate) fn needs_an_operator(&self) -> bool {
        matches!(self, Self::CannotCreate { .. })
    }
}

fn preference_text(preference: u64) -> String {
    preference.to_string()
}

fn millis(d: Duration) -> i64 {
    d.as_millis().try_into().unwrap_or(i64::MAX)
}

/// What a standby's upsert found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Registered {
    /// Another live standby outranks this one.
    pub(crate) outranked: bool,
    /// The `live_until` it wrote, in microseconds (the next upsert's `written_before`).
    pub(crate) written: Option<i64>,
    /// Its row was written by another replica since its last upsert: two live replicas of
    /// the key share its identity.
    pub(crate) duplicate: bool,
}

/// A standby that says it is alive.
pub(crate) struct Candidate<'a> {
    pub(crate) key: LockKey,
    pub(crate) identity: &'a str,
    pub(crate) preference: u64,
    pub(crate) interval: Duration,
    /// It keeps a session waiting for the lock (fast takeover).
    pub(crate) waits: bool,
    /// The `live_until` its last upsert wrote ([`Registered::written`]).
    pub(crate) written_before: Option<i64>,
}

/// A connection of `pool`, waiting at most `bound` for it.
async fn borrow(
    pool: &deadpool_postgres::Pool,
    bound: Duration,
) -> Result<Borrowed, RegisterError> {
    let object = tokio::time::timeout(bound, pool.get())
        .await
        .map_err(|_| RegisterError::NoConnection(bound))?
        .map_err(SessionError::Pool)?;
    Ok(Borrowed::new(object))
}

/// Gives `borrowed` back, unless its statement ran inside a transaction the application left
/// open (`open`): then it is closed, which ends that transaction, and that is an error.
fn give_back_unless_open(borrowed: Borrowed, open: bool) -> Result<(), RegisterError> {
    if open {
        // Dropping `borrowed` closes the connection.
        return Err(RegisterError::InTransaction);
    }
    borrowed.give_back();
    Ok(())
}

/// Upserts this standby's row on a connection of `pool`: live for two intervals. Creates the
/// table when it is missing. Answers whether another live standby outranks this one. Waits at
/// most `bound` for the connection and `bound` for each statement; a connection whose statement
/// did not answer in time is closed, not given back.
pub(crate) async fn register(
    pool: &deadpool_postgres::Pool,
    candidate: &Candidate<'_>,
    bound: Duration,
) -> Result<Registered, RegisterError> {
    let Candidate {
        key,
        identity,
        preference,
        interval,
        waits,
        written_before,
    } = *candidate;
    let borrowed = borrow(pool, bound).await?;
    let client = borrowed.client();
    let preference = preference_text(preference);
    let live = millis(2 * interval);
    let (class, object) = (key.class(), key.object());
    let params: [(&(dyn ToSql + Sync), Type); 7] = [
        (&class, Type::INT4),
        (&object, Type::INT4),
        (&identity, Type::TEXT),
        (&preference, Type::TEXT),
        (&live, Type::INT8),
        (&waits, Type::BOOL),
        (&written_before, Type::INT8),
    ];
    let upsert = || probed(client, client.query_typed(REGISTER, &params));
    let rows = match bounded(bound, upsert()).await {
        Ok(rows) => rows,
        // No table, or one made before a column was added: the DDL makes both right.
        Err(SessionError::Query(e))
            if matches!(
                e.code(),
                Some(&SqlState::UNDEFINED_TABLE | &SqlState::UNDEFINED_COLUMN)
            ) =>
        {
            create(client, bound).await?;
            bounded(bound, upsert()).await?
        }
        Err(e) => return Err(e.into()),
    };
    let (rows, open) = rows;
    let column = |i| rows.first().and_then(|row| row.try_get::<_, bool>(i).ok());
    give_back_unless_open(borrowed, open || column(1).unwrap_or(false))?;
    Ok(Registered {
        outranked: column(0).unwrap_or(false),
        written: rows.first().and_then(|row| row.try_get(2).ok()).flatten(),
        duplicate: column(3).unwrap_or(false),
    })
}

/// Creates the table; a concurrent creation by another replica is no error.
async fn create(client: &tokio_postgres::Client, bound: Duration) -> Result<(), RegisterError> {
    match bounded(bound, client.batch_execute(CANDIDATES_DDL)).await {
        Ok(()) => Ok(()),
        Err(SessionError::Query(e))
            if matches!(
                e.code(),
                Some(&SqlState::UNIQUE_VIOLATION | &SqlState::DUPLICATE_TABLE)
            ) =>
        {
            Ok(())
        }
        Err(SessionError::Query(e)) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            Err(RegisterError::CannotCreate {
                source: SessionError::Query(e),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The parameters of [`defer!`]'s statements: the key, and the identity and preference of the
/// replica that asks.
struct Deferring<'a> {
    class: i32,
    object: i32,
    identity: &'a str,
    preference: String,
}

impl<'a> Deferring<'a> {
    fn new(key: LockKey, identity: &'a str, preference: u64) -> Self {
        Self {
            class: key.class(),
            object: key.object(),
            identity,
            preference: preference_text(preference),
        }
    }

    async fn query(
        &self,
        client: &tokio_postgres::Client,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        client
            .query_typed(
                sql,
                &[
                    (&self.class, Type::INT4),
                    (&self.object, Type::INT4),
                    (&self.identity, Type::TEXT),
                    (&self.preference, Type::TEXT),
                ],
            )
            .await
    }
}

/// What a grant found in the candidates table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Another live standby should have the lock.
    Defer,
    /// The grant stands; its term begins in this standing.
    Keep(Standing),
}

/// Whether a grant of `key` to this replica (`identity`, `preference`) should go to another
/// live standby instead, asked on the session that was granted it, in a transaction of its
/// own whose lock waits are bounded ([`waits_bounded`]). Keeps the grant while the table does
/// not exist.
pub(crate) async fn claim(
    client: &tokio_postgres::Client,
    key: LockKey,
    identity: &str,
    preference: u64,
    interval: Duration,
) -> Result<Claim, tokio_postgres::Error> {
    let keep = |on_request| {
        Claim::Keep(Standing {
            on_request,
            ..Standing::default()
        })
    };
    if !table_exists(client).await? {
        return Ok(keep(false));
    }
    let asking = Deferring::new(key, identity, preference);
    let rows = waits_bounded(client, interval, asking.query(client, CLAIM)).await?;
    let Some(row) = rows.first() else {
        return Ok(keep(false));
    };
    Ok(match row.try_get(0)? {
        true => Claim::Defer,
        false => keep(row.try_get(1)?),
    })
}

/// `query` on `client` in a transaction of its own whose lock waits are bounded at half an
/// interval (`lock_timeout`, for that transaction only): a table locked by an operator (an
/// `ALTER TABLE` queued behind a long transaction) then fails the statement instead of holding
/// the session past its check. A grant's session may still be a transaction pooler's, shared
/// with other clients (its first check finds out), so nothing is set for the session. The
/// three statements are sent at once: one round trip.
async fn waits_bounded<T>(
    client: &tokio_postgres::Client,
    interval: Duration,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
    let ms = (millis(interval) / 2).max(1);
    let begin = format!("BEGIN; SET LOCAL lock_timeout = {ms}");
    // `join!` polls them first in this order, and each sends its statement when first polled.
    let (begun, answered, ended) = tokio::join!(
        client.batch_execute(&begin),
        query,
        client.batch_execute("COMMIT")
    );
    begun?;
    let answer = answered?;
    ended?;
    Ok(answer)
}

/// Bounds every lock wait of the leader's lock session at half an interval (`lock_timeout`,
/// for the session), before its first look at the candidates table: a table locked by an
/// operator (an `ALTER TABLE` queued behind a long transaction) then fails the look, which is
/// logged, instead of holding the session past its check. Only after a check has proved the
/// session this elector's alone (no transaction pooler shares it), so that no other client's
/// session gets the setting. The session's other statements wait for no lock, or set their
/// own bound (the fencing bump).
pub(crate) async fn bound_lock_waits(
    client: &tokio_postgres::Client,
    interval: Duration,
) -> Result<(), tokio_postgres::Error> {
    let ms = (millis(interval) / 2).max(1).to_string();
    client
        .query_typed(
            "SELECT pg_catalog.set_config('lock_timeout', $1::text, false)",
            &[(&ms, Type::TEXT)],
        )
        .await
        .map(drop)
}

/// A leader's own row, dropped on its lock session before it unlocks: the row it wrote as a
/// standby stays until its term's first look, and a term that ends before (a shutdown, a
/// resign, a grant given back) would otherwise leave it live for two intervals, during which
/// every other standby leaves the free lock to a replica that no longer wants it.
const DROP_OWN_ROW: &str = concat!(
    no_wait!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text RETURNING 1) \
     SELECT (SELECT s FROM bound), (SELECT count(*) FROM gone)"
);

/// [`DROP_OWN_ROW`] on a lock session, once the table exists; an error is only logged (the
/// row then counts for two more intervals at most).
pub(crate) async fn drop_own_row(client: &tokio_postgres::Client, key: LockKey, identity: &str) {
    let dropped = async {
        if !table_exists(client).await? {
            return Ok(());
        }
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&key.class(), Type::INT4),
            (&key.object(), Type::INT4),
            (&identity, Type::TEXT),
        ];
        client.query_typed(DROP_OWN_ROW, &params).await.map(drop)
    };
    if let Err(e) = dropped.await {
        tracing::debug!(key = %key, error = %crate::error::chain(&e), "cannot drop this replica's row before it unlocks; it counts for two more intervals at most");
    }
}

/// Whether the candidates table exists, on a server not in recovery (a read replica's lock
/// grants nothing, and its try goes on to say so).
async fn table_exists(client: &tokio_postgres::Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_typed(
            &format!("SELECT {EXISTS} AND NOT pg_catalog.pg_is_in_recovery()"),
            &[],
        )
        .await?
        .first()
        .is_some_and(|row| row.get::<_, bool>(0)))
}

/// What a standby's try asks once the lock is found free, before it takes it: whether a live
/// standby should have it instead. A standby that took the lock only to give it back would
/// refuse, meanwhile, the try of the one it gives it to, which then waits a whole interval.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gate<'a> {
    preference: u64,
    identity: &'a str,
}

impl<'a> Gate<'a> {
    /// The gate of a replica of `preference` (`None`: no gate, as for a group of shards).
    pub(crate) fn new(preference: Option<u64>, identity: &'a str) -> Option<Self> {
        preference.map(|preference| Self {
            preference,
            identity,
        })
    }

    /// What [`DEFER`] answers on `client` for `key`: all false while the table does not
    /// exist, and when the server refuses to read it (a role without `SELECT` on a table
    /// another service created): said at WARN, and the try goes on as without preferences,
    /// rather than never leading.
    pub(crate) async fn defers(
        &self,
        client: &tokio_postgres::Client,
        key: LockKey,
    ) -> Result<Deferred, tokio_postgres::Error> {
        match self.asks(client, key).await {
            Err(e) if e.as_db_error().is_some() => {
                tracing::warn!(key = %key, error = %crate::error::chain(&e), "cannot read the candidates table; the try goes on without preferences");
                Ok(Deferred::default())
            }
            asked => asked,
        }
    }

    async fn asks(
        &self,
        client: &tokio_postgres::Client,
        key: LockKey,
    ) -> Result<Deferred, tokio_postgres::Error> {
        if !table_exists(client).await? {
            return Ok(Deferred::default());
        }
        let rows = Deferring::new(key, self.identity, self.preference)
            .query(client, DEFER)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Deferred::default());
        };
        Ok(Deferred {
            defers: row.try_get(0)?,
            hold_outlasts: row.try_get(1)?,
            open: row.try_get(2)?,
        })
    }
}

/// What [`DEFER`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deferred {
    /// The free lock is left to another live standby.
    pub(crate) defers: bool,
    /// The session still holds the question's shared hold: a transaction the application
    /// left open, which only closing the connection ends.
    pub(crate) hold_outlasts: bool,
    /// It ran inside a transaction [`PROBE`] marked.
    pub(crate) open: bool,
}

/// Whether a live standby outranks this one (`gate`), read on a connection of `pool`: for a
/// standby without a preference that holds a waiting slot, which it gives up if so. Bounded
/// as [`register`].
pub(crate) async fn outranked(
    pool: &deadpool_postgres::Pool,
    gate: Gate<'_>,
    key: LockKey,
    bound: Duration,
) -> Result<bool, RegisterError> {
    let borrowed = borrow(pool, bound).await?;
    let client = borrowed.client();
    let (found, open) = bounded(bound, probed(client, gate.defers(client, key))).await?;
    give_back_unless_open(borrowed, open || found.open)?;
    Ok(found.defers)
}

/// What a replica that handed over on request sees of the target ([`StayAway`]): whether a
/// session named as the target holds the key's lock in this database, and whether the
/// target's row says it is a live standby.
const TARGET: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
       WHERE l.locktype = 'advisory' AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid \
       AND l.objsubid = 2 AND l.mode = 'ExclusiveLock' AND l.granted \
       AND a.application_name = $3::text \
       AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                         WHERE datname = pg_catalog.current_database())), \
     EXISTS (SELECT 1 FROM pg_elector_candidates c \
       WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity = $3::text \
       AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp()), ",
    open!()
);

/// [`TARGET`], on a connection of `pool`, bounded as [`register`].
pub(crate) async fn target_seen(
    pool: &deadpool_postgres::Pool,
    key: LockKey,
    target: &str,
    bound: Duration,
) -> Result<TargetSeen, RegisterError> {
    let borrowed = borrow(pool, bound).await?;
    let client = borrowed.client();
    let (class, object) = (key.class(), key.object());
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&class, Type::INT4),
        (&object, Type::INT4),
        (&target, Type::TEXT),
    ];
    let (rows, open) = bounded(bound, probed(client, client.query_typed(TARGET, &params))).await?;
    let row = rows.first().ok_or(SessionError::Unexpected(None))?;
    let column = |i| row.try_get::<_, bool>(i).map_err(SessionError::Query);
    let seen = TargetSeen {
        leads: column(0)?,
        live: column(1)?,
    };
    give_back_unless_open(borrowed, open || column(2)?)?;
    Ok(seen)
}

/// Drops this standby's row as it stops, on a connection of `pool`, bounded by `bound` (the
/// row would otherwise count for two more intervals). A failure is only logged.
pub(crate) async fn withdraw(
    pool: &deadpool_postgres::Pool,
    key: LockKey,
    identity: &str,
    bound: Duration,
) {
    let withdrawn = tokio::time::timeout(bound, async {
        let object = pool.get().await.map_err(|e| e.to_string())?;
        let borrowed = Borrowed::new(object);
        let client = borrowed.client();
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&key.class(), Type::INT4),
            (&key.object(), Type::INT4),
            (&identity, Type::TEXT),
        ];
        let (rows, open) = probed(client, client.query_typed(WITHDRAW, &params))
            .await
            .map_err(|e| crate::error::chain(&e))?;
        let marked = rows.first().and_then(|row| row.try_get(2).ok());
        give_back_unless_open(borrowed, open || marked.unwrap_or(false)).map_err(|e| e.to_string())
    })
    .await;
    match withdrawn {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(key = %key, error = %e, "cannot drop this standby's row from the candidates table; it counts for two more intervals")
        }
        Err(_) => {
            tracing::warn!(key = %key, ?bound, "dropping this standby's row from the candidates table got no answer; it counts for two more intervals")
        }
    }
}

/// The leader's look at the candidates, on its lock session (see [`LOOK`]); `interval` is the
/// leader's.
pub(crate) async fn look(
    client: &tokio_postgres::Client,
    key: LockKey,
    identity: &str,
    interval: Duration,
) -> Result<Look, tokio_postgres::Error> {
    let ready_after = millis(interval);
    let rows = client
        .query_typed(
            LOOK,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&identity, Type::TEXT),
                (&ready_after, Type::INT8),
            ],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(Look::default());
    };
    let best: Option<String> = row.try_get(0)?;
    let stay_away: Option<i64> = row.try_get(1)?;
    let target: Option<String> = row.try_get(2)?;
    Ok(Look {
        own_row_live: row.try_get(5)?,
        asked_for_me: row.try_get(3)?,
        // A preference that does not parse (written by hand) counts as none.
        best: best.and_then(|b| b.parse().ok()),
        requested: stay_away.zip(target).map(|(ms, target)| Request {
            target,
            stay_away: Duration::from_millis(ms.max(0).unsigned_abs()),
        }),
    })
}

/// Who a handover asked with [`request_handover`] goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandoverTo {
    /// The live standby with this identity (see
    /// [`ElectorBuilder::identity`](crate::ElectorBuilder::identity)).
    Identity(String),
    /// The most preferred live standby.
    MostPreferred,
}

/// Asks the leader of `key` to hand over to another replica, from any process connected to the
/// database (for maintenance on the leader's node, say). The leader sees the request at its
/// next check, ends its term gracefully (its work drains, up to its drain timeout), unlocks,
/// and stays a standby for `stay_away`; meanwhile the other standbys leave the lock to the
/// target. Returns the target's identity.
///
/// Only a *live* standby can be named: a replica built with a
/// [`preference`](crate::ElectorBuilder::preference) (any, 0 included) that tried the lock
/// within its last two check intervals. The request stays valid for a minute, or until the
/// target's term has begun and passed its first check; if the target stops trying meanwhile,
/// the other standbys stop waiting for it within two of its intervals. The old leader stays
/// away only while the target may still lead: once the target is neither live nor leading,
/// or has led and no longer does, it stands by again.
///
/// # Errors
///
/// [`Error::NoLeader`] when no replica leads `key`; [`Error::NoSuchStandby`] when no live
/// standby matches (then nothing changed); [`Error::HandoverQuery`] when a query fails.
///
/// ```no_run
/// # async fn example(client: &tokio_postgres::Client) -> Result<(), pg_elector::Error> {
/// use std::time::Duration;
/// use pg_elector::{HandoverTo, LockKey, request_handover};
///
/// let key = LockKey::from_name("billing/sweep");
/// let to = request_handover(client, key, HandoverTo::MostPreferred, Duration::from_secs(300)).await?;
/// println!("the lead goes to {to}");
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// A dropped call may or may not have asked. It puts no timeout on the queries.
pub async fn request_handover(
    client: &tokio_postgres::Client,
    key: LockKey,
    to: HandoverTo,
    stay_away: Duration,
) -> Result<String, Error> {
    let leader = super::leader::leader_of(client, key, None)
        .await
        .map_err(|e| match e {
            Error::CurrentLeaderQuery(e) => Error::HandoverQuery(e),
            other => other,
        })?
        .ok_or(Error::NoLeader)?;
    let named = match &to {
        HandoverTo::Identity(name) => Some(name.as_str()),
        HandoverTo::MostPreferred => None,
    };
    let stay_away = millis(stay_away);
    let rows = client
        .query_typed(
            REQUEST,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&leader.identity, Type::TEXT),
                (&named, Type::TEXT),
                (&stay_away, Type::INT8),
            ],
        )
        .await;
    let no_such = || Error::NoSuchStandby {
        identity: named.map(str::to_owned),
    };
    let rows = match rows {
        Ok(rows) => rows,
        // No table: nobody ever registered.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => return Err(no_such()),
        Err(e) => return Err(Error::HandoverQuery(e)),
    };
    rows.iter()
        .find(|row| row.get::<_, bool>(1))
        .map(|row| row.get::<_, String>(0))
        .ok_or_else(no_such)
}
