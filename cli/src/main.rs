//! `pg-elector`: one leader among replicas through a PostgreSQL advisory lock, on the command
//! line. `run` runs any program on the leader only, `cron` at each due of a schedule, once
//! across the replicas; `status` shows who leads; `handover` moves the lead.

mod command;
mod connect;
mod cron;
mod exit;
mod group;
mod handover;
mod keeper;
mod os;
mod replica;
mod run;
mod status;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// One leader among replicas, through a PostgreSQL session advisory lock.
#[derive(Debug, Parser)]
#[command(name = "pg-elector", version, after_help = exit::HELP)]
struct Cli {
    /// The database, as a URL (postgres://user@host/db) or key=value pairs. TLS as libpq's
    /// settings say: sslmode=disable|allow|prefer (the default)|require|verify-ca|verify-full,
    /// sslrootcert=FILE|system, sslcert=FILE, sslkey=FILE.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Stand by, and run a command only while this replica leads NAME.
    ///
    /// The command gets PG_ELECTOR_KEY, PG_ELECTOR_IDENTITY and, with --fencing,
    /// PG_ELECTOR_EPOCH. When the term ends gracefully (a handover, SIGTERM, SIGINT or SIGHUP
    /// to pg-elector) everything the command started gets SIGTERM (its process group, and what
    /// left it with setsid), then SIGKILL after --grace; when the lead is lost it gets SIGKILL
    /// at once, since another replica may already lead. The lock is given up only once it is
    /// all gone. If pg-elector itself dies, it is all killed with it; if it is stopped
    /// (SIGSTOP) for two intervals, it is all killed too, before the server frees the lock.
    #[command(after_help = exit::HELP)]
    Run(run::RunArgs),
    /// Run a command at each due of a cron schedule, once across every replica that runs the
    /// same line.
    ///
    /// The command gets PG_ELECTOR_KEY, PG_ELECTOR_IDENTITY, PG_ELECTOR_DUE (the due instant,
    /// RFC 3339), PG_ELECTOR_ATTEMPT and, with --fencing, PG_ELECTOR_EPOCH; its status is the
    /// run's outcome in the jobs table. The leader claims each due before it runs it, so a
    /// due runs once across a failover; a new leader runs the dues it missed as --catch-up
    /// says. The command's group ends with the term as in `run`.
    #[command(after_help = exit::HELP)]
    Cron(cron::CronArgs),
    /// Show who leads each key of the database, since when, who waits, the candidates and a
    /// pending handover; and each stored job's next due and last run.
    ///
    /// Every two-number advisory lock of the database is listed, the crate's or not, and every
    /// key with a live candidate. PostgreSQL keeps only a key's two numbers: give the names
    /// your replicas use and those keys show by name (and are listed even while nobody holds
    /// them). In CANDIDATES, `*` marks a standby that waits for the lock (fast takeover), and
    /// `(dead)` one that stopped trying. AGE and EPOCH need --fencing on the replicas. Jobs
    /// (of `cron` and the library's schedules, in the default tables) follow in a second table:
    /// NEXT is late while no leader has claimed that due.
    #[command(after_help = exit::HELP)]
    Status(status::StatusArgs),
    /// Ask the leader of NAME to hand the lead over to a live standby.
    #[command(after_help = exit::HELP)]
    Handover(handover::HandoverArgs),
    /// The process between `run` and its command (internal).
    #[command(name = "__keeper", hide = true)]
    Keeper {
        #[arg(long)]
        grace_ms: u64,
        #[arg(long)]
        stop_limit_ms: u64,
        #[arg(long)]
        parent: i32,
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let status = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(status);
        }
    };
    if let Command::Keeper {
        grace_ms,
        stop_limit_ms,
        parent,
        command,
    } = &cli.command
    {
        std::process::exit(keeper::main(
            Duration::from_millis(*grace_ms),
            Duration::from_millis(*stop_limit_ms),
            *parent,
            command,
        ));
    }
    init_logging();
    // One thread: the command's parent-death signal follows the thread that started it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let status = match runtime {
        Ok(runtime) => runtime.block_on(dispatch(cli)),
        Err(e) => {
            eprintln!("pg-elector: cannot start: {e}");
            exit::INTERNAL
        }
    };
    std::process::exit(status);
}

async fn dispatch(cli: Cli) -> i32 {
    let url = cli.url.as_deref();
    let done = match cli.command {
        Command::Run(args) => run::run(url, args).await,
        Command::Cron(args) => cron::cron(url, args).await,
        Command::Status(args) => status::status(url, args).await,
        Command::Handover(args) => handover::handover(url, args).await.map(|()| exit::OK),
        Command::Keeper { .. } => Ok(exit::INTERNAL),
    };
    done.unwrap_or_else(|failure| {
        eprintln!("pg-elector: {}", failure.message);
        failure.status
    })
}

/// Log lines on stderr: INFO and above, or as `PG_ELECTOR_LOG` says (`debug`,
/// `pg_elector=trace`, …).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PG_ELECTOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
