//! What the job tasks of a running schedule share: the tables, the elector, the pool, the
//! bounds of every query, what this process remembers across terms, and the job metrics; and
//! what they do with it alike: make the tables ready, name a term, report a run's outcome or
//! a skipped due to the probe and the metrics.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Object, Pool};
use jiff::Timestamp;

use super::store::{Claimant, Ensured, Outcome, Store};
use super::{
    ENDED_TERMS, LostState, Registered, Schedule, ScheduleError, SkipReason, borrow_bound,
    query_bound,
};
use crate::background::TickOutcome;
use crate::pooled::{NotBorrowed, outside_transactions};
use crate::sync::lock;
use crate::{Elector, Term};

/// What every job task of a running schedule shares.
pub(super) struct Context {
    pub(super) store: Store,
    pub(super) elector: Elector,
    pub(super) pool: Pool,
    pub(super) namespace: String,
    pub(super) poll: Duration,
    pub(super) lost_state: LostState,
    /// Jobs whose row this process has seen: a missing row then means lost state.
    pub(super) seen: Mutex<HashSet<String>>,
    /// The latest terms of this schedule that have ended: their runs are over (a term's job
    /// tasks are joined or aborted before the next term begins), so a run they left `running`
    /// is abandoned at once, without waiting for it to go quiet.
    pub(super) ended: Mutex<Vec<String>>,
    /// Jobs halted by [`LostState::Halt`]: they run no more in this process.
    pub(super) halted: Mutex<HashSet<String>>,
    /// The latest due this process moved each job's row to (a claim or a skip): a row read
    /// later that is behind it lost committed writes.
    moved_to: Mutex<HashMap<String, Timestamp>>,
    #[cfg(feature = "prometheus")]
    pub(super) metrics: Option<super::metrics::JobMetrics>,
}

impl Context {
    /// What the job tasks of `schedule` share, its job metrics registered.
    pub(super) fn new(schedule: &Schedule) -> Result<Self, ScheduleError> {
        let ctx = Context {
            store: Store::new(schedule.schema.as_deref(), &schedule.prefix)?,
            elector: schedule.elector.clone(),
            pool: schedule.pool.clone(),
            namespace: schedule.namespace.clone(),
            poll: schedule.poll,
            lost_state: schedule.lost_state,
            seen: Mutex::new(HashSet::new()),
            ended: Mutex::new(Vec::new()),
            halted: Mutex::new(HashSet::new()),
            moved_to: Mutex::new(HashMap::new()),
            #[cfg(feature = "prometheus")]
            metrics: match &schedule.registry {
                Some(registry) => Some(
                    super::metrics::JobMetrics::register(registry)
                        .map_err(|e| {
                            tracing::error!(error = %e, "job metrics not registered");
                            e
                        })
                        .ok(),
                )
                .flatten(),
                None => None,
            },
        };
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &ctx.metrics {
            for registered in &schedule.jobs {
                metrics.add_job(&registered.job.name);
            }
        }
        Ok(ctx)
    }

    /// Remembers that the term `term_id` has ended: its runs are over.
    pub(super) fn term_ended(&self, term_id: String) {
        let mut ended = lock(&self.ended);
        if ended.len() == ENDED_TERMS {
            ended.remove(0);
        }
        ended.push(term_id);
    }

    /// Remembers that this process moved `job`'s row to `due` (a claim or a skip committed).
    pub(super) fn moved_row(&self, job: &str, due: Timestamp) {
        let mut moved = lock(&self.moved_to);
        let latest = moved.entry(job.to_owned()).or_insert(due);
        *latest = (*latest).max(due);
    }

    /// Says at ERROR when `job`'s row, read at `last_due`, is behind a due this process moved
    /// it to: the database lost committed writes, and the dues in between may run again.
    /// Said once for each loss (what the row says is taken from then on); `true` when it was.
    pub(super) fn row_went_back(&self, job: &str, last_due: Option<Timestamp>) -> bool {
        let mut moved = lock(&self.moved_to);
        let Some(&wrote) = moved.get(job) else {
            return false;
        };
        if last_due.is_some_and(|due| due >= wrote) {
            return false;
        }
        moved.remove(job);
        tracing::error!(
            job,
            row_due = ?last_due.map(|due| due.to_string()),
            written_due = %wrote,
            "the job's row is behind what this process wrote to it: the database lost committed \
             writes (a failover to a standby that had not received them, or a restore); dues \
             after the row's may run a second time"
        );
        true
    }

    /// This replica in `term`, as it claims runs and records skipped dues.
    pub(super) fn claimant<'a>(&'a self, term: &Term, term_id: &'a str) -> Claimant<'a> {
        Claimant {
            identity: self.elector.identity().unwrap_or("local"),
            term_id,
            epoch: term.epoch(),
            heartbeat: self.poll,
        }
    }

