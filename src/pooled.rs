//! A pooled connection with a statement in flight: given back only once the statement's answer
//! came, closed otherwise; and the probe that tells whether the application left a transaction
//! open on a pool connection, so that the crate never writes inside one.

use deadpool_postgres::{Object, Pool};
use tokio_postgres::error::SqlState;

/// A pooled connection on which a statement is in flight. Unless it is given back or kept,
/// dropping it (a timeout, a cancelled future) closes the connection instead of returning it to
/// the pool: the statement may still run on it, a lock it took may still be held, and behind a
/// partition the next borrower would wait on it in vain.
pub(crate) struct Borrowed(Option<Object>);

impl Borrowed {
    pub(crate) fn new(object: Object) -> Self {
        Self(Some(object))
    }

    pub(crate) fn client(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a borrowed connection is present until it is let go")
    }

    pub(crate) fn client_mut(&mut self) -> &mut Object {
        self.0
            .as_mut()
            .expect("a borrowed connection is present until it is let go")
    }

    /// Back to the pool, unchanged.
    pub(crate) fn give_back(mut self) {
        drop(self.0.take());
    }

    /// Out of the guard, to be taken from the pool.
    pub(crate) fn keep(mut self) -> Object {
        self.0
            .take()
            .expect("a borrowed connection is present until it is let go")
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(Object::take(object));
        }
    }
}

/// SQL: whether the statement runs inside a transaction [`PROBE`] marked, one the application
/// left open on the pool connection (a `BEGIN` without its `COMMIT`).
macro_rules! in_open_transaction {
    () => {
        "coalesce(pg_catalog.current_setting('pg_elector.probe', true), '') = 'open'"
    };
}
pub(crate) use in_open_transaction;

/// Sent in the same round trip before a statement on a pool connection: it marks the
/// transaction it runs in. Outside a transaction block that is its own, over at once, and the
/// statement after it reads no mark; inside a transaction the application left open, the
/// statement reads it ([`in_open_transaction!`]).
pub(crate) const PROBE: &str = "SELECT pg_catalog.set_config('pg_elector.probe', 'open', true)";

/// Whether [`PROBE`]'s mark is still there: the statements ran inside a transaction the
/// application left open.
pub(crate) const STILL_MARKED: &str = concat!("SELECT ", in_open_transaction!());

/// `query` on `client`, a pool connection, after [`PROBE`] and beside [`STILL_MARKED`]: its
/// answer, and whether it ran inside a transaction the application left open. The probe goes
/// first; the read of the mark goes out once `query` has sent its first statement (a query that
/// sends more after an answer, as the gate's does, sends them after the read, in the same
/// transaction if one was left open: the mark lasts as long as it). A mark that cannot be read
/// (a statement failed inside such a transaction, which aborts it) counts as open: the
/// connection is then closed.
pub(crate) async fn probed<T>(
    client: &tokio_postgres::Client,
    query: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<(T, bool), tokio_postgres::Error> {
    // `join!` polls them first in this order, and each sends its statement when first polled.
    let (marked, answer, still) = tokio::join!(
        client.query_typed(PROBE, &[]),
        query,
        client.query_typed(STILL_MARKED, &[])
    );
    marked?;
    let open = still.map_or(true, |rows| {
        rows.first()
            .and_then(|row| row.try_get::<_, bool>(0).ok())
            .unwrap_or(true)
    });
    Ok((answer?, open))
}

/// Why [`outside_transactions`] got no connection.
#[derive(Debug)]
pub(crate) enum NotBorrowed {
    /// The pool had none by its deadline.
    PoolTimeout,
    /// The probe got no answer by its deadline.
    Timeout,
    /// The pool could not hand one out.
    Pool(deadpool_postgres::PoolError),
    /// The probe failed (other than in a transaction the application left aborted).
    Query(tokio_postgres::Error),
}

/// A connection of `pool`, borrowed by `borrow_until` and probed by `until`, on which no
/// transaction is open: one the
/// application handed back inside a transaction (a `BEGIN` without its `COMMIT`, or one
/// aborted by an error) is closed, which ends that transaction, and another is borrowed. So
/// the crate never sends a statement into a transaction it did not open (a `BEGIN` of its own
/// would join it, and its `COMMIT` commit the application's work). One round trip
/// ([`probed`]).
pub(crate) async fn outside_transactions(
    pool: &Pool,
    borrow_until: tokio::time::Instant,
    until: tokio::time::Instant,
) -> Result<Borrowed, NotBorrowed> {
    loop {
        let object = tokio::time::timeout_at(borrow_until.min(until), pool.get())
            .await
            .map_err(|_| NotBorrowed::PoolTimeout)?
            .map_err(NotBorrowed::Pool)?;
        let borrowed = Borrowed::new(object);
        match tokio::time::timeout_at(until, probed(borrowed.client(), async { Ok(()) })).await {
            Err(_) => return Err(NotBorrowed::Timeout),
            Ok(Ok(((), false))) => return Ok(borrowed),
            Ok(Ok(((), true))) => {}
            Ok(Err(e)) if e.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => {}
            Ok(Err(e)) => return Err(NotBorrowed::Query(e)),
        }
        // Dropped, the connection is closed.
        tracing::warn!(
            "a pool connection was inside a transaction the application left open; closed, which ends that transaction"
        );
    }
}
