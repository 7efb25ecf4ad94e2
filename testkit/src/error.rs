//! The harness's error type.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// Everything that can go wrong while setting up or driving a test server.
///
/// The type is [`Clone`] (sources are kept in an [`Arc`]) so that
/// [`PgServer::shared`](crate::PgServer::shared) can hand the same cached
/// error to every caller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum KitError {
    /// No usable PostgreSQL server: the binaries were not found (the message
    /// says where the harness looked and how to fix it) or `PG_BINDIR` is invalid.
    NoServer(String),
    /// No `pgbouncer` program to start a [`Pgbouncer`](crate::server::pooler::Pgbouncer)
    /// with: the message says where the harness looked and how to install it.
    NoPgbouncer(String),
    /// A private-server control (restart, stop, ...) was called on an
    /// external server (one given by `DATABASE_URL`).
    NotPrivate,
    /// The server failed to initialise, start, stop or restart. The message
    /// includes the command's output and/or the tail of the server log.
    Server(String),
    /// The connection settings are unusable (e.g. a bad `DATABASE_URL`).
    Config(String),
    /// A waiting helper's bound passed first: the message says what was awaited and what was
    /// seen instead.
    Timeout(String),
    /// The elector refused its settings (an interval below the crate's minimum, say).
    Elector(String),
    /// A fault could not be put in place: the message says which and why (the replica has no
    /// lock session to kill, the process is gone, ...).
    Fault(String),
    /// An I/O error, with what the harness was doing.
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// A PostgreSQL client error, with what the harness was doing.
    Postgres {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        source: Arc<tokio_postgres::Error>,
    },
}

impl KitError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        KitError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn pg(context: impl Into<String>, source: tokio_postgres::Error) -> Self {
        KitError::Postgres {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

impl fmt::Display for KitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KitError::NoServer(msg) | KitError::Server(msg) | KitError::NoPgbouncer(msg) => {
                f.write_str(msg)
            }
            KitError::Timeout(msg) => write!(f, "timed out: {msg}"),
            KitError::Elector(msg) => write!(f, "the elector refused its settings: {msg}"),
            KitError::Fault(msg) => write!(f, "could not put the fault in place: {msg}"),
            KitError::NotPrivate => f.write_str(
                "this operation needs a private server started by the harness \
                 (PgServer::spawn), not an external one from DATABASE_URL",
            ),
            KitError::Config(msg) => write!(f, "invalid configuration: {msg}"),
            KitError::Io { context, source } => {
                write!(f, "{context}: {}", chain(&**source))
            }
            KitError::Postgres { context, source } => {
                write!(f, "{context}: {}", chain(&**source))
            }
        }
    }
}

/// An error and its sources, joined with `": "` (`tokio_postgres::Error`
/// alone says little, e.g. "error connecting to server").
pub(crate) fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    text
}

impl StdError for KitError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            KitError::Io { source, .. } => Some(&**source),
            KitError::Postgres { source, .. } => Some(&**source),
            _ => None,
        }
    }
}
