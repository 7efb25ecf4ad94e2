//! Why a try, a wait or a check on a lock session failed: one type for the standby's tries, the
//! waiting session, the leader's checks and a shard member's statements.

use std::time::Duration;

use deadpool_postgres::PoolError;
use tokio::time::timeout;

/// Why a try or a check failed. Displays the server's own message for a server error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("no pool connection within {0:?}")]
    PoolTimeout(Duration),
    // The text is the whole chain, with the server's message, so the source is not exposed a
    // second time.
    #[error("{}", crate::error::chain(.0))]
    Pool(PoolError),
    #[error("{}", crate::error::chain(.0))]
    Query(tokio_postgres::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The try answered something this elector does not know; the lock state of that session
    /// is unknown, so its connection is closed.
    #[error("unexpected answer to the try: {0:?}")]
    Unexpected(Option<String>),
    #[error("the connection attempt was cancelled")]
    BorrowCancelled,
    #[error("the waiting session's task was cancelled")]
    WaitAborted,
}

/// `query`, bounded by `bound`: its error, or [`SessionError::Timeout`] when it did not
/// answer in time.
pub(crate) async fn bounded<T>(
    bound: Duration,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SessionError> {
    timeout(bound, query)
        .await
        .map_err(|_| SessionError::Timeout(bound))?
        .map_err(SessionError::Query)
}
