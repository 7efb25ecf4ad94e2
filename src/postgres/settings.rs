//! What an election on PostgreSQL runs with, and the bounds that follow from it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use super::candidates::CandidatesTable;
use crate::fence::{FenceTable, FenceTarget};
use crate::key::LockKey;

/// How long the unlock at shutdown may take.
pub(crate) const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// What the election on PostgreSQL runs with.
pub(crate) struct PgSettings {
    pub(crate) pool: Pool,
    pub(crate) key: LockKey,
    pub(crate) interval: Duration,
    /// The lock session's `application_name`, and the epoch row's holder.
    pub(crate) identity: String,
    /// The epoch table, with fencing on.
    pub(crate) fencing: Option<Arc<FenceTable>>,
    /// How long a graceful handover waits for work still running.
    pub(crate) drain_timeout: Duration,
    /// A standby keeps a session waiting for the lock.
    pub(crate) fast_takeover: bool,
    /// The try and the check go as statements prepared once per connection.
    pub(crate) prepared_statements: Option<bool>,
    /// How much this replica prefers to lead; `Some` registers it as a candidate while it
    /// stands by.
    pub(crate) preference: Option<u64>,
    /// The candidates table of preferred leaders.
    pub(crate) candidates: CandidatesTable,
}

impl PgSettings {
    /// The longest a graceful handover takes: the drain, one check while draining (and one
    /// interval for the loop to notice), and the unlock.
    pub(crate) fn handover_bound(&self) -> Duration {
        self.drain_timeout
            .saturating_add(2 * self.interval)
            .saturating_add(RELEASE_BOUND)
    }

    /// The same settings for another key: one shard of a group.
    pub(crate) fn for_key(&self, key: LockKey) -> Self {
        Self {
            pool: self.pool.clone(),
            key,
            interval: self.interval,
            identity: self.identity.clone(),
            fencing: self.fencing.clone(),
            drain_timeout: self.drain_timeout,
            fast_takeover: false,
            prepared_statements: None,
            preference: None,
            candidates: self.candidates.clone(),
        }
    }

    /// This replica's preference; a replica built without one counts as 0.
    pub(crate) fn own_preference(&self) -> u64 {
        self.preference.unwrap_or(0)
    }

    /// Where a term's fenced writes check its epoch; `None` without fencing.
    pub(crate) fn fence_target(&self) -> Option<FenceTarget> {
        self.fencing.as_ref().map(|table| FenceTarget {
            table: table.clone(),
            key: self.key,
        })
    }
}
