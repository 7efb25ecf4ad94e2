//! Who leads now, as the server sees it: the backend that holds the lock, and its epoch row.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use tokio_postgres::types::Type;

use crate::fence::{DEFAULT_TABLE, FenceTable};
use crate::pooled::Borrowed;
use crate::{CurrentLeaderError, Error, LockKey};

/// Who leads a key, as the server sees it; from [`current_leader`] or
/// [`Elector::current_leader`](crate::Elector::current_leader).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The backend process that holds the lock (the leader's lock session).
    pub pid: i32,
    /// The leader's identity: its lock session's `application_name` (see
    /// [`ElectorBuilder::identity`](crate::ElectorBuilder::identity)).
    pub identity: String,
    /// The leader's address as the server sees it; `None` over a Unix socket.
    pub client_addr: Option<IpAddr>,
    /// When the current term began, from the epoch row; `None` without fencing.
    pub since: Option<SystemTime>,
    /// The epoch of the latest term begun, from the epoch row; `None` without fencing.
    pub epoch: Option<u64>,
}

const HOLDER: &str = "SELECT l.pid, coalesce(a.application_name, ''), pg_catalog.host(a.client_addr) \
     FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
     AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                         WHERE datname = pg_catalog.current_database())";

/// Who leads `key` in the database `client` is connected to, or `None` when no replica holds
/// the lock at this moment. Reads `pg_locks` and `pg_stat_activity`, and the epoch row of the
/// default fencing table (`pg_elector_epochs`) when it exists; for another table use
/// [`Elector::current_leader`](crate::Elector::current_leader).
///
/// Any role sees the leader's pid and `application_name` (its identity). Its `client_addr`
/// needs the `pg_read_all_stats` role (or the leader's own user); without it the address reads
/// `None`. Once the epoch table exists, the role needs `SELECT` on it.
///
/// # Errors
///
/// [`CurrentLeaderError::Query`](crate::CurrentLeaderError::Query) (in [`Error::CurrentLeader`]) when a query fails, for example a role without `SELECT` on an existing
/// epoch table.
///
/// # Cancel safety
///
/// Cancel safe: it only reads. It puts no timeout on the queries: bound it with
/// `tokio::time::timeout` if the server may not answer.
pub async fn current_leader(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<Option<LeaderInfo>, Error> {
    let table = FenceTable::new(None, DEFAULT_TABLE)?;
    let exists: bool = client
        .query_typed(
            "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
            &[(&table.name(), Type::TEXT)],
        )
        .await
        .map_err(CurrentLeaderError::Query)?
        .first()
        .is_some_and(|row| row.get(0));
    let found = leader_of(client, key, exists.then_some(&*table)).await;
    Ok(found.map_err(CurrentLeaderError::Query)?)
}

/// [`leader_of`] on a connection of `pool`, waiting at most `bound` for the connection and
/// `bound` for the answer. A connection whose answer did not come in time is closed, not given
/// back to the pool: the query may still be on it.
pub(crate) async fn leader_via(
    pool: &deadpool_postgres::Pool,
    key: LockKey,
    table: Option<&FenceTable>,
    bound: Duration,
) -> Result<Option<LeaderInfo>, CurrentLeaderError> {
    let object = tokio::time::timeout(bound, pool.get())
        .await
        .map_err(|_| CurrentLeaderError::PoolTimeout(bound))?
        .map_err(|e| CurrentLeaderError::Pool(Box::new(e)))?;
    let borrowed = Borrowed::new(object);
    let found = tokio::time::timeout(bound, leader_of(borrowed.client(), key, table))
        .await
        .map_err(|_| CurrentLeaderError::Timeout(bound))?
        .map_err(CurrentLeaderError::Query)?;
    borrowed.give_back();
    Ok(found)
}

/// As [`current_leader`], with the epoch read from `table`, if any.
pub(crate) async fn leader_of(
    client: &tokio_postgres::Client,
    key: LockKey,
    table: Option<&FenceTable>,
) -> Result<Option<LeaderInfo>, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            HOLDER,
            &[
                (&key.class_oid(), Type::OID),
                (&key.object_oid(), Type::OID),
            ],
        )
        .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let addr: Option<String> = row.try_get(2)?;
    let mut info = LeaderInfo {
        pid: row.try_get(0)?,
        identity: row.try_get(1)?,
        client_addr: addr.and_then(|a| a.parse().ok()),
        since: None,
        epoch: None,
    };
    let Some(table) = table else {
        return Ok(Some(info));
    };
    if let Some((epoch, since)) = table.read(client, key).await? {
        info.epoch = Some(epoch);
        info.since = Some(since);
    }
    Ok(Some(info))
}
