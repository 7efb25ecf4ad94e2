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
//! claim; dues that pass meanwhile are handled by the job's [`CatchUp`]. The heartbeats borrow
//! from the schedule's pool: a pool kept full for three periods (by the job itself, say) can
//! make a live run look dead, so leave it a connection beyond what the jobs hold.
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

mod job;
mod plan;
mod store;

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use deadpool_postgres::Pool;
use jiff::Timestamp;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing::instrument::WithSubscriber;

pub use job::{CatchUp, Job, JobRun, MAX_CATCH_UP, RunKind};
pub use plan::SkipReason;

use crate::background::panic::catch_panic;
use crate::background::{Probe, Readiness, TickOutcome};
use crate::sync::lock;
use crate::{Elector, Term};
use job::Spec;
use store::{ClaimStatus, Claimant, Claimed, Ensured, Store};

/// What can go wrong with a schedule. Failures of the database while the schedule runs are not
/// errors of [`Schedule::run`]: they are logged and the schedule goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A cron expression that does not parse.
    #[error("invalid cron expression {expression:?}: {reason}")]
    InvalidCron {
        /// The expression.
        expression: String,
        /// What the parser said.
        reason: String,
    },
    /// A time zone name the bundled IANA database does not know.
    #[error("unknown time zone {zone:?}: {reason}")]
    UnknownZone {
        /// The name.
        zone: String,
        /// What the database said.
        reason: String,
    },
    /// A time zone was asked for a fixed-period job.
    #[error("job {job:?} runs on a fixed period; only cron jobs take a time zone")]
    NotCron {
        /// The job.
        job: String,
    },
    /// Two jobs of one schedule have the same name.
    #[error("two jobs are named {job:?}; names are unique within a schedule")]
    DuplicateJob {
        /// The name.
        job: String,
    },
    /// No job of this name is registered in the job table.
    #[error("no job named {job:?} in this schedule's table")]
    UnknownJob {
        /// The name.
        job: String,
    },
    /// A table, schema or prefix that makes an empty or overlong identifier.
    #[error("invalid table name {name:?}: 1 to 63 bytes, no NUL")]
    InvalidTable {
        /// The name.
        name: String,
    },
    /// The job table holds a schedule this version cannot read.
    #[error("unreadable stored schedule {text:?}")]
    Stored {
        /// The stored text.
        text: String,
    },
    /// The tables are missing and this role may not create them.
    #[error(
        "the job tables are missing and this role may not create them ({}); run this once as a role that may: {ddl}",
        crate::error::chain(source)
    )]
    CannotCreate {
        /// The statements to run.
        ddl: String,
        /// The server's refusal.
        source: tokio_postgres::Error,
    },
    /// The job tables lack columns this version uses (an earlier version made them) and this
    /// role may not add them: only the tables' owner may.
    #[error(
        "the job tables lack columns this version uses and this role may not add them ({}); run this once as their owner: {ddl}",
        crate::error::chain(source)
    )]
    CannotUpgrade {
        /// The statements to run.
        ddl: String,
        /// The server's refusal.
        source: tokio_postgres::Error,
    },
    /// No pool connection within the schedule's poll interval (at least 1 s).
    #[error("no pool connection within {0:?}")]
    PoolTimeout(Duration),
    /// The pool could not hand out a connection.
    #[error("the pool could not hand out a connection: {}", crate::error::chain(.0))]
    Pool(Box<deadpool_postgres::PoolError>),
    /// A query failed; the message carries the server's (severity, SQLSTATE, text).
    #[error("a query of the job tables failed: {}", crate::error::chain(.0))]
    Database(tokio_postgres::Error),
    /// A query of the job tables got no answer in time.
    #[error("no answer from the job tables within {0:?}")]
    Timeout(Duration),
    /// The fence of a claim failed.
    #[error("the claim's fence failed: {0}")]
    Fence(crate::Fenced),
}
// Each text above already carries the whole chain of its cause, so no variant exposes the
// cause as its `source()` as well: a report that prints the sources would say it twice. The
// cause is the field, to match on.

impl From<tokio_postgres::Error> for ScheduleError {
    fn from(error: tokio_postgres::Error) -> Self {
        ScheduleError::Database(error)
    }
}

impl ScheduleError {
    /// A job table is missing (SQLSTATE 42P01).
    fn is_missing_table(&self) -> bool {
        matches!(self, ScheduleError::Database(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE))
    }

    /// Whether a COMMIT that failed so may still have been carried out: no answer in time, or
    /// a connection lost (an error the server did not send). An error the server sent (a
    /// SQLSTATE) means it rolled the transaction back.
    fn leaves_commit_unknown(&self) -> bool {
        match self {
            ScheduleError::Timeout(_) => true,
            ScheduleError::Database(e) => e.code().is_none(),
            _ => false,
        }
    }
}

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

