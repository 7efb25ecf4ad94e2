//! The while-leader launcher: a self-paced loop that runs for one term at a time.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::gate::Gate;
use super::panic::{CaughtIn, CaughtPanic, catch_panic};
use super::probe::{Probe, TickOutcome};
use crate::{Term, TermEnd};

/// Runs a self-paced loop on the leader, one leadership term at a time.
///
/// For each term this replica leads, the launcher calls the loop once with that term (linked
/// to the launcher's shutdown token). When the term ends, the term's token is cancelled, so a
/// loop that watches it can see the end and return; the launcher then waits for the next term
/// and starts the loop again. A loop that does not return is dropped at its current `.await`:
///
/// | how the term ended | the loop may run on for |
/// |---|---|
/// | leadership lost (the lock is gone: another replica may lead already) | its [grace](Self::stop_grace), none by default |
/// | gracefully: the launcher's or the elector's shutdown, a [resign](crate::Elector::resign), a handover to a preferred standby | the elector's [drain timeout](crate::Elector::drain_timeout), or its grace if longer |
///
/// The elector does not unlock until a loop that ended gracefully has returned (or that time
/// has passed), so the next leader starts after the statements the loop had sent have
/// finished. So a loop should return promptly once its token is cancelled, as the example
/// below does: one that goes on working holds a graceful handover up to the drain timeout.
///
/// A loop that returns while its term is still live (`Ok`, `Err` or a panic) is not spun:
/// it is started again only in a later term. An `Err` while leading logs WARN `loop failed`
/// (`loop_name`, `error`), a panic logs ERROR `loop panicked` (`loop_name`, `panic`,
/// `location`, `backtrace`); an outcome that arrives after the term ended is dropped, as
/// [`do_work`](crate::Elector::do_work) drops it. A panic is caught only where the build
/// unwinds: with `panic = "abort"` it aborts the process. The first loop to run installs a
/// process-wide panic hook, chained to the previous one, to capture the backtrace (see
/// [`install_panic_hook`](super::install_panic_hook)).
///
/// **Waiting for a term.** The launcher waits on
/// [`Elector::wait_for_leadership`](crate::Elector::wait_for_leadership), so a new term starts
/// the loop at once, with no polling; the end of a term is seen at once, through its token.
///
/// **Probe.** With a [probe](Self::probe), the launcher records: standby (pass) when it finds
/// this replica not leading, success (pass) when the loop starts in a new term, and the
/// failure (or panic) when the loop fails while leading, which stays until the next term
/// starts the loop again or the replica is seen standby.
///
/// ```
/// use std::time::Duration;
/// use pg_elector::Elector;
/// use pg_elector::background::WhileLeader;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let (elector, control) = Elector::manual();
/// let shutdown = CancellationToken::new();
/// let archiver = WhileLeader::new("audit-archiver", &elector);
/// let launcher = tokio::spawn({
///     let shutdown = shutdown.clone();
///     async move {
///         archiver
///             .run(shutdown, |term| async move {
///                 while term.is_leader() {
///                     // ... archive one batch, then pace ...
///                     tokio::select! {
///                         _ = term.cancelled() => {}
///                         _ = tokio::time::sleep(Duration::from_millis(5)) => {}
///                     }
///                 }
///                 Ok::<_, std::io::Error>(())
///             })
///             .await
///     }
/// });
///
/// control.promote(); // the loop starts at once
/// tokio::time::sleep(Duration::from_millis(50)).await;
/// control.demote(); // its term's token is cancelled, and the loop stops
/// shutdown.cancel();
/// launcher.await.unwrap();
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a launcher does nothing until it is run"]
pub struct WhileLeader {
    name: Arc<str>,
    gate: Gate,
    grace: Duration,
    probe: Option<Probe>,
}

impl WhileLeader {
    /// A launcher for the loop `name` (the `loop_name` of its log lines), run while `gate` is
    /// open.
    pub fn new(name: impl Into<String>, gate: impl Into<Gate>) -> Self {
        let name: String = name.into();
        Self {
            name: name.into(),
            gate: gate.into(),
            grace: Duration::ZERO,
            probe: None,
        }
    }

