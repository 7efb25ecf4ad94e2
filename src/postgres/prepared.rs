//! How the elector's statements go: prepared once per connection where the connection reaches
//! its server session directly (the default) or always (the user's opt-in), unnamed otherwise
//! (or when the user says so), and back to unnamed for good once a server session shows it
//! does not keep them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::ClientWrapper;
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::{ToSql, Type};

use super::cancel_key::{self, CancelKey};
use crate::LockKey;

/// Sends `query` (the elector's `statement`, named in the log) as a statement prepared once on
/// this connection where `prepared` says so for it, and as one unnamed statement otherwise. A
/// prepared statement that the server session does not have ([`lost_statement`]) is sent again
/// at once, unnamed, and turns `prepared` off for good (logged once).
///
/// Every such query ends with a `pg_backend_pid()` column. Where the connection was judged
/// direct by its cancel key (the default), an answer from another backend than the key names
/// shows a pooler that gave out a real backend's key (pgagroal replays the key of the server
/// session its client logged in on): prepared statements turn off for good, with a WARN line.
pub(super) async fn send(
    prepared: &Prepared,
    key: LockKey,
    statement: &str,
    client: &ClientWrapper,
    query: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    if let Some(verify) = prepared.for_connection(key, client).await {
        match prepared_query(client, query, params).await {
            Err(e) if lost_statement(&e, client) => prepared.lost(key, statement, &e),
            Ok(rows) => {
                if let Some(expected) = verify {
                    prepared.verify(key, expected, &rows);
                }
                return Ok(rows);
            }
            Err(e) => return Err(e),
        }
    }
    client.query_typed(query, params).await
}

/// Whether an elector's tries and checks go as statements prepared once per connection, which
/// the server does not parse and plan again at each one. Shared by the standby's tries and the
/// check of the lock session they are granted.
///
/// By default ([`Prepared::new`] with `None`) only on a connection that reaches its server
/// session directly: its cancel key names the backend that serves it ([`cancel_key`]; a pooler
/// gives keys of its own). Behind a transaction-mode pooler that does not keep prepared
/// statements per client (PgBouncer before 1.21, or with `max_prepared_statements = 0`), a
/// statement name of the driver's (`s0`, `s1`, ..., the same in every process) could meet
/// another client's statement of that name on a shared server session. `Some(true)` (the
/// user's opt-in, for a pooler that keeps them per client) prepares on every connection,
/// `Some(false)` on none. Either way it turns off for good once a server session shows that it
/// does not keep them ([`lost_statement`]) or a try finds a transaction pooler.
#[derive(Clone, Debug)]
pub(crate) struct Prepared(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// `None`: where the connection is direct; `Some(on)`: on every connection, or none.
    chosen: Option<bool>,
    /// Turned off for good.
    off: AtomicBool,
    /// What this elector found of each connection it used, by its cancel key: whether it reaches
    /// its server session directly.
    direct: Mutex<HashMap<CancelKey, bool>>,
}

/// The connections [`Inner::direct`] remembers at most; more (a pool that churns) and it starts
/// again, which costs each connection one more `pg_backend_pid()`.
const REMEMBERED: usize = 1024;

