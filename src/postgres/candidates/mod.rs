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
use crate::LockKey;
use crate::pooled::Borrowed;

mod borrowed;
mod gate;
mod request;
pub(crate) mod rule;
mod sql;

use crate::pooled::probed;
use borrowed::{borrow, give_back_unless_open};
pub(crate) use gate::{Deferred, Gate, outranked};
pub use request::{HandoverTo, request_handover, request_handover_in};
use sql::*;
pub(crate) use sql::{CandidatesTable, EXISTS};

pub(crate) use rule::{
    Backoff, Look, Request, SHORT_TERM_INTERVALS, Standing, StayAway, TargetSeen, Yield,
};

/// Why a standby could not say it is alive.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("no pool connection within {0:?}")]
    NoConnection(Duration),
    #[error(
        "the candidates table is missing, or made by an earlier version and missing a column, and this role may not create or alter it ({source}); run: {ddl}"
    )]
    CannotCreate { source: SessionError, ddl: String },
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
    pub(crate) table: &'a CandidatesTable,
    pub(crate) key: LockKey,
    pub(crate) identity: &'a str,
    pub(crate) preference: u64,
    pub(crate) interval: Duration,
    /// It keeps a session waiting for the lock (fast takeover).
    pub(crate) waits: bool,
    /// The `live_until` its last upsert wrote ([`Registered::written`]).
    pub(crate) written_before: Option<i64>,
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
        table,
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
    let register = table.sql(REGISTER);
    let upsert = || probed(client, client.query_typed(&register, &params));
    let rows = match bounded(bound, upsert()).await {
        Ok(rows) => rows,
        // No table, or one made before a column was added: the DDL makes both right.
        Err(SessionError::Query(e))
            if matches!(
                e.code(),
                Some(&SqlState::UNDEFINED_TABLE | &SqlState::UNDEFINED_COLUMN)
            ) =>
        {
            create(client, table, bound).await?;
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
async fn create(
    client: &tokio_postgres::Client,
    table: &CandidatesTable,
    bound: Duration,
) -> Result<(), RegisterError> {
    match bounded(bound, client.batch_execute(&table.ddl())).await {
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
                ddl: table.ddl().into_owned(),
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
    table: &CandidatesTable,
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
    if !table_exists(client, table).await? {
        return Ok(keep(false));
    }
    let asking = Deferring::new(key, identity, preference);
    let rows = waits_bounded(client, interval, asking.query(client, &table.sql(CLAIM))).await?;
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
    let ms = (millis(interval) / 2).max(1).unsigned_abs();
    waits_bounded_ms(client, ms, query).await
}

/// [`waits_bounded`], the lock waits bounded at `ms` milliseconds.
async fn waits_bounded_ms<T>(
    client: &tokio_postgres::Client,
    ms: u64,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, tokio_postgres::Error> {
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

/// How long [`drop_own_row`]'s statement may wait for a lock of the table (an operator's
/// `ALTER TABLE` queued behind a long transaction): the unlock after it must not wait.
const DROP_LOCK_WAIT_MS: u64 = 100;

/// [`DROP_OWN_ROW`] on a lock session, in a transaction of its own whose lock waits are bounded
/// ([`DROP_LOCK_WAIT_MS`]), in one round trip; an error (no table yet, a lock not granted in
/// time) is only logged: the row then counts for two more intervals at most.
pub(crate) async fn drop_own_row(
    client: &tokio_postgres::Client,
    table: &CandidatesTable,
    key: LockKey,
    identity: &str,
) {
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&key.class(), Type::INT4),
        (&key.object(), Type::INT4),
        (&identity, Type::TEXT),
    ];
    let drop_own_row = table.sql(DROP_OWN_ROW);
    let dropping = client.query_typed(&drop_own_row, &params);
    if let Err(e) = waits_bounded_ms(client, DROP_LOCK_WAIT_MS, dropping).await {
        tracing::debug!(key = %key, error = %crate::error::chain(&e), "cannot drop this replica's row before it unlocks; it counts for two more intervals at most");
    }
}

/// Whether the candidates table exists, on a server not in recovery (a read replica's lock
/// grants nothing, and its try goes on to say so).
async fn table_exists(
    client: &tokio_postgres::Client,
    table: &CandidatesTable,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_typed(
            &format!(
                "SELECT {} AND NOT pg_catalog.pg_is_in_recovery()",
                table.sql(EXISTS)
            ),
            &[],
        )
        .await?
        .first()
        .is_some_and(|row| row.get::<_, bool>(0)))
}

/// [`TARGET`], on a connection of `pool`, bounded as [`register`].
pub(crate) async fn target_seen(
    pool: &deadpool_postgres::Pool,
    table: &CandidatesTable,
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
    let target = table.sql(TARGET);
    let (rows, open) = bounded(bound, probed(client, client.query_typed(&target, &params))).await?;
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
/// row would otherwise count for two more intervals). A connection the application left
/// inside a transaction is closed and another borrowed (a few times at most). A failure is
/// only logged.
pub(crate) async fn withdraw(
    pool: &deadpool_postgres::Pool,
    table: &CandidatesTable,
    key: LockKey,
    identity: &str,
    bound: Duration,
) {
    let withdrawn = tokio::time::timeout(bound, async {
        let mut tries = 1;
        loop {
            match withdraw_once(pool, table, key, identity).await {
                Err(RegisterError::InTransaction) if tries < WITHDRAW_TRIES => tries += 1,
                done => return done,
            }
        }
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

/// How many connections [`withdraw`] borrows at most: each one left inside a transaction is
/// closed, and the last such one makes it give up.
const WITHDRAW_TRIES: u32 = 3;

/// [`WITHDRAW`] once, on a connection of `pool` given back only outside a transaction.
async fn withdraw_once(
    pool: &deadpool_postgres::Pool,
    table: &CandidatesTable,
    key: LockKey,
    identity: &str,
) -> Result<(), RegisterError> {
    let object = pool.get().await.map_err(SessionError::Pool)?;
    let borrowed = Borrowed::new(object);
    let client = borrowed.client();
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&key.class(), Type::INT4),
        (&key.object(), Type::INT4),
        (&identity, Type::TEXT),
    ];
    let (rows, open) = probed(client, client.query_typed(&table.sql(WITHDRAW), &params))
        .await
        .map_err(SessionError::Query)?;
    let marked = rows.first().and_then(|row| row.try_get(2).ok());
    give_back_unless_open(borrowed, open || marked.unwrap_or(false))
}

/// The leader's look at the candidates, on its lock session (see [`LOOK`]); `interval` is the
/// leader's.
pub(crate) async fn look(
    client: &tokio_postgres::Client,
    table: &CandidatesTable,
    key: LockKey,
    identity: &str,
    interval: Duration,
) -> Result<Look, tokio_postgres::Error> {
    let ready_after = millis(interval);
    let rows = client
        .query_typed(
            &table.sql(LOOK),
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
