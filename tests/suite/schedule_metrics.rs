//! F5: the job metrics on the application's registry: runs by outcome, the last success's
//! time, and the runs' durations.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use common::*;
use pg_elector::Elector;
use pg_elector::schedule::{Job, Schedule};
use prometheus::proto::{Metric, MetricFamily};
use tokio_util::sync::CancellationToken;

/// The family `name`; a vector without series yet is not gathered at all.
fn family(registry: &prometheus::Registry, name: &str) -> Option<MetricFamily> {
    registry.gather().into_iter().find(|f| f.name() == name)
}

/// The series of `family` whose labels are exactly `labels`.
fn series<'a>(family: &'a MetricFamily, labels: &[(&str, &str)]) -> Option<&'a Metric> {
    family.get_metric().iter().find(|m| {
        let mut got: Vec<(&str, &str)> = m
            .get_label()
            .iter()
            .map(|l| (l.name(), l.value()))
            .collect();
        got.sort();
        let mut want = labels.to_vec();
        want.sort();
        got == want
    })
}

fn runs(registry: &prometheus::Registry, outcome: &str) -> u64 {
    family(registry, "pg_elector_job_runs_total")
        .and_then(|f| {
            series(&f, &[("job", "report"), ("outcome", outcome)])
                .map(|m| m.get_counter().value() as u64)
        })
        .unwrap_or(0)
}

/// Job metrics count runs by outcome, time the last success, and the durations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f5_job_metrics_count_outcomes_last_success_and_durations() {
    let _timing = timing();
    let db = fresh_db().await;
    let registry = prometheus::Registry::new();
    let (elector, control) = Elector::manual();
    let calls = Arc::new(AtomicUsize::new(0));
    // A run that fails at once, then one that succeeds after 50 ms, 300 ms apart.
    let schedule = Schedule::new(&elector, db.pool(2))
        .poll_interval(Duration::from_millis(50))
        .registry(&registry)
        .job(Job::every("report", Duration::from_millis(300)), {
            let calls = calls.clone();
            move |_run| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        return Err("upstream unavailable".to_owned());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(())
                }
            }
        });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(schedule.run(shutdown.clone()));
    let before = SystemTime::now();
    control.promote();
    wait_for(Duration::from_secs(3), || {
        runs(&registry, "failed") + runs(&registry, "succeeded") >= 2
    })
    .await
    .expect("two runs within 3 s");
    // Before the next due, 300 ms on: the metrics of exactly these two runs.
    control.demote();
    let after = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(400)).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 2, "two runs");
    assert_eq!(runs(&registry, "failed"), 1, "one failure");
    assert_eq!(runs(&registry, "succeeded"), 1, "one success");
    assert_eq!(runs(&registry, "abandoned"), 0);

    let last = series(
        &family(&registry, "pg_elector_job_last_success_timestamp_seconds").unwrap(),
        &[("job", "report")],
    )
    .expect("a last-success series for the job")
    .get_gauge()
    .value();
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    assert!(
        secs(before) <= last && last <= secs(after),
        "the success's time, {last}, lies within the test's {} .. {}",
        secs(before),
        secs(after)
    );

    let durations = family(&registry, "pg_elector_job_duration_seconds").unwrap();
    let histogram = series(&durations, &[("job", "report")])
        .expect("a duration series for the job")
        .get_histogram();
    assert_eq!(histogram.get_sample_count(), 2, "both runs timed");
    let sum = histogram.get_sample_sum();
    assert!(
        (0.05..1.0).contains(&sum),
        "the failure's few ms and the success's 50 ms: {sum} s"
    );
}
