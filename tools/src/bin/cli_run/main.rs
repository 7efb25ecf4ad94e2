//! `pg-elector run` and `pg-elector cron` under faults, with real processes (issue 44): how
//! soon the leader's command ends after its lead does, how soon the standby's starts, and
//! whether two ever ran at once, counted by the commands themselves.
//!
//! ```sh
//! cargo build --release -p pg-elector-cli && cargo run --release -p pg-elector-tools --bin cli_run
//! cargo build --release -p pg-elector-cli && cargo run --release -p pg-elector-tools --bin cli_run -- --rounds 5 --cron-seconds 20
//! ```
//!
//! The `pg-elector` binary is the one beside this one (the same target directory), or
//! `PG_ELECTOR_BIN`. The server is a private PostgreSQL the harness starts. For each mode
//! (poll, and `--fast-takeover`), two replicas `a` and `b` of one key at `--interval` (default
//! 200 ms), each through a proxy of its own, run this binary as their command: it writes its
//! start, its SIGTERM and its end with the wall clock to a log; a command killed without a
//! word is seen gone by the bench, which looks every millisecond. The lock's holder is
//! sampled from `pg_locks` every millisecond. Each fault is put `--rounds` times (default 10)
//! on whichever replica leads, at a random phase of the interval, and healed before the next:
//!
//! - the leader's command gone: from the fault to its command (the whole group) gone;
//! - the standby's command started: from the fault to the standby's command's first line;
//! - the spawn: from the lock's grant to the standby (in `pg_locks`) to that first line;
//! - two at once: pairs of commands whose lives overlapped, over the whole mode.
//!
//! Then `cron`: three replicas of `* * * * * *` (a 300 ms command, `--catch-up all`) for
//! `--cron-seconds` (default 60), the replica running the dues SIGKILLed (and started again)
//! and the lead handed over, in turn, every 5 s: every due from the first to the last started
//! exactly once; the runs a kill or a handover's SIGTERM cut off are counted.
//!
//! The logs (the commands' and the cron replicas' stderr) are in a scratch directory under
//! the temporary directory, removed at the end unless `CLI_RUN_KEEP` is set.

mod child;
mod cron;
mod pair;
mod timeline;

use std::path::{Path, PathBuf};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::PgServer;
use pg_elector_testkit::replica::unix_us;
use pg_elector_tools::args::{Args, or_exit};
use pg_elector_tools::rng::{Rng, time_seed};
use pg_elector_tools::stats::summary;
use tokio::task::block_in_place;

use pair::{Fault, Pair, wait_until};
use timeline::{Timeline, overlaps};

/// The hidden first argument of this binary run as `run`'s command.
pub(crate) const RUN_CHILD: &str = "--run-child";
/// The hidden first argument of this binary run as `cron`'s command.
pub(crate) const CRON_CHILD: &str = "--cron-child";

const USAGE: &str = "usage: cli_run [--rounds N] [--interval-ms MS] [--cron-seconds S]";

struct Options {
    rounds: usize,
    interval: Duration,
    cron: Duration,
}

fn options() -> Result<Options, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut args = Args::new(&argv);
    let mut o = Options {
        rounds: 10,
        interval: Duration::from_millis(200),
        cron: Duration::from_secs(60),
    };
    let number = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
    while let Some(flag) = args.next_flag() {
        match flag {
            "--rounds" => o.rounds = number(args.value()?)? as usize,
            "--interval-ms" => o.interval = Duration::from_millis(number(args.value()?)?),
            "--cron-seconds" => o.cron = Duration::from_secs(number(args.value()?)?),
            _ => args.other()?,
        }
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(RUN_CHILD) => return child::run_command(Path::new(&args[2])),
        Some(CRON_CHILD) => return child::cron_command(Path::new(&args[2])),
        _ => {}
    }
    let o = or_exit(options(), "cli_run", USAGE);
    let bin = std::env::var_os("PG_ELECTOR_BIN").map_or_else(
        || {
            std::env::current_exe()
                .expect("this binary's path")
                .with_file_name("pg-elector")
        },
        PathBuf::from,
    );
    if !bin.exists() {
        eprintln!(
            "cli_run: no pg-elector binary at {} (cargo build --release -p pg-elector-cli, or set PG_ELECTOR_BIN)",
            bin.display()
        );
        std::process::exit(2);
    }
    pg_elector_tools::block_on(bench(o, bin));
}

