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

#[cfg(test)]
mod tests {
    use super::chain;

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