impl Prepared {
    /// Statements prepared where the connection is direct (`None`), on every connection
    /// (`Some(true)`), or on none (`Some(false)`).
    pub(crate) fn new(chosen: Option<bool>) -> Self {
        Self(Arc::new(Inner {
            chosen,
            off: AtomicBool::new(chosen == Some(false)),
            direct: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether statements go prepared on `client` (`Some`), and if so the backend every answer
    /// must come from (`Some(pid)`: by default, where the connection was judged direct). By
    /// default that is asked of the server once per connection (`pg_backend_pid()`, unnamed),
    /// and remembered.
    pub(super) async fn for_connection(
        &self,
        key: LockKey,
        client: &tokio_postgres::Client,
    ) -> Option<Option<i32>> {
        if self.0.off.load(Ordering::Relaxed) {
            return None;
        }
        if self.0.chosen == Some(true) {
            return Some(None);
        }
        let Some(cancel_key) = cancel_key::of(client) else {
            tracing::debug!(key = %key, "no cancel key to read: statements go unnamed");
            return None;
        };
        let direct = self.judged(key, client, cancel_key).await;
        direct.then_some(Some(cancel_key.process_id))
    }

    /// Whether the connection with `cancel_key` reaches its server session directly, asked of
    /// the server the first time.
    async fn judged(
        &self,
        key: LockKey,
        client: &tokio_postgres::Client,
        cancel_key: CancelKey,
    ) -> bool {
        if let Some(direct) = self.remembered(cancel_key) {
            return direct;
        }
        // An error here is the connection's: the statement that follows meets it too.
        let Ok(rows) = client
            .query_typed("SELECT pg_catalog.pg_backend_pid()", &[])
            .await
        else {
            return false;
        };
        let backend = rows.first().and_then(|row| row.try_get::<_, i32>(0).ok());
        let direct = backend == Some(cancel_key.process_id);
        tracing::debug!(
            key = %key,
            backend,
            cancel_key_process = cancel_key.process_id,
            direct,
            statements = if direct { "prepared" } else { "unnamed (a pooler's cancel key)" },
            "a new pool connection: how its statements go"
        );
        self.remember(cancel_key, direct);
        direct
    }

    fn remembered(&self, cancel_key: CancelKey) -> Option<bool> {
        let direct = self.0.direct.lock().unwrap_or_else(|e| e.into_inner());
        direct.get(&cancel_key).copied()
    }

    fn remember(&self, cancel_key: CancelKey, is_direct: bool) {
        let mut direct = self.0.direct.lock().unwrap_or_else(|e| e.into_inner());
        if direct.len() >= REMEMBERED {
            direct.clear();
        }
        direct.insert(cancel_key, is_direct);
    }

    /// Turns prepared statements off for good, with a WARN line, if `rows` (a prepared answer on
    /// a connection judged direct) came from another backend than `expected`, the one its
    /// cancel key names: its last column is the answering backend's pid.
    fn verify(&self, key: LockKey, expected: i32, rows: &[tokio_postgres::Row]) {
        let Some(row) = rows.first() else {
            return;
        };
        let Some(last) = row.len().checked_sub(1) else {
            return;
        };
        let backend = row.try_get::<_, i32>(last).ok();
        if backend != Some(expected) && !self.0.off.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                key = %key,
                expected,
                backend,
                "a connection whose cancel key named its backend was answered by another one: \
                 a pooler hands out real backends' keys (pgagroal does); this elector's \
                 statements go unnamed from now on (set prepared_statements(false) behind \
                 such a pooler)"
            );
        }
    }

    /// Turns prepared statements off for good once a try on `client` found a transaction
    /// pooler, with an INFO line if the user turned them on, and a WARN line if `client` was
    /// judged direct by its cancel key (a pooler that hands out real backends' keys); by
    /// default they were on only for connections judged direct.
    pub(super) fn behind_a_pooler(&self, key: LockKey, client: &tokio_postgres::Client) {
        let judged_direct = self.0.chosen.is_none()
            && cancel_key::of(client).and_then(|k| self.remembered(k)) == Some(true);
        if self.0.off.swap(true, Ordering::Relaxed) {
            return;
        }
        if judged_direct {
            tracing::warn!(
                key = %key,
                "a try on a connection whose cancel key named its backend landed on a server \
                 session a transaction pooler shares: the pooler hands out real backends' keys \
                 (pgagroal does); this elector's statements go unnamed from now on (set \
                 prepared_statements(false) behind such a pooler)"
            );
        } else if self.0.chosen == Some(true) {
            tracing::info!(
                key = %key,
                "a try landed on a server session a transaction pooler shares: this elector's \
                 statements go unnamed from now on"
            );
        }
    }

    /// Turns prepared statements off for good after the server session lost one (`error`),
    /// with an INFO line the first time.
    pub(super) fn lost(&self, key: LockKey, statement: &str, error: &tokio_postgres::Error) {
        if !self.0.off.swap(true, Ordering::Relaxed) {
            tracing::info!(
                key = %key,
                statement,
                error = %crate::error::chain(error),
                "the server session does not keep prepared statements (a transaction-mode \
                 pooler without prepared-statement support, or a DEALLOCATE ALL or DISCARD \
                 ALL between statements): this elector's statements go unnamed from now on"
            );
        }
    }
}

/// Runs `query` as a statement prepared once on this connection (deadpool's statement cache).
/// A statement the server session has lost is dropped from the cache, so that a connection
/// that prepares it again later does not ask for the lost one.
pub(super) async fn prepared_query(
    client: &ClientWrapper,
    query: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
    let statement = client.prepare_typed_cached(query, &types).await?;
    let rows = client.query(&statement, &values).await;
    if let Err(e) = &rows
        && lost_statement(e, client)
    {
        client.statement_cache.remove(query, &types);
    }
    rows
}

/// Whether an error says that the server session does not have this connection's prepared
/// statement, or has another under its name: an ERROR (not FATAL) on a connection that is
/// still open, by which the server refused the statement before running anything, so that it
/// can be sent again unnamed. `26000`: no such statement (another server session behind a
/// transaction pooler, or `DEALLOCATE ALL`); `42P05`: the name is taken (a statement of another
/// client on a shared server session); `08P01` or `22P03` raised where the server binds a
/// statement's parameters (`exec_bind_message`; the routine's name is not translated, the
/// message is): the statement under that name takes other parameters (the same). Any other
/// `08P01` (a pooler's own errors, a broken protocol) is an error like any other.
pub(super) fn lost_statement(e: &tokio_postgres::Error, client: &tokio_postgres::Client) -> bool {
    let Some(db) = e.as_db_error() else {
        return false;
    };
    if client.is_closed() || db.parsed_severity() != Some(Severity::Error) {
        return false;
    }
    let code = db.code();
    if *code == SqlState::INVALID_SQL_STATEMENT_NAME || *code == SqlState::DUPLICATE_PSTATEMENT {
        return true;
    }
    (*code == SqlState::PROTOCOL_VIOLATION || *code == SqlState::INVALID_BINARY_REPRESENTATION)
        && db.routine() == Some("exec_bind_message")
}
