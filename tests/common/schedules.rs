//! Helpers of the schedule tests (`schedule`, `schedule_failover`, `schedule_hardening`): the
//! type of a boxed job body, a schedule on a manual elector as its own task, a first run cut
//! off at the end of its term, and the stored runs of a job.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pg_elector::schedule::{JobRun, Schedule, ScheduleError};
use pg_elector::{Elector, ManualControl};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use super::capture::Capture;
use super::wait_for;

/// What a job body returns: one run, boxed.
pub type BoxedRun = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A job body that can be shared and chosen at run time.
pub type Body = Arc<dyn Fn(JobRun) -> BoxedRun + Send + Sync>;

/// What a schedule says when a run outlived the grace its term's end gave it.
const CUT_OFF: &str = "job runs still going after the term ended";

/// A schedule on a manual elector, as its own task.
pub struct ManualSchedule {
    /// Promotes and demotes the elector the schedule was made on.
    pub control: ManualControl,
    /// The schedule's shutdown.
    pub shutdown: CancellationToken,
    /// The schedule's `run`.
    pub task: JoinHandle<Result<(), ScheduleError>>,
}

impl ManualSchedule {
    /// Runs `schedule` as a task, its events going to the test's subscriber; `control` steers
    /// the manual elector it was made on.
    pub fn spawn(control: ManualControl, schedule: Schedule) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(schedule.run(shutdown.clone()));
        Self {
            control,
            shutdown,
            task,
        }
    }

    /// Like [`ManualSchedule::spawn`], with every event of the schedule recorded in `capture`.
    pub fn spawn_captured(control: ManualControl, schedule: Schedule, capture: &Capture) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            schedule
                .run(shutdown.clone())
                .with_subscriber(capture.dispatch()),
        );
        Self {
            control,
            shutdown,
            task,
        }
    }

    /// Cancels the shutdown token and waits for `run` to return `Ok`.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }

    /// A first run cut off at the end of its term: promotes the elector, waits up to `within`
    /// for the first entry of `starts` (or panics saying `first`, see [`first_start`]), demotes,
    /// and waits up to 5 s for the schedule to say in `capture` that the run outlived its grace
    /// (or panics saying `cut_off`). Returns the first entry.
    pub async fn cut_off_first_run<T: Clone>(
        &self,
        starts: &Mutex<Vec<T>>,
        capture: &Capture,
        within: Duration,
        first: &str,
        cut_off: &str,
    ) -> T {
        self.control.promote();
        let started = first_start(starts, within, first).await;
        self.control.demote();
        // The schedule waits for its runs at least the elector's drain timeout after a term
        // ends (a local elector's: 5 s) before it cuts them off; 3 s of slack on top.
        let grace = Elector::manual().0.drain_timeout();
        capture
            .logged(CUT_OFF, grace + Duration::from_secs(3))
            .await
            .expect(cut_off);
        started
    }

    /// [`ManualSchedule::cut_off_first_run`] (its first run waited for up to `within`), then the
    /// next term: promotes the elector again. Returns the cut-off run's entry in `starts`.
    pub async fn cut_off_first_run_then_promote<T: Clone>(
        &self,
        starts: &Mutex<Vec<T>>,
        capture: &Capture,
        within: Duration,
    ) -> T {
        let first = self
            .cut_off_first_run(
                starts,
                capture,
                within,
                "a first run",
                "the run is cut off after its grace",
            )
            .await;
        self.control.promote();
        first
    }
}

/// Waits up to `within` for a job body to push its first start to `starts`, or panics saying
/// `expect`; returns that start.
pub async fn first_start<T: Clone>(starts: &Mutex<Vec<T>>, within: Duration, expect: &str) -> T {
    wait_for(within, || !starts.lock().unwrap().is_empty())
        .await
        .expect(expect);
    starts.lock().unwrap()[0].clone()
}

/// `(due, attempt, kind, outcome, claimed_by)` of every stored run of `job`, oldest first.
pub async fn stored_runs(
    client: &tokio_postgres::Client,
    job: &str,
) -> Vec<(SystemTime, i32, String, String, String)> {
    client
        .query(
            "SELECT due, attempt, kind, outcome, claimed_by FROM pg_elector_job_runs \
             WHERE job = $1 ORDER BY due, attempt",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}
