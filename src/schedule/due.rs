//! One due of a job: claimed by compare-and-set (fenced with the term's epoch when the elector
//! fences, read back when the answer to its COMMIT is lost), run with a heartbeat every poll,
//! and its end recorded.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jiff::Timestamp;

use super::context::{Context, record};
use super::store::{ClaimStatus, Claimed, Outcome, RunRef};
use super::{JobRun, Registered, RunKind, ScheduleError, borrow_bound, stale_after};
use crate::Term;
use crate::background::panic::catch_panic;

/// A claim's commit is durable whatever the session's `synchronous_commit` says: with `off`,
/// a server crash right after the commit returned can lose the claim (and with it, the next
/// term runs the due again), and with `off` or `local` a synchronous standby is not waited
/// for, so a failover to it can run the due again. Stricter settings (`remote_write`,
/// `remote_apply`) are left as they are.
const DURABLE_COMMIT: &str = "SELECT pg_catalog.set_config('synchronous_commit', 'on', true) \
     WHERE pg_catalog.current_setting('synchronous_commit') IN ('off', 'local')";

/// What became of one due that [`run_due`] was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
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
pub(super) async fn run_due(
    ctx: &Context,
    registered: &Registered,
    due: Timestamp,
    kind: RunKind,
    term_id: &str,
) -> Taken {
    let label: Arc<str> = registered.job.name.as_str().into();
    let name = label.clone();
    let work = ctx.elector.do_work_named(&label, |term| async move {
        let Some(attempt) = claim(ctx, &term, &name, due, kind, term_id).await? else {
            return Ok(false);
        };
        if kind == RunKind::Scheduled {
            ctx.moved_row(&name, due);
        }
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
        let job = catch_panic((registered.run)(run));
        let run = RunRef {
            namespace: &ctx.namespace,
            job: &name,
            due,
            attempt,
        };
        let (outcome, error) = match with_heartbeat(ctx, run, job).await {
            Ok(Ok(())) => (Outcome::Succeeded, None),
            Ok(Err(e)) => (Outcome::Failed, Some(e)),
            Err(panic) => (
                Outcome::Failed,
                Some(format!("panicked: {}", panic.message)),
            ),
        };
        if let Some(error) = &error {
            tracing::warn!(job = %name, due = %due, error = %error, "job run failed");
        } else {
            tracing::debug!(job = %name, due = %due, "job run succeeded");
        }
        record(
            ctx,
            registered,
            outcome,
            error.as_deref(),
            Some(started.elapsed()),
        );
        finish(ctx, run, term_id, outcome, error.as_deref()).await;
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

/// Claims `due` in `term`: the run's attempt number when the claim is ours; `None` when it is
/// not (claimed already, fenced off, or the term ended before the outcome of a claim whose
/// COMMIT got no answer was known).
async fn claim(
    ctx: &Context,
    term: &Term,
    name: &str,
    due: Timestamp,
    kind: RunKind,
    term_id: &str,
) -> Result<Option<u32>, ScheduleError> {
    let who = ctx.claimant(term, term_id);
    // The claim, on a connection of its own that goes back to the pool at once. Once its
    // COMMIT is sent, `sent` holds what it claimed: an answer lost then (the bound, a
    // broken connection) leaves the claim's outcome unknown, and it is read back.
    let mut sent: Option<Claimed> = None;
    let claim = ctx.bounded(async {
        let mut client = ctx.client().await?;
        let tx = client.transaction().await?;
        tx.batch_execute(DURABLE_COMMIT).await?;
        if term.epoch().is_some() {
            term.fence(&tx).await.map_err(ScheduleError::Fence)?;
        }
        let Some(claimed) = ctx
            .store
            .claim(&tx, &ctx.namespace, name, due, kind, &who)
            .await?
        else {
            return Ok(None);
        };
        let attempt = claimed.attempt;
        sent = Some(claimed);
        tx.commit().await?;
        Ok(Some(attempt))
    });
    match claim.await {
        Ok(Some(attempt)) => Ok(Some(attempt)),
        Ok(None) => {
            tracing::debug!(job = %name, due = %due, "already claimed");
            Ok(None)
        }
        Err(ScheduleError::Fence(fenced)) if !fenced.is_query_error() => {
            tracing::info!(job = %name, error = %fenced, "the due's claim was fenced: the term is over");
            Ok(None)
        }
        Err(e) => match sent {
            Some(claimed) if e.leaves_commit_unknown() => {
                tracing::info!(job = %name, due = %due, error = %e, "the claim's COMMIT got no answer; reading it back");
                match read_back(ctx, term, name, due, &claimed, term_id).await {
                    Some(true) => Ok(Some(claimed.attempt)),
                    Some(false) => Err(e),
                    None => {
                        tracing::warn!(job = %name, due = %due, error = %e, "the term ended before the claim's outcome was known; a later term settles its run");
                        Ok(None)
                    }
                }
            }
            _ => Err(e),
        },
    }
}

/// Runs `job` to its end, saying every poll that its `run` is alive.
async fn with_heartbeat<F: Future>(ctx: &Context, run: RunRef<'_>, job: F) -> F::Output {
    let job = std::pin::pin!(job);
    tokio::select! {
        outcome = job => outcome,
        never = heartbeat(ctx, run) => match never {},
    }
}

/// A beat every poll, as the claim promised (the run's row holds the period): on a fixed
/// cadence, each bounded by a poll (at least 1 s), so that a slow or failed beat does not push
/// the next ones back. A failed beat is logged at DEBUG; once the run has been silent for half
/// of what another term waits before it calls the run abandoned, at WARN (once while the beats
/// keep failing), and at INFO when a beat lands again.
async fn heartbeat(ctx: &Context, run: RunRef<'_>) -> Infallible {
    let mut beats = tokio::time::interval_at(tokio::time::Instant::now() + ctx.poll, ctx.poll);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut silence = Silence::new(stale_after(ctx.poll));
    loop {
        beats.tick().await;
        let bound = borrow_bound(ctx.poll);
        let beat = tokio::time::timeout(bound, async {
            ctx.store.heartbeat(&*ctx.client().await?, run).await
        });
        let failure = match beat.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {bound:?}")),
        };
        silence.after_beat(run.job, failure);
    }
}

/// How long a run's beats have failed, and whether that was said at WARN.
struct Silence {
    stale_after: Duration,
    since: tokio::time::Instant,
    warned: bool,
}

impl Silence {
    fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            since: tokio::time::Instant::now(),
            warned: false,
        }
    }

    /// Logs a beat's outcome: `failure` is `None` when it landed.
    fn after_beat(&mut self, job: &str, failure: Option<String>) {
        let silent = self.since.elapsed();
        match failure {
            None => {
                if self.warned {
                    tracing::info!(job, ?silent, "heartbeats of the running run land again");
                }
                self.since = tokio::time::Instant::now();
                self.warned = false;
            }
            Some(error) if !self.warned && silent >= self.stale_after / 2 => {
                tracing::warn!(
                    job,
                    ?silent,
                    stale_after = ?self.stale_after,
                    %error,
                    "heartbeats of the running run keep failing; another term takes a run silent for stale_after as abandoned (and runs it again if rerun_abandoned)"
                );
                self.warned = true;
            }
            Some(error) => tracing::debug!(job, %error, "heartbeat failed"),
        }
    }
}

/// Records the end of a run, on a fresh connection (the job may have run for hours), tried a
/// few times.
async fn finish(
    ctx: &Context,
    run: RunRef<'_>,
    term_id: &str,
    outcome: Outcome,
    error: Option<&str>,
) {
    let (name, due) = (run.job, run.due);
    for retry in 0..3u32 {
        let finished = ctx.bounded(async {
            ctx.store
                .finish(&*ctx.client().await?, run, term_id, outcome, error)
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
    let run = RunRef {
        namespace: &ctx.namespace,
        job: name,
        due,
        attempt: claimed.attempt,
    };
    loop {
        let status = ctx.bounded(async {
            ctx.store
                .claim_status(&*ctx.client().await?, run, &claimed.xid, term_id)
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