/// `every` as a poll interval: from [`MIN_POLL_INTERVAL`] to [`MAX_POLL_INTERVAL`].
fn poll_within_bounds(every: Duration) -> Duration {
    every.clamp(MIN_POLL_INTERVAL, MAX_POLL_INTERVAL)
}

/// How long one query of the job tables may take, for a schedule polling every `poll`: two
/// polls, at least 2 s.
fn query_bound(poll: Duration) -> Duration {
    poll.saturating_mul(2).max(Duration::from_secs(2))
}

/// How many of the heartbeat periods its runner promised (the poll interval of the replica
/// that claimed it, stored with the run) a run may stay silent before another term calls it
/// abandoned ...
const STALE_BEATS: u32 = 3;

/// ... and at least how long. (A period is at most [`MAX_POLL_INTERVAL`], so the threshold is
/// at most three hours.)
const STALE_FLOOR: Duration = Duration::from_secs(3);

/// How long the job tasks of an ended term may go on before they are cut off, for a schedule
/// polling every `poll` on an elector whose graceful handover waits `drain` for work
/// ([`Elector::drain_timeout`]): the query bound, and at least the drain timeout.
fn grace(poll: Duration, drain: Duration) -> Duration {
    query_bound(poll).max(drain)
}

/// How long a pool borrow may wait, for a schedule polling every `poll`: a poll, at least 1 s.
fn borrow_bound(poll: Duration) -> Duration {
    poll.max(Duration::from_secs(1))
}

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
        let namespace = elector.key().map_or_else(
            || "local".to_owned(),
            |k| format!("{}:{}", k.class(), k.object()),
        );
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
    /// least 3 s) is taken for dead by a later leader, whatever that leader's own poll.
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
        let mut names = HashSet::new();
        for registered in &self.jobs {
            if !names.insert(registered.job.name.clone()) {
                return Err(ScheduleError::DuplicateJob {
                    job: registered.job.name.clone(),
                });
            }
        }
        let ctx = Arc::new(Context {
            store: Store::new(self.schema.as_deref(), &self.prefix)?,
            elector: self.elector.clone(),
            pool: self.pool.clone(),
            namespace: self.namespace.clone(),
            poll: self.poll,
            lost_state: self.lost_state,
            seen: Mutex::new(HashSet::new()),
            ended: Mutex::new(Vec::new()),
            halted: Mutex::new(HashSet::new()),
            #[cfg(feature = "prometheus")]
            metrics: match &self.registry {
                Some(registry) => Some(
                    crate::metrics::JobMetrics::register(registry)
                        .map_err(|e| {
                            tracing::error!(error = %e, "job metrics not registered");
                            e
                        })
                        .ok(),
                )
                .flatten(),
                None => None,
            },
        });
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &ctx.metrics {
            for registered in &self.jobs {
                metrics.add_job(&registered.job.name);
            }
        }
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
            async {
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
                if !ensure_tables(&ctx, ending).await {
                    return;
                }
                let cut = CancellationToken::new();
                let mut tasks = JoinSet::new();
                for registered in &self.jobs {
                    let job_span = tracing::info_span!("job", job = %registered.job.name);
                    let task = job_task(
                        ctx.clone(),
                        registered.clone(),
                        term.clone(),
                        term_id.clone(),
                        stop.clone(),
                        false,
                    )
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
                tokio::select! {
                    () = term.cancelled() => {}
                    () = shutdown.cancelled() => {}
                }
                stop.cancel();
                // Runs in progress are waited for by the elector's drain; what is left after
                // a grace is cut off at its current `.await` (a run cut off stays `running`
                // until the next term calls it abandoned). The grace is at least the drain
                // timeout, so that it never cuts a run off that the drain still waits for.
                let grace = grace(ctx.poll, ctx.elector.drain_timeout());
                let drained = tokio::time::timeout(grace, async {
                    while tasks.join_next().await.is_some() {}
                })
                .await;
                if drained.is_err() {
                    tracing::warn!(
                        ?grace,
                        "job runs still going after the term ended; aborting them"
                    );
                    cut.cancel();
                    while tasks.join_next().await.is_some() {}
                }
            }
            .instrument(span)
            .await;
            {
                let mut ended = lock(&ctx.ended);
                if ended.len() == ENDED_TERMS {
                    ended.remove(0);
                }
                ended.push(term_id);
            }
            for registered in &self.jobs {
                registered.probe.record(TickOutcome::Standby);
            }
        }
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

/// Triggers or reschedules a schedule's jobs, from any replica (a standby's request reaches
/// the leader at its next poll of the job's row); made by [`Schedule::handle`].
#[derive(Clone)]
pub struct ScheduleHandle {
    pool: Pool,
    namespace: String,
    schema: Option<String>,
    prefix: String,
    wait: Duration,
}

impl ScheduleHandle {
    async fn client(&self) -> Result<deadpool_postgres::Object, ScheduleError> {
        tokio::time::timeout(self.wait, self.pool.get())
            .await
            .map_err(|_| ScheduleError::PoolTimeout(self.wait))?
            .map_err(|e| ScheduleError::Pool(Box::new(e)))
    }

