//! A handover asked from outside the leader's process.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::millis;
use super::sql::{CandidatesTable, REQUEST};
use crate::pooled::{NotBorrowed, outside_transactions};
use crate::{HandoverError, LockKey};

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
/// within its last two check intervals. Name it by its identity as
/// [`current_leader`](crate::current_leader) and `pg_stat_activity.application_name` show it
/// (a replica with a preference has an identity PostgreSQL keeps whole). The request stays
/// valid for a minute, or until the target's term has begun and passed its first check; if
/// the target stops trying meanwhile, the other standbys stop waiting for it within two of its
/// intervals. The old leader stays away only while the target may still lead: once the target
/// is neither live nor leading, or has led and no longer does, it stands by again.
///
/// The call borrows one connection of `pool` outside any transaction (a connection the
/// application handed back inside one is closed, which ends it, and another borrowed), and
/// takes at most `bound` in all (a few milliseconds on a healthy server; a second or more
/// leaves room for a loaded one). A connection whose answer did not come in time is closed,
/// not given back.
///
/// # Errors
///
/// [`HandoverError::NoLeader`] when no replica leads `key`; [`HandoverError::NoSuchStandby`]
/// when no live standby matches (then nothing changed); [`HandoverError::Pool`] when the pool
/// cannot connect; [`HandoverError::Timeout`] when the connection or the answer did not come
/// within `bound` (the request may or may not have been made); [`HandoverError::Query`] when a
/// query fails. Each converts into [`Error::Handover`](crate::Error::Handover) with `?`.
///
/// ```no_run
/// # async fn example(pool: &deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
/// use std::time::Duration;
/// use pg_elector::{HandoverTo, LockKey, request_handover};
///
/// let key = LockKey::from_name("billing/sweep");
/// let stay_away = Duration::from_secs(300);
/// let to = request_handover(pool, key, HandoverTo::MostPreferred, stay_away, Duration::from_secs(5)).await?;
/// println!("the lead goes to {to}");
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// A dropped call may or may not have asked; its connection is closed.
pub async fn request_handover(
    pool: &deadpool_postgres::Pool,
    key: LockKey,
    to: HandoverTo,
    stay_away: Duration,
    bound: Duration,
) -> Result<String, HandoverError> {
    let table = CandidatesTable::default();
    asked_of(pool, &table, key, to, stay_away, bound).await
}

/// [`request_handover`] for replicas built with a
/// [`candidates_table`](crate::ElectorBuilder::candidates_table) of their own: `table` in
/// `schema` (the `search_path`'s first when `None`), named as there.
///
/// # Errors
///
/// As [`request_handover`]'s, and [`HandoverError::InvalidTable`] for an empty or overlong
/// name (nothing is asked then).
///
/// ```no_run
/// # async fn example(pool: &deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
/// use std::time::Duration;
/// use pg_elector::{HandoverTo, LockKey, request_handover_in};
///
/// let key = LockKey::from_name("billing/sweep");
/// let to = HandoverTo::MostPreferred;
/// let (stay_away, bound) = (Duration::from_secs(300), Duration::from_secs(5));
/// request_handover_in(pool, Some("ops"), "leader_candidates", key, to, stay_away, bound).await?;
/// # Ok(()) }
/// ```
pub async fn request_handover_in(
    pool: &deadpool_postgres::Pool,
    schema: Option<&str>,
    table: &str,
    key: LockKey,
    to: HandoverTo,
    stay_away: Duration,
    bound: Duration,
) -> Result<String, HandoverError> {
    let table =
        CandidatesTable::new(schema, table).map_err(|name| HandoverError::InvalidTable { name })?;
    asked_of(pool, &table, key, to, stay_away, bound).await
}

/// [`request_handover_in`]'s work, on `table`.
async fn asked_of(
    pool: &deadpool_postgres::Pool,
    table: &CandidatesTable,
    key: LockKey,
    to: HandoverTo,
    stay_away: Duration,
    bound: Duration,
) -> Result<String, HandoverError> {
    let until = tokio::time::Instant::now() + bound;
    let borrowed = outside_transactions(pool, until, until)
        .await
        .map_err(|e| match e {
            NotBorrowed::PoolTimeout | NotBorrowed::Timeout => HandoverError::Timeout(bound),
            NotBorrowed::Pool(e) => HandoverError::Pool(Box::new(e)),
            NotBorrowed::Query(e) => HandoverError::Query(e),
        })?;
    // A connection whose answer did not come in time, or that failed, is closed.
    let asked = tokio::time::timeout_at(until, ask(borrowed.client(), table, key, &to, stay_away))
        .await
        .map_err(|_| HandoverError::Timeout(bound))??;
    borrowed.give_back();
    Ok(asked)
}

/// [`request_handover`]'s two queries on `client`, a pool connection outside any transaction:
/// who leads, then the request.
async fn ask(
    client: &tokio_postgres::Client,
    table: &CandidatesTable,
    key: LockKey,
    to: &HandoverTo,
    stay_away: Duration,
) -> Result<String, HandoverError> {
    let leader = match crate::postgres::leader::leader_of(client, key, None).await {
        Ok(Some(leader)) => leader,
        Ok(None) => return Err(HandoverError::NoLeader),
        Err(e) => return Err(HandoverError::Query(e)),
    };
    let named = match to {
        HandoverTo::Identity(name) => Some(name.as_str()),
        HandoverTo::MostPreferred => None,
    };
    let stay_away = millis(stay_away);
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&key.class(), Type::INT4),
        (&key.object(), Type::INT4),
        (&leader.identity, Type::TEXT),
        (&named, Type::TEXT),
        (&stay_away, Type::INT8),
    ];
    let no_such = || HandoverError::NoSuchStandby {
        identity: named.map(str::to_owned),
    };
    let rows = match client.query_typed(&table.sql(REQUEST), &params).await {
        Ok(rows) => rows,
        // No table: nobody ever registered.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => return Err(no_such()),
        Err(e) => return Err(HandoverError::Query(e)),
    };
    rows.iter()
        .find(|row| row.get::<_, bool>(1))
        .map(|row| row.get::<_, String>(0))
        .ok_or_else(no_such)
}
