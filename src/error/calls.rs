//! The errors of the calls that ask the database something for the caller:
//! [`current_leader`](crate::current_leader) and
//! [`request_handover`](crate::request_handover).

use std::time::Duration;

use super::chain;

/// Why [`current_leader`](crate::current_leader) (or
/// [`Elector::current_leader`](crate::Elector::current_leader)) could not say who leads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CurrentLeaderError {
    /// [`Elector::current_leader`](crate::Elector::current_leader) got no pool connection
    /// within this time.
    #[error("current_leader: no pool connection within {0:?}")]
    PoolTimeout(Duration),

    /// [`Elector::current_leader`](crate::Elector::current_leader) got no answer within this
    /// time: the server or the network stalls, as in a partition.
    #[error("current_leader: no answer within {0:?}")]
    Timeout(Duration),

    /// The pool could not hand out a connection. The text carries the pool's error and, for a
    /// connection the server refused, the server's message; the error itself is the field.
    // The text is the whole chain, so the error is not also exposed as the source: a report
    // that prints the sources would say it twice.
    #[error("current_leader: the pool could not hand out a connection: {}", chain(.0))]
    Pool(Box<deadpool_postgres::PoolError>),

    /// A query failed. The text carries the server's message (severity, SQLSTATE, message,
    /// detail and hint); the error itself, with
    /// [`as_db_error`](tokio_postgres::Error::as_db_error), is the field. For example a role
    /// without `SELECT` on an existing epoch table.
    #[error("current_leader: the query failed: {}", chain(.0))]
    Query(tokio_postgres::Error),
}

impl CurrentLeaderError {
    /// Whether no pool connection or no answer came in time (the pool's own wait timeout
    /// included).
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::PoolTimeout(_) | Self::Timeout(_) => true,
            Self::Pool(e) => matches!(**e, deadpool_postgres::PoolError::Timeout(_)),
            Self::Query(_) => false,
        }
    }
}

/// Why [`request_handover`](crate::request_handover) (or
/// [`request_handover_in`](crate::request_handover_in)) did not ask, or may not have.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoverError {
    /// No replica leads the key, so there is nothing to hand over.
    #[error("request_handover: no replica leads the key")]
    NoLeader,

    /// No live standby matches (the named identity, or any), so nothing was asked. A standby
    /// is live for this while it tries the lock, and only a replica built with a preference
    /// says so.
    #[error("request_handover: no live standby {}; only a replica built with a preference that tried the lock within its last two check intervals can take a handover", .identity.as_deref().map_or_else(String::new, |name| format!("named {name:?}")))]
    NoSuchStandby {
        /// The identity that was asked for; `None` for the most preferred standby.
        identity: Option<String>,
    },

    /// No pool connection, or no answer, within the call's bound: the request may or may not
    /// have been made.
    #[error("request_handover: no pool connection or no answer within {0:?}")]
    Timeout(Duration),

    /// The pool could not hand out a connection (the text carries why); nothing was asked.
    #[error("request_handover: the pool could not hand out a connection: {}", chain(.0))]
    Pool(Box<deadpool_postgres::PoolError>),

    /// A query failed; the server's message is in the text, the error itself is the field. A
    /// connection lost after the request was sent may or may not have made it.
    #[error("request_handover: the query failed: {}", chain(.0))]
    Query(tokio_postgres::Error),

    /// The candidates table or schema name given to
    /// [`request_handover_in`](crate::request_handover_in) is empty, longer than
    /// PostgreSQL's 63-byte identifiers, or holds a NUL; nothing was asked.
    #[error(
        "request_handover: invalid candidates table or schema name {name:?}: 1 to 63 bytes, no NUL"
    )]
    InvalidTable {
        /// The name that was given.
        name: String,
    },
}

impl HandoverError {
    /// Whether no pool connection or no answer came in time: the request may or may not have
    /// been made.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Pool(e) => matches!(**e, deadpool_postgres::PoolError::Timeout(_)),
            _ => false,
        }
    }
}
