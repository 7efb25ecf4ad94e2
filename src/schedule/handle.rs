//! [`ScheduleHandle`]: a schedule's jobs triggered or rescheduled from any replica, through
//! the job tables.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::Pool;

use super::context::on_connection;
use super::store::Store;
use super::{Job, ScheduleError};

/// Triggers or reschedules a schedule's jobs, from any replica (a standby's request reaches
/// the leader at its next poll of the job's row); made by [`Schedule::handle`](super::Schedule::handle).
#[derive(Clone)]
pub struct ScheduleHandle {
    pub(super) pool: Pool,
    pub(super) namespace: String,
    pub(super) schema: Option<String>,
    pub(super) prefix: String,
    pub(super) wait: Duration,
}

impl ScheduleHandle {
    fn store(&self) -> Result<Store, ScheduleError> {
        Store::new(self.schema.as_deref(), &self.prefix)
    }

    /// One call of the handle, borrow and statement together, bounded by the handle's wait: a
    /// connection whose answer did not come in time is closed (behind a partition the next
    /// call would wait on it in vain).
    async fn call(
        &self,
        statement: impl AsyncFnOnce(&Store, &tokio_postgres::Client) -> Result<bool, ScheduleError>,
    ) -> Result<bool, ScheduleError> {
        let store = self.store()?;
        on_connection(&self.pool, self.wait, self.wait, async |client| {
            statement(&store, client).await
        })
        .await
    }

    /// Asks the leader to run `job` now, once, besides its schedule (recorded as a
    /// `triggered` run).
    ///
    /// The whole call (the pool borrow and the statement) takes at most the handle's wait:
    /// the schedule's [poll interval](super::Schedule::poll_interval), at least 1 s.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownJob`] when no leader registered the job yet;
    /// [`ScheduleError::Timeout`] when the answer did not come within the handle's wait (a
    /// partition, a server that does not answer: the request may still have reached the
    /// server; the connection is closed, not given back to the pool);
    /// [`ScheduleError::PoolTimeout`] when the pool had no connection within it; a database
    /// error.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it was sent, nothing happens; after, the request stands.
    pub async fn trigger(&self, job: &str) -> Result<(), ScheduleError> {
        let known = self
            .call(async |store, client| store.trigger(client, &self.namespace, job).await)
            .await?;
        known_job(known, job)
    }

    /// Changes `job`'s schedule to `schedule`'s (the name is the job's), from its next due
    /// on; its history is kept. The change lasts until a deploy registers another schedule in
    /// code.
    ///
    /// The whole call (the pool borrow and the statement) takes at most the handle's wait:
    /// the schedule's [poll interval](super::Schedule::poll_interval), at least 1 s.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownJob`] when no leader registered the job yet;
    /// [`ScheduleError::Timeout`] when the answer did not come within the handle's wait (a
    /// partition, a server that does not answer: the change may still have reached the
    /// server; the connection is closed, not given back to the pool);
    /// [`ScheduleError::PoolTimeout`] when the pool had no connection within it; a database
    /// error.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it was sent, nothing changes; after, the change stands.
    pub async fn reschedule(&self, job: &str, schedule: &Job) -> Result<(), ScheduleError> {
        let spec = schedule.schedule();
        let known = self
            .call(async |store, client| store.reschedule(client, &self.namespace, job, &spec).await)
            .await?;
        known_job(known, job)
    }
}

/// `UnknownJob` when the statement found no row for `job`.
fn known_job(known: bool, job: &str) -> Result<(), ScheduleError> {
    match known {
        true => Ok(()),
        false => Err(ScheduleError::UnknownJob {
            job: job.to_owned(),
        }),
    }
}

impl fmt::Debug for ScheduleHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduleHandle")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}
