//! Helpers of the schedule tests (`schedule`, `schedule_failover`, `schedule_hardening`,
//! `schedule_partial`): the type of a boxed job body, a body that records its starts, a
//! schedule on a manual elector as its own task, a first run cut off at the end of its term,
//! slow claim commits, and the stored runs of a job.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use pg_elector::schedule::{Job, JobRun, RunKind, Schedule, ScheduleError};
use pg_elector::{Elector, ManualControl};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use super::capture::Capture;
use super::{TestDb, wait_for};

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

/// One run as its body saw it: the replica, the due, the attempt, the kind, when it started.
pub type Started = (&'static str, SystemTime, u32, RunKind, Instant);

/// The runs started so far, in order.
pub type Starts = Arc<Mutex<Vec<Started>>>;

/// A job body that says when it starts and then works for `lasts(n)`, `n` counting the runs
/// started so far on every replica.
pub fn working(
    replica: &'static str,
    starts: &Starts,
    lasts: impl Fn(usize) -> Duration + Send + Sync + 'static,
) -> Body {
    let starts = starts.clone();
    Arc::new(move |run: JobRun| {
        let n = {
            let mut starts = starts.lock().unwrap();
            starts.push((replica, run.due, run.attempt, run.kind, Instant::now()));
            starts.len() - 1
        };
        let lasts = lasts(n);
        Box::pin(async move {
            tokio::time::sleep(lasts).await;
            Ok(())
        })
    })
}

/// `(replica, attempt, kind)` of every run of `due` started so far, in order.
pub fn started_for(starts: &Starts, due: SystemTime) -> Vec<(&'static str, u32, RunKind)> {
    starts
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.1 == due)
        .map(|s| (s.0, s.2, s.3))
        .collect()
}

/// A schedule of one job on a manual elector (not leading yet), polling every `poll`, as its
/// own task, its events in `capture`.
pub fn schedule(
    pool: deadpool_postgres::Pool,
    poll: Duration,
    job: Job,
    body: Body,
    capture: &Capture,
) -> ManualSchedule {
    let (elector, control) = Elector::manual();
    let schedule = Schedule::new(&elector, pool)
        .poll_interval(poll)
        .job(job, move |run| body(run));
    ManualSchedule::spawn_captured(control, schedule, capture)
}

/// A schedule of `job` on `pool` as [`schedule`] makes it, polling every 50 ms, on an elector
/// it promotes at once, whose runs (on replica `m`) take `lasts` each: the runs it starts, its
/// events, and the schedule.
pub fn leading_schedule(
    pool: deadpool_postgres::Pool,
    job: Job,
    lasts: Duration,
) -> (Starts, Capture, ManualSchedule) {
    let starts: Starts = Arc::default();
    let capture = Capture::default();
    let sched = schedule(
        pool,
        Duration::from_millis(50),
        job,
        working("m", &starts, move |_| lasts),
        &capture,
    );
    sched.control.promote();
    (starts, capture, sched)
}

/// Makes the job tables from `ddl()` and a deferred trigger that, once armed, makes the next
/// claim's COMMIT take `secs` (a synchronous standby or an fsync stall, as the client sees
/// it): the claim's transaction sleeps at its commit, then commits. The due whose claim it
/// slowed is kept in `slow_commit`.
pub async fn slow_commits(db: &TestDb, admin: &tokio_postgres::Client, secs: f64) {
    let ddl = Schedule::new(&Elector::manual().0, db.pool(1))
        .ddl()
        .unwrap();
    admin.batch_execute(&ddl).await.unwrap();
    admin
        .batch_execute(&format!(
            "CREATE TABLE slow_commit (armed boolean NOT NULL, due timestamptz); \
             INSERT INTO slow_commit VALUES (false, NULL); \
             CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
             DECLARE n int; \
             BEGIN \
               UPDATE slow_commit SET armed = false, due = NEW.due WHERE armed; \
               GET DIAGNOSTICS n = ROW_COUNT; \
               IF n > 0 THEN PERFORM pg_sleep({secs}); END IF; \
               RETURN NULL; \
             END $$; \
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON pg_elector_job_runs \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.outcome = 'running') \
             EXECUTE FUNCTION slow_commit()"
        ))
        .await
        .unwrap();
}

/// The job tables as the version before the heartbeat period made them.
pub const OLD_DDL: &str = "CREATE TABLE pg_elector_jobs (namespace text NOT NULL, job text NOT NULL, \
 schedule text NOT NULL, registered text NOT NULL, last_due timestamptz, \
 claimed_by text, claimed_term text, claimed_epoch bigint, \
 started_at timestamptz, finished_at timestamptz, outcome text, error text, \
 trigger_requested timestamptz, PRIMARY KEY (namespace, job)); \
 CREATE TABLE pg_elector_job_runs (namespace text NOT NULL, job text NOT NULL, \
 due timestamptz NOT NULL, attempt int4 NOT NULL, kind text NOT NULL, \
 claimed_by text NOT NULL, claimed_term text NOT NULL, epoch bigint, \
 started_at timestamptz NOT NULL, heartbeat_at timestamptz, \
 finished_at timestamptz, outcome text NOT NULL, error text, \
 PRIMARY KEY (namespace, job, due, attempt)); \
 CREATE INDEX pg_elector_job_runs_running ON pg_elector_job_runs (namespace, job) \
 WHERE outcome = 'running'";
