//! With the `prometheus` feature: the series, registered once per registry and shared by the
//! electors, groups and schedules given the same one.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::{
    CHANGES_NAME, CHECK_DURATION_NAME, Change, DEFAULT_GAUGE_NAME, EPOCH_NAME, SHARD_MOVES_NAME,
    SHARDS_HELD_UNOWNED_NAME, SHARDS_OWNED_NAME,
};
use crate::{BuildError, Error};

const GAUGE_HELP: &str =
    "1 while this replica leads the pg-elector election for the key, 0 otherwise.";
const CHANGES_HELP: &str = "Leadership changes of this replica, by key and cause.";
const CHECK_HELP: &str = "How long the leader's checks of its lock session took, by key.";
const EPOCH_HELP: &str = "The fencing epoch of this replica's latest term, by key (with fencing).";

/// Where the metrics go, as the builders collect it.
#[derive(Debug, Clone)]
pub(crate) struct MetricsSpec {
    pub(crate) registry: Option<Registry>,
    pub(crate) gauge_name: String,
}

impl Default for MetricsSpec {
    fn default() -> Self {
        Self {
            registry: None,
            gauge_name: DEFAULT_GAUGE_NAME.to_owned(),
        }
    }
}

impl MetricsSpec {
    /// The metrics of one elector for `key` (its label), registered; `None` without a
    /// registry.
    pub(crate) fn register(&self, key: &str) -> Result<Option<Metrics>, Error> {
        let Some(registry) = &self.registry else {
            return Ok(None);
        };
        let gauge: IntGaugeVec = register_shared(
            registry,
            &self.gauge_name,
            IntGaugeVec::new(Opts::new(&self.gauge_name, GAUGE_HELP), &["key"]),
        )?;
        let changes: IntCounterVec = register_shared(
            registry,
            CHANGES_NAME,
            IntCounterVec::new(Opts::new(CHANGES_NAME, CHANGES_HELP), &["key", "cause"]),
        )?;
        let checks: HistogramVec = register_shared(
            registry,
            CHECK_DURATION_NAME,
            HistogramVec::new(
                HistogramOpts::new(CHECK_DURATION_NAME, CHECK_HELP),
                &["key"],
            ),
        )?;
        let epochs: IntGaugeVec = register_shared(
            registry,
            EPOCH_NAME,
            IntGaugeVec::new(Opts::new(EPOCH_NAME, EPOCH_HELP), &["key"]),
        )?;
        Ok(Some(Metrics {
            leader: gauge.with_label_values(&[key]),
            leading: AtomicBool::new(false),
            changes,
            checks: checks.with_label_values(&[key]),
            epoch: epochs.with_label_values(&[key]),
            key: key.to_owned(),
        }))
    }
}

/// One elector's series.
///
/// Electors of one process given the same registry share the collectors; the gauge's
/// series for a key counts the electors of this process that lead for it (0 or 1), so
/// summed over the replicas it is 1 per key in steady state.
#[derive(Debug)]
pub(crate) struct Metrics {
    leader: IntGauge,
    leading: AtomicBool,
    changes: IntCounterVec,
    checks: Histogram,
    epoch: IntGauge,
    key: String,
}

impl Metrics {
    /// Records whether this elector leads; idempotent.
    pub(crate) fn set_leading(&self, leading: bool) {
        if self.leading.swap(leading, Ordering::AcqRel) != leading {
            if leading {
                self.leader.inc();
            } else {
                self.leader.dec();
            }
        }
    }

    pub(crate) fn count(&self, change: Change) {
        self.changes
            .with_label_values(&[self.key.as_str(), change.label()])
            .inc();
    }

    pub(crate) fn observe_check(&self, took: Duration) {
        self.checks.observe(took.as_secs_f64());
    }

    /// The epoch of the term this replica just began.
    pub(crate) fn set_epoch(&self, epoch: u64) {
        self.epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.set_leading(false);
    }
}

