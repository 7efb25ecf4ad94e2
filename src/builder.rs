//! Building an [`Elector`]: on PostgreSQL, or a local one; both over one set of metrics options.

use std::time::Duration;

use deadpool_postgres::Pool;
#[cfg(feature = "prometheus")]
use prometheus::Registry;

use crate::elector::{Elector, LocalKind, Mode, PgSettings};
use crate::local::{ManualControl, promote};
use crate::metrics::MetricsSpec;
use crate::{Error, LockKey};

/// The default check interval: 5 s.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The smallest check interval `build` accepts.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// The largest check interval `build` accepts: 4 × interval must fit `idle_session_timeout`
/// (at most 2³¹ − 1 ms).
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(i32::MAX as u64 / 4);

/// Configures an [`Elector`]; made by [`Elector::builder`].
///
/// ```
/// use std::time::Duration;
/// use pg_elector::{Elector, LockKey};
///
/// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
/// let registry = prometheus::Registry::new();
/// let elector = Elector::builder(pool, LockKey::new(0x7377_6570, 1))
///     .check_interval(Duration::from_secs(2))
///     .registry(&registry)
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug)]
pub struct ElectorBuilder {
    pool: Pool,
    key: LockKey,
    check_interval: Duration,
    metrics: MetricsSpec,
}

impl ElectorBuilder {
    pub(crate) fn new(pool: Pool, key: LockKey) -> Self {
        Self {
            pool,
            key,
            check_interval: DEFAULT_CHECK_INTERVAL,
            metrics: MetricsSpec::default(),
        }
    }

    /// The one interval I that drives the election (default 5 s; zero means the default).
    ///
    /// A standby tries the lock every I; the leader checks its session every I and each check
    /// may take at most I; the lock session's `idle_session_timeout` is 4·I. Smaller intervals
    /// give faster takeover and cost one query per I per replica.
    ///
    /// [`build`](Self::build) rejects an interval below 10 ms or above 2³¹ − 1 ms / 4.
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.check_interval = if every.is_zero() {
            DEFAULT_CHECK_INTERVAL
        } else {
            every
        };
        self
    }

    /// Registers the elector's metrics in `registry`. Default: no metrics.
    ///
    /// | metric | type | labels |
    /// |---|---|---|
    /// | `pg_elector_leader` (see [`gauge_name`](Self::gauge_name)) | gauge: 1 while this replica leads, else 0 | `key` |
    /// | `pg_elector_leadership_changes_total` | counter of promotions and demotions | `key`, `cause` |
    /// | `pg_elector_check_duration_seconds` | histogram of the leader's checks | `key` |
    ///
    /// `key` is `class:object`. `cause` is `acquired` for a promotion, and for a demotion one of
    /// `released` (shutdown), `connection_closed`, `lease_expired`, `lock_gone`, `pooler`,
    /// `check_timeout`, `check_failed`, `abandoned` (`run` dropped while leading), `demoted`
    /// (a manual elector). Electors given the same registry share the collectors; summed over
    /// the replicas, the gauge is 1 per key in steady state.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &Registry) -> Self {
        self.metrics.registry = Some(registry.clone());
        self
    }

    /// The leader gauge's name (default `pg_elector_leader`), for example
    /// `scheduler_is_leader`.
    #[cfg(feature = "prometheus")]
    pub fn gauge_name(mut self, name: impl Into<String>) -> Self {
        self.metrics.gauge_name = name.into();
        self
    }

    /// Checks the configuration and makes the elector. It does nothing until
    /// [`Elector::run`] is called.
    ///
    /// # Errors
    ///
    /// [`Error::IntervalTooSmall`] and [`Error::IntervalTooLarge`] for an interval out of
    /// range; [`Error::MetricClash`] or [`Error::Metric`] when the registry refuses the gauge.
    pub fn build(self) -> Result<Elector, Error> {
        let interval = self.check_interval;
        if interval < MIN_CHECK_INTERVAL {
            return Err(Error::IntervalTooSmall { interval });
        }
        if interval > MAX_CHECK_INTERVAL {
            return Err(Error::IntervalTooLarge { interval });
        }
        let metrics =
            self.metrics
                .register(&format!("{}:{}", self.key.class(), self.key.object()))?;
        Ok(Elector::from_mode(
            Mode::Postgres(PgSettings {
                pool: self.pool,
                key: self.key,
                interval,
            }),
            metrics,
        ))
    }
}

/// Configures a local elector; made by [`Elector::local_builder`].
#[must_use = "a builder does nothing until it builds"]
#[derive(Debug, Default)]
pub struct LocalBuilder {
    metrics: MetricsSpec,
}

impl LocalBuilder {
    /// Registers the elector's metrics in `registry`, as
    /// [`ElectorBuilder::registry`](crate::ElectorBuilder::registry) does, with the `key` label
    /// `local`. Default: no metrics.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &Registry) -> Self {
        self.metrics.registry = Some(registry.clone());
        self
    }

    /// The leader gauge's name (default `pg_elector_leader`).
    #[cfg(feature = "prometheus")]
    pub fn gauge_name(mut self, name: impl Into<String>) -> Self {
        self.metrics.gauge_name = name.into();
        self
    }

    /// An elector that leads from the start; see [`Elector::always_leader`].
    ///
    /// # Panics
    ///
    /// Never; use [`try_always_leader`](Self::try_always_leader) to see a registry's refusal,
    /// which this method logs and ignores (the elector then has no metrics).
    pub fn always_leader(self) -> Elector {
        let elector = self.build_or_log(LocalKind::AlwaysLeader);
        promote(&elector.shared);
        elector
    }

    /// Like [`always_leader`](Self::always_leader), with the registry's refusal as an error.
    ///
    /// # Errors
    ///
    /// [`Error::MetricClash`] or [`Error::Metric`] when the registry refuses the gauge.
    pub fn try_always_leader(self) -> Result<Elector, Error> {
        let elector = self.build(LocalKind::AlwaysLeader)?;
        promote(&elector.shared);
        Ok(elector)
    }

    /// A standby elector with a [`ManualControl`]; see [`Elector::manual`].
    pub fn manual(self) -> (Elector, ManualControl) {
        let elector = self.build_or_log(LocalKind::Manual);
        let control = ManualControl {
            elector: elector.clone(),
        };
        (elector, control)
    }

    fn build(self, kind: LocalKind) -> Result<Elector, Error> {
        let metrics = self.metrics.register("local")?;
        Ok(Elector::from_mode(Mode::Local(kind), metrics))
    }

    fn build_or_log(self, kind: LocalKind) -> Elector {
        self.build(kind).unwrap_or_else(|e| {
            tracing::error!(error = %e, "local elector built without its metrics");
            Elector::from_mode(Mode::Local(kind), None)
        })
    }
}
