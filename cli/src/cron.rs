//! `pg-elector cron NAME --schedule CRON -- CMD [ARGS…]`: every replica runs the same line,
//! and each due instant runs the command once across them, through the library's schedules
//! (stored dues, claims, catch-up, skipped dues counted). The command's status is the run's
//! outcome in the jobs table.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use pg_elector::schedule::{CatchUp, Job, JobRun, Schedule};

use crate::exit::{self, Failure};
use crate::group::Group;
use crate::replica::{ReplicaArgs, connect_unless_stopped, environment, stop_on_signal};
use crate::{command, connect};

/// What a new leader does with the dues it missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CatchUpArg {
    /// Runs none of them.
    Skip,
    /// Runs the latest of them once.
    Latest,
    /// Runs each of them, oldest first (at most 100).
    All,
}

/// What `cron` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct CronArgs {
    /// The key's name, and the job's: every replica that runs the same name runs each due
    /// once across them.
    name: String,
    /// When the command is due: a cron expression, five fields (minute first) or six
    /// (seconds first).
    #[arg(long, value_name = "CRON")]
    schedule: String,
    /// The time zone the expression is read in (IANA: Europe/Berlin).
    #[arg(long, value_name = "ZONE", default_value = "UTC")]
    tz: String,
    /// What a new leader does with the dues it missed.
    #[arg(long, value_enum, default_value_t = CatchUpArg::Latest)]
    catch_up: CatchUpArg,
    /// Run again a due whose run was abandoned: left `running` by a leader that died or was
    /// cut off from the database mid-run (a run stopped at the end of its term, the database
    /// reachable, is recorded failed instead).
    #[arg(long)]
    rerun_abandoned: bool,
    #[command(flatten)]
    replica: ReplicaArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

impl CronArgs {
    fn job(&self) -> Result<Job, Failure> {
        let bad = |e: pg_elector::schedule::ScheduleError| {
            Failure::new(exit::BAD_SCHEDULE, e.to_string())
        };
        let catch_up = match self.catch_up {
            CatchUpArg::Skip => CatchUp::Skip,
            CatchUpArg::Latest => CatchUp::Latest,
            CatchUpArg::All => CatchUp::All,
        };
        Ok(Job::cron(self.name.clone(), &self.schedule)
            .map_err(bad)?
            .in_zone(&self.tz)
            .map_err(bad)?
            .catch_up(catch_up)
            .rerun_abandoned(self.rerun_abandoned))
    }
}

/// Runs the schedule until SIGTERM or SIGINT (exit 0).
pub(crate) async fn cron(url: Option<&str>, args: CronArgs) -> Result<i32, Failure> {
    let job = args.job()?;
    command::check(&args.command)?;
    let shutdown = stop_on_signal();
    let Some(pool) = connect_unless_stopped(url, &shutdown).await? else {
        return Ok(exit::OK);
    };
    let schedule_pool = connect::schedule_pool(url.unwrap_or_default())?;
    let elector = args.replica.elector(pool, &args.name)?;
    let election = elector.spawn(shutdown.clone());
    let (command, grace, name) = (
        Arc::new(args.command),
        [args.replica.grace, args.replica.check_interval()],
        Arc::new(args.name),
    );
    let body_elector = elector.clone();
    let schedule = Schedule::new(&elector, schedule_pool).job(job, move |run: JobRun| {
        let (command, name, elector) = (command.clone(), name.clone(), body_elector.clone());
        async move {
            let mut env = environment(&elector, &run.term, &name);
            env.push((
                "PG_ELECTOR_DUE",
                humantime::format_rfc3339_millis(run.due).to_string(),
            ));
            env.push(("PG_ELECTOR_ATTEMPT", run.attempt.to_string()));
            run_once(&command, grace, &env, &run).await
        }
    });
    let scheduled = schedule.run(shutdown.clone()).await;
    shutdown.cancel();
    let elected = election.await;
    match (scheduled, elected) {
        (Err(e), _) => Err(Failure::new(exit::INTERNAL, e.to_string())),
        (_, Ok(Err(e))) => Err(Failure::new(exit::INTERNAL, e.to_string())),
        (_, Err(e)) => Err(Failure::new(exit::INTERNAL, e.to_string())),
        (Ok(()), Ok(Ok(()))) => Ok(exit::OK),
    }
}

/// One run: the command under a keeper, its status the run's outcome; stopped with the term.
/// A run the schedule cuts off (its future dropped) kills the group.
async fn run_once(
    command: &[OsString],
    [grace, interval]: [Duration; 2],
    env: &[(&str, String)],
    run: &JobRun,
) -> Result<(), String> {
    let mut group = Group::start(command, [grace, interval], env)
        .map_err(|e| format!("cannot start the command: {e}"))?;
    let status = tokio::select! {
        status = group.wait() => status,
        () = run.term.cancelled() => {
            let status = group.stop_for(&run.term).await;
            return Err(format!("stopped at the end of the term (status {status})"));
        }
    };
    if group.killed_for_stop() {
        Err("killed: pg-elector was stopped (SIGSTOP) for two intervals".into())
    } else if status == 0 {
        Ok(())
    } else {
        Err(format!("the command exited with status {status}"))
    }
}