/// A group of shards' series on this replica.
#[derive(Debug)]
pub(crate) struct ShardMetrics {
    owned: IntGauge,
    held_unowned: IntGauge,
    moves: IntCounterVec,
    group: String,
}

impl ShardMetrics {
    pub(crate) fn register(registry: &Registry, group: &str) -> Result<Self, Error> {
        let owned: IntGaugeVec = register_shared(
            registry,
            SHARDS_OWNED_NAME,
            IntGaugeVec::new(
                Opts::new(SHARDS_OWNED_NAME, "Shards of the group this replica owns."),
                &["group"],
            ),
        )?;
        let held_unowned: IntGaugeVec = register_shared(
            registry,
            SHARDS_HELD_UNOWNED_NAME,
            IntGaugeVec::new(
                Opts::new(
                    SHARDS_HELD_UNOWNED_NAME,
                    "Shards of the group this replica holds locked but does not own: their terms could not start, most often because an older term's open fenced transaction holds their epoch rows.",
                ),
                &["group"],
            ),
        )?;
        let moves: IntCounterVec = register_shared(
            registry,
            SHARD_MOVES_NAME,
            IntCounterVec::new(
                Opts::new(
                    SHARD_MOVES_NAME,
                    "Shards this replica gained or gave up, by group and cause.",
                ),
                &["group", "cause"],
            ),
        )?;
        Ok(Self {
            owned: owned.with_label_values(&[group]),
            held_unowned: held_unowned.with_label_values(&[group]),
            moves,
            group: group.to_owned(),
        })
    }

    pub(crate) fn set_owned(&self, owned: usize) {
        self.owned.set(i64::try_from(owned).unwrap_or(i64::MAX));
    }

    /// The shards this replica holds locked whose terms could not start.
    pub(crate) fn set_held_unowned(&self, shards: usize) {
        self.held_unowned
            .set(i64::try_from(shards).unwrap_or(i64::MAX));
    }

    /// `shards` shards gained or given up for `cause` (`gained`, `moved`, `released`, or
    /// a [`LossCause`](crate::LossCause)'s label).
    pub(crate) fn count_move(&self, cause: &str, shards: usize) {
        self.moves
            .with_label_values(&[self.group.as_str(), cause])
            .inc_by(shards as u64);
    }
}

/// Registers `made` under `name`, or finds the collector of ours an earlier elector
/// registered there.
pub(crate) fn register_shared<C>(
    registry: &Registry,
    name: &str,
    made: prometheus::Result<C>,
) -> Result<C, BuildError>
where
    C: Collector + Clone + 'static,
{
    let collector = made.map_err(BuildError::Metric)?;
    match registry.register(Box::new(Shared(collector.clone()))) {
        Ok(()) => Ok(collector),
        Err(prometheus::Error::AlreadyReg) => {
            find_registered(registry, name).ok_or_else(|| BuildError::MetricClash {
                name: name.to_owned(),
            })
        }
        Err(e) => Err(BuildError::Metric(e)),
    }
}

/// A collector as registered: one that can be found again in a registry.
struct Shared<C>(C);

/// While `find_registered` gathers a registry: the name looked for, and the collector of
/// that name once it has been collected.
type Search = Option<(String, Option<Box<dyn Any>>)>;

thread_local! {
    static SEARCH: RefCell<Search> = const { RefCell::new(None) };
}

impl<C: Collector + Clone + 'static> Collector for Shared<C> {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        SEARCH.with(|search| {
            if let Some((name, found)) = search.borrow_mut().as_mut() {
                if self.0.desc().first().is_some_and(|d| d.fq_name == *name) {
                    *found = Some(Box::new(self.0.clone()));
                }
            }
        });
        self.0.collect()
    }
}

