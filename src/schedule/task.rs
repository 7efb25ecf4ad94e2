//! One job in one term of a running schedule, as a loop: register the job, then, at every
//! pass over its row, call the runs an earlier term left going abandoned, run the reruns owed
//! and a trigger asked for, plan its dues (the catch-up decision is [`plan`]'s, a
//! pure function) and run them, and wait for the next due or poll. A job whose row or tables
//! are gone is registered again, in the same loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::context::{Context, count_skipped, ensure_tables, record};
use super::due::{Taken, run_due};
use super::job::Spec;
use super::skips::{count_halted, skip_dues};
use super::store::{JobRow, Outcome};
use super::{LostState, Registered, RunKind, ScheduleError, SkipReason, plan};
use crate::Term;
use crate::background::TickOutcome;
use crate::sync::lock;

/// What became of the dues a pass claimed in turn.
enum Claims {
    /// Each was run (`ran`: at least one), found handled by another term, or left for the
    /// next pass (not this term's to claim yet).
    Settled { ran: bool },
    /// A claim failed: that due and those after it are tried again at the next poll, still
    /// on time.
    Failed,
    /// The term is ending.
    Stopped,
}

/// One job in one term: register it, report an abandoned run, catch up, then run each due.
pub(super) struct JobTask {
    ctx: Arc<Context>,
    registered: Registered,
    term: Term,
    /// The term's unique id, stored with each claim.
    term_id: String,
    /// Cancelled when the term ends or the schedule shuts down.
    stop: CancellationToken,
    /// A run of this term was cut off while its beats failed, and is still `running` in the
    /// table: the next look for abandoned runs calls it so (and reruns it if the job asks).
    gave_up: AtomicBool,
}

/// Why the passes over a job's row ended.
enum Restart {
    /// The term ended: the task is over.
    Stop,
    /// The job's row is gone: registering again tells (at ERROR) that the row this process
    /// saw is gone.
    RowGone,
    /// The job tables are gone: they are made again (when this role may), and the job
    /// registered again under the lost-state policy.
    TablesGone(ScheduleError),
}

/// What one pass over a job's row leads to.
enum Pass {
    /// The next pass, at once (a triggered run ran).
    Again,
    /// The next pass, after this wait: until the next due, or the next poll of the row (a
    /// trigger, a schedule change).
    Wait(Duration),
    /// No next pass.
    End(Restart),
}

/// How a job's registration went.
enum Registration {
    /// Registered; `created` when its row was made now.
    Done { created: bool },
    /// Its row was gone and the policy is [`LostState::Halt`]: the job is halted.
    Halted,
    /// The term ended first.
    Stopped,
}

/// The latest due instant at or before `now`: a new job's starting point (its past is not
/// caught up on); `now` for a job never due before.
fn latest_due(spec: &Spec, now: Timestamp) -> Option<Timestamp> {
    spec.previous(now, true).or(Some(now))
}

impl JobTask {
    /// `registered`'s task in the term `term` (`term_id`), until `stop` is cancelled.
    pub(super) fn new(
        ctx: Arc<Context>,
        registered: Registered,
        term: Term,
        term_id: String,
        stop: CancellationToken,
    ) -> Self {
        Self {
            ctx,
            registered,
            term,
            term_id,
            stop,
            gave_up: AtomicBool::new(false),
        }
    }

    fn name(&self) -> &str {
        &self.registered.job.name
    }

    /// Registers the job and passes over its row until the term ends; registers it again when
    /// its row or its tables are gone.
    pub(super) async fn run(self) {
        // The job's state was found lost (its tables gone) and said so at ERROR.
        let mut loss_reported = false;
        loop {
            if lock(&self.ctx.halted).contains(self.name()) {
                return self.halted().await;
            }
            match self.register(loss_reported).await {
                Registration::Done { created } => {
                    tracing::debug!(job = self.name(), new = created, "job registered");
                }
                Registration::Halted => return self.halted().await,
                Registration::Stopped => return,
            }
            loss_reported = match self.watch().await {
                Restart::Stop => return,
                Restart::RowGone => false,
                Restart::TablesGone(error) => {
                    if !self.tables_lost(error).await {
                        return;
                    }
                    true
                }
            };
        }
    }

    /// A job halted in this process: its probe fails, and its dues are counted as skipped
    /// until the term ends.
    async fn halted(&self) {
        self.registered.probe.record(TickOutcome::Failed(format!(
            "job {:?}: its stored state was lost; halted until the process restarts",
            self.name()
        )));
        count_halted(&self.ctx, &self.registered, &self.term_id, &self.stop).await;
    }

