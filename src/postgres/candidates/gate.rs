//! The gate of a try that found the lock free: whether a live standby should have it instead.

use std::time::Duration;

use super::borrowed::{borrow, give_back_unless_open};
use super::sql::DEFER;
use super::{CandidatesTable, Deferring, RegisterError, table_exists};
use crate::LockKey;
use crate::pooled::probed;
use crate::postgres::session_error::bounded;

/// What a standby's try asks once the lock is found free, before it takes it: whether a live
/// standby should have it instead. A standby that took the lock only to give it back would
/// refuse, meanwhile, the try of the one it gives it to, which then waits a whole interval.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gate<'a> {
    preference: u64,
    identity: &'a str,
    table: &'a CandidatesTable,
}

impl<'a> Gate<'a> {
    /// The gate of a replica of `preference` (`None`: no gate, as for a group of shards).
    pub(crate) fn new(
        preference: Option<u64>,
        identity: &'a str,
        table: &'a CandidatesTable,
    ) -> Option<Self> {
        preference.map(|preference| Self {
            preference,
            identity,
            table,
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
        if !table_exists(client, self.table).await? {
            return Ok(Deferred::default());
        }
        let rows = Deferring::new(key, self.identity, self.preference)
            .query(client, &self.table.sql(DEFER))
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
    /// It ran inside a transaction [`PROBE`](crate::pooled::PROBE) marked.
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
