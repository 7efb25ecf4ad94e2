//! Leader schedules: cron and fixed-period jobs that run on the leader only, whose state lives
//! in PostgreSQL, so that a new leader continues the schedule instead of starting over.
//!
//! Each job has a row in a table (`pg_elector_jobs`): its schedule and the latest due instant
//! claimed, by whom, in which term, when it started and ended and how. Each run has a row in
//! `pg_elector_job_runs`: its history. The leader claims every due instant by compare-and-set
//! on the job's row (and, when the elector fences, inside a fenced transaction), so no due run
//! starts twice, even while two replicas both think they lead, or when a deposed leader wakes
//! up. A new leader reads where the schedule stands and applies the job's [`CatchUp`] to the
//! dues missed while nobody led; a due that came while it led is never taken for missed, even
//! when its claim fails at first: it is claimed again at the next poll.
//!
//! **A graceful handover** (a shutdown, a resign) lets the runs in progress finish before the
//! lock is given up: they count as work for the elector's drain, up to its
//! [drain timeout](crate::ElectorBuilder::drain_timeout), so set that above the longest run.
//! The schedule itself waits for its runs at least as long (and at least two poll intervals,
//! 2 s at least) after the term ends; a run still going then is cut off at its current
//! `.await` and stays `running` until a later term calls it abandoned.
//!
//! **A claim whose answer is lost.** A claim is one transaction, bounded like every query of
//! the job tables. When its COMMIT gets no answer (a slow synchronous standby, an fsync stall,
//! a connection lost after the COMMIT was sent), the leader does not give the due up: it reads
//! the claim back, the transaction's status and the run's row, every poll interval until it
//! knows, and runs the job if the claim was committed. Should its term end first, the run it
//! may have claimed stays `running` and a later term calls it abandoned.
//!
//! **Runs cut off by a failover.** A running job says it is alive every poll interval of the
//! replica that runs it, and that period is stored with the run. A run that an earlier term
//! left `running` is recorded as `abandoned` once its runner is known to be gone: silent for
//! three of its own periods (at least 3 s), whatever the poll interval of the replica that
//! looks, or at once when that term was this process's own (its runs were stopped before the
//! next term began). Until then the new leader claims nothing of that job, so it never starts
//! the job beside a deposed leader's run that is still going, and never overwrites that run's
//! claim; dues that pass meanwhile are handled by the job's [`CatchUp`].
//!
//! **A run ends before it can be taken for dead.** The runner cuts its run off (the job's
//! future is dropped at its current `.await`) once its beats have not been confirmed for two
//! thirds of that threshold, counted from when the last confirmed beat was sent (a beat is
//! seen on the primary at once, and confirmed once it is on the synchronous standby, when one
//! is configured: a standby promoted later has it); the run is then
//! called abandoned like any other (and rerun if the job asks). A beat that finds that
//! another term called the run abandoned ends it at once (and that record stays). This holds while the term drains too: a partitioned
//! leader's run never goes on beside the next leader's rerun, unless its process froze. The
//! heartbeats borrow from the schedule's pool: a pool kept full (by the job itself, say) cuts
//! the run off, so leave it a connection beyond what the jobs hold.
//!
//! **A pool shared with the application.** Every statement on the job tables is bounded, and a
//! connection whose statement did not answer in time (a COMMIT waiting for a synchronous
//! standby, a row lock, a silent socket) is closed, never handed back to the pool.
//!
//! An abandoned run is run again only if the job asks for it ([`Job::rerun_abandoned`]); a
//! triggered run is reported, not rerun. The rerun is owed in the table: the statement that
//! calls the run abandoned also adds its due to the job row's `rerun_dues`, and only the
//! rerun's claim takes it off, so a claim that fails, an answer that is lost, or a leader that
//! goes away in between does not lose it: this leader at a later poll, or any later leader,
//! runs it, once.
//!
//! ```no_run
//! use std::time::Duration;
//! use pg_elector::Elector;
//! use pg_elector::schedule::{Job, Schedule};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(elector: Elector, pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let schedule = Schedule::new(&elector, pool)
//!     .job(Job::cron("retention-cleanup", "0 2 * * *")?, |run| async move {
//!         println!("cleaning up for {:?} (epoch {:?})", run.due, run.epoch);
//!         Ok::<_, std::io::Error>(())
//!     })
//!     .job(Job::every("indexer-health", Duration::from_secs(300)), |_run| async {
//!         Ok::<_, std::io::Error>(())
//!     });
//! let handle = schedule.handle(); // trigger or reschedule a job, from any replica
//! schedule.run(CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! **Dues that do not run** are recorded, so that an operator can alert on them: a due
//! dropped by the job's [`CatchUp`], one past [`Job::max_catch_up`], the due of an abandoned
//! run that is not rerun, and the dues of a job halted by [`LostState::Halt`] while this
//! process leads. Each stretch of them is a row of `pg_elector_job_runs` with outcome
//! `skipped`, its [`SkipReason`] in `reason`, the latest of its dues in `due` and how many dues
//! it stands for in `skipped_dues`; and `pg_elector_job_skipped_total{job,reason}` counts the
//! dues this process recorded (with `Schedule::registry`). A stretch of a cron job is counted
//! up to 100 000 dues.
//!
//! **Time.** Due instants are computed on the replica's wall clock, in UTC (cron jobs in their
//! zone); replicas whose clocks disagree still never run a due twice (the claim decides), but
//! a run may start as early or late as the skew.