    fn store(&self) -> Result<Store, ScheduleError> {
        Store::new(self.schema.as_deref(), &self.prefix)
    }

    /// One call of the handle, borrow and statement together, bounded by the handle's wait.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, ScheduleError>>,
    ) -> Result<T, ScheduleError> {
        tokio::time::timeout(self.wait, call)
            .await
            .map_err(|_| ScheduleError::Timeout(self.wait))?
    }

    /// Asks the leader to run `job` now, once, besides its schedule (recorded as a
    /// `triggered` run).
    ///
    /// The whole call (the pool borrow and the statement) takes at most the handle's wait:
    /// the schedule's [poll interval](Schedule::poll_interval), at least 1 s.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownJob`] when no leader registered the job yet;
    /// [`ScheduleError::Timeout`] when the call took longer than the handle's wait (a
    /// partition, a server that does not answer: the request may still have reached the
    /// server); [`ScheduleError::PoolTimeout`] when the pool had no connection within it; a
    /// database error.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it was sent, nothing happens; after, the request stands.
    pub async fn trigger(&self, job: &str) -> Result<(), ScheduleError> {
        let store = self.store()?;
        let known = self
            .bounded(async {
                let client = self.client().await?;
                store.trigger(&client, &self.namespace, job).await
            })
            .await?;
        match known {
            true => Ok(()),
            false => Err(ScheduleError::UnknownJob {
                job: job.to_owned(),
            }),
        }
    }

    /// Changes `job`'s schedule to `schedule`'s (the name is the job's), from its next due
    /// on; its history is kept. The change lasts until a deploy registers another schedule in
    /// code.
    ///
    /// The whole call (the pool borrow and the statement) takes at most the handle's wait:
    /// the schedule's [poll interval](Schedule::poll_interval), at least 1 s.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownJob`] when no leader registered the job yet;
    /// [`ScheduleError::Timeout`] when the call took longer than the handle's wait (a
    /// partition, a server that does not answer: the change may still have reached the
    /// server); [`ScheduleError::PoolTimeout`] when the pool had no connection within it; a
    /// database error.
    ///
    /// # Cancel safety
    ///
    /// One statement: dropped before it was sent, nothing changes; after, the change stands.
    pub async fn reschedule(&self, job: &str, schedule: &Job) -> Result<(), ScheduleError> {
        let store = self.store()?;
        let known = self
            .bounded(async {
                let client = self.client().await?;
                store
                    .reschedule(&client, &self.namespace, job, &schedule.schedule())
                    .await
            })
            .await?;
        match known {
            true => Ok(()),
            false => Err(ScheduleError::UnknownJob {
                job: job.to_owned(),
            }),
        }
    }
}

impl fmt::Debug for ScheduleHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduleHandle")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// What every job task of a running schedule shares.
struct Context {
    store: Store,
    elector: Elector,
    pool: Pool,
    namespace: String,
    poll: Duration,
    lost_state: LostState,
    /// Jobs whose row this process has seen: a missing row then means lost state.
    seen: Mutex<HashSet<String>>,
    /// The latest terms of this schedule that have ended: their runs are over (a term's job
    /// tasks are joined or aborted before the next term begins), so a run they left `running`
    /// is abandoned at once, without waiting for it to go quiet.
    ended: Mutex<Vec<String>>,
    /// Jobs halted by [`LostState::Halt`]: they run no more in this process.
    halted: Mutex<HashSet<String>>,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::metrics::JobMetrics>,
}

impl Context {
    async fn client(&self) -> Result<deadpool_postgres::Object, ScheduleError> {
        let wait = borrow_bound(self.poll);
        tokio::time::timeout(wait, self.pool.get())
            .await
            .map_err(|_| ScheduleError::PoolTimeout(wait))?
            .map_err(|e| ScheduleError::Pool(Box::new(e)))
    }

    /// This replica in `term`, as it claims runs and records skipped dues.
    fn claimant<'a>(&'a self, term: &Term, term_id: &'a str) -> Claimant<'a> {
        Claimant {
            identity: self.elector.identity().unwrap_or("local"),
            term_id,
            epoch: term.epoch(),
            heartbeat: self.poll,
        }
    }

    /// Every query of the job tables is bounded: a partition must not hang a job's task (and
    /// with it the end of the term and the shutdown).
    async fn bounded<T>(
        &self,
        query: impl Future<Output = Result<T, ScheduleError>>,
    ) -> Result<T, ScheduleError> {
        let bound = query_bound(self.poll);
        tokio::time::timeout(bound, query)
            .await
            .map_err(|_| ScheduleError::Timeout(bound))?
    }
}

/// A term's unique id, stored with each claim: a run left `running` under another id was
/// abandoned by an earlier term.
fn term_id(elector: &Elector) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}/{}/{nanos:x}/{}",
        elector.identity().unwrap_or("local"),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates the tables if needed, retrying every poll interval until it works or `until`
