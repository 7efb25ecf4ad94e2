//! `pg-elector run NAME -- CMD [ARGS…]`: stand by, and run the command only while leading.
//!
//! One elector for the key `NAME`; on each term the command starts under a keeper (see
//! [`group`]) and ends with the term: gracefully (SIGTERM to its process group, SIGKILL after
//! `--grace`) when the term ends gracefully (a handover, SIGTERM or SIGINT to `pg-elector`),
//! at once (SIGKILL) when the lead is lost, since another replica may already lead. The lock
//! is given up only once the group is gone.

mod group;
mod restart;

use std::ffi::OsString;
use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::{Elector, LockKey, Term, TermEnd};
use tokio_util::sync::CancellationToken;

use crate::connect;
use crate::exit::{self, Failure};
use group::Group;
use restart::Backoff;
pub(crate) use restart::Restart;

/// How long the first connection may take before `run` gives up on the database.
const CONNECT_BOUND: Duration = Duration::from_secs(10);

/// How much longer than `--grace` a graceful end may wait for the group: the keeper's second
/// after its SIGKILL, and room to spare.
const DRAIN_SLACK: Duration = Duration::from_secs(2);

/// What `run` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The key's name: every replica that runs the same name competes for one lead.
    name: String,
    /// How often a standby tries the lock and the leader checks it.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// A standby waits on the lock and leads within milliseconds of the leader's end.
    #[arg(long)]
    fast_takeover: bool,
    /// Lead in preference to live standbys with a lower number (a handover moves the lead).
    #[arg(long, value_name = "N")]
    preference: Option<u64>,
    /// How long the command's group has after SIGTERM before SIGKILL, at a graceful end.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Count terms in an epoch table and give the command `PG_ELECTOR_EPOCH`.
    #[arg(long)]
    fencing: bool,
    /// This replica's name in `pg_stat_activity` and to `handover --to` (default: host and pid).
    #[arg(long)]
    identity: Option<String>,
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
    let pool = connect::pool(url, CONNECT_BOUND).await?;
    let elector = elector(pool, &args)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let election = elector.spawn(shutdown.clone());
    let status = stand_by(&elector, &args, &shutdown).await;
    shutdown.cancel();
    match election.await {
        Ok(Ok(())) => Ok(status),
        Ok(Err(e)) => Err(Failure::new(exit::INTERNAL, e.to_string())),
        Err(e) => Err(Failure::new(exit::INTERNAL, e.to_string())),
    }
}

fn elector(pool: Pool, args: &RunArgs) -> Result<Elector, Failure> {
    let mut builder = Elector::builder(pool, LockKey::from_name(&args.name))
        .check_interval(args.interval)
        .fast_takeover(args.fast_takeover)
        .fencing(args.fencing)
        .drain_timeout(args.grace + DRAIN_SLACK);
    if let Some(identity) = &args.identity {
        builder = builder.identity(identity);
    }
    if let Some(preference) = args.preference {
        builder = builder.preference(preference);
    }
    builder
        .build()
        .map_err(|e| Failure::new(exit::USAGE, e.to_string()))
}

/// Cancels `shutdown` at SIGTERM, SIGINT or SIGHUP.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!(
            "cannot listen for SIGTERM, SIGINT and SIGHUP: stop pg-elector with SIGKILL"
        );
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = hup.recv() => {}
    }
    tracing::info!("stopping: the command's group ends, then the lock is given up");
    shutdown.cancel();
}

/// Stands by and leads until `shutdown` (0), the command's end without restart (its status),
/// or the first term's end with `--once`.
async fn stand_by(elector: &Elector, args: &RunArgs, shutdown: &CancellationToken) -> i32 {
    let mut backoff = Backoff::default();
    loop {
        tokio::select! {
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
    let env = environment(elector, term, args);
    loop {
        tracing::info!(key = %args.name, epoch = ?term.epoch(), "leading: starting the command");
        let started = tokio::time::Instant::now();
        let mut group = match Group::start(&args.command, args.grace, &env) {
            Ok(group) => group,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the command's keeper");
                return Lead::Finished(exit::INTERNAL);
            }
        };
        let status = tokio::select! {
            status = group.wait() => status,
            () = term.cancelled() => return Lead::Ended(stop(&mut group, term).await),
        };
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
            () = tokio::time::sleep(pause) => {}
            () = term.cancelled() => return Lead::Ended(status),
        }
    }
}

/// Stops the group as the term's end calls for: at once when the lead was lost (another
/// replica may already lead), with the grace otherwise.
async fn stop(group: &mut Group, term: &Term) -> i32 {
    if term.end() == Some(TermEnd::LeadershipLost) {
        tracing::warn!(cause = ?term.loss_cause(), "the lead was lost: killing the command's group");
        group.kill();
    } else {
        tracing::info!(end = ?term.end(), "the term ended: stopping the command's group");
        group.end();
    }
    group.wait().await
}

/// What the command is told: the key, this replica's identity, the term's epoch.
fn environment(elector: &Elector, term: &Term, args: &RunArgs) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PG_ELECTOR_KEY", args.name.clone()),
        (
            "PG_ELECTOR_IDENTITY",
            elector.identity().unwrap_or_default().to_owned(),
        ),
    ];
    if let Some(epoch) = term.epoch() {
        env.push(("PG_ELECTOR_EPOCH", epoch.to_string()));
    }
    env
}
