//! Fencing epochs: a row per key whose epoch every new term bumps in the lock session before
//! the term starts, and the check a write makes inside its own transaction.
//!
//! The check locks the row `FOR SHARE`, and the bump updates it, so the two exclude each
//! other: a new term's bump waits for every fenced transaction of the old term to end, and a
//! fenced transaction that starts after the bump sees the new epoch. Fenced writes of two terms
//! therefore never interleave.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::LockKey;
use crate::error::{Error, Fenced};
use crate::ident;

/// The server's clock in whole milliseconds since 1970: the least epoch a bump hands out.
const CLOCK_MS: &str =
    "pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::int8";

/// The table's default name.
pub(crate) const DEFAULT_TABLE: &str = "pg_elector_epochs";

/// The epoch table: where it is, and its statements with the name quoted as an identifier.
#[derive(Debug)]
pub(crate) struct FenceTable {
    /// `"schema"."table"` or `"table"`, quoted.
    quoted: String,
    bump: String,
    bump_free: String,
    check: String,
    read: String,
    ddl: String,
}

impl FenceTable {
    /// The table `table` in `schema` (or the first schema of the `search_path`).
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Result<Arc<Self>, Error> {
        let quoted = ident::qualified(schema, table)
            .map_err(|name| crate::BuildError::InvalidFencingTable { name })?;
        let check = format!(
            "SELECT epoch FROM {quoted} WHERE class = $1::int4 AND object = $2::int4 FOR SHARE"
        );
        let read = format!(
            "SELECT epoch, since FROM {quoted} WHERE class = $1::int4 AND object = $2::int4"
        );
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (\
             class int4 NOT NULL, object int4 NOT NULL, epoch bigint NOT NULL, \
             holder text NOT NULL, since timestamptz NOT NULL, PRIMARY KEY (class, object))"
        );
        Ok(Arc::new(Self {
            bump: bump_sql(&quoted),
            bump_free: bump_free_sql(&quoted),
            quoted,
            check,
            read,
            ddl,
        }))
    }

    /// The statement that creates the table, for a migration or an administrator.
    pub(crate) fn ddl(&self) -> &str {
        &self.ddl
    }

    /// The quoted name.
    pub(crate) fn name(&self) -> &str {
        &self.quoted
    }

    /// Bumps `key`'s epoch on `client` (the lock session) and returns the new one; creates the
    /// table first when it is missing. The row lock is waited for at most `wait`.
    pub(crate) async fn bump(
        &self,
        client: &tokio_postgres::Client,
        key: LockKey,
        holder: &str,
        wait: Duration,
    ) -> Result<u64, BumpError> {
        self.creating(client, || self.bump_once(client, key, holder, wait))
            .await
    }

    /// Bumps the epochs of the keys (`class`, each of `objects`) in one statement on `client`
    /// (the lock session), skipping each key whose row a fenced transaction holds; returns
    /// the bumped ones (object, new epoch). Creates the table first when it is missing.
    pub(crate) async fn bump_free(
        &self,
        client: &tokio_postgres::Client,
        class: i32,
        objects: &[i32],
        holder: &str,
    ) -> Result<Vec<(i32, u64)>, BumpError> {
        self.creating(client, || async {
            let rows = client
                .query_typed(
                    &self.bump_free,
                    &[
                        (&class, Type::INT4),
                        (&objects, Type::INT4_ARRAY),
                        (&holder, Type::TEXT),
                    ],
                )
                .await
                .map_err(BumpError::Query)?;
            rows.iter()
                .map(|row| {
                    let epoch: i64 = row.try_get(1).map_err(BumpError::Query)?;
                    Ok((row.try_get(0).map_err(BumpError::Query)?, epoch as u64))
                })
                .collect()
        })
        .await
    }

    /// Runs `once`, and again after creating the table when it was missing (its schema too:
    /// then the create fails, naming the statement to run once the schema is made).
    async fn creating<T, Fut>(
        &self,
        client: &tokio_postgres::Client,
        once: impl Fn() -> Fut,
    ) -> Result<T, BumpError>
    where
        Fut: Future<Output = Result<T, BumpError>>,
    {
        match once().await {
            Err(BumpError::Query(e))
                if e.code() == Some(&SqlState::UNDEFINED_TABLE)
                    || e.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
            {
                self.create(client).await?;
                once().await
            }
            other => other,
        }
    }

    async fn bump_once(
        &self,
        client: &tokio_postgres::Client,
        key: LockKey,
        holder: &str,
        wait: Duration,
    ) -> Result<u64, BumpError> {
        let wait_ms = wait.as_millis().max(1).to_string();
        let rows = client
            .query_typed(
                &self.bump,
                &[
                    (&key.class(), Type::INT4),
                    (&key.object(), Type::INT4),
                    (&holder, Type::TEXT),
                    (&wait_ms, Type::TEXT),
                ],
            )
            .await
            .map_err(|e| match e.code() {
                Some(&SqlState::LOCK_NOT_AVAILABLE) => BumpError::RowBusy(wait),
                _ => BumpError::Query(e),
            })?;
        let epoch: i64 = rows
            .first()
            .ok_or(BumpError::NoRow)?
            .try_get(0)
            .map_err(BumpError::Query)?;
        Ok(u64::try_from(epoch).unwrap_or(0))
    }

    async fn create(&self, client: &tokio_postgres::Client) -> Result<(), BumpError> {
        match client.batch_execute(&self.ddl).await {
            Ok(()) => {
                tracing::info!(table = %self.quoted, "created the fencing epoch table");
                Ok(())
            }
            // Two replicas creating it at once: the other one won.
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(()),
            // A role that may not create it, or a schema that does not exist: nothing this
            // elector can do; an administrator must.
            Err(e)
                if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
                    || e.code() == Some(&SqlState::INVALID_SCHEMA_NAME) =>
            {
                Err(BumpError::CannotCreate {
                    ddl: self.ddl.clone(),
                    source: e,
                })
            }
            Err(e) => Err(BumpError::Query(e)),
        }
    }

    /// `key`'s epoch and when its term began, without locking; `None` without a row.
    pub(crate) async fn read(
        &self,
        client: &tokio_postgres::Client,
        key: LockKey,
    ) -> Result<Option<(u64, std::time::SystemTime)>, tokio_postgres::Error> {
        let rows = client
            .query_typed(
                &self.read,
                &[(&key.class(), Type::INT4), (&key.object(), Type::INT4)],
            )
            .await?;
        match rows.first() {
            Some(row) => {
                let epoch: i64 = row.try_get(0)?;
                Ok(Some((u64::try_from(epoch).unwrap_or(0), row.try_get(1)?)))
            }
            None => Ok(None),
        }
    }

    /// The fence: locks `key`'s row `FOR SHARE` in `tx` and compares its epoch with `ours`.
    pub(crate) async fn check(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        key: LockKey,
        ours: u64,
    ) -> Result<(), Fenced> {
        let rows = tx
            .query_typed(
                &self.check,
                &[(&key.class(), Type::INT4), (&key.object(), Type::INT4)],
            )
            .await
            .map_err(|e| Fenced::failed(Some(ours), e))?;
        let current = match rows.first() {
            Some(row) => {
                let epoch: i64 = row.try_get(0).map_err(|e| Fenced::failed(Some(ours), e))?;
                Some(u64::try_from(epoch).unwrap_or(0))
            }
            None => None,
        };
        if current == Some(ours) {
            Ok(())
        } else {
            Err(Fenced::superseded(ours, current))
        }
    }
}

