//! The server's shared lock table, full: how its refusal is recognised, and the setting the
//! log names. Every advisory lock held takes a slot of that table, so a group of many shards
//! can fill it; a single elector's try and a member's join can then be refused too.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use super::session::SessionError;

/// What to do about a full lock table, in the words of an operator's setting.
const RAISE: &str = "raise max_locks_per_transaction (the table holds max_locks_per_transaction × (max_connections + max_prepared_transactions) locks, shared by the whole server)";

/// The setting the server's hint names when the shared lock table is full.
const SETTING: &str = "max_locks_per_transaction";

/// When `error` is the server's "out of shared memory" (SQLSTATE 53200) with the hint that
/// names `max_locks_per_transaction`: a lock, or the start of a new backend, refused because the shared
/// lock table is full. Returns what to do about it, naming the setting to raise; `None` for any
/// other error, a backend's own "out of memory" included (the same SQLSTATE, for which raising
/// the setting would do nothing).
pub(crate) fn full(error: &SessionError) -> Option<&'static str> {
    let server_error = match error {
        SessionError::Query(e) | SessionError::Pool(PoolError::Backend(e)) => e,
        _ => return None,
    };
    let db = server_error.as_db_error()?;
    // The hint, not the message: a server with other `lc_messages` translates the message, but
    // the hint names the setting as it is spelled.
    let names_setting = db.hint().is_some_and(|hint| hint.contains(SETTING));
    (db.code() == &SqlState::OUT_OF_MEMORY && names_setting).then_some(RAISE)
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

    /// SQLSTATE 53200 is any "out of memory" of the server: only the shared lock table's
    /// ("out of shared memory", with the hint naming `max_locks_per_transaction`) is a full
    /// lock table; a backend that ran out of its own memory is not, and raising the setting
    /// would not help it. Both errors as a real server sends them: the lock table filled by one
    /// transaction's advisory locks, and the plain out-of-memory raised by the server with the
    /// code, message and detail of PostgreSQL's own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plain_out_of_memory_is_not_a_full_lock_table() {
        // A server of its own: while the table is full, every other test's login on the
        // shared server fails ("out of shared memory"), and `serial()` holds back only the
        // timing tests.
        let server = pg_elector_testkit::PgServer::spawn().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let client = db.connect().await.unwrap();

        let plain = client
            .batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION 'out of memory' USING ERRCODE = 'out_of_memory', \
                 DETAIL = 'Failed on request of size 1073741824 in memory context \"ExecutorState\".'; \
                 END $$",
            )
            .await
            .unwrap_err();
        assert_eq!(plain.code(), Some(&SqlState::OUT_OF_MEMORY));
        assert_eq!(full(&SessionError::Query(plain)), None);

        // Every advisory lock of the transaction takes a slot, until the table is full; the
        // rollback frees them all.
        let filled = client
            .batch_execute(
                "BEGIN; DO $$ BEGIN FOR i IN 1..100000000 LOOP \
                 PERFORM pg_catalog.pg_advisory_xact_lock(7, i); END LOOP; END $$",
            )
            .await
            .unwrap_err();
        client.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(filled.code(), Some(&SqlState::OUT_OF_MEMORY), "{filled:?}");
        assert_eq!(full(&SessionError::Query(filled)), Some(RAISE));
    }
}
