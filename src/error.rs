//! The crate's error type.

use std::time::Duration;

/// What can go wrong when building or running an [`Elector`](crate::Elector).
///
/// Failures of the database while the election runs are not errors of [`run`](crate::Elector::run):
/// they are logged, the replica stays (or becomes) a standby, and the election goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`run`](crate::Elector::run) was called while another call on the same elector (or a
    /// clone of it) is still running.
    #[error("the elector is already running: one run at a time")]
    AlreadyRunning,

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

    /// [`Elector::current_leader`](crate::Elector::current_leader) got no pool connection
    /// within this time.
    #[error("current_leader: no pool connection within {0:?}")]
    CurrentLeaderPoolTimeout(Duration),

    /// [`Elector::current_leader`](crate::Elector::current_leader) got no answer within this
    /// time: the server or the network stalls, as in a partition.
    #[error("current_leader: no answer within {0:?}")]
    CurrentLeaderTimeout(Duration),

    /// The pool could not hand out a connection. The text carries the pool's error and, for a
    /// connection the server refused, the server's message; the error itself is the field.
    // The text is the whole chain, so the error is not also exposed as the source: a report
    // that prints the sources would say it twice.
    #[error("the pool could not hand out a connection: {}", chain(.0))]
    Pool(Box<deadpool_postgres::PoolError>),

    /// A query of [`current_leader`](crate::current_leader) failed. The text carries the
    /// server's message (severity, SQLSTATE, message, detail and hint); the error itself,
    /// with [`as_db_error`](tokio_postgres::Error::as_db_error), is the field.
    #[error("the query failed: {}", chain(.0))]
    CurrentLeaderQuery(tokio_postgres::Error),

    /// [`request_handover`](crate::request_handover): no replica leads the key, so there is
    /// nothing to hand over.
    #[error("request_handover: no replica leads the key")]
    NoLeader,

    /// [`request_handover`](crate::request_handover): no live standby matches (the named
    /// identity, or any), so nothing was asked. A standby is live for this while it tries the
    /// lock, and only a replica built with a preference says so.
    #[error("request_handover: no live standby {}; only a replica built with a preference that tried the lock within its last two check intervals can take a handover", .identity.as_deref().map_or_else(String::new, |name| format!("named {name:?}")))]
    NoSuchStandby {
        /// The identity that was asked for; `None` for the most preferred standby.
        identity: Option<String>,
    },

    /// [`request_handover`](crate::request_handover) got no pool connection, or no answer,
    /// within its bound: the request may or may not have been made.
    #[error("request_handover: no pool connection or no answer within {0:?}")]
    HandoverTimeout(Duration),

    /// A query of [`request_handover`](crate::request_handover) failed; the server's message
    /// is in the text, the error itself is the field. A connection lost after the request was
    /// sent may or may not have made it.
    #[error("request_handover: the query failed: {}", chain(.0))]
    HandoverQuery(tokio_postgres::Error),

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

    /// [`run`](crate::Elector::run) was called on the handle of one shard
    /// (`Shards::elector`), which cannot be run on its own:
    /// the group's `Shards::run` runs every shard.
    #[error("run was called on a shard's elector: its group's Shards::run runs every shard")]
    RunOnShard,

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

/// A fenced write was refused: the term it was made in is over, or a later term has begun.
///
/// Returned by [`Term::fence`](crate::Term::fence); roll the transaction back (dropping it does).
/// [`ours`](Self::ours) is the epoch of the term that tried, [`current`](Self::current) the one
/// the epoch row holds.
#[derive(Debug)]
pub struct Fenced {
    ours: Option<u64>,
    current: Option<u64>,
    why: FencedBecause,
}

#[derive(Debug)]
enum FencedBecause {
    /// The row holds another epoch: a later term has begun.
    Superseded,
    /// This replica's term has ended (it may not know who leads now).
    TermEnded,
    /// The elector was built without fencing, so its terms have no epoch.
    NotFenced,
    /// The fence query failed; the transaction is unusable.
    Failed(tokio_postgres::Error),
}

impl Fenced {
    pub(crate) fn superseded(ours: u64, current: Option<u64>) -> Self {
        Self {
            ours: Some(ours),
            current,
            why: FencedBecause::Superseded,
        }
    }

