//! The crate's errors, one enum per kind of call: [`BuildError`] for what a builder refuses,
//! [`CurrentLeaderError`] for [`current_leader`](crate::current_leader),
//! [`HandoverError`] for [`request_handover`](crate::request_handover), [`Fenced`] for a
//! fenced write, and [`Error`], which `run`, `build` and `current_leader` return and each of
//! the others converts into.

use std::time::Duration;

mod calls;
mod fenced;
#[cfg(test)]
mod tests;

pub use calls::{CurrentLeaderError, HandoverError};
pub use fenced::Fenced;

/// What can go wrong when building or running an [`Elector`](crate::Elector), or asking who
/// leads: one variant per kind of call, each with its own enum to match on.
///
/// Failures of the database while the election runs are not errors of [`run`](crate::Elector::run):
/// they are logged, the replica stays (or becomes) a standby, and the election goes on.
///
/// ```
/// use std::time::Duration;
/// use pg_elector::{BuildError, Elector, Error, LockKey};
///
/// # fn pool() -> deadpool_postgres::Pool { pg_elector::pool_from_url("host=localhost").unwrap() }
/// let built = Elector::builder(pool(), LockKey::new(1, 1))
///     .check_interval(Duration::from_millis(1))
///     .build();
/// assert!(matches!(built, Err(Error::Build(BuildError::IntervalTooSmall { .. }))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`run`](crate::Elector::run) was called while another call on the same elector (or a
    /// clone of it) is still running.
    #[error("the elector is already running: one run at a time")]
    AlreadyRunning,

    /// [`run`](crate::Elector::run) was called on the handle of one shard
    /// (`Shards::elector`), which cannot be run on its own:
    /// the group's `Shards::run` runs every shard.
    #[error("run was called on a shard's elector: its group's Shards::run runs every shard")]
    RunOnShard,

    /// A builder's `build()` (or [`pool_from_url`](crate::pool_from_url)) refused what it was
    /// given.
    #[error(transparent)]
    Build(#[from] BuildError),

    /// [`current_leader`](crate::current_leader) (or
    /// [`Elector::current_leader`](crate::Elector::current_leader)) could not find out.
    #[error(transparent)]
    CurrentLeader(#[from] CurrentLeaderError),

    /// [`request_handover`](crate::request_handover) did not ask, or may not have.
    #[error(transparent)]
    Handover(#[from] HandoverError),
}

impl Error {
    /// Whether no answer (or no pool connection) came in time: the server or the network
    /// stalls, and trying again later may work. For a handover request, it may or may not
    /// have been made.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::CurrentLeader(e) => e.is_timeout(),
            Error::Handover(e) => e.is_timeout(),
            _ => false,
        }
    }
}

/// What a builder's `build()` refuses (and [`pool_from_url`](crate::pool_from_url)): every
/// variant is a setting to change in code or configuration; nothing was started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The check interval is so large that the lock session's `idle_session_timeout`
    /// (4 × interval) does not fit PostgreSQL's maximum of 2³¹ − 1 ms.
    #[error(
        "check interval {interval:?} is too large: 4 × interval must fit idle_session_timeout (at most 2147483647 ms)"
    )]
    IntervalTooLarge {
        /// The interval that was asked for.
        interval: Duration,
    },

    /// The check interval is below the smallest supported one (10 ms).
    #[error("check interval {interval:?} is too small: it must be at least 10 ms")]
    IntervalTooSmall {
        /// The interval that was asked for.
        interval: Duration,
    },

    /// The identity holds a NUL byte, which PostgreSQL refuses in `application_name`; or the
    /// replica has a preference and the identity is over 63 bytes or holds a character
    /// outside printable ASCII, which `application_name` would not show as it is.
    #[error(
        "invalid identity {identity:?}: no NUL byte, and with a preference at most 63 bytes of printable ASCII (what PostgreSQL keeps of an application_name)"
    )]
    InvalidIdentity {
        /// The identity that was given.
        identity: String,
    },

    /// [`pool_from_url`](crate::pool_from_url) could not read the URL (or key-value string):
    /// the field is tokio-postgres's reason, which the text carries (never the URL, which
    /// may hold a password).
    #[error("invalid database URL: {}", chain(.0))]
    InvalidUrl(tokio_postgres::Error),

    /// The fencing table or schema name is empty, longer than PostgreSQL's 63-byte
    /// identifiers, or holds a NUL.
    #[error("invalid fencing table or schema name {name:?}: 1 to 63 bytes, no NUL")]
    InvalidFencingTable {
        /// The name that was given.
        name: String,
    },

    /// The candidates table or schema name
    /// ([`ElectorBuilder::candidates_table`](crate::ElectorBuilder::candidates_table)) is
    /// empty, longer than PostgreSQL's 63-byte identifiers, or holds a NUL.
    #[error("invalid candidates table or schema name {name:?}: 1 to 63 bytes, no NUL")]
    InvalidCandidatesTable {
        /// The name that was given.
        name: String,
    },

    /// A group of shards needs 1 to 16 384 shards.
    #[error("a group of shards needs 1 to {max} shards, not {count}")]
    InvalidShardCount {
        /// The count that was given.
        count: u32,
        /// The largest count a group may have.
        max: u32,
    },

    /// The registry already holds a metric of this name that is not one of `pg-elector`'s
    /// (another collector type, or a metric of the application's own).
    #[cfg(feature = "prometheus")]
    #[error("metric {name:?} is already registered by a collector that is not pg-elector's")]
    MetricClash {
        /// The metric name.
        name: String,
    },

    /// The registry refused a metric (an invalid name, or the same name with other help text
    /// or labels).
    #[cfg(feature = "prometheus")]
    #[error("cannot register the elector's metrics")]
    Metric(#[source] prometheus::Error),
}

/// An error and its sources on one line, with a server error's own message.
///
/// tokio-postgres displays a server error as just "db error"; the severity, SQLSTATE and
/// message are in its source. Links whose text the previous one already ends with (a pool
/// error that prints its cause) are not repeated.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut link = Some(error);
    while let Some(error) = link {
        let piece = match error.downcast_ref::<tokio_postgres::error::DbError>() {
            Some(db) => server_message(db),
            None => error.to_string(),
        };
        if !text.ends_with(&piece) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&piece);
        }
        link = error.source();
    }
    text
}

fn server_message(db: &tokio_postgres::error::DbError) -> String {
    let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    if let Some(detail) = db.detail() {
        text.push_str(&format!(" (detail: {detail})"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!(" (hint: {hint})"));
    }
    text
}