/// completes (the term ends); `false` then.
async fn ensure_tables(ctx: &Context, until: impl Future<Output = ()>) -> bool {
    let mut until = std::pin::pin!(until);
    let mut told = false;
    loop {
        let made = ctx.bounded(async { ctx.store.ensure(&*ctx.client().await?).await });
        match made.await {
            Ok(ensured) => {
                match ensured {
                    Ensured::Created => tracing::info!("created the job tables"),
                    Ensured::Upgraded => {
                        tracing::info!("added the columns of this version to the job tables");
                    }
                    Ensured::Ready => {}
                }
                return true;
            }
            Err(e) => {
                if told {
                    tracing::debug!(error = %e, "the job tables are not ready");
                } else {
                    tracing::error!(error = %e, "the job tables are not ready; jobs wait");
                    told = true;
                }
            }
        }
        tokio::select! {
            () = &mut until => return false,
            () = tokio::time::sleep(ctx.poll) => {}
        }
    }
}

/// The latest due instant at or before `now`: a new job's starting point (its past is not
/// caught up on); `now` for a job never due before.
fn latest_due(spec: &Spec, now: Timestamp) -> Option<Timestamp> {
    spec.previous(now, true).or(Some(now))
}

/// One job in one term: register it, report an abandoned run, catch up, then run each due.
///
/// `loss_reported`: the job's state was found lost (its tables gone) and said so at ERROR.
async fn job_task(
    ctx: Arc<Context>,
    registered: Registered,
    term: Term,
    term_id: String,
    stop: CancellationToken,
    loss_reported: bool,
) {
    let job = &registered.job;
    let name = job.name.as_str();
    let halt = |registered: &Registered| {
        registered.probe.record(TickOutcome::Failed(format!(
            "job {name:?}: its stored state was lost; halted until the process restarts"
        )));
    };
    if lock(&ctx.halted).contains(name) {
        halt(&registered);
        count_halted(&ctx, &registered, &term_id, &stop).await;
        return;
    }
    let registered_now;
    // Registration: retried until it works or the term ends.
    loop {
        let step = ctx.bounded(async {
            let client = ctx.client().await?;
            ctx.store
                .register(
                    &client,
                    &ctx.namespace,
                    name,
                    &job.spec.text(),
                    latest_due(&job.spec, Timestamp::now()),
                )
                .await
        });
        match step.await {
            Ok(created) => {
                let seen_before = lock(&ctx.seen).contains(name);
                lock(&ctx.seen).insert(name.to_owned());
                if created && seen_before {
                    if !loss_reported {
                        tracing::error!(
                            job = name,
                            policy = ?ctx.lost_state,
                            "the job's row was gone (the table emptied, restored, or a failover to a lagging replica); it was made again"
                        );
                    }
                    if ctx.lost_state == LostState::Halt {
                        lock(&ctx.halted).insert(name.to_owned());
                        halt(&registered);
                        count_halted(&ctx, &registered, &term_id, &stop).await;
                        return;
                    }
                }
                registered_now = created;
                break;
            }
            Err(e) if e.is_missing_table() => {
                // Dropped since the term began: made again, then registered.
                if !ensure_tables(&ctx, stop.cancelled()).await {
                    return;
                }
                continue;
            }
            Err(e) => tracing::warn!(job = name, error = %e, "cannot register the job; retrying"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(ctx.poll) => {}
        }
    }
    tracing::debug!(job = name, new = registered_now, "job registered");
    // Dues from before this instant were missed (a leaderless gap, another leader's run still
    // going, or a run of this one that overran them): the job's catch-up policy decides. Dues
    // after it came while this leader watched, and run however late it woke, and however many
    // times their claim fails first: it moves on only past dues that were settled.
    let mut on_time_from = Timestamp::now();
    while !stop.is_cancelled() {
        // Runs another term left going: called abandoned (and rerun if the job asks) once
        // their runner is known to be gone. Looked at every iteration: a deposed leader's run
        // may still be going when this term begins, and is only abandoned once it has gone
        // quiet; meanwhile no claim of this term starts the job beside it.
        let ended = lock(&ctx.ended).clone();
        let who = ctx.claimant(&term, &term_id);
        let abandoned = ctx.bounded(async {
            ctx.store
                .abandon(
                    &*ctx.client().await?,
                    &ctx.namespace,
                    name,
                    &term_id,
                    &ended,
                    ctx.poll,
                    job.rerun_abandoned,
                    &who,
                )
                .await
        });
        match abandoned.await {
            Ok(runs) => {
                for run in runs {
                    tracing::warn!(
                        job = name,
                        due = %run.due,
                        attempt = run.attempt,
                        kind = %run.kind,
                        claimed_by = %run.claimed_by,
                        rerun = run.rerun,
                        "a run claimed by an earlier term never finished: abandoned"
                    );
                    record(&ctx, &registered, "abandoned", None, None);
                    if !run.rerun {
                        count_skipped(&ctx, &registered, SkipReason::Abandoned, 1);
                    }
                }
            }
            Err(e) if e.is_missing_table() => {
                return tables_lost(ctx, registered, term, term_id, stop, e).await;
            }
            Err(e) => tracing::warn!(job = name, error = %e, "cannot look for abandoned runs"),
        }
        let row = ctx.bounded(async {
            ctx.store
                .load(&*ctx.client().await?, &ctx.namespace, name)
                .await
        });
        let row = match row.await {
            Ok(Some(row)) => row,
            Ok(None) => {
                // Registering again tells (at ERROR) that the row this process saw is gone.
                Box::pin(job_task(
                    ctx.clone(),
                    registered.clone(),
                    Term::clone(&term),
                    term_id.clone(),
                    stop.clone(),
                    false,
                ))
                .await;
                return;
            }
            Err(e) if e.is_missing_table() => {
                return tables_lost(ctx, registered, term, term_id, stop, e).await;
            }
            Err(e) => {
                tracing::warn!(job = name, error = %e, "cannot read the job's row; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(ctx.poll) => {}
                }
                continue;
            }
        };
        let spec = match Spec::parse(&row.schedule) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(job = name, error = %e, "unreadable stored schedule; using the registered one");
                job.spec.clone()
            }
        };
        // Abandoned runs still to be rerun, as the job's row says (whichever term or replica
        // called them abandoned): each rerun's claim takes its due off the list. A claim that
        // failed is tried again at the next poll, before anything else of the job.
        let mut rerun_failed = false;
        for &due in &row.rerun_dues {
            if stop.is_cancelled() {
                return;
            }
            if run_due(&ctx, &registered, due, RunKind::Rerun, &term_id).await == Taken::Failed {
                rerun_failed = true;
                break;
            }
        }
        if rerun_failed {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ctx.poll) => {}
            }
            continue;
        }
        // A trigger asked for: run it now; only a run actually claimed loops at once (a claim
        // that failed waits for the next poll, rather than spinning).
        if row.trigger_requested.is_some()
            && run_due(
                &ctx,
                &registered,
                Timestamp::now(),
                RunKind::Triggered,
                &term_id,
            )
            .await
                == Taken::Ran
        {
            continue;
        }
        let now = Timestamp::now();
        let last = row.last_due.unwrap_or(now);
        let plan = plan::plan(
            &spec,
            last,
            now,
            on_time_from,
            job.catch_up,
            job.max_catch_up,
        );
        let mut failed = false;
        if let Some(through) = plan.skip_through() {
            failed = skip_dues(&ctx, &registered, last, through, &plan.skipped, &term_id).await
                == Taken::Failed;
        }
        if plan.catching_up {
            tracing::info!(job = name, runs = plan.run.len(), policy = ?job.catch_up, "catching up on missed dues");
        }
        let mut ran = false;
        for &due in &plan.run {
            if stop.is_cancelled() {
                return;
            }
            if failed {
                break;
            }
            match run_due(&ctx, &registered, due, RunKind::Scheduled, &term_id).await {
                Taken::Ran => ran = true,
                Taken::NotOurs => {}
                // Not settled: this due (and those after it) are tried again at the next
                // poll, still on time.
                Taken::Failed => failed = true,
            }
        }
        // Until the next due, or the next poll of the row (a trigger, a schedule change).
        let wait = if failed {
            ctx.poll
        } else {
            // Settled up to `now`; dues that came while a run of this pass went on were
            // overrun by it.
            on_time_from = if ran { Timestamp::now() } else { now };
            let next = spec.next_after(on_time_from.max(last));
            next.map_or(ctx.poll, |next| {
                let until = Timestamp::now().duration_until(next);
                ctx.poll
                    .min(Duration::try_from(until).unwrap_or(Duration::ZERO))
            })
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The job tables are gone while the term runs (dropped, or the database restored or failed
/// over to one without them): said at ERROR, the tables made again (when this role may), and
/// the job registered again under the lost-state policy.
async fn tables_lost(
    ctx: Arc<Context>,
    registered: Registered,
    term: Term,
    term_id: String,
    stop: CancellationToken,
    error: ScheduleError,
) {
    tracing::error!(
        job = %registered.job.name,
        policy = ?ctx.lost_state,
        error = %error,
        "the job tables are gone (dropped, restored, or a failover to a server without them); the job's stored state is lost"
    );
    if !ensure_tables(&ctx, stop.cancelled()).await {
        return;
    }
    Box::pin(job_task(ctx, registered, term, term_id, stop, true)).await;
}

/// What became of one due that [`run_due`] was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    /// The claim was ours, and the job ran.
    Ran,
    /// Not ours to run: claimed already, not due any more, another term's run in the way, or
    /// this replica does not lead.
    NotOurs,
    /// The claim (or the record of the run's end) failed: try again later.
    Failed,
}

/// Claims `due` and, when the claim is ours, runs the job (heart-beating while it runs) and
/// records how it ended.
async fn run_due(
    ctx: &Context,
    registered: &Registered,
    due: Timestamp,
    kind: RunKind,
    term_id: &str,
) -> Taken {
    let label: Arc<str> = registered.job.name.as_str().into();
    let name = label.clone();
    let work = ctx.elector.do_work_named(&label, |term| async move {
        let who = ctx.claimant(&term, term_id);
        // The claim, on a connection of its own that goes back to the pool at once. Once its
        // COMMIT is sent, `sent` holds what it claimed: an answer lost then (the bound, a
        // broken connection) leaves the claim's outcome unknown, and it is read back.
        let mut sent: Option<Claimed> = None;
        let claim = ctx.bounded(async {
            let mut client = ctx.client().await?;
            let tx = client.transaction().await?;
            if term.epoch().is_some() {
                term.fence(&tx).await.map_err(ScheduleError::Fence)?;
            }
            let Some(claimed) = ctx
                .store
                .claim(&tx, &ctx.namespace, &name, due, kind, &who)
                .await?
            else {
                return Ok(None);
            };
            let attempt = claimed.attempt;
            sent = Some(claimed);
            tx.commit().await?;
            Ok(Some(attempt))
        });
        let attempt = match claim.await {
            Ok(Some(attempt)) => attempt,
            Ok(None) => {
                tracing::debug!(job = %name, due = %due, "already claimed");
                return Ok(false);
            }
            Err(ScheduleError::Fence(fenced)) if !fenced.is_query_error() => {
                tracing::info!(job = %name, error = %fenced, "the due's claim was fenced: the term is over");
                return Ok(false);
            }
            Err(e) => match sent {
                Some(claimed) if e.leaves_commit_unknown() => {
                    tracing::info!(job = %name, due = %due, error = %e, "the claim's COMMIT got no answer; reading it back");
                    match read_back(ctx, &term, &name, due, &claimed, term_id).await {
                        Some(true) => claimed.attempt,
                        Some(false) => return Err(e),
                        None => {
                            tracing::warn!(job = %name, due = %due, error = %e, "the term ended before the claim's outcome was known; a later term settles its run");
                            return Ok(false);
                        }
                    }
                }
                _ => return Err(e),
            },
        };
        tracing::debug!(job = %name, due = %due, kind = kind.label(), attempt, "run starts");
        let started = std::time::Instant::now();
        let run = JobRun {
            job: name.to_string(),
            due: SystemTime::from(due),
            kind,
            epoch: term.epoch(),
            term,
            attempt,
        };
        let outcome = {
            let job = std::pin::pin!(catch_panic((registered.run)(run)));
            // A beat every poll, as the claim promised (the run's row holds the period): on a
            // fixed cadence, each bounded by a poll (at least 1 s), so that a slow or failed
            // beat does not push the next ones back.
            let beat = async {
                let mut beats = tokio::time::interval_at(
                    tokio::time::Instant::now() + ctx.poll,
                    ctx.poll,
                );
                beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    beats.tick().await;
                    let bound = borrow_bound(ctx.poll);
                    let beat = tokio::time::timeout(bound, async {
                        ctx.store
                            .heartbeat(&*ctx.client().await?, &ctx.namespace, &name, due, attempt)
                            .await
                    });
                    match beat.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(job = %name, error = %e, "heartbeat failed"),
                        Err(_) => tracing::debug!(job = %name, ?bound, "heartbeat timed out"),
                    }
                }
            };
            tokio::select! {
                outcome = job => outcome,
                never = beat => never,
            }
        };
        let (label, error) = match outcome {
            Ok(Ok(())) => ("succeeded", None),
            Ok(Err(e)) => ("failed", Some(e)),
            Err(panic) => ("failed", Some(format!("panicked: {}", panic.message))),
        };
        if let Some(error) = &error {
            tracing::warn!(job = %name, due = %due, error = %error, "job run failed");
        } else {
            tracing::debug!(job = %name, due = %due, "job run succeeded");
        }
        record(ctx, registered, label, error.as_deref(), Some(started.elapsed()));
        // The record of its end, on a fresh connection (the job may have run for hours), tried
        // a few times.
        for retry in 0..3u32 {
            let finished = ctx.bounded(async {
                ctx.store
                    .finish(
                        &*ctx.client().await?,
                        &ctx.namespace,
                        &name,
                        due,
                        attempt,
                        term_id,
                        label,
                        error.as_deref(),
                    )
                    .await
            });
            match finished.await {
                Ok(()) => break,
                Err(e) if retry < 2 => {
                    tracing::debug!(job = %name, error = %e, "cannot record the run's end; retrying");
                    tokio::time::sleep(ctx.poll).await;
                }
                Err(e) => {
                    // The run is over, whatever its row says: it stays `running` until a later
                    // term calls it abandoned.
                    tracing::warn!(job = %name, due = %due, error = %e, "cannot claim or record the run");
                    break;
                }
            }
        }
        Ok::<_, ScheduleError>(true)
    });
    match work.await {
        Ok(Some(true)) => Taken::Ran,
        Ok(Some(false) | None) => Taken::NotOurs,
        Err(e) => {
            tracing::warn!(job = %registered.job.name, due = %due, error = %e, "cannot claim or record the run");
            Taken::Failed
        }
    }
}

