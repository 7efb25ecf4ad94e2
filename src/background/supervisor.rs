//! The worker supervisor: named workers, restarted with backoff within a budget.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::panic::{CaughtIn, catch_panic};
use super::probe::{Probe, TickOutcome};
use super::{LeaderTicker, WhileLeader};
use crate::{Elector, Term};
pub use restart::RestartPolicy;
use restart::Restarts;

/// The supervisor probe's default name.
pub const DEFAULT_SUPERVISOR_PROBE: &str = "workers";

/// What a worker's future may return: `()` or `Result<(), E>` with a displayable `E`.
pub trait WorkerResult {
    /// `Ok(())` when the worker finished, `Err` with the error's text when it failed.
    fn into_worker_result(self) -> Result<(), String>;
}

impl WorkerResult for () {
    fn into_worker_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Display> WorkerResult for Result<(), E> {
    fn into_worker_result(self) -> Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

type BoxedRun = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type Factory = Box<dyn FnMut(CancellationToken) -> BoxedRun + Send>;

/// Runs named workers, restarts those that fail, and stops them all at shutdown.
///
/// A worker is a function that is given a [`CancellationToken`] and returns a future: it
/// should return when the token is cancelled. Each worker runs in its own task. When its
/// future returns an error or panics, the worker is restarted (by calling the function again)
/// after a backoff, within a restart budget (see [`RestartPolicy`]); past the budget it stops
/// for good and the supervisor's [`probe`](Self::probe) fails, naming it. A worker that
/// returns `Ok` (or `()`) before shutdown is done and not restarted.
///
/// Run the elector's [`run`](crate::Elector::run) as one of the workers: this is the
/// documented way to start the election, and a panic in it is then logged and restarted
/// (`run` may be called again after a panic).
///
/// A panic is caught only where the build unwinds: with `panic = "abort"` it aborts the
/// process, and nothing restarts. The first worker to run installs a process-wide panic hook,
/// chained to the previous one, to capture the backtrace (see [`install_panic_hook`]).
///
/// [`install_panic_hook`]: super::install_panic_hook
///
/// Logs: ERROR `worker panicked` (`worker`, `panic`, `location`, `backtrace`), WARN
/// `worker failed` (`worker`, `error`, `restart_in`), ERROR `worker stopped: restart
/// budget spent` (`worker`, `error`).
///
/// ```
/// use std::time::Duration;
/// use pg_elector::Elector;
/// use pg_elector::background::{LeaderTicker, Supervisor};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let elector = Elector::always_leader(); // Elector::builder(pool, key).build()? in production
/// let ticker = LeaderTicker::new("sweep", &elector, Duration::from_millis(10));
///
/// let supervisor = Supervisor::new()
///     .worker("pg-elector", {
///         let elector = elector.clone();
///         move |token| {
///             let elector = elector.clone();
///             async move { elector.run(token).await }
///         }
///     })
///     .worker("sweep", move |token| {
///         let ticker = ticker.clone();
///         async move {
///             ticker.run(token, |_term| async { Ok::<_, std::io::Error>(()) }).await
///         }
///     });
/// let probe = supervisor.probe(); // add it to the Readiness set of /readyz
///
/// let shutdown = CancellationToken::new();
/// let stopper = shutdown.clone();
/// tokio::spawn(async move {
///     tokio::time::sleep(Duration::from_millis(50)).await;
///     stopper.cancel();
/// });
/// supervisor.run(shutdown).await; // returns once every worker has stopped
/// assert!(probe.status().is_pass());
/// assert!(!elector.is_leader(), "the election was shut down");
/// # }
/// ```
#[must_use = "a supervisor does nothing until it is run"]
pub struct Supervisor {
    workers: Vec<(Arc<str>, Factory)>,
    policy: RestartPolicy,
    shutdown_timeout: Duration,
    /// The longest its electors and launchers may take to stop gracefully: the shutdown waits
    /// at least this long, whatever its timeout.
    stop_bound: Duration,
    probe: Probe,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    /// A supervisor with no workers, the default [`RestartPolicy`], a shutdown timeout of
    /// 30 s, and a probe named [`DEFAULT_SUPERVISOR_PROBE`] (`workers`).
    pub fn new() -> Self {
        Self {
            workers: Vec::new(),
            policy: RestartPolicy::default(),
            shutdown_timeout: Duration::from_secs(30),
            stop_bound: Duration::ZERO,
            probe: Probe::new(DEFAULT_SUPERVISOR_PROBE),
        }
    }

    /// The restart policy of every worker. Default: [`RestartPolicy::default`].
    pub fn restart_policy(mut self, policy: RestartPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long [`run`](Self::run) waits for the workers after shutdown before it aborts the
    /// ones still running (each is named in a WARN line). Default 30 s.
    ///
    /// Never shorter than a graceful stop of the electors and launchers added with
    /// [`election`](Self::election), [`ticker`](Self::ticker) and
    /// [`while_leader`](Self::while_leader) may take (the elector's drain timeout, one check
    /// interval while draining and the unlock's 2 s; a launcher's stop grace if longer): an
    /// abort inside that time would drop the work the drain waits for, and the lock with the
    /// session, so the next leader could start while that work's statements still run.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Names the supervisor's probe. Default [`DEFAULT_SUPERVISOR_PROBE`] (`workers`).
    ///
    /// Renames the one probe of this supervisor, so a probe taken earlier with
    /// [`probe`](Self::probe) carries the new name too and reports the same state.
    pub fn probe_name(self, name: impl Into<String>) -> Self {
        self.probe.rename(name.into());
        self
    }

    /// Adds a worker named `name`. `start` is called for each (re)start with a token that is
    /// cancelled at shutdown.
    pub fn worker<F, Fut>(mut self, name: impl Into<String>, mut start: F) -> Self
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerResult,
    {
        let factory: Factory = Box::new(move |token| {
            let run = start(token);
            Box::pin(async move { run.await.into_worker_result() })
        });
        let name: String = name.into();
        self.workers.push((name.into(), factory));
        self
    }

    /// Runs `elector`'s election as the worker `pg-elector`: the short form of
    /// `.worker("pg-elector", move |token| { let e = elector.clone(); async move { e.run(token).await } })`.
    ///
    /// The elector of one shard of a group (`Shards::elector`) is run by its group's
    /// `Shards::run`, not here: its worker runs nothing and watches the group instead. While
    /// the group's run is in progress (as another worker, or wherever it runs) the worker waits
    /// for shutdown; when the group's run has not been in progress for two of its check
    /// intervals (at least a second: not started, or ended and not restarted), the worker fails
    /// (nothing leads the shard then) and is restarted by the policy, so that a group never run
    /// spends the budget and fails the probe, naming the fix.
    pub fn election(mut self, elector: &Elector) -> Self {
        if elector.is_shard() {
            let elector = elector.clone();
            return self.worker("pg-elector", move |token| {
                let elector = elector.clone();
                async move { watch_group(&elector, token).await }
            });
        }
        self.stop_bound = self.stop_bound.max(elector.graceful_stop_bound());
        let elector = elector.clone();
        self.worker("pg-elector", move |token| {
            let elector = elector.clone();
            async move { elector.run(token).await }
        })
    }

    /// Runs `ticker` as a worker named after it, calling `tick` for every tick on the leader
    /// (see [`LeaderTicker::run`]).
    pub fn ticker<F, Fut, E>(mut self, ticker: LeaderTicker, tick: F) -> Self
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.stop_bound = self.stop_bound.max(ticker.stop_bound());
        let tick = Arc::new(tick);
        let name = ticker.name().to_owned();
        self.worker(name, move |token| {
            let (ticker, tick) = (ticker.clone(), tick.clone());
            async move { ticker.run(token, move |term| tick(term)).await }
        })
    }

    /// Runs `launcher` as a worker named after it, calling `run_loop` in every term this
    /// replica leads (see [`WhileLeader::run`]).
    pub fn while_leader<F, Fut, E>(mut self, launcher: WhileLeader, run_loop: F) -> Self
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.stop_bound = self.stop_bound.max(launcher.stop_bound());
        let run_loop = Arc::new(run_loop);
        let name = launcher.name().to_owned();
        self.worker(name, move |token| {
            let (launcher, run_loop) = (launcher.clone(), run_loop.clone());
            async move { launcher.run(token, move |term| run_loop(term)).await }
        })
    }

    /// The probe that fails once a worker stopped for good, naming every such worker. Add it
    /// to the [`Readiness`](super::Readiness) set; take it before [`run`](Self::run).
    pub fn probe(&self) -> Probe {
        self.probe.clone()
    }

    /// [`run`](Self::run) until the first SIGTERM or SIGINT (Ctrl-C elsewhere than on Unix),
    /// with [`shutdown_on_signal`](super::shutdown_on_signal)'s token: the service's `main`
    /// needs no signal handling of its own.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub async fn run_until_signal(self) {
        self.run(super::shutdown_on_signal()).await;
    }

