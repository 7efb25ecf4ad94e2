//! The server's shared lock table, full: how its refusal is recognised, and the setting the
//! log names. Every advisory lock held takes a slot of that table, so a group of many shards
//! can fill it; a single elector's try and a member's join can then be refused too.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use super::session::SessionError;

/// What to do about a full lock table, in the words of an operator's setting.
const RAISE: &str = "raise max_locks_per_transaction (the table holds max_locks_per_transaction × (max_connections + max_prepared_transactions) locks, shared by the whole server)";

/// When `error` is the server's "out of shared memory" (SQLSTATE 53200): a lock, or the start
/// of a new backend, refused because the shared lock table is full. Returns what to do about
/// it, naming the setting to raise; `None` for any other error.
pub(super) fn full(error: &SessionError) -> Option<&'static str> {
    let server_error = match error {
        SessionError::Query(e) | SessionError::Pool(PoolError::Backend(e)) => e,
        _ => return None,
    };
    (server_error.code() == Some(&SqlState::OUT_OF_MEMORY)).then_some(RAISE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_a_server_error_can_be_a_full_table() {
        assert_eq!(full(&SessionError::Timeout(Duration::from_secs(1))), None);
        assert_eq!(full(&SessionError::Unexpected(None)), None);
        assert!(RAISE.contains("max_locks_per_transaction"));
    }
}
