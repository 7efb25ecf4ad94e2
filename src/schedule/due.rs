//! One due of a job: claimed by compare-and-set (fenced with the term's epoch when the elector
//! fences, read back when the answer to its COMMIT is lost), run with a heartbeat every poll,
//! and its end recorded.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jiff::Timestamp;

use super::context::{Context, record};
use super::store::{ClaimStatus, Claimed, Outcome, RunRef};
use super::{JobRun, Registered, RunKind, ScheduleError, borrow_bound, stale_after};
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

/// Runs `job` to its end, saying every poll that its `run` is alive; cut off (the job's
/// future dropped at its current `.await`) when the beats stop landing, before another term
/// may take the run for dead, or when another term has already called it abandoned.
/// `claimed_at`: when the claim was sent, the run's last sign of life until a beat lands.
async fn with_heartbeat<F: Future>(
    ctx: &Context,
    run: RunRef<'_>,
    claimed_at: tokio::time::Instant,
    job: F,
) -> Result<F::Output, CutOff> {
    let alive_at = first_beat(ctx, run, claimed_at).await?;
    let silent = alive_at.elapsed();
    if silent >= cut_off_after(stale_after(ctx.poll)) {
        return Err(CutOff::Silent(silent));
    }
    let job = std::pin::pin!(job);
    tokio::select! {
        // The cut-off first: a run already silent for the cut-off does not start.
        biased;
        cut = heartbeat(ctx, run, alive_at) => Err(cut),
        outcome = job => Ok(outcome),
    }
}

/// Before the job starts, a beat when the claim took a poll or longer (a COMMIT that waited
/// for a standby, a claim read back): other terms see the run from the claim's start, and
/// may take it for dead soon after the claim finally commits. The run's last sign of life
/// then, or its cut-off when another term has already called it abandoned.
async fn first_beat(
    ctx: &Context,
    run: RunRef<'_>,
    claimed_at: tokio::time::Instant,
) -> Result<tokio::time::Instant, CutOff> {
    if claimed_at.elapsed() < ctx.poll {
        return Ok(claimed_at);
    }
    let sent = tokio::time::Instant::now();
    let beat = ctx.query_within(borrow_bound(ctx.poll), async |client| {
        ctx.store.heartbeat(client, run).await
    });
    match beat.await {
        Ok(true) => Ok(sent),
        Ok(false) => Err(CutOff::Settled),
        // The heartbeat's own cut-off decides.
        Err(_) => Ok(claimed_at),
    }
}

/// A beat every poll, as the claim promised (the run's row holds the period): on a fixed
/// cadence, each bounded by a poll (at least 1 s), so that a slow or failed beat does not push
/// the next ones back. Returns when the run must end: its beats have not landed for
/// [`cut_off_after`] (measured from when the last beat that landed was sent), or a beat found
/// the run no longer `running`. What it says on the way is [`Silence`]'s.
async fn heartbeat(ctx: &Context, run: RunRef<'_>, alive_at: tokio::time::Instant) -> CutOff {
    let mut beats = tokio::time::interval_at(alive_at + ctx.poll, ctx.poll);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut silence = Silence::new(run.job, stale_after(ctx.poll), alive_at);
    loop {
        let (cut_off, warn_at) = silence.deadlines();
        let mut cut_off = std::pin::pin!(tokio::time::sleep_until(cut_off));
        let mut warn = std::pin::pin!(tokio::time::sleep_until(warn_at));
        loop {
            tokio::select! {
                biased;
                () = &mut cut_off => return CutOff::Silent(silence.silent()),
                () = &mut warn, if !silence.warned => silence.warn(),
                _ = beats.tick() => break,
            }
        }
        let sent = tokio::time::Instant::now();
        // Dropped at the cut-off, the beat's connection is closed, not given back.
        let beat = ctx.query_within(borrow_bound(ctx.poll), async |client| {
            ctx.store.heartbeat(client, run).await
        });
        let mut beat = std::pin::pin!(beat);
        let landed = loop {
            tokio::select! {
                biased;
                () = &mut cut_off => return CutOff::Silent(silence.silent()),
                () = &mut warn, if !silence.warned => silence.warn(),
                landed = &mut beat => break landed,
            }
        };
        match landed {
            Ok(true) => silence.landed(sent),
            Ok(false) => return CutOff::Settled,
            Err(e) => silence.failed(e.to_string()),
        }
    }
}