    /// Runs every worker until `shutdown` is cancelled, then cancels them all and waits for
    /// them (at most the [shutdown timeout](Self::shutdown_timeout)).
    ///
    /// Each worker runs in a task spawned on the current runtime. Returns once every task has
    /// ended, early when all workers have finished or stopped.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future aborts every worker's task (each worker's future is dropped at
    /// its current `.await`); no task outlives it.
    pub async fn run(self, shutdown: CancellationToken) {
        let stopped = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut tasks = JoinSet::new();
        let mut running = Vec::new();
        for (name, factory) in self.workers {
            let watch = Watch {
                name: name.clone(),
                policy: self.policy,
                probe: self.probe.clone(),
                stopped: stopped.clone(),
            };
            let span = tracing::info_span!("worker", worker = %name);
            let task = supervise(watch, factory, shutdown.clone()).instrument(span);
            running.push((tasks.spawn(task).id(), name));
        }
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                joined = tasks.join_next_with_id() => match joined {
                    None => return,
                    Some(joined) => joined_one(&mut running, joined),
                },
            }
        }
        let limit = self.shutdown_timeout.max(self.stop_bound);
        let waited = tokio::time::timeout(limit, async {
            while let Some(joined) = tasks.join_next_with_id().await {
                joined_one(&mut running, joined);
            }
        })
        .await;
        if waited.is_err() {
            let names: Vec<&str> = running.iter().map(|(_, name)| &**name).collect();
            tracing::warn!(
                workers = ?names,
                timeout = ?limit,
                "workers did not stop within the shutdown timeout; aborting them"
            );
            tasks.shutdown().await;
        }
    }
}