/// The collector of ours registered under `name`, if it is one (of type `C`).
///
/// prometheus' `AlreadyReg` does not hand back the registered collector, so we gather the
/// registry once, on this thread, and let our own collector say who it is.
fn find_registered<C: 'static>(registry: &Registry, name: &str) -> Option<C> {
    SEARCH.with(|search| *search.borrow_mut() = Some((name.to_owned(), None)));
    let _ = registry.gather();
    SEARCH
        .with(|search| search.borrow_mut().take())
        .and_then(|(_, found)| found)
        .and_then(|found| found.downcast::<C>().ok())
        .map(|found| *found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(registry: &Registry, name: &str) -> MetricsSpec {
        MetricsSpec {
            registry: Some(registry.clone()),
            gauge_name: name.to_owned(),
        }
    }

    /// The gauge's value for `key`.
    fn value(registry: &Registry, name: &str, key: &str) -> Option<i64> {
        registry
            .gather()
            .iter()
            .find(|family| family.name() == name)?
            .get_metric()
            .iter()
            .find(|m| m.get_label().iter().any(|l| l.value() == key))
            .map(|m| m.get_gauge().value() as i64)
    }

    #[test]
    fn two_electors_on_one_registry_write_one_series_per_key() {
        let registry = Registry::new();
        let a = spec(&registry, DEFAULT_GAUGE_NAME)
            .register("1:1")
            .unwrap()
            .unwrap();
        let b = spec(&registry, DEFAULT_GAUGE_NAME)
            .register("1:1")
            .unwrap()
            .unwrap();
        let other = spec(&registry, DEFAULT_GAUGE_NAME)
            .register("1:2")
            .unwrap()
            .unwrap();
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME, "1:1"), Some(0));
        a.set_leading(true);
        a.set_leading(true);
        other.set_leading(true);
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME, "1:1"), Some(1));
        assert_eq!(
            value(&registry, DEFAULT_GAUGE_NAME, "1:2"),
            Some(1),
            "a key of its own"
        );
        b.set_leading(false);
        assert_eq!(
            value(&registry, DEFAULT_GAUGE_NAME, "1:1"),
            Some(1),
            "a standby leaves it be"
        );
        a.set_leading(false);
        b.set_leading(true);
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME, "1:1"), Some(1));
        drop(b);
        assert_eq!(
            value(&registry, DEFAULT_GAUGE_NAME, "1:1"),
            Some(0),
            "a dropped elector leads no more"
        );
        a.count(Change::Acquired);
        a.observe_check(Duration::from_millis(3));
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                CHECK_DURATION_NAME,
                EPOCH_NAME,
                DEFAULT_GAUGE_NAME,
                CHANGES_NAME
            ]
        );
    }

    #[test]
    fn separate_registries_do_not_share() {
        let (r1, r2) = (Registry::new(), Registry::new());
        let a = spec(&r1, "g").register("k").unwrap().unwrap();
        let _b = spec(&r2, "g").register("k").unwrap().unwrap();
        a.set_leading(true);
        assert_eq!(value(&r1, "g", "k"), Some(1));
        assert_eq!(value(&r2, "g", "k"), Some(0));
    }

    #[test]
    fn a_foreign_collector_of_the_same_name_is_a_clash() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("jobs", GAUGE_HELP).unwrap();
        registry.register(Box::new(counter)).unwrap();
        match spec(&registry, "jobs").register("k") {
            Err(Error::Build(BuildError::MetricClash { name })) => assert_eq!(name, "jobs"),
            other => panic!("expected a clash, got {other:?}"),
        }
        let foreign = IntGaugeVec::new(Opts::new("mine", GAUGE_HELP), &["key"]).unwrap();
        registry.register(Box::new(foreign)).unwrap();
        assert!(
            matches!(
                spec(&registry, "mine").register("k"),
                Err(Error::Build(BuildError::MetricClash { .. }))
            ),
            "the application's own gauge of the same shape is not ours"
        );
        assert!(matches!(
            spec(&registry, "bad name!").register("k"),
            Err(Error::Build(BuildError::Metric(_)))
        ));
    }
}