mod bounds;
mod context;
mod due;
mod error;
mod handle;
mod heartbeat;
mod job;
#[cfg(feature = "prometheus")]
mod metrics;
pub(crate) mod plan;
mod skips;
pub(crate) mod status;
mod store;
mod task;

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::instrument::WithSubscriber;

pub use error::ScheduleError;
pub use handle::ScheduleHandle;
pub use job::{CatchUp, Job, JobRun, MAX_CATCH_UP, RunKind};
pub use plan::SkipReason;

use crate::background::{Probe, Readiness, TickOutcome};
use crate::{Elector, Term};
use bounds::{
    STALE_BEATS, STALE_FLOOR, borrow_bound, grace, poll_within_bounds, query_bound, stale_after,
};
use context::{Context, ensure_tables, term_id};
use store::Store;
use task::JobTask;

/// What the leader does when a job's row, which this process had seen, is gone: the table was
/// emptied or dropped, restored from a backup, or the database failed over to a replica that
/// lagged behind. Either way it is logged at ERROR, and dropped tables are made again (when the
/// role may create them; otherwise jobs wait for an administrator, as at the first start).
///
/// Which rows it has seen is kept in the process's memory, not in the database (the database
/// is what lost them): only a process that has led and registered the job since it started
/// can tell. A replica that first leads after the loss takes the missing row for a new job and
/// starts it from now, whatever the policy, without an ERROR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostState {
    /// Starts the job over from now (the default): its row is made again as for a new job, so
    /// nothing of its past is re-run; only dues from now on run.
    #[default]
    StartFromNow,
    /// Stops running the job in this process, in this term and the next ones: its probe
    /// fails while it leads, naming the cause, until the process restarts (after an operator
    /// looked at the table). The dues that pass meanwhile while it leads are recorded as
    /// skipped ([`SkipReason::Halted`]). Another replica that leads later runs the job if it had not seen
    /// its row (see above).
    Halt,
}

/// The shortest poll interval a schedule takes ([`Schedule::poll_interval`]).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The longest poll interval a schedule takes ([`Schedule::poll_interval`]): an hour.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

/// How many of its ended terms a schedule remembers (their runs are abandoned at the start of
/// the next term, so a few are plenty).
const ENDED_TERMS: usize = 8;

type RunFn =
    Arc<dyn Fn(JobRun) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Clone)]
struct Registered {
    job: Job,
    run: RunFn,
    probe: Probe,
}

/// Runs jobs on the leader of `elector`, their state in PostgreSQL; see the [module
/// docs](self).
#[must_use = "a schedule does nothing until it is run"]
pub struct Schedule {
    elector: Elector,
    pool: Pool,
    namespace: String,
    schema: Option<String>,
    prefix: String,
    poll: Duration,
    lost_state: LostState,
    jobs: Vec<Registered>,
    #[cfg(feature = "prometheus")]
    registry: Option<prometheus::Registry>,
}

impl Schedule {
    /// A schedule of the jobs to come, run on `elector`'s leader, its tables reached through
    /// `pool` (the application's pool will do: a run borrows one connection to claim its due
    /// and one to record its end).
    ///
    /// The jobs are kept under a namespace, by default the elector's key (`class:object`, or
    /// `local` for a local elector), so that several services can share the tables.
    pub fn new(elector: &Elector, pool: Pool) -> Self {
        let namespace = elector
            .key()
            .map_or_else(|| "local".to_owned(), |k| k.to_string());
        Self {
            poll: poll_within_bounds(
                elector
                    .check_interval()
                    .unwrap_or(Duration::from_secs(1))
                    .min(Duration::from_secs(5)),
            ),
            elector: elector.clone(),
            pool,
            namespace,
            schema: None,
            prefix: "pg_elector_".to_owned(),
            lost_state: LostState::default(),
            jobs: Vec::new(),
            #[cfg(feature = "prometheus")]
            registry: None,
        }
    }