/// Reads back a claim of this term whose COMMIT got no answer, every poll until it is settled:
/// `Some(true)` when it was committed, `Some(false)` when it aborted, `None` when the term
/// ended first (its run, if committed, then stays `running` for a later term to abandon).
async fn read_back(
    ctx: &Context,
    term: &Term,
    name: &str,
    due: Timestamp,
    claimed: &Claimed,
    term_id: &str,
) -> Option<bool> {
    loop {
        let status = ctx.bounded(async {
            ctx.store
                .claim_status(
                    &*ctx.client().await?,
                    &ctx.namespace,
                    name,
                    due,
                    claimed,
                    term_id,
                )
                .await
        });
        match status.await {
            Ok(ClaimStatus::Committed) => {
                tracing::info!(job = name, due = %due, "the claim was committed: the run starts");
                return Some(true);
            }
            Ok(ClaimStatus::Aborted) => return Some(false),
            Ok(ClaimStatus::Unsettled) => {
                tracing::debug!(job = name, due = %due, "the claim is still committing");
            }
            Err(e) => tracing::debug!(job = name, error = %e, "cannot read the claim back yet"),
        }
        tokio::select! {
            () = term.cancelled() => return None,
            () = tokio::time::sleep(ctx.poll) => {}
        }
    }
}

