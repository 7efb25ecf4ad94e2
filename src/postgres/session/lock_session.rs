//! The session that holds the lock once it is granted: its check, its graceful unlock.

use std::time::Duration;

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::{ToSql, Type};

use super::sql::CHECK;
use super::{Check, SessionError, bounded};
use crate::LockKey;
use crate::postgres::candidates::CandidatesTable;
use crate::postgres::handover::{self, Unlocked};
use crate::postgres::prepared::{Prepared, send};

/// The connection that holds the lock, out of the pool. Dropping it closes the connection,
/// and the server frees the lock with the session.
pub(crate) struct LockSession {
    pub(super) client: ClientWrapper,
    key: LockKey,
    /// This grant's mark on the server session.
    mark: String,
    /// Whether the check goes as a prepared statement, shared with the tries of the standby
    /// that was granted the lock.
    prepared: Prepared,
}

impl LockSession {
    /// The lock session that `client` became when a statement that marked it with `mark`
    /// was granted the lock.
    pub(crate) fn new(
        client: ClientWrapper,
        key: LockKey,
        mark: String,
        prepared: Prepared,
    ) -> Self {
        Self {
            client,
            key,
            mark,
            prepared,
        }
    }

    /// The leader check, as a statement prepared once on the lock session where [`Prepared`]
    /// says so for it, as one unnamed statement otherwise, and unnamed from the first time the
    /// server session does not have it.
    pub(crate) async fn check(&self, bound: Duration) -> Result<Check, SessionError> {
        self.check_seeing(bound, &CandidatesTable::default())
            .await
            .map(|(check, _)| check)
    }

    /// [`check`](Self::check), and whether the candidates table of preferred leaders
    /// (`candidates`) exists.
    pub(crate) async fn check_seeing(
        &self,
        bound: Duration,
        candidates: &CandidatesTable,
    ) -> Result<(Check, bool), SessionError> {
        let class = self.key.class_oid();
        let object = self.key.object_oid();
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&class, Type::OID),
            (&object, Type::OID),
            (&self.mark, Type::TEXT),
        ];
        let (holds, ours_alone, candidates): (bool, bool, bool) = bounded(bound, async {
            let rows = send(
                &self.prepared,
                self.key,
                "check",
                &self.client,
                &candidates.sql(CHECK),
                &params,
            )
            .await?;
            match rows.first() {
                Some(row) => Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)),
                // A SELECT without FROM always returns one row.
                None => Ok((false, false, false)),
            }
        })
        .await?;
        Ok((Check::of(ours_alone, holds), candidates))
    }

    /// Gives the lock up gracefully, marking the session it hands the lock to (see
    /// [`handover`]).
    pub(crate) async fn unlock(&self, bound: Duration) -> Result<Unlocked, SessionError> {
        bounded(bound, handover::unlock(&self.client, self.key)).await
    }

    /// This grant's mark on the server session, which every statement of a shard member's
    /// session checks before it takes a lock.
    pub(crate) fn mark(&self) -> &str {
        &self.mark
    }

    /// The client of the lock session, for the fencing bump.
    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Whether the connection has closed. tokio-postgres notices a FIN or RST as soon as
    /// it arrives, because its connection task always reads; the client only exposes that as a
    /// flag, which the leader polls every [`WATCH_POLL`](super::WATCH_POLL).
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}