/// Where a term's fenced writes check its epoch: the table, and the key whose row it is.
#[derive(Clone, Debug)]
pub(crate) struct FenceTarget {
    pub(crate) table: Arc<FenceTable>,
    pub(crate) key: LockKey,
}

impl FenceTarget {
    /// The fence of a term of epoch `ours`, in `tx` (see [`FenceTable::check`]).
    pub(crate) async fn check(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        ours: u64,
    ) -> Result<(), Fenced> {
        self.table.check(tx, self.key, ours).await
    }
}

/// Why a bump failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BumpError {
    #[error(
        "the epoch row stayed locked for {0:?}: a fenced transaction of the previous term is still open (set idle_in_transaction_session_timeout on the application's pool)"
    )]
    RowBusy(Duration),
    #[error(
        "the fencing epoch table is missing and this role cannot create it ({}); run this once as a role that may (in a schema that exists): {ddl}",
        crate::error::chain(source)
    )]
    CannotCreate {
        ddl: String,
        source: tokio_postgres::Error,
    },
    #[error("the bump returned no row")]
    NoRow,
    #[error("{}", crate::error::chain(.0))]
    Query(tokio_postgres::Error),
}

impl BumpError {
    /// Whether only an operator can fix it (the table is missing and this role may not create
    /// it): such a failure is an ERROR, not a WARN.
    pub(crate) fn needs_an_operator(&self) -> bool {
        matches!(self, Self::CannotCreate { .. })
    }
}