/// Records `skipped` (dues of a pass that do not run) as `skipped` rows, and the job's row as
/// handled up to `through`, in a fenced transaction on the leader, and counts them; `NotOurs`
/// when another replica (or this one, earlier) moved the job's row on since `last` was read.
async fn skip_dues(
    ctx: &Context,
    registered: &Registered,
    last: Timestamp,
    through: Timestamp,
    skipped: &[plan::Skipped],
    term_id: &str,
) -> Taken {
    let name = registered.job.name.as_str();
    let label: Arc<str> = name.into();
    let work = ctx.elector.do_work_named(&label, |term| async move {
        let who = ctx.claimant(&term, term_id);
        ctx.bounded(async {
            let mut client = ctx.client().await?;
            let tx = client.transaction().await?;
            if term.epoch().is_some() {
                term.fence(&tx).await.map_err(ScheduleError::Fence)?;
            }
            let recorded = ctx
                .store
                .skip(&tx, &ctx.namespace, name, (last, through), skipped, &who)
                .await?;
            tx.commit().await?;
            Ok(recorded)
        })
        .await
    });
    match work.await {
        Ok(Some(true)) => {
            for stretch in skipped {
                tracing::info!(
                    job = name,
                    reason = %stretch.reason,
                    dues = stretch.dues,
                    latest = %stretch.latest,
                    "skipping missed dues"
                );
                count_skipped(ctx, registered, stretch.reason, stretch.dues);
            }
            Taken::Ran
        }
        Ok(Some(false) | None) => Taken::NotOurs,
        Err(ScheduleError::Fence(fenced)) if !fenced.is_query_error() => Taken::NotOurs,
        Err(e) => {
            tracing::warn!(job = name, error = %e, "cannot skip the missed dues");
            Taken::Failed
        }
    }
}