    /// Runs `statement` on a connection of the pool, borrow and statement bounded together by
    /// the query bound: a partition must not hang a job's task (and with it the end of the
    /// term and the shutdown). See [`on_connection`] for what becomes of the connection.
    pub(super) async fn query<T>(
        &self,
        statement: impl AsyncFnOnce(&mut Object) -> Result<T, ScheduleError>,
    ) -> Result<T, ScheduleError> {
        self.query_within(query_bound(self.poll), statement).await
    }

    /// [`query`](Self::query) within `bound`.
    pub(super) async fn query_within<T>(
        &self,
        bound: Duration,
        statement: impl AsyncFnOnce(&mut Object) -> Result<T, ScheduleError>,
    ) -> Result<T, ScheduleError> {
        let wait = borrow_bound(self.poll).min(bound);
        on_connection(&self.pool, wait, bound, statement).await
    }
}

/// A term's unique id, stored with each claim: a run left `running` under another id was
/// abandoned by an earlier term.
pub(super) fn term_id(elector: &Elector) -> String {
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
pub(super) async fn ensure_tables(ctx: &Context, until: impl Future<Output = ()>) -> bool {
    let mut until = std::pin::pin!(until);
    let mut told = false;
    loop {
        let made = ctx.query(async |client| ctx.store.ensure(client).await);
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
            Err(e) if e.is_lock_timeout() && !told => {
                tracing::warn!(error = %e, "the job tables' upgrade waits for a lock another session holds on them; tried again every poll, jobs wait");
                told = true;
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

/// Counts `dues` due runs of the job that did not run, for `reason`.
pub(super) fn count_skipped(ctx: &Context, registered: &Registered, reason: SkipReason, dues: u64) {
    #[cfg(feature = "prometheus")]
    if let Some(metrics) = &ctx.metrics {
        metrics.skipped(&registered.job.name, reason, dues);
    }
    #[cfg(not(feature = "prometheus"))]
    let _ = (ctx, registered, reason, dues);
}

/// Reports one run's outcome to the job's probe and metrics.
pub(super) fn record(
    ctx: &Context,
    registered: &Registered,
    outcome: Outcome,
    error: Option<&str>,
    took: Option<Duration>,
) {
    match (outcome, error) {
        (Outcome::Succeeded, _) => registered.probe.record(TickOutcome::Succeeded),
        (_, Some(error)) => registered.probe.record(TickOutcome::Failed(format!(
            "job {:?}: {error}",
            registered.job.name
        ))),
        _ => {}
    }
    #[cfg(feature = "prometheus")]
    if let Some(metrics) = &ctx.metrics {
        metrics.record(&registered.job.name, outcome.as_str(), took);
    }
    #[cfg(not(feature = "prometheus"))]
    let _ = (ctx, took);
}

/// Runs `statement` on a connection of `pool` borrowed within `wait`, the whole within
/// `bound`: the one way the schedule's job tasks and its handle reach the job tables. The
/// connection is one outside any transaction ([`outside_transactions`]: a connection the
/// application handed back inside one is closed, and another borrowed).
///
/// The connection goes back to the pool once `statement` has succeeded (every statement it
/// sent answered). Cut off by `bound`, dropped, or failed, the connection is closed instead: its statement may still run on the server (a COMMIT waiting for a
/// synchronous standby, an UPDATE waiting on a row lock, a socket gone quiet), and the next
/// borrower, the application's own code among them when it shares the pool, would queue
/// behind it.
///
/// # Errors
///
/// [`ScheduleError::PoolTimeout`] (naming `wait`) when the pool had no connection in time,
/// [`ScheduleError::Timeout`] (naming `bound`) when the answer did not come in time, or what
/// `statement` returned.
pub(super) async fn on_connection<T>(
    pool: &Pool,
    wait: Duration,
    bound: Duration,
    statement: impl AsyncFnOnce(&mut Object) -> Result<T, ScheduleError>,
) -> Result<T, ScheduleError> {
    let started = tokio::time::Instant::now();
    let deadline = started + bound;
    // Never on a connection inside a transaction the application left open.
    let mut borrowed = outside_transactions(pool, started + wait, deadline)
        .await
        .map_err(|e| match e {
            NotBorrowed::PoolTimeout => ScheduleError::PoolTimeout(wait),
            NotBorrowed::Timeout => ScheduleError::Timeout(bound),
            NotBorrowed::Pool(e) => ScheduleError::Pool(Box::new(e)),
            NotBorrowed::Query(e) => ScheduleError::Database(e),
        })?;
    let answer = tokio::time::timeout_at(deadline, statement(borrowed.client_mut()))
        .await
        .map_err(|_| ScheduleError::Timeout(bound))?;
    // An error may leave something unanswered on the connection (a transaction dropped on
    // the way out queues its ROLLBACK without waiting for it): closed too.
    if answer.is_ok() {
        borrowed.give_back();
    }
    answer
}