/// µs as milliseconds with one decimal.
fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

/// What one round of a fault measured, in µs from the fault.
#[derive(Default)]
struct Round {
    gone: Option<u64>,
    started: Option<u64>,
    spawn: Option<u64>,
}

async fn bench(o: Options, bin: PathBuf) {
    let server = block_in_place(PgServer::spawn).unwrap_or_else(|e| panic!("{e}"));
    let scratch = std::env::temp_dir().join(format!("cli_run-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    println!(
        "cli_run: I = {} ms, {} rounds per fault, {} s of cron",
        o.interval.as_millis(),
        o.rounds,
        o.cron.as_secs()
    );
    let mut rng = Rng::new(time_seed());
    for fast in [false, true] {
        let mode = if fast { "fast" } else { "poll" };
        let db = server.create_database().await.expect("a database");
        let key = format!("bench/{mode}");
        let log = scratch.join(format!("{mode}.log"));
        let timeline = Timeline::start(log.clone(), &db, LockKey::from_name(&key)).await;
        let mut pair = Pair::start(db, &key, fast, o.interval, [&bin, &log], &timeline).await;
        println!(
            "\n{mode} mode:\n\n| fault | the leader's command gone | the next command started | of which the spawn after the grant | two at once |\n|---|---|---|---|---|"
        );
        for fault in Fault::ALL {
            let from = unix_us();
            let mut rounds = Vec::new();
            for _ in 0..o.rounds {
                let wait = rng.below(o.interval.as_millis() as u64);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                rounds.push(round(&mut pair, fault, &timeline, o.interval).await);
            }
            let lives: Vec<_> = timeline
                .lives()
                .into_iter()
                .filter(|l| l.end.is_none_or(|end| end > from))
                .collect();
            let twice = overlaps(&lives, unix_us());
            let of = |f: fn(&Round) -> Option<u64>| {
                let values: Vec<u64> = rounds.iter().filter_map(f).collect();
                let missing = rounds.len() - values.len();
                let shown = summary(values, ms);
                if missing > 0 {
                    format!("{shown} ({missing} of {} none)", rounds.len())
                } else {
                    shown
                }
            };
            println!(
                "| {} | {} | {} | {} | {} |",
                fault.label(),
                of(|r| r.gone),
                of(|r| r.started),
                of(|r| r.spawn),
                if twice.is_empty() {
                    "0".to_owned()
                } else {
                    format!("**{}**: {twice:?}", twice.len())
                }
            );
        }
        pair.stop().await;
        timeline.stop();
    }
    let db = server.create_database().await.expect("a database");
    cron::bench(&db, &bin, &scratch.join("cron.log"), o.cron, o.interval).await;
    if std::env::var_os("CLI_RUN_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

/// One fault on whichever replica leads, measured, then healed.
async fn round(pair: &mut Pair, fault: Fault, timeline: &Timeline, interval: Duration) -> Round {
    let Some(old) = timeline.running() else {
        panic!("no command runs before the {fault:?}");
    };
    let at = pair.inject(fault, &old.name).await;
    // After a stop (already over when `inject` returns), a few intervals tell.
    let within = if matches!(fault, Fault::Stop | Fault::ShortStop) {
        3 * interval
    } else {
        30 * interval
    };
    let new = wait_until(within, || {
        timeline
            .lives()
            .into_iter()
            .find(|l| l.start > at && l.pid != old.pid)
    })
    .await;
    let gone = wait_until(within, || {
        timeline
            .lives()
            .into_iter()
            .find(|l| l.pid == old.pid)
            .and_then(|l| l.end)
    })
    .await;
    pair.heal(fault, &old.name).await;
    let grant = timeline.next_grant(at);
    Round {
        gone: gone.map(|end| end.saturating_sub(at)),
        started: new.as_ref().map(|l| l.start - at),
        spawn: new
            .as_ref()
            .zip(grant)
            .map(|(l, grant)| l.start.saturating_sub(grant)),
    }
}