/// A job halted in this process: while this replica leads, every poll, the dues that passed
/// (and will not run) are recorded as `skipped` rows and counted, until the term ends.
async fn count_halted(
    ctx: &Context,
    registered: &Registered,
    term_id: &str,
    stop: &CancellationToken,
) {
    let name = registered.job.name.as_str();
    let label: Arc<str> = name.into();
    let mut counted_until = Timestamp::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(ctx.poll) => {}
        }
        let now = Timestamp::now();
        let spec = &registered.job.spec;
        let dues = spec.count_between(counted_until, now);
        let Some(latest) = spec.previous(now, true).filter(|_| dues > 0) else {
            continue;
        };
        let stretch = plan::Skipped {
            reason: SkipReason::Halted,
            latest,
            dues,
        };
        let work = ctx.elector.do_work_named(&label, |term| async move {
            let who = ctx.claimant(&term, term_id);
            ctx.bounded(async {
                ctx.store
                    .record_skipped(
                        &*ctx.client().await?,
                        &ctx.namespace,
                        name,
                        &[stretch],
                        &who,
                    )
                    .await
            })
            .await
        });
        match work.await {
            Ok(Some(())) => {
                count_skipped(ctx, registered, SkipReason::Halted, dues);
                counted_until = latest;
            }
            // Not leading: no due of it was this replica's to run.
            Ok(None) => counted_until = latest,
            Err(e) => {
                tracing::debug!(job = name, error = %e, "cannot record the halted job's dues; retrying")
            }
        }
    }
}

