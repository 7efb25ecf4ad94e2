//! A standby's statements on its pool's connections: borrowed with a bound, bracketed by the
//! probe that tells a transaction the application left open ([`crate::pooled::probed`]), and
//! given back only outside one.

use std::time::Duration;

use super::RegisterError;
use crate::pooled::Borrowed;
use crate::postgres::session_error::SessionError;

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