    /// How long a loop may keep running after its term was lost, to finish what it does on
    /// seeing the term's token, before its future is dropped. Default zero: dropped at once.
    /// After a graceful end of the term the loop may run on for the elector's drain timeout
    /// anyway (or this, if longer).
    ///
    /// Another replica may lead during the grace after a lost term, so keep it short.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Reports the loop's state to `probe` (a clone of it). Default: no probe.
    pub fn probe(mut self, probe: &Probe) -> Self {
        self.probe = Some(probe.clone());
        self
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the loop in every term this replica leads, until `shutdown` is cancelled.
    ///
    /// `run_loop` is called once per term; its future need not be `'static` or `Send`
    /// unless the caller spawns this future.
    ///
    /// # Cancel safety
    ///
    /// On shutdown the loop's term ends too (with
    /// [`TermEnd::ParentCancelled`](crate::TermEnd::ParentCancelled)), and the loop is stopped
    /// as at any graceful end of a term: it may run on for the elector's drain timeout (or its
    /// grace, if longer). Dropping this future drops the loop's future at once. Nothing
    /// outlives the future.
    pub async fn run<F, Fut, E>(&self, shutdown: CancellationToken, mut run_loop: F)
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        tracing::debug!(loop_name = %self.name, "while-leader launcher started");
        loop {
            if !self.gate.is_open() {
                self.record(TickOutcome::Standby);
            }
            let Some(term) = self.gate.next_term(&shutdown).await else {
                break;
            };
            // Counted as running (for a graceful handover's drain) from before leadership is
            // looked at again, until the loop's future is dropped, grace included.
            let in_flight = self
                .gate
                .elector()
                .shared
                .in_flight()
                .enter(self.name.clone());
            if !term.is_leader() {
                continue;
            }
            tracing::debug!(loop_name = %self.name, "loop starting for a new term");
            self.record(TickOutcome::Succeeded);
            let span = tracing::debug_span!("while_leader", loop_name = %self.name);
            let outcome = {
                // Scoped, so the loop's future is dropped as soon as it is stopped.
                // `run_loop` is called inside the guard, so a panic in its synchronous part
                // is caught like one in the loop.
                let mut running = std::pin::pin!(
                    catch_panic(async { run_loop(term.clone()).await }).instrument(span)
                );
                let outcome = tokio::select! {
                    biased;
                    outcome = &mut running => Some(outcome),
                    _ = term.cancelled() => None,
                };
                match outcome {
                    Some(outcome) => Some(outcome),
                    None => {
                        let keep = self.keep_after(term.end());
                        match keep.is_zero() {
                            true => None,
                            false => tokio::time::timeout(keep, &mut running).await.ok(),
                        }
                    }
                }
            };
            drop(in_flight);
            self.report(&term, outcome);
            // Not in the same term again: wait for it to end (or for shutdown, which ends it).
            term.cancelled().await;
        }
        tracing::debug!(loop_name = %self.name, "while-leader launcher stopped");
    }

    /// Says (and records in the probe) how a term's loop ended: `None` when it was stopped
    /// at the term's end (after its grace), else what it returned or how it panicked.
    fn report<E: fmt::Display>(
        &self,
        term: &Term,
        outcome: Option<Result<Result<(), E>, CaughtPanic>>,
    ) {
        match outcome {
            None => {
                tracing::debug!(loop_name = %self.name, end = ?term.end(), "term ended; loop stopped");
            }
            Some(_) if !term.is_leader() => {
                tracing::debug!(loop_name = %self.name, end = ?term.end(), "term ended; loop returned");
            }
            Some(Ok(Ok(()))) => {
                tracing::info!(loop_name = %self.name, "loop returned while leading; it starts again in the next term");
            }
            Some(Ok(Err(error))) => {
                tracing::warn!(loop_name = %self.name, error = %error, "loop failed; it starts again in the next term");
                self.record(TickOutcome::Failed(error.to_string()));
            }
            Some(Err(panic)) => {
                panic.log(CaughtIn::Loop(&self.name));
                self.record(TickOutcome::Failed(format!(
                    "background loop {:?}: loop panicked: {}",
                    &*self.name, panic.message
                )));
            }
        }
    }

    /// How long a loop whose term ended with `end` may run on: after a graceful end (the
    /// launcher's or the elector's shutdown, a resign) until the elector's drain gives up, or
    /// the grace if longer; after a lost term, the grace.
    fn keep_after(&self, end: Option<TermEnd>) -> Duration {
        match end {
            Some(TermEnd::LeadershipLost) => self.grace,
            _ => self.grace.max(self.gate.elector().drain_timeout()),
        }
    }

    /// How long this launcher may take to stop once its shutdown is cancelled: its loop runs
    /// on for the drain timeout or its grace, which the elector's graceful stop covers unless
    /// the grace is longer.
    pub(super) fn stop_bound(&self) -> Duration {
        self.grace.max(self.gate.elector().graceful_stop_bound())
    }

    fn record(&self, outcome: TickOutcome) {
        if let Some(probe) = &self.probe {
            probe.record(outcome);
        }
    }
}

impl fmt::Debug for WhileLeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WhileLeader")
            .field("name", &self.name)
            .field("gate", &self.gate)
            .field("stop_grace", &self.grace)
            .field("probe", &self.probe.as_ref().map(Probe::name))
            .finish()
    }
}