/// Counts `dues` due runs of the job that did not run, for `reason`.
fn count_skipped(ctx: &Context, registered: &Registered, reason: SkipReason, dues: u64) {
    #[cfg(feature = "prometheus")]
    if let Some(metrics) = &ctx.metrics {
        metrics.skipped(&registered.job.name, reason, dues);
    }
    #[cfg(not(feature = "prometheus"))]
    let _ = (ctx, registered, reason, dues);
}

/// Reports one run's outcome to the job's probe and metrics.
fn record(
    ctx: &Context,
    registered: &Registered,
    outcome: &str,
    error: Option<&str>,
    took: Option<Duration>,
) {
    match (outcome, error) {
        ("succeeded", _) => registered.probe.record(TickOutcome::Succeeded),
        (_, Some(error)) => registered.probe.record(TickOutcome::Failed(format!(
            "job {:?}: {error}",
            registered.job.name
        ))),
        _ => {}
    }
    #[cfg(feature = "prometheus")]
    if let Some(metrics) = &ctx.metrics {
        metrics.record(&registered.job.name, outcome, took);
    }
    #[cfg(not(feature = "prometheus"))]
    let _ = (ctx, took);
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::time::Duration;

    use super::*;
    use crate::Fenced;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn the_grace_after_a_term_is_at_least_the_elector_s_drain_timeout() {
        let poll = Duration::from_millis(200);
        assert_eq!(
            grace(poll, Duration::ZERO),
            2 * SEC,
            "two polls, at least 2 s"
        );
        assert_eq!(grace(poll, Duration::from_millis(200)), 2 * SEC);
        assert_eq!(grace(poll, 6 * SEC), 6 * SEC, "the drain timeout");
        assert_eq!(grace(5 * SEC, 6 * SEC), 10 * SEC, "two polls");
        assert_eq!(grace(poll, Duration::MAX), Duration::MAX);
        assert_eq!(
            grace(poll, Elector::manual().0.drain_timeout()),
            crate::DEFAULT_CHECK_INTERVAL,
            "a local elector's drain timeout"
        );
    }

    #[test]
    fn only_a_lost_answer_leaves_a_commit_unknown() {
        assert!(ScheduleError::Timeout(SEC).leaves_commit_unknown());
        assert!(!ScheduleError::PoolTimeout(SEC).leaves_commit_unknown());
        assert!(
            !ScheduleError::Fence(Fenced::term_ended(Some(7))).leaves_commit_unknown(),
            "a fence refused before the COMMIT"
        );
    }

    #[test]
    fn a_poll_interval_is_kept_between_10_ms_and_an_hour() {
        assert_eq!(
            poll_within_bounds(Duration::ZERO),
            Duration::from_millis(10)
        );
        assert_eq!(poll_within_bounds(Duration::MAX), Duration::from_secs(3600));
        assert_eq!(poll_within_bounds(SEC), SEC);
        let (elector, _control) = Elector::manual();
        let mut config = deadpool_postgres::Config::new();
        config.dbname = Some("never-connected".to_owned());
        let pool = config.create_pool(None, tokio_postgres::NoTls).unwrap();
        let schedule = Schedule::new(&elector, pool).poll_interval(Duration::MAX);
        assert_eq!(schedule.poll, MAX_POLL_INTERVAL);
        assert_eq!(schedule.handle().wait, MAX_POLL_INTERVAL);
    }

    #[test]
    fn every_bound_derived_from_a_user_duration_saturates_instead_of_overflowing() {
        for poll in [
            Duration::ZERO,
            Duration::from_millis(10),
            SEC,
            Duration::MAX,
        ] {
            // No panic on any input, and each bound at least its floor.
            assert!(query_bound(poll) >= 2 * SEC, "{poll:?}");
            assert!(borrow_bound(poll) >= SEC, "{poll:?}");
        }
        assert_eq!(query_bound(Duration::MAX), Duration::MAX);
        assert_eq!(query_bound(Duration::from_millis(50)), 2 * SEC);
        assert_eq!(query_bound(5 * SEC), 10 * SEC);
        assert_eq!(borrow_bound(MAX_POLL_INTERVAL), MAX_POLL_INTERVAL);
        assert_eq!(grace(Duration::MAX, Duration::MAX), Duration::MAX);
        // What a schedule derives from its largest poll is far from any overflow.
        assert_eq!(query_bound(MAX_POLL_INTERVAL), 2 * MAX_POLL_INTERVAL);
    }

    #[test]
    fn an_error_says_its_cause_once() {
        let pool = ScheduleError::Pool(Box::new(deadpool_postgres::PoolError::Closed));
        let fence = ScheduleError::Fence(Fenced::term_ended(Some(7)));
        for error in [pool, fence] {
            assert!(error.source().is_none(), "{error:?}");
        }
        let fence = ScheduleError::Fence(Fenced::term_ended(Some(7)));
        assert_eq!(
            fence.to_string(),
            "the claim's fence failed: fenced: the term of epoch 7 has ended"
        );
    }
}
