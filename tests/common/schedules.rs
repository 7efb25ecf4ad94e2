//! Helpers of the schedule tests (`schedule`, `schedule_failover`, `schedule_hardening`): the
//! type of a boxed job body, a schedule on a manual elector as its own task, and a first run
//! cut off at the end of its term.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

/// Waits up to `within` for a job body to push its first start to `starts`, or panics saying
/// `expect`; returns that start.
pub async fn first_start<T: Clone>(starts: &Mutex<Vec<T>>, within: Duration, expect: &str) -> T {
    wait_for(within, || !starts.lock().unwrap().is_empty())
        .await
        .expect(expect);
    starts.lock().unwrap()[0].clone()
}