    pub(crate) fn term_ended(ours: Option<u64>) -> Self {
        Self {
            ours,
            current: None,
            why: FencedBecause::TermEnded,
        }
    }

    pub(crate) fn not_fenced() -> Self {
        Self {
            ours: None,
            current: None,
            why: FencedBecause::NotFenced,
        }
    }

    pub(crate) fn failed(ours: Option<u64>, error: tokio_postgres::Error) -> Self {
        Self {
            ours,
            current: None,
            why: FencedBecause::Failed(error),
        }
    }

    /// The epoch of the term that tried to write; `None` without fencing.
    pub fn ours(&self) -> Option<u64> {
        self.ours
    }

    /// The epoch the row holds, when the fence read it (a later term's).
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Whether a later term has begun (the row holds another epoch).
    pub fn is_superseded(&self) -> bool {
        matches!(self.why, FencedBecause::Superseded)
    }

    /// Whether the fence query itself failed (a lost connection, a missing table), rather than
    /// finding the term over.
    pub fn is_query_error(&self) -> bool {
        matches!(self.why, FencedBecause::Failed(_))
    }
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ours = |f: &mut std::fmt::Formatter<'_>| match self.ours {
            Some(epoch) => write!(f, "epoch {epoch}"),
            None => f.write_str("a term without an epoch"),
        };
        f.write_str("fenced: ")?;
        match &self.why {
            FencedBecause::Superseded => {
                ours(f)?;
                match self.current {
                    Some(current) => write!(f, " is not the current one, {current}"),
                    None => f.write_str(" is not the current one (the epoch row is missing)"),
                }
            }
            FencedBecause::TermEnded => {
                f.write_str("the term of ")?;
                ours(f)?;
                f.write_str(" has ended")
            }
            FencedBecause::NotFenced => f.write_str(
                "the elector was built without fencing(true), so its terms have no epoch",
            ),
            FencedBecause::Failed(e) => write!(f, "the epoch could not be checked: {}", chain(e)),
        }
    }
}

impl std::error::Error for Fenced {}

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

#[cfg(test)]
mod tests {
    use super::{Error, chain};
    use crate::{Elector, LockKey};
    use pg_elector_testkit::PgServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_current_leader_says_what_the_server_said() {
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let key = LockKey::new(12, 1);
        // Someone holds the lock, so `current_leader` goes on to read the epoch row, from a
        // fencing table that was never created.
        let holder = db.connect().await.unwrap();
        holder
            .execute(
                "SELECT pg_advisory_lock($1::int4, $2::int4)",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let elector = Elector::builder(db.pool(1), key)
            .fencing(true)
            .fencing_table(None, "no_such_epochs")
            .build()
            .unwrap();
        let error = elector
            .current_leader()
            .await
            .expect_err("the epoch table is missing");
        assert!(matches!(error, Error::CurrentLeaderQuery(_)), "{error:?}");
        let text = error.to_string();
        assert!(
            text.starts_with("the query failed: ")
                && text.contains("ERROR 42P01: relation \"no_such_epochs\" does not exist"),
            "{text}"
        );
        assert!(
            std::error::Error::source(&error).is_none(),
            "the text carries the cause, once"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_the_server_refuses_says_what_the_server_said() {
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let mut config = db.config();
        config.dbname("no_such_database");
        let pool = pg_elector_testkit::config::pool_from_config(config, 1);
        let elector = Elector::builder(pool, LockKey::new(12, 2)).build().unwrap();
        let error = elector
            .current_leader()
            .await
            .expect_err("no such database");
        assert!(matches!(error, Error::Pool(_)), "{error:?}");
        let text = error.to_string();
        assert!(
            text.starts_with("the pool could not hand out a connection: ")
                && text.contains("FATAL 3D000: ")
                && text.contains("\"no_such_database\" does not exist"),
            "{text}"
        );
    }

    #[test]
    fn a_chain_without_repeats() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: inner")]
        struct Outer(#[source] Inner);
        #[derive(Debug, thiserror::Error)]
        #[error("inner")]
        struct Inner;
        assert_eq!(chain(&Outer(Inner)), "outer: inner");
        assert_eq!(chain(&Inner), "inner");
    }
}