    /// Adds `job`, whose runs call `f`. A run that returns `Err` or panics is recorded as
    /// failed, with the error, and the job stays on its schedule.
    pub fn job<F, Fut, E>(mut self, job: Job, f: F) -> Self
    where
        F: Fn(JobRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + 'static,
    {
        let run: RunFn = Arc::new(move |run| {
            let fut = f(run);
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
        });
        let probe = Probe::new(job.name.clone());
        self.jobs.push(Registered { job, run, probe });
        self
    }

    /// The namespace of this schedule's rows (default: the elector's key). Replicas that run
    /// the same jobs must use the same one.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Where the tables are: `schema` (default: the `search_path`'s first) and a prefix
    /// (default `pg_elector_`, giving `pg_elector_jobs`, `pg_elector_job_runs` and the index
    /// `pg_elector_job_runs_running`). Names are quoted as identifiers, so case and any
    /// character but NUL are kept; the prefix may be at most 47 bytes, the schema 63
    /// ([`run`](Self::run) and [`ddl`](Self::ddl) refuse others).
    pub fn tables(mut self, schema: Option<&str>, prefix: &str) -> Self {
        self.schema = schema.map(str::to_owned);
        self.prefix = prefix.to_owned();
        self
    }

    /// How often the leader reads each job's row for a trigger or a schedule change asked
    /// from any replica (default: the elector's check interval, at most 5 s). Dues themselves
    /// run on time, whatever this is. It is also how often a running job says it is alive,
    /// as stored with each run it claims: a run silent for three of its runner's polls (and at
    /// least 3 s) is taken for dead by a later leader, whatever that leader's own poll, and
    /// its runner cuts it off after two thirds of that.
    ///
    /// Taken from [`MIN_POLL_INTERVAL`] (10 ms) to [`MAX_POLL_INTERVAL`] (an hour): a shorter
    /// interval (`Duration::ZERO`) is 10 ms, a longer one (`Duration::MAX`) an hour.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = poll_within_bounds(every);
        self
    }

    /// What to do when a job's row this process had seen is gone (default
    /// [`LostState::StartFromNow`]).
    pub fn on_lost_state(mut self, policy: LostState) -> Self {
        self.lost_state = policy;
        self
    }

