//! `pg-elector run NAME -- CMD [ARGS…]`: stand by, and run the command only while leading.
//!
//! One elector for the key `NAME`; on each term the command starts under a keeper (see
//! [`group`](crate::group)) and ends with the term: gracefully (SIGTERM to its process group, SIGKILL after
//! `--grace`) when the term ends gracefully (a handover, SIGTERM or SIGINT to `pg-elector`),
//! at once (SIGKILL) when the lead is lost, since another replica may already lead. The lock
//! is given up only once the group is gone.

mod restart;

use std::ffi::OsString;

use pg_elector::{Elector, Term};
use tokio_util::sync::CancellationToken;

use crate::command;
use crate::exit::{self, Failure};
use crate::group::Group;
use crate::replica::{ReplicaArgs, connect_unless_stopped, environment, stop_on_signal};
use restart::Backoff;
pub(crate) use restart::Restart;

/// What `run` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The key's name: every replica that runs the same name competes for one lead.
    name: String,
    #[command(flatten)]
    replica: ReplicaArgs,
    /// What to do when the command ends while leading: give the lead up and exit with its
    /// status (`never`), or run it again after a backoff.
    #[arg(long, value_enum, default_value_t = Restart::Never)]
    restart: Restart,
    /// Leave after the first term, with the command's status.
    #[arg(long)]
    once: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// How a term ended for `run`.
#[derive(Debug)]
enum Lead {
    /// The command ended on its own and is not run again: leave with its status.
    Finished(i32),
    /// The term ended (the command was stopped): stand by again, or leave with `--once`.
    Ended(i32),
}

/// Runs `args.command` on the leader only, until SIGTERM or SIGINT (exit 0), or until the
/// command ends while leading (its status).
pub(crate) async fn run(url: Option<&str>, args: RunArgs) -> Result<i32, Failure> {
    command::check(&args.command)?;
    let shutdown = stop_on_signal();
    let Some(pool) = connect_unless_stopped(url, &shutdown).await? else {
        return Ok(exit::OK);
    };
    let elector = args.replica.elector(pool, &args.name)?;
    let election = elector.spawn(shutdown.clone());
    let status = stand_by(&elector, &args, &shutdown).await;
    shutdown.cancel();
    match election.await {
        Ok(Ok(())) => Ok(status),
        Ok(Err(e)) => Err(Failure::new(exit::INTERNAL, e.to_string())),
        Err(e) => Err(Failure::new(exit::INTERNAL, e.to_string())),
    }
}

/// Stands by and leads until `shutdown` (0), the command's end without restart (its status),
/// or the first term's end with `--once`.
async fn stand_by(elector: &Elector, args: &RunArgs, shutdown: &CancellationToken) -> i32 {
    let mut backoff = Backoff::default();
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return exit::OK,
            _ = elector.wait_for_leadership() => {}
        }
        match lead(elector, args, &mut backoff).await {
            Lead::Finished(status) => return status,
            Lead::Ended(_) if shutdown.is_cancelled() => return exit::OK,
            Lead::Ended(status) if args.once => return status,
            Lead::Ended(_) => {}
        }
    }
}

/// One term: the command, run again as `--restart` says while the term lasts, stopped with
/// the term. The elector's graceful end waits for it (it is the term's work).
async fn lead(elector: &Elector, args: &RunArgs, backoff: &mut Backoff) -> Lead {
    let mut ended = None;
    let work = elector.do_work(|term| {
        let ended = &mut ended;
        async move {
            *ended = Some(lead_term(elector, &term, args, backoff).await);
            Ok::<(), std::convert::Infallible>(())
        }
    });
    let _ = work.await;
    // `None`: the term ended before the work began.
    ended.unwrap_or(Lead::Ended(exit::OK))
}

async fn lead_term(elector: &Elector, term: &Term, args: &RunArgs, backoff: &mut Backoff) -> Lead {
    let env = environment(elector, term, &args.name);
    loop {
        tracing::info!(key = %args.name, epoch = ?term.epoch(), "leading: starting the command");
        let started = tokio::time::Instant::now();
        let limits = [args.replica.grace, args.replica.check_interval()];
        let mut group = match Group::start(&args.command, limits, &env) {
            Ok(group) => group,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the command's keeper");
                return Lead::Finished(exit::INTERNAL);
            }
        };
        let status = tokio::select! {
            biased;
            () = term.cancelled() => return Lead::Ended(group.stop_for(term).await),
            status = group.wait() => status,
        };
        if group.killed_for_stop() {
            // Killed while this process was stopped: the lead goes on if the term does (the
            // library's lease says so), and the command with it.
            if !term.is_leader() {
                return Lead::Ended(status);
            }
            tracing::warn!(
                "the command was killed while pg-elector was stopped: starting it again"
            );
            continue;
        }
        let Some(pause) = backoff.after(args.restart, status, started.elapsed()) else {
            tracing::info!(status, "the command ended: giving the lead up");
            return Lead::Finished(status);
        };
        tracing::warn!(
            status,
            ?pause,
            "the command ended: running it again after a pause"
        );
        tokio::select! {
            biased;
            () = term.cancelled() => return Lead::Ended(status),
            () = tokio::time::sleep(pause) => {}
        }
    }
}
