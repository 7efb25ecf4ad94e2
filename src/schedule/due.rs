//! One due of a job: claimed by compare-and-set (fenced with the term's epoch when the elector
//! fences, read back when the answer to its COMMIT is lost), run with a heartbeat (`heartbeat.rs`),
//! and its end recorded.

use std::sync::Arc;
use std::time::SystemTime;

use jiff::Timestamp;

use super::context::{Context, record};
use super::heartbeat::{CutOff, with_heartbeat};
use super::store::{ClaimStatus, Claimed, Outcome, RunRef};
use super::{JobRun, Registered, RunKind, ScheduleError};
use crate::Term;
use crate::background::TickOutcome;
use crate::background::panic::{CaughtPanic, catch_panic};

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
    /// The run was cut off because its heartbeats did not land: it is still `running` in the
    /// table, for this term's next look (or a later term's) to call abandoned, rerunning it
    /// if the job asks for that.
    GaveUp,
}

/// How a claimed run ended, as far as the table is concerned.
enum Ended {
    /// Its end is recorded (or could not be: it stays `running`).
    Recorded,
    /// Cut off while silent: left `running`, to be called abandoned.
    GaveUp,
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
        // Before the claim is sent: the run's row is stale (for other terms) a stale threshold
        // after the claim, at the earliest, until a beat lands.
        let claimed_at = tokio::time::Instant::now();
        let Some(attempt) = claim(ctx, &term, &name, due, kind, term_id).await? else {
            return Ok(None);
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
            term: term_id,
        };
        let ended = with_heartbeat(ctx, run, claimed_at, job).await;
        Ok::<_, ScheduleError>(Some(end_run(ctx, registered, run, started, ended).await))
    });
    match work.await {
        Ok(Some(Some(Ended::Recorded))) => Taken::Ran,
        Ok(Some(Some(Ended::GaveUp))) => Taken::GaveUp,
        Ok(Some(None) | None) => Taken::NotOurs,
        Err(e) => {
            tracing::warn!(job = %registered.job.name, due = %due, error = %e, "cannot claim or record the run");
            Taken::Failed
        }
    }
}

/// Says and records how the job's run ended (`ended`: what [`with_heartbeat`] returned), its
/// end in the run's row unless it was cut off.
async fn end_run(
    ctx: &Context,
    registered: &Registered,
    run: RunRef<'_>,
    started: std::time::Instant,
    ended: Result<Result<Result<(), String>, CaughtPanic>, CutOff>,
) -> Ended {
    let (name, due) = (run.job, run.due);
    let (outcome, error) = match ended {
        Ok(Ok(Ok(()))) => (Outcome::Succeeded, None),
        Ok(Ok(Err(e))) => (Outcome::Failed, Some(e)),
        Ok(Err(panic)) => (
            Outcome::Failed,
            Some(format!("panicked: {}", panic.message)),
        ),
        Err(cut) => {
            cut.log(name, due);
            registered
                .probe
                .record(TickOutcome::Failed(format!("job {name:?}: {cut}")));
            return match cut {
                // Recorded as abandoned (and so rerun, when the job asks) by the next look at
                // the job: a run cut off mid-way did not happen in full.
                CutOff::Silent(_) => Ended::GaveUp,
                // Another term recorded it so already.
                CutOff::Settled => Ended::Recorded,
            };
        }
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
    finish(ctx, run, outcome, error.as_deref()).await;
    Ended::Recorded
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
    let claim = ctx.query(async |client| {
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
            // Answered before the connection goes back: a ROLLBACK left queued on it would
            // keep the next borrower waiting behind a socket that may have gone quiet.
            tx.rollback().await?;
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

/// Records the end of a run, on a fresh connection (the job may have run for hours), tried a
/// few times.
async fn finish(ctx: &Context, run: RunRef<'_>, outcome: Outcome, error: Option<&str>) {
    let (name, due) = (run.job, run.due);
    for retry in 0..3u32 {
        let finished =
            ctx.query(async |client| ctx.store.finish(client, run, outcome, error).await);
        match finished.await {
            Ok(true) => break,
            Ok(false) => {
                // Another term called it abandoned (its beats had gone quiet), or the record
                // is gone (a failover that lost the claim; another term's claim of the same
                // due is not this run's): that record stands, and a rerun it asked for is
                // that term's.
                tracing::info!(job = %name, due = %due, outcome = outcome.as_str(), "the run ended after its record stopped saying running (another term called it abandoned, or the row is gone: a failover may have lost the claim); the record stays");
                break;
            }
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
        term: term_id,
    };
    loop {
        let status =
            ctx.query(async |client| ctx.store.claim_status(client, run, &claimed.xid).await);
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
