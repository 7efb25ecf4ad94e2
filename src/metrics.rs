//! The leader gauge (E12).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Opts, Registry};

use crate::Error;

/// The gauge's default name.
pub const DEFAULT_GAUGE_NAME: &str = "pg_elector_leader";

const HELP: &str = "1 while this replica leads the pg-elector election, 0 otherwise.";

/// Where the leader gauge goes, as the builders collect it.
#[derive(Debug, Clone)]
pub(crate) struct GaugeSpec {
    pub(crate) registry: Option<Registry>,
    pub(crate) name: String,
}

impl Default for GaugeSpec {
    fn default() -> Self {
        Self {
            registry: None,
            name: DEFAULT_GAUGE_NAME.to_owned(),
        }
    }
}

impl GaugeSpec {
    /// The gauge, registered; `None` without a registry.
    pub(crate) fn register(&self) -> Result<Option<LeaderGauge>, Error> {
        self.registry
            .as_ref()
            .map(|registry| LeaderGauge::register(registry, &self.name))
            .transpose()
    }
}

/// This elector's share of the leader gauge.
///
/// Electors that are given the same registry and name share one gauge, which counts the
/// electors of this process that lead; so summed over the replicas it is 1 in steady state.
#[derive(Debug)]
pub(crate) struct LeaderGauge {
    gauge: IntGauge,
    leading: AtomicBool,
}

impl LeaderGauge {
    /// Registers the gauge in `registry`, or joins the one an earlier elector registered there.
    pub(crate) fn register(registry: &Registry, name: &str) -> Result<Self, Error> {
        let gauge = IntGauge::with_opts(Opts::new(name, HELP)).map_err(Error::Metric)?;
        let gauge = match registry.register(Box::new(SharedGauge(gauge.clone()))) {
            Ok(()) => gauge,
            Err(prometheus::Error::AlreadyReg) => {
                find_registered(registry, name).ok_or_else(|| Error::MetricClash {
                    name: name.to_owned(),
                })?
            }
            Err(e) => return Err(Error::Metric(e)),
        };
        Ok(Self {
            gauge,
            leading: AtomicBool::new(false),
        })
    }

    /// Records whether this elector leads; idempotent.
    pub(crate) fn set(&self, leading: bool) {
        if self.leading.swap(leading, Ordering::AcqRel) != leading {
            if leading {
                self.gauge.inc();
            } else {
                self.gauge.dec();
            }
        }
    }
}

impl Drop for LeaderGauge {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// The gauge as registered: a collector that can be found again in a registry.
struct SharedGauge(IntGauge);

thread_local! {
    /// Set while `find_registered` gathers a registry: the name looked for, and the gauge of
    /// that name once its collector has been collected.
    static SEARCH: RefCell<Option<(String, Option<IntGauge>)>> = const { RefCell::new(None) };
}

impl Collector for SharedGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        SEARCH.with(|search| {
            if let Some((name, found)) = search.borrow_mut().as_mut() {
                if self.0.desc().first().is_some_and(|d| d.fq_name == *name) {
                    *found = Some(self.0.clone());
                }
            }
        });
        self.0.collect()
    }
}

/// The shared gauge registered under `name`, if the collector there is one of ours.
///
/// prometheus' `AlreadyReg` does not hand back the registered collector, so we gather the
/// registry once, on this thread, and let our own collector say who it is.
fn find_registered(registry: &Registry, name: &str) -> Option<IntGauge> {
    SEARCH.with(|search| *search.borrow_mut() = Some((name.to_owned(), None)));
    let _ = registry.gather();
    SEARCH.with(|search| search.borrow_mut().take().and_then(|(_, found)| found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(registry: &Registry, name: &str) -> Option<i64> {
        registry
            .gather()
            .iter()
            .find(|family| family.name() == name)
            .map(|family| family.get_metric()[0].get_gauge().value() as i64)
    }

    #[test]
    fn two_electors_on_one_registry_write_one_series() {
        let registry = Registry::new();
        let a = LeaderGauge::register(&registry, DEFAULT_GAUGE_NAME).unwrap();
        let b = LeaderGauge::register(&registry, DEFAULT_GAUGE_NAME).unwrap();
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME), Some(0));
        a.set(true);
        a.set(true);
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME), Some(1));
        b.set(false);
        assert_eq!(
            value(&registry, DEFAULT_GAUGE_NAME),
            Some(1),
            "a standby leaves it be"
        );
        a.set(false);
        b.set(true);
        assert_eq!(value(&registry, DEFAULT_GAUGE_NAME), Some(1));
        drop(b);
        assert_eq!(
            value(&registry, DEFAULT_GAUGE_NAME),
            Some(0),
            "a dropped elector leads no more"
        );
        assert_eq!(registry.gather().len(), 1);
    }

    #[test]
    fn separate_registries_do_not_share() {
        let (r1, r2) = (Registry::new(), Registry::new());
        let a = LeaderGauge::register(&r1, "g").unwrap();
        let _b = LeaderGauge::register(&r2, "g").unwrap();
        a.set(true);
        assert_eq!(value(&r1, "g"), Some(1));
        assert_eq!(value(&r2, "g"), Some(0));
    }

    #[test]
    fn a_foreign_collector_of_the_same_name_is_a_clash() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("jobs", HELP).unwrap();
        registry.register(Box::new(counter)).unwrap();
        match LeaderGauge::register(&registry, "jobs") {
            Err(Error::MetricClash { name }) => assert_eq!(name, "jobs"),
            other => panic!("expected a clash, got {other:?}"),
        }
        let other_help = prometheus::IntCounter::new("runs", "other help").unwrap();
        registry.register(Box::new(other_help)).unwrap();
        assert!(
            matches!(
                LeaderGauge::register(&registry, "runs"),
                Err(Error::MetricClash { .. })
            ),
            "a counter of the same name with other help text"
        );
        assert!(matches!(
            LeaderGauge::register(&registry, "bad name!"),
            Err(Error::Metric(_))
        ));
    }
}