/// How often the worker of a shard's elector looks whether its group runs.
const GROUP_WATCH_EVERY: Duration = Duration::from_millis(100);

/// The worker of a shard's elector ([`Supervisor::election`]): `Ok` at shutdown; an error
/// once the shard's group has not been running for a grace of two of its intervals (at least a
/// second), at the start or after its run ended (a group restarted by its own worker runs again
/// within that time, and costs this worker nothing).
async fn watch_group(elector: &Elector, shutdown: CancellationToken) -> Result<(), &'static str> {
    let interval = elector.check_interval().unwrap_or_default();
    let grace = (2 * interval).max(Duration::from_secs(1));
    let mut last_ran = Instant::now();
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        if elector.group_runs() == Some(true) {
            last_ran = Instant::now();
        } else if last_ran.elapsed() >= grace {
            return Err(
                "a shard's elector runs only in its group, and the group's Shards::run has not been running: nothing leads this shard; run it (another worker, or Shards::spawn)",
            );
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(GROUP_WATCH_EVERY) => {}
        }
    }
}

/// Takes a finished task off the running list; a task that did not end normally is logged
/// (the supervision loop catches the worker's panics, so that is a bug or an abort).
fn joined_one(
    running: &mut Vec<(tokio::task::Id, Arc<str>)>,
    joined: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
) {
    let id = match &joined {
        Ok((id, ())) => *id,
        Err(e) => e.id(),
    };
    let Some(at) = running.iter().position(|(task, _)| *task == id) else {
        return;
    };
    let (_, name) = running.swap_remove(at);
    if let Err(e) = joined {
        tracing::error!(worker = %name, error = %e, "worker task ended abnormally");
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field(
                "workers",
                &self.workers.iter().map(|(n, _)| &**n).collect::<Vec<_>>(),
            )
            .field("policy", &self.policy)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("stop_bound", &self.stop_bound)
            .field("probe", &self.probe)
            .finish()
    }
}

/// What one worker's supervision loop reports to.
struct Watch {
    name: Arc<str>,
    policy: RestartPolicy,
    probe: Probe,
    stopped: Arc<Mutex<Vec<String>>>,
}

impl Watch {
    fn give_up(&self, error: &str) {
        tracing::error!(worker = %self.name, error = %error, "worker stopped: restart budget spent");
        let mut stopped = crate::sync::lock(&self.stopped);
        stopped.push(format!(
            "worker {:?} stopped after its restart budget ({} within {:?}); last error: {error}",
            &*self.name, self.policy.budget, self.policy.window
        ));
        self.probe.record(TickOutcome::Failed(stopped.join("; ")));
    }
}

/// Runs one worker, restarting it per the policy, until shutdown or the budget is spent.
async fn supervise(watch: Watch, mut start: Factory, shutdown: CancellationToken) {
    let mut restarts = Restarts::default();
    loop {
        let token = shutdown.child_token();
        tracing::debug!(worker = %watch.name, "worker starting");
        // `start` is called inside the guard too: a panic in its synchronous part (a bad
        // setting found at start) is a failed start like any other.
        let error = match catch_panic(async { start(token).await }).await {
            Ok(Ok(())) => {
                if shutdown.is_cancelled() {
                    tracing::debug!(worker = %watch.name, "worker stopped");
                } else {
                    tracing::info!(worker = %watch.name, "worker finished; it is not restarted");
                }
                return;
            }
            Ok(Err(error)) => error,
            Err(panic) => {
                panic.log(CaughtIn::Worker(&watch.name));
                format!("panicked: {}", panic.message)
            }
        };
        if shutdown.is_cancelled() {
            tracing::debug!(worker = %watch.name, error = %error, "worker failed during shutdown");
            return;
        }
        let Some(wait) = restarts.next(&watch.policy, Instant::now()) else {
            watch.give_up(&error);
            return;
        };
        tracing::warn!(worker = %watch.name, error = %error, restart_in = ?wait, "worker failed");
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

mod restart;
#[cfg(test)]
mod tests;