    /// Waits `wait`; `false` when the term ends first.
    async fn pause(&self, wait: Duration) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// Registers the job: retried every poll until it works or the term ends.
    async fn register(&self, loss_reported: bool) -> Registration {
        let (ctx, job, name) = (&self.ctx, &self.registered.job, self.name());
        loop {
            let step = ctx.query(async |client| {
                ctx.store
                    .register(
                        client,
                        &ctx.namespace,
                        name,
                        &job.spec.text(),
                        latest_due(&job.spec, Timestamp::now()),
                    )
                    .await
            });
            match step.await {
                Ok(created) => return self.registered(created, loss_reported),
                Err(e) if e.is_missing_table() => {
                    // Dropped since the term began: made again, then registered.
                    if !ensure_tables(ctx, self.stop.cancelled()).await {
                        return Registration::Stopped;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(job = name, error = %e, "cannot register the job; retrying")
                }
            }
            if !self.pause(ctx.poll).await {
                return Registration::Stopped;
            }
        }
    }

    /// The job is registered, its row `created` now or not: a row this process had seen that
    /// had to be made again is lost state, said at ERROR (unless `loss_reported`) and handled
    /// by the policy.
    fn registered(&self, created: bool, loss_reported: bool) -> Registration {
        let (ctx, name) = (&self.ctx, self.name());
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
                return Registration::Halted;
            }
        }
        Registration::Done { created }
    }

    /// The job tables are gone while the term runs (dropped, or the database restored or
    /// failed over to one without them): said at ERROR, and the tables made again (when this
    /// role may); `false` when the term ends first.
    async fn tables_lost(&self, error: ScheduleError) -> bool {
        tracing::error!(
            job = %self.registered.job.name,
            policy = ?self.ctx.lost_state,
            error = %error,
            "the job tables are gone (dropped, restored, or a failover to a server without them); the job's stored state is lost"
        );
        ensure_tables(&self.ctx, self.stop.cancelled()).await
    }

    /// Passes over the job's row until the term ends, or the row or the tables are gone.
    async fn watch(&self) -> Restart {
        // Dues from before this instant were missed (a leaderless gap, another leader's run
        // still going, or a run of this one that overran them): the job's catch-up policy
        // decides. Dues after it came while this leader watched, and run however late it
        // woke, and however many times their claim fails first: it moves on only past dues
        // that were settled.
        let mut on_time_from = Timestamp::now();
        while !self.stop.is_cancelled() {
            let wait = match self.pass(&mut on_time_from).await {
                Pass::Again => continue,
                Pass::Wait(wait) => wait,
                Pass::End(restart) => return restart,
            };
            if !self.pause(wait).await {
                return Restart::Stop;
            }
        }
        Restart::Stop
    }

    /// One pass: stale runs abandoned, then the job's row read, and the reruns it owes, a
    /// trigger it asks for and the dues its plan runs.
    async fn pass(&self, on_time_from: &mut Timestamp) -> Pass {
        if let Some(restart) = self.abandon_stale().await {
            return Pass::End(restart);
        }
        let row = match self.load().await {
            Ok(row) => row,
            Err(pass) => return pass,
        };
        let spec = match Spec::parse(&row.schedule) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(job = self.name(), error = %e, "unreadable stored schedule; using the registered one");
                self.registered.job.spec.clone()
            }
        };
        if let Some(pass) = self.rerun(&row.rerun_dues).await {
            return pass;
        }
        // A trigger asked for: run it now; only a run actually claimed loops at once (a claim
        // that failed waits for the next poll, rather than spinning).
        if row.trigger_requested.is_some()
            && self.take(Timestamp::now(), RunKind::Triggered).await == Taken::Ran
        {
            return Pass::Again;
        }
        self.run_plan(&spec, row.last_due, on_time_from).await
    }

    /// Runs another term left going: called abandoned (and rerun if the job asks) once their
    /// runner is known to be gone. Looked at every pass: a deposed leader's run may still be
    /// going when this term begins, and is only abandoned once it has gone quiet; meanwhile
    /// no claim of this term starts the job beside it. `Some` when the tables are gone.
    async fn abandon_stale(&self) -> Option<Restart> {
        let (ctx, job, name) = (&self.ctx, &self.registered.job, self.name());
        let mut ended = lock(&ctx.ended).clone();
        let gave_up = self.gave_up.load(Ordering::Relaxed);
        if gave_up {
            ended.push(self.term_id.clone());
        }
        let who = ctx.claimant(&self.term, &self.term_id);
        let abandoned = ctx.query(async |client| {
            ctx.store
                .abandon(
                    client,
                    &ctx.namespace,
                    name,
                    &self.term_id,
                    &ended,
                    ctx.poll,
                    job.rerun_abandoned,
                    &who,
                )
                .await
        });
        match abandoned.await {
            Ok(runs) => {
                if gave_up {
                    self.gave_up.store(false, Ordering::Relaxed);
                }
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
                    record(ctx, &self.registered, Outcome::Abandoned, None, None);
                    if !run.rerun {
                        count_skipped(ctx, &self.registered, SkipReason::Abandoned, 1);
                    }
                }
            }
            Err(e) if e.is_missing_table() => return Some(Restart::TablesGone(e)),
            Err(e) => tracing::warn!(job = name, error = %e, "cannot look for abandoned runs"),
        }
        None
    }

    /// The job's row; the pass to make instead when it cannot be read.
    async fn load(&self) -> Result<JobRow, Pass> {
        let (ctx, name) = (&self.ctx, self.name());
        let row = ctx.query(async |client| ctx.store.load(client, &ctx.namespace, name).await);
        match row.await {
            Ok(Some(row)) => {
                ctx.row_went_back(name, row.last_due);
                Ok(row)
            }
            Ok(None) => Err(Pass::End(Restart::RowGone)),
            Err(e) if e.is_missing_table() => Err(Pass::End(Restart::TablesGone(e))),
            Err(e) => {
                tracing::warn!(job = name, error = %e, "cannot read the job's row; retrying");
                Err(Pass::Wait(ctx.poll))
            }
        }
    }

    /// Abandoned runs still to be rerun, as the job's row says (whichever term or replica
    /// called them abandoned): each rerun's claim takes its due off the list. A claim that
    /// failed is tried again at the next poll, before anything else of the job (`Some`: the
    /// pass ends so).
    async fn rerun(&self, dues: &[Timestamp]) -> Option<Pass> {
        for &due in dues {
            if self.stop.is_cancelled() {
                return Some(Pass::End(Restart::Stop));
            }
            if self.take(due, RunKind::Rerun).await == Taken::Failed {
                return Some(Pass::Wait(self.ctx.poll));
            }
        }
        None
    }

    /// The job's plan for its dues after `last_due` (the catch-up decision), carried out: the
    /// dues that do not run recorded, the others run; then the wait for the next pass.
    async fn run_plan(
        &self,
        spec: &Spec,
        last_due: Option<Timestamp>,
        on_time_from: &mut Timestamp,
    ) -> Pass {
        let job = &self.registered.job;
        let now = Timestamp::now();
        let last = last_due.unwrap_or(now);
        let plan = plan::plan(
            spec,
            last,
            now,
            *on_time_from,
            job.catch_up,
            job.max_catch_up,
        );
        let mut failed = false;
        if let Some(through) = plan.skip_through() {
            failed = skip_dues(
                &self.ctx,
                &self.registered,
                last,
                through,
                &plan.skipped,
                &self.term_id,
            )
            .await
                == Taken::Failed;
        }
        if plan.catching_up {
            tracing::info!(job = self.name(), runs = plan.run.len(), policy = ?job.catch_up, "catching up on missed dues");
        }
        if failed {
            return Pass::Wait(self.ctx.poll);
        }
        let ran = match self.claim_in_turn(&plan.run).await {
            Claims::Settled { ran } => ran,
            Claims::Failed => return Pass::Wait(self.ctx.poll),
            Claims::Stopped => return Pass::End(Restart::Stop),
        };
        // Settled up to `now`; dues that came while a run of this pass went on were overrun
        // by it.
        *on_time_from = if ran { Timestamp::now() } else { now };
        Pass::Wait(self.until_next(spec, (*on_time_from).max(last)))
    }

    /// Claims and runs `dues` in turn, oldest first, as far as they are this term's.
    async fn claim_in_turn(&self, dues: &[Timestamp]) -> Claims {
        let mut ran = false;
        for &due in dues {
            if self.stop.is_cancelled() {
                return Claims::Stopped;
            }
            match self.take(due, RunKind::Scheduled).await {
                // A run given up comes back from `take` as run.
                Taken::Ran | Taken::GaveUp => ran = true,
                // Claimed or skipped by another term already: nothing is lost, on to the next.
                Taken::NotOurs if self.handled_elsewhere(due).await => {}
                // Not ours otherwise (another term's run in the way, or the lead gone): no
                // later due is claimed in this pass. A later claim would move the row past
                // this due, which then never runs, should the run in the way end meanwhile;
                // the next pass plans again from the row.
                Taken::NotOurs => break,
                Taken::Failed => return Claims::Failed,
            }
        }
        Claims::Settled { ran }
    }

    /// Whether the job's row has moved to `due` or past it (another term claimed or skipped
    /// it), so that a claim refused for that reason loses nothing.
    async fn handled_elsewhere(&self, due: Timestamp) -> bool {
        let (ctx, name) = (&self.ctx, self.name());
        let row = ctx.query(async |client| ctx.store.load(client, &ctx.namespace, name).await);
        matches!(row.await, Ok(Some(row)) if row.last_due.is_some_and(|last| last >= due))
    }

    /// How long until the job's next due after `after`, at most a poll.
    fn until_next(&self, spec: &Spec, after: Timestamp) -> Duration {
        spec.next_after(after).map_or(self.ctx.poll, |next| {
            let until = Timestamp::now().duration_until(next);
            self.ctx
                .poll
                .min(Duration::try_from(until).unwrap_or(Duration::ZERO))
        })
    }

    /// Claims `due` and runs it, as a run of `kind`. A run given up counts as run: its due is
    /// not missed, it is abandoned at the next look (and rerun if the job asks).
    async fn take(&self, due: Timestamp, kind: RunKind) -> Taken {
        match run_due(&self.ctx, &self.registered, due, kind, &self.term_id).await {
            Taken::GaveUp => {
                self.gave_up.store(true, Ordering::Relaxed);
                Taken::Ran
            }
            taken => taken,
        }
    }
}
