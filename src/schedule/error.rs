//! What can go wrong with a schedule: [`ScheduleError`], and what its variants say about a
//! query of the job tables that failed.

use std::time::Duration;

/// What can go wrong with a schedule. Failures of the database while the schedule runs are not
/// errors of [`Schedule::run`](super::Schedule::run): they are logged and the schedule goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A cron expression that does not parse.
    #[error("invalid cron expression {expression:?}: {reason}")]
    InvalidCron {
        /// The expression.
        expression: String,
        /// What the parser said.
        reason: String,
    },
    /// A time zone name the bundled IANA database does not know.
    #[error("unknown time zone {zone:?}: {reason}")]
    UnknownZone {
        /// The name.
        zone: String,
        /// What the database said.
        reason: String,
    },
    /// A time zone was asked for a fixed-period job.
    #[error("job {job:?} runs on a fixed period; only cron jobs take a time zone")]
    NotCron {
        /// The job.
        job: String,
    },
    /// Two jobs of one schedule have the same name.
    #[error("two jobs are named {job:?}; names are unique within a schedule")]
    DuplicateJob {
        /// The name.
        job: String,
    },
    /// No job of this name is registered in the job table.
    #[error("no job named {job:?} in this schedule's table")]
    UnknownJob {
        /// The name.
        job: String,
    },
    /// A table, schema or prefix that makes an empty or overlong identifier.
    #[error("invalid table name {name:?}: 1 to 63 bytes, no NUL")]
    InvalidTable {
        /// The name.
        name: String,
    },
    /// The job table holds a schedule this version cannot read.
    #[error("unreadable stored schedule {text:?}")]
    Stored {
        /// The stored text.
        text: String,
    },
    /// The tables are missing and this role may not create them.
    #[error(
        "the job tables are missing and this role may not create them ({}); run this once as a role that may: {ddl}",
        crate::error::chain(source)
    )]
    CannotCreate {
        /// The statements to run.
        ddl: String,
        /// The server's refusal.
        source: tokio_postgres::Error,
    },
    /// The job tables lack columns this version uses (an earlier version made them) and this
    /// role may not add them: only the tables' owner may.
    #[error(
        "the job tables lack columns this version uses and this role may not add them ({}); run this once as their owner: {ddl}",
        crate::error::chain(source)
    )]
    CannotUpgrade {
        /// The statements to run.
        ddl: String,
        /// The server's refusal.
        source: tokio_postgres::Error,
    },
    /// No pool connection within the schedule's poll interval (at least 1 s).
    #[error("no pool connection within {0:?}")]
    PoolTimeout(Duration),
    /// The pool could not hand out a connection.
    #[error("the pool could not hand out a connection: {}", crate::error::chain(.0))]
    Pool(Box<deadpool_postgres::PoolError>),
    /// A query failed; the message carries the server's (severity, SQLSTATE, text).
    #[error("a query of the job tables failed: {}", crate::error::chain(.0))]
    Database(tokio_postgres::Error),
    /// A query of the job tables got no answer in time.
    #[error("no answer from the job tables within {0:?}")]
    Timeout(Duration),
    /// The fence of a claim failed.
    #[error("the claim's fence failed: {0}")]
    Fence(crate::Fenced),
}
// Each text above already carries the whole chain of its cause, so no variant exposes the
// cause as its `source()` as well: a report that prints the sources would say it twice. The
// cause is the field, to match on.

impl From<tokio_postgres::Error> for ScheduleError {
    fn from(error: tokio_postgres::Error) -> Self {
        ScheduleError::Database(error)
    }
}

impl ScheduleError {
    /// A job table is missing (SQLSTATE 42P01).
    pub(super) fn is_missing_table(&self) -> bool {
        matches!(self, ScheduleError::Database(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE))
    }

    /// A lock the statement needed was held too long by another session (SQLSTATE 55P03, the
    /// `lock_timeout` the table upgrade sets).
    pub(super) fn is_lock_timeout(&self) -> bool {
        matches!(self, ScheduleError::Database(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE))
    }

    /// Whether a COMMIT that failed so may still have been carried out: no answer in time, or
    /// a connection lost (an error the server did not send). An error the server sent (a
    /// SQLSTATE) means it rolled the transaction back.
    pub(super) fn leaves_commit_unknown(&self) -> bool {
        match self {
            ScheduleError::Timeout(_) => true,
            ScheduleError::Database(e) => e.code().is_none(),
            _ => false,
        }
    }
}
