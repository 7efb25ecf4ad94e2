//! A standby's statements on its pool's connections: borrowed with a bound, bracketed by the
//! probe that tells a transaction the application left open, and given back only outside one.

use std::time::Duration;

use super::RegisterError;
use super::sql::{PROBE, STILL_MARKED};
use crate::pooled::Borrowed;
use crate::postgres::session_error::SessionError;

/// `query` on `client`, a pool connection, after [`PROBE`] and beside [`STILL_MARKED`]: its
/// answer, and whether it ran inside a transaction the application left open. The probe goes
/// first; the read of the mark goes out once `query` has sent its first statement (a query that
/// sends more after an answer, as the gate's does, sends them after the read, in the same
/// transaction if one was left open: the mark lasts as long as it). A mark that cannot be read
/// (a statement failed inside such a transaction, which aborts it) counts as open: the
/// connection is then closed.
pub(super) async fn probed<T>(
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

/// A connection of `pool`, waiting at most `bound` for it.
pub(super) async fn borrow(
    pool: &deadpool_postgres::Pool,
    bound: Duration,
) -> Result<Borrowed, RegisterError> {
    let object = tokio::time::timeout(bound, pool.get())
        .await
        .map_err(|_| RegisterError::NoConnection(bound))?
        .map_err(SessionError::Pool)?;
    Ok(Borrowed::new(object))
}

/// Gives `borrowed` back, unless its statement ran inside a transaction the application left
/// open (`open`): then it is closed, which ends that transaction, and that is an error.
pub(super) fn give_back_unless_open(borrowed: Borrowed, open: bool) -> Result<(), RegisterError> {
    if open {
        // Dropping `borrowed` closes the connection.
        return Err(RegisterError::InTransaction);
    }
    borrowed.give_back();
    Ok(())
}
