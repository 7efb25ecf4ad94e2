//! Building a group of [`Shards`]: the elector's options that apply, over the elector's own
//! builder, so that both check a configuration the same way.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;

use super::Shards;
use super::assign::MAX_SHARDS;
use super::group::{Inner, MEMBER_OBJECT, group_class};
use crate::elector::{Elector, Mode};
use crate::{ElectorBuilder, Error, LockKey};

/// Configures a group of [`Shards`]; made by [`Shards::builder`].
///
/// ```
/// use std::time::Duration;
/// use pg_elector::shards::Shards;
///
/// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
/// let shards = Shards::builder(pool, "billing/tenants", 64)
///     .check_interval(Duration::from_secs(1))
///     .identity("billing-7f9c")
///     .fencing(true)
///     .build()?;
/// assert_eq!(shards.count(), 64);
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug)]
pub struct ShardsBuilder {
    group: String,
    count: u32,
    /// The membership's settings, checked as an elector's are.
    member: ElectorBuilder,
    #[cfg(feature = "prometheus")]
    registry: Option<prometheus::Registry>,
}

impl ShardsBuilder {
    pub(crate) fn new(pool: Pool, group: String, count: u32) -> Self {
        let class = group_class(&group);
        Self {
            member: ElectorBuilder::new(pool, LockKey::new(class, MEMBER_OBJECT)),
            group,
            count,
            #[cfg(feature = "prometheus")]
            registry: None,
        }
    }

    /// The interval I (default 5 s; zero means the default), as
    /// [`ElectorBuilder::check_interval`]: the member checks its session, and tries the shards
    /// it should own, every I.
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.member = self.member.check_interval(every);
        self
    }

    /// Who this replica is, as [`ElectorBuilder::identity`]: the lock session's
    /// `application_name` and the epoch rows' holder. Two members may share one.
    pub fn identity(mut self, name: impl Into<String>) -> Self {
        self.member = self.member.identity(name);
        self
    }

    /// Fencing epochs per shard (default off), as [`ElectorBuilder::fencing`]: one epoch row
    /// per shard key, bumped when a member gains the shard, so that
    /// [`Term::fence`](crate::Term::fence) refuses the writes of a shard's old owner once its
    /// new owner's term began. The shards a member gains are bumped in one statement; a
    /// shard whose row an open fenced transaction of its old owner holds is skipped (not
    /// waited for, unlike a single elector's bump) and its term starts at the first check
    /// after that transaction ends.
    pub fn fencing(mut self, on: bool) -> Self {
        self.member = self.member.fencing(on);
        self
    }

    /// The epoch table, as [`ElectorBuilder::fencing_table`]. Turns fencing on.
    pub fn fencing_table(mut self, schema: Option<&str>, table: &str) -> Self {
        self.member = self.member.fencing_table(schema, table);
        self
    }

    /// How long a shard that moves (or every shard, at shutdown) waits for its work still
    /// running before it is unlocked: `do_work` calls and while-leader loops on it. Default:
    /// one check interval.
    pub fn drain_timeout(mut self, limit: Duration) -> Self {
        self.member = self.member.drain_timeout(limit);
        self
    }

    /// Registers the group's metrics in `registry`: `pg_elector_shards_owned` (a gauge by
    /// `group`) and `pg_elector_shard_moves_total` (a counter by `group` and `cause`:
    /// `gained`, `moved` for a shard handed to another member, `released` at shutdown, or the
    /// cause of a lost session such as `connection_closed`). Default: no metrics.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &prometheus::Registry) -> Self {
        self.registry = Some(registry.clone());
        self
    }

    /// Checks the configuration and makes the group's handle. It does nothing until
    /// [`Shards::run`] is called.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidShardCount`](crate::BuildError::InvalidShardCount) for a count of 0 or above 16 384, and every error of
    /// [`ElectorBuilder::build`] for the options shared with it.
    pub fn build(self) -> Result<Shards, Error> {
        if self.count == 0 || self.count > MAX_SHARDS {
            return Err(crate::BuildError::InvalidShardCount {
                count: self.count,
                max: MAX_SHARDS,
            }
            .into());
        }
        let member = self.member.build()?;
        let Some(pg) = member.pg() else {
            unreachable!("an elector built on a pool runs on PostgreSQL");
        };
        let class = pg.key.class();
        let shards = (0..self.count)
            .map(|i| {
                let key = LockKey::new(class, i as i32);
                Elector::from_mode(Mode::Shard(pg.for_key(key), member.shared.clone()), None)
            })
            .collect();
        #[cfg(feature = "prometheus")]
        let metrics = match &self.registry {
            Some(registry) => Some(crate::metrics::ShardMetrics::register(
                registry,
                &self.group,
            )?),
            None => None,
        };
        #[cfg(not(feature = "prometheus"))]
        let metrics = None;
        Ok(Shards {
            inner: Arc::new(Inner {
                group: self.group,
                class,
                member,
                shards,
                ownership: watch::Sender::new(Default::default()),
                metrics,
            }),
        })
    }
}