/// The bump of one key's epoch, on the table `quoted`. The row lock waits at most $4
/// (lock_timeout, local to this statement's transaction), so that a fenced transaction left open by the old term cannot hold the bump forever.
/// An existing row's `since` is read after that wait: when the term really begins.
/// The commit is flushed locally whatever the server's default (`local`): with
/// `synchronous_commit = off`, a crash right after a bump can lose it, and the next
/// term would get the same epoch again (seen in the restart test). It does not wait
/// for a synchronous standby: one that stops confirming would hold the bump, and with
/// it the lock (a backend waiting for its standby keeps its locks even when its client
/// is gone), so that nobody could lead; a bump a failover loses is covered by the clock
/// (below).
///
/// The new epoch is the larger of the row's + 1 and the server's clock in milliseconds
/// since 1970, so that epochs never repeat across a failover to a standby that had not
/// received the latest bumps (asynchronous replication): a later term reads a later
/// clock, as long as the two servers' clocks agree to within the failover's duration.
fn bump_sql(quoted: &str) -> String {
    format!(
        "INSERT INTO {quoted} AS e (class, object, epoch, holder, since) \
             SELECT $1::int4, $2::int4, {CLOCK_MS}, $3::text, pg_catalog.clock_timestamp() \
             FROM (SELECT pg_catalog.set_config('lock_timeout', $4::text, true), \
                          pg_catalog.set_config('synchronous_commit', 'local', true)) AS bound \
             ON CONFLICT (class, object) DO UPDATE \
             SET epoch = GREATEST(e.epoch + 1, {CLOCK_MS}), \
                 holder = EXCLUDED.holder, since = pg_catalog.clock_timestamp() \
             RETURNING epoch"
    )
}

/// The bump of many keys of one class at once, on the table `quoted` (a shard member's
/// gained shards): one round trip and
/// one commit, whatever their number. A row that a fenced transaction holds is skipped,
/// not waited for: its key's term waits for a later bump. New rows are inserted; the
/// rows that exist are locked (those free of fenced transactions) and bumped, as above.
fn bump_free_sql(quoted: &str) -> String {
    format!(
        "WITH bound AS MATERIALIZED (\
               SELECT pg_catalog.set_config('synchronous_commit', 'local', true)), \
             want AS (SELECT o FROM pg_catalog.unnest($2::int4[]) AS o), \
             fresh AS (INSERT INTO {quoted} AS e (class, object, epoch, holder, since) \
               SELECT $1::int4, w.o, {CLOCK_MS}, $3::text, pg_catalog.clock_timestamp() \
               FROM want w, bound ON CONFLICT (class, object) DO NOTHING \
               RETURNING e.object, e.epoch), \
             free AS (SELECT e.object FROM {quoted} e JOIN want w ON e.object = w.o \
               WHERE e.class = $1::int4 FOR UPDATE OF e SKIP LOCKED), \
             bumped AS (UPDATE {quoted} AS e \
               SET epoch = GREATEST(e.epoch + 1, {CLOCK_MS}), holder = $3::text, \
                   since = pg_catalog.clock_timestamp() \
               FROM free f, bound WHERE e.class = $1::int4 AND e.object = f.object \
               RETURNING e.object, e.epoch) \
             SELECT object, epoch FROM fresh UNION ALL SELECT object, epoch FROM bumped"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_as_identifiers_never_pasted() {
        let table = FenceTable::new(Some("Ops"), "epochs\"; DROP TABLE x; --").unwrap();
        assert_eq!(table.name(), "\"Ops\".\"epochs\"\"; DROP TABLE x; --\"");
        assert!(
            table.ddl().starts_with(
                "CREATE TABLE IF NOT EXISTS \"Ops\".\"epochs\"\"; DROP TABLE x; --\" ("
            )
        );
        assert_eq!(
            FenceTable::new(None, DEFAULT_TABLE).unwrap().name(),
            "\"pg_elector_epochs\""
        );
    }

    #[test]
    fn an_empty_or_overlong_name_is_an_error() {
        for bad in ["", &"x".repeat(64), "a\0b"] {
            assert!(matches!(
                FenceTable::new(None, bad),
                Err(crate::Error::Build(
                    crate::BuildError::InvalidFencingTable { .. }
                ))
            ));
            assert!(FenceTable::new(Some(bad), "t").is_err());
        }
        assert!(FenceTable::new(None, &"x".repeat(63)).is_ok());
    }
}
