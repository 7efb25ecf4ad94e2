//! How the elector's statements go: unnamed by default, or prepared once per connection (the
//! user's opt-in), and back to unnamed for good once a server session shows it does not keep
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::ClientWrapper;
use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::types::{ToSql, Type};

use crate::LockKey;

/// Sends `query` as a statement prepared once on this connection while `prepared` is on, and
/// as one unnamed statement otherwise. A prepared statement that the server session does not
/// have ([`lost_statement`]) is sent again at once, unnamed, and turns `prepared` off for good
/// (logged once).
pub(super) async fn send(
    prepared: &Prepared,
    key: LockKey,
    client: &ClientWrapper,
    query: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    if prepared.on() {
        match prepared_query(client, query, params).await {
            Err(e) if lost_statement(&e, client) => prepared.lost(key, "try", &e),
            answer => return answer,
        }
    }
    client.query_typed(query, params).await
}

/// Whether an elector's tries and checks go as statements prepared once per connection (the
/// user's opt-in, `ElectorBuilder::prepared_statements`): off by default, since behind a
/// transaction-mode pooler that does not keep prepared statements per client (PgBouncer before
/// 1.21, or with `max_prepared_statements = 0`), a statement name of the driver's (`s0`, `s1`,
/// ..., the same in every process) can meet another client's statement of that name on a
/// shared server session. When on, it turns off for good once a server session shows that it
/// does not keep them ([`lost_statement`]) or a try finds a transaction pooler. Shared by the
/// standby's tries and the check of the lock session they are granted.
#[derive(Clone, Debug)]
pub(crate) struct Prepared(Arc<AtomicBool>);

impl Prepared {
    /// Statements prepared once per connection when `on`, unnamed otherwise.
    pub(crate) fn new(on: bool) -> Self {
        Self(Arc::new(AtomicBool::new(on)))
    }

    pub(crate) fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Turns prepared statements off for good once a try found a transaction pooler, with an
    /// INFO line if they were on.
    pub(super) fn behind_a_pooler(&self, key: LockKey) {
        if self.0.swap(false, Ordering::Relaxed) {
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
        if self.0.swap(false, Ordering::Relaxed) {
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