/// How long a run's beats may fail before its runner cuts it off: two thirds of the stale
/// threshold (at least one heartbeat period short of it, as the threshold is at least three),
/// so that the run has ended before another term can call it abandoned and rerun it.
fn cut_off_after(stale_after: Duration) -> Duration {
    stale_after.saturating_mul(2) / 3
}

/// Why a run was cut off before its end.
#[derive(Debug)]
enum CutOff {
    /// Its beats did not land for this long.
    Silent(Duration),
    /// A beat found its record no longer `running`: another term called it abandoned, or the
    /// row is gone (a restore, the tables emptied, a failover that lost the claim, after which
    /// another term may have claimed the same due again: a beat names its own term).
    Settled,
}

impl CutOff {
    fn log(&self, job: &str, due: Timestamp) {
        match self {
            CutOff::Silent(silent) => tracing::error!(
                job,
                due = %due,
                ?silent,
                "the run was cut off: its heartbeats did not land, and another term would soon take it for dead"
            ),
            CutOff::Settled => tracing::error!(
                job,
                due = %due,
                "the run was cut off: its record is no longer running (another term called it abandoned, or the row is gone: a failover may have lost the claim)"
            ),
        }
    }
}

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutOff::Silent(silent) => write!(
                f,
                "cut off: its heartbeats did not land for {silent:?}, and another term may take a run that silent for dead"
            ),
            CutOff::Settled => f.write_str(
                "cut off: its record is no longer running (another term called it abandoned, or the row is gone: a failover may have lost the claim)",
            ),
        }
    }
}

/// A running run's silence: since when its beats have not landed (the send time of the last
/// one that did), and what was said of it. A failed beat is said at DEBUG; once the run has
/// been silent for a third of the stale threshold, at WARN (once while the beats keep
/// failing); at INFO when a beat lands again.
struct Silence<'a> {
    job: &'a str,
    stale_after: Duration,
    alive_at: tokio::time::Instant,
    warned: bool,
    last_error: Option<String>,
}

impl<'a> Silence<'a> {
    fn new(job: &'a str, stale_after: Duration, alive_at: tokio::time::Instant) -> Self {
        Self {
            job,
            stale_after,
            alive_at,
            warned: false,
            last_error: None,
        }
    }

    fn silent(&self) -> Duration {
        self.alive_at.elapsed()
    }

    /// When the run is cut off, and when its silence is said at WARN.
    fn deadlines(&self) -> (tokio::time::Instant, tokio::time::Instant) {
        (
            self.alive_at + cut_off_after(self.stale_after),
            self.alive_at + self.stale_after / 3,
        )
    }

    fn warn(&mut self) {
        tracing::warn!(
            job = self.job,
            silent = ?self.silent(),
            stale_after = ?self.stale_after,
            cut_after = ?cut_off_after(self.stale_after),
            error = self.last_error.as_deref().unwrap_or("no beat answered yet"),
            "heartbeats of the running run keep failing; the run is cut off once silent for cut_after, before another term takes it as abandoned (and runs it again if rerun_abandoned)"
        );
        self.warned = true;
    }

    fn landed(&mut self, sent: tokio::time::Instant) {
        if self.warned {
            tracing::info!(job = self.job, silent = ?self.silent(), "heartbeats of the running run land again");
        }
        self.alive_at = sent;
        self.warned = false;
        self.last_error = None;
    }

    fn failed(&mut self, error: String) {
        tracing::debug!(job = self.job, %error, "heartbeat failed");
        self.last_error = Some(error);
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