    /// Registers the job metrics in `registry`: `pg_elector_job_runs_total{job,outcome}`,
    /// `pg_elector_job_last_success_timestamp_seconds{job}`,
    /// `pg_elector_job_duration_seconds{job}` and `pg_elector_job_skipped_total{job,reason}`
    /// (due runs that did not run, by [`SkipReason`]; each job's series start at 0). Two
    /// schedules given the same registry share the series.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &prometheus::Registry) -> Self {
        self.registry = Some(registry.clone());
        self
    }

    /// Each job's readiness probe: its last run's outcome on the leader (pass on a standby),
    /// under the job's name. Add them to the service's [`Readiness`].
    pub fn probes(&self) -> Vec<Probe> {
        self.jobs.iter().map(|r| r.probe.clone()).collect()
    }

    /// Adds every job's probe to `readiness`.
    pub fn add_probes_to(&self, readiness: &Readiness) {
        for probe in self.probes() {
            readiness.add(&probe);
        }
    }

    /// A handle to trigger or reschedule this schedule's jobs from any replica.
    pub fn handle(&self) -> ScheduleHandle {
        ScheduleHandle {
            pool: self.pool.clone(),
            namespace: self.namespace.clone(),
            schema: self.schema.clone(),
            prefix: self.prefix.clone(),
            wait: borrow_bound(self.poll),
        }
    }

    /// The statements that create the job tables, for a migration run by a role that may
    /// create tables (the schedule's role then needs `SELECT, INSERT, UPDATE` on both). They
    /// also add the columns of this version to tables an earlier version made (`ALTER TABLE …
    /// ADD COLUMN IF NOT EXISTS`), so the same statements upgrade them; run them as the
    /// tables' owner.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::InvalidTable`] for a bad schema or prefix.
    pub fn ddl(&self) -> Result<String, ScheduleError> {
        Ok(Store::new(self.schema.as_deref(), &self.prefix)?
            .ddl()
            .to_owned())
    }

    /// Runs the jobs in every term this replica leads, until `shutdown` is cancelled; on a
    /// standby it only waits for a term.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::DuplicateJob`] or [`ScheduleError::InvalidTable`] at once; nothing
    /// while it runs (database failures are logged, and retried every poll interval). Tables
    /// that are missing are created, and tables an earlier version made get the columns of
    /// this version, at the start of each term; a role that may not do it gets an ERROR in
    /// the log naming the statements to run ([`ScheduleError::CannotCreate`],
    /// [`ScheduleError::CannotUpgrade`]), and the jobs wait until they have been run.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the runs in progress at their current `.await`; a run cut
    /// off that way stays `running` in the table and is reported abandoned by the next term.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ScheduleError> {
        self.check_names()?;
        let ctx = Arc::new(Context::new(&self)?);
        crate::background::install_panic_hook();
        loop {
            let term = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                term = self.elector.wait_for_leadership() => term,
            };
            let term_id = term_id(&self.elector);
            let span =
                tracing::info_span!("schedule", namespace = %ctx.namespace, epoch = ?term.epoch());
            self.run_term(&ctx, &term, &term_id, &shutdown)
                .instrument(span)
                .await;
            ctx.term_ended(term_id);
            for registered in &self.jobs {
                registered.probe.record(TickOutcome::Standby);
            }
        }
    }

    /// [`ScheduleError::DuplicateJob`] for the first name two jobs share.
    fn check_names(&self) -> Result<(), ScheduleError> {
        let mut names = HashSet::new();
        for registered in &self.jobs {
            if !names.insert(registered.job.name.clone()) {
                return Err(ScheduleError::DuplicateJob {
                    job: registered.job.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// One term this replica leads: the tables made ready, then a task for each job until the
    /// term ends or `shutdown` is cancelled, then the runs still going waited for or cut off.
    async fn run_term(
        &self,
        ctx: &Arc<Context>,
        term: &Term,
        term_id: &str,
        shutdown: &CancellationToken,
    ) {
        tracing::debug!("schedule starts for a new term");
        let stop = shutdown.child_token();
        let ending = {
            let (term, stop) = (term.clone(), stop.clone());
            async move {
                tokio::select! {
                    () = term.cancelled() => {}
                    () = stop.cancelled() => {}
                }
            }
        };
        if !ensure_tables(ctx, ending).await {
            return;
        }
        let cut = CancellationToken::new();
        let tasks = self.spawn_jobs(ctx, term, term_id, &stop, &cut);
        tokio::select! {
            () = term.cancelled() => {}
            () = shutdown.cancelled() => {}
        }
        stop.cancel();
        join_or_cut(tasks, &cut, grace(ctx.poll, ctx.elector.drain_timeout())).await;
    }

    /// A task for each job in `term`, stopped by `stop` and cut off by `cut`.
    fn spawn_jobs(
        &self,
        ctx: &Arc<Context>,
        term: &Term,
        term_id: &str,
        stop: &CancellationToken,
        cut: &CancellationToken,
    ) -> JoinSet<()> {
        let mut tasks = JoinSet::new();
        for registered in &self.jobs {
            let job_span = tracing::info_span!("job", job = %registered.job.name);
            let task = JobTask::new(
                ctx.clone(),
                registered.clone(),
                term.clone(),
                term_id.to_owned(),
                stop.clone(),
            )
            .run()
            .instrument(job_span);
            // The task polls with the subscriber (and span) of this one, and is cut off
            // (dropped) inside a poll rather than aborted: a scoped subscriber's span
            // closed under another subscriber panics in tracing-subscriber.
            let cut = cut.clone();
            tasks.spawn(
                async move {
                    tokio::select! {
                        () = task => {}
                        () = cut.cancelled() => {}
                    }
                }
                .with_current_subscriber(),
            );
        }
        tasks
    }
}

/// Waits for the job tasks of a term that has ended, up to `grace`, then cuts off the rest.
async fn join_or_cut(mut tasks: JoinSet<()>, cut: &CancellationToken, grace: Duration) {
    // Runs in progress are waited for by the elector's drain; what is left after a grace is
    // cut off at its current `.await` (a run cut off stays `running` until the next term
    // calls it abandoned). The grace is at least the drain timeout, so that it never cuts a
    // run off that the drain still waits for.
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            ?grace,
            "job runs still going after the term ended; aborting them"
        );
        cut.cancel();
        while tasks.join_next().await.is_some() {}
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("namespace", &self.namespace)
            .field(
                "jobs",
                &self.jobs.iter().map(|r| &r.job).collect::<Vec<_>>(),
            )
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
