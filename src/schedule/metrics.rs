//! With the `prometheus` and `schedule` features: the series of a schedule's jobs, shared by
//! the schedules given the same registry.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::plan::SkipReason;
use crate::Error;
use crate::metrics::register_shared;

/// The counter of a scheduled job's due runs that did not run, by `job` and `reason` (a
/// [`SkipReason`]'s label).
const JOB_SKIPPED_NAME: &str = "pg_elector_job_skipped_total";

/// The metrics of a schedule's jobs.
#[derive(Debug, Clone)]
pub(crate) struct JobMetrics {
    runs: IntCounterVec,
    last_success: prometheus::GaugeVec,
    duration: HistogramVec,
    skipped: IntCounterVec,
}

impl JobMetrics {
    pub(crate) fn register(registry: &Registry) -> Result<Self, Error> {
        Ok(Self {
            runs: register_shared(
                registry,
                "pg_elector_job_runs_total",
                IntCounterVec::new(
                    Opts::new(
                        "pg_elector_job_runs_total",
                        "Runs of scheduled jobs by outcome.",
                    ),
                    &["job", "outcome"],
                ),
            )?,
            last_success: register_shared(
                registry,
                "pg_elector_job_last_success_timestamp_seconds",
                prometheus::GaugeVec::new(
                    Opts::new(
                        "pg_elector_job_last_success_timestamp_seconds",
                        "When each scheduled job last succeeded on this replica (UNIX time).",
                    ),
                    &["job"],
                ),
            )?,
            duration: register_shared(
                registry,
                "pg_elector_job_duration_seconds",
                HistogramVec::new(
                    HistogramOpts::new(
                        "pg_elector_job_duration_seconds",
                        "How long each scheduled job's runs took.",
                    ),
                    &["job"],
                ),
            )?,
            skipped: register_shared(
                registry,
                JOB_SKIPPED_NAME,
                IntCounterVec::new(
                    Opts::new(
                        JOB_SKIPPED_NAME,
                        "Due runs of scheduled jobs that did not run, by reason.",
                    ),
                    &["job", "reason"],
                ),
            )?,
        })
    }

    /// Makes `job`'s skipped series, at 0 for every reason, so that an alert on their
    /// increase sees the first skip.
    pub(crate) fn add_job(&self, job: &str) {
        for reason in SkipReason::ALL {
            self.skipped.with_label_values(&[job, reason.as_str()]);
        }
    }

    /// `dues` due runs of `job` that did not run, for `reason`.
    pub(crate) fn skipped(&self, job: &str, reason: SkipReason, dues: u64) {
        self.skipped
            .with_label_values(&[job, reason.as_str()])
            .inc_by(dues);
    }

    /// One run's outcome (`succeeded`, `failed`, `abandoned`) and, if it ran, its duration.
    pub(crate) fn record(&self, job: &str, outcome: &str, took: Option<Duration>) {
        self.runs.with_label_values(&[job, outcome]).inc();
        if outcome == "succeeded" {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.last_success.with_label_values(&[job]).set(now);
        }
        if let Some(took) = took {
            self.duration
                .with_label_values(&[job])
                .observe(took.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_schedules_on_one_registry_count_skipped_dues_in_one_series() {
        let registry = Registry::new();
        let a = JobMetrics::register(&registry).unwrap();
        let b = JobMetrics::register(&registry).unwrap();
        a.add_job("report");
        let value = |reason: &str| {
            registry
                .gather()
                .iter()
                .find(|f| f.name() == JOB_SKIPPED_NAME)
                .and_then(|f| {
                    f.get_metric()
                        .iter()
                        .find(|m| {
                            m.get_label().iter().any(|l| l.value() == "report")
                                && m.get_label().iter().any(|l| l.value() == reason)
                        })
                        .map(|m| m.get_counter().value() as u64)
                })
        };
        for reason in SkipReason::ALL {
            assert_eq!(value(reason.as_str()), Some(0), "{reason}: made at 0");
        }
        a.skipped("report", SkipReason::CatchUp, 3);
        b.skipped("report", SkipReason::CatchUp, 2);
        b.skipped("report", SkipReason::Halted, 1);
        assert_eq!(value("catch_up"), Some(5), "one series for both schedules");
        assert_eq!(value("halted"), Some(1));
        assert_eq!(value("abandoned"), Some(0));
    }
}
