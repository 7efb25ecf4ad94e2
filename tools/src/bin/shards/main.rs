//! Shards at scale (design §6, issue 18): 1 024 shards over 1, 2, 4 and 8 replica processes
//! at I = 1 s, and the same work the old way (1 024 electors per process) side by side.
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin shards                 # 1 024 shards, 20 kills, 20 s windows
//! cargo run --release -p pg-elector-tools --bin shards -- --quick      # 256 shards, 5 kills, 5 s windows
//! ```
//!
//! Flags: `--count S` (default 1024), `--interval-ms` (default 1000), `--kills K` (default
//! 20), `--leaves L` (default 5), `--window S` seconds of each CPU window (default 20),
//! `--no-old` (skip the old way), `--quick`.
//!
//! The server is a private PostgreSQL started by the harness (its CPU is read from /proc),
//! with `max_connections` raised to what the old way needs. The replicas are this binary run
//! again with `--shards-child`, each with a pool of 4 (16 for the old way's), reporting every change of `is_owner` of
//! every shard (sampled every millisecond) with the wall clock. Measured:
//!
//! - joins: processes started one by one up to 1, 2, 4 and 8 members; for each, the time from
//!   its lock session's establishment (`is_member`) to every shard having one owner with every
//!   member at ⌊S/N⌋ or ⌈S/N⌉, and how many shards changed owner;
//! - lock sessions (distinct backends holding any key of the group in `pg_locks`) and the
//!   group's backends (`pg_stat_activity`) at each size;
//! - kills: with 8 members, one SIGKILLed at random (at a random phase of the interval), the
//!   time until every shard it owned is owned again as `is_owner` says it, then a new process
//!   joins; repeated `--kills` times;
//! - leaves: a member asked to leave gracefully; the time until its shards are owned again and
//!   the shards moved; then a new process joins;
//! - two-owner time: the sum over shards of the time two processes' `is_owner` were both true;
//! - server CPU over a window with 8 idle members, with 8 processes of 1 024 electors each (the
//!   old way), and with no client at all (subtracted from both).

mod child;
mod fleet;

use std::time::Duration;

use pg_elector::shards::Shards;
use pg_elector_testkit::replica::unix_us;
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_testkit::{PgServer, TestDb};
use pg_elector_tools::args::{Args, or_exit};
use pg_elector_tools::procfs::{clock_ticks_per_second, postmaster_pid, server_ticks};
use pg_elector_tools::rng::Rng;
use pg_elector_tools::stats::{percentile, sorted};
use tokio::task::block_in_place;

use fleet::{Fleet, two_owner_us};

pub(crate) const CHILD_FLAG: &str = "--shards-child";
pub(crate) const MARK: &str = "SHARDS ";
pub(crate) const ENV_URL: &str = "PG_ELECTOR_SHARDS_URL";
pub(crate) const ENV_COUNT: &str = "PG_ELECTOR_SHARDS_COUNT";
pub(crate) const ENV_INTERVAL_MS: &str = "PG_ELECTOR_SHARDS_INTERVAL_MS";
pub(crate) const ENV_ELECTORS: &str = "PG_ELECTOR_SHARDS_ELECTORS";
pub(crate) const GROUP: &str = "bench/shards";
/// The class of the old way's keys.
pub(crate) const OLD_CLASS: i32 = 0x006f_6c64;
/// The pool of each of the old way's processes.
pub(crate) const OLD_POOL: usize = 16;

const USAGE: &str = "usage: shards [--count S] [--interval-ms MS] [--kills K] [--leaves L] [--window S] [--no-old] [--quick]";

struct Options {
    count: u32,
    interval: Duration,
    kills: usize,
    leaves: usize,
    window: Duration,
    old: bool,
}

fn options() -> Result<Options, String> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut args = Args::new(&argv);
    let mut o = Options {
        count: 1024,
        interval: Duration::from_secs(1),
        kills: 20,
        leaves: 5,
        window: Duration::from_secs(20),
        old: true,
    };
    let number = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
    while let Some(flag) = args.next_flag() {
        match flag {
            "--count" => o.count = number(args.value()?)? as u32,
            "--interval-ms" => o.interval = Duration::from_millis(number(args.value()?)?),
            "--kills" => o.kills = number(args.value()?)? as usize,
            "--leaves" => o.leaves = number(args.value()?)? as usize,
            "--window" => o.window = Duration::from_secs(number(args.value()?)?),
            "--no-old" => o.old = false,
            "--quick" => {
                o.count = 256;
                o.kills = 5;
                o.leaves = 2;
                o.window = Duration::from_secs(5);
            }
            _ => args.other()?,
        }
    }
    Ok(o)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some(CHILD_FLAG) {
        return child::main();
    }
    let o = or_exit(options(), "shards", USAGE);
    pg_elector_tools::block_on(bench(o));
}

fn ms(us: u64) -> String {
    format!("{:.0} ms", us as f64 / 1000.0)
}

/// p50 / p99 / max of µs values, in ms.
fn spread(values: &[u64]) -> String {
    let v = sorted(values.to_vec());
    match (
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        percentile(&v, 1.0),
    ) {
        (Some(a), Some(b), Some(c)) => format!("{} / {} / {}", ms(a), ms(b), ms(c)),
        _ => "-".into(),
    }
}

async fn bench(o: Options) {
    let server = block_in_place(PgServer::spawn).unwrap_or_else(|e| panic!("{e}"));
    let db = server.create_database().await.unwrap();
    let need = (o.count as usize + 8 * OLD_POOL + 50).max(300);
    let setup = db.connect().await.unwrap();
    setup
        .batch_execute(&format!("ALTER SYSTEM SET max_connections = {need}"))
        .await
        .unwrap();
    drop(setup);
    block_in_place(|| server.restart(ShutdownMode::Fast)).unwrap_or_else(|e| panic!("{e}"));
    let postmaster = postmaster_pid(server.data_dir().unwrap()).expect("postmaster.pid");
    let admin = db.connect().await.unwrap();
    let class = Shards::builder(db.pool(1), GROUP, o.count)
        .build()
        .unwrap()
        .shard(0)
        .unwrap()
        .key()
        .class();
    let i = o.interval;
    println!(
        "shards bench: {} shards, I = {i:?}, {} kills, {} leaves, {:?} CPU windows, max_connections {need}",
        o.count, o.kills, o.leaves, o.window
    );
    let idle = cpu_window(postmaster, o.window).await;

    let mut fleet = Fleet::new(db.url(), o.count, i);
    let mut joins: Vec<(usize, u64, usize)> = Vec::new();
    let mut sizes = Vec::new();
    for n in 1..=8 {
        join(&mut fleet, &mut joins).await;
        if [1, 2, 4, 8].contains(&n) {
            sizes.push((
                n,
                lock_sessions(&admin, class).await,
                backends(&admin).await,
            ));
        }
    }
    let shards_cpu = cpu_window(postmaster, o.window).await;

    let mut rng = Rng::new(unix_us() | 1);
    let (mut reowned, mut kill_balanced, mut kill_moves) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.kills {
        // At a random phase of the members' checks, which the join just before aligned.
        tokio::time::sleep(random_phase(&mut rng, i)).await;
        let before = fleet.owner_map();
        let at = rng.below(fleet.procs.len() as u64) as usize;
        let (victim, killed_at) = fleet.kill(at).await;
        let theirs: Vec<usize> = (0..before.len()).filter(|&s| before[s] == victim).collect();
        let again = fleet
            .until(10 * i, |f| {
                let r = f.reports.lock().unwrap();
                theirs.iter().all(|&s| r.owners[s].len() == 1)
            })
            .await
            .expect("a killed member's shards owned again within 10·I");
        reowned.push(again - killed_at);
        let balanced = fleet
            .until(10 * i, Fleet::balanced)
            .await
            .expect("balanced after a kill");
        kill_balanced.push(balanced - killed_at);
        kill_moves.push(moved(&before, &fleet.owner_map()));
        join(&mut fleet, &mut joins).await;
    }
    let (mut leave_balanced, mut leave_moves, mut leave_owned) =
        (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.leaves {
        tokio::time::sleep(random_phase(&mut rng, i)).await;
        let before = fleet.owner_map();
        let at = rng.below(fleet.procs.len() as u64) as usize;
        let (leaver, asked) = fleet.leave(at).await;
        let theirs: Vec<usize> = (0..before.len()).filter(|&s| before[s] == leaver).collect();
        let again = fleet
            .until(10 * i, |f| {
                let r = f.reports.lock().unwrap();
                theirs.iter().all(|&s| r.owners[s].len() == 1)
            })
            .await
            .expect("a leaver's shards owned again within 10·I");
        leave_owned.push(again - asked);
        let balanced = fleet
            .until(10 * i, Fleet::balanced)
            .await
            .expect("balanced after a leave");
        leave_balanced.push(balanced - asked);
        leave_moves.push(moved(&before, &fleet.owner_map()));
        join(&mut fleet, &mut joins).await;
    }
    fleet.stop_all().await;
    let two_owner = two_owner_us(&fleet.reports.lock().unwrap().changes, o.count);

    let old = if o.old {
        Some(old_way(&db, &admin, postmaster, &o).await)
    } else {
        None
    };

    let fair = |n: usize| (o.count as usize).div_ceil(n);
    println!("\n| members | lock sessions | backends of the group |\n|---|---|---|");
    for (n, locks, b) in &sizes {
        println!("| {n} | {locks} | {b} |");
    }
    println!(
        "\n| joins to N members | balanced after (from the session) | shards moved | fair share ⌈S/N⌉ |\n|---|---|---|---|"
    );
    for n in 1..=8 {
        let at: Vec<&(usize, u64, usize)> = joins.iter().filter(|j| j.0 == n).collect();
        if at.is_empty() {
            continue;
        }
        let times: Vec<u64> = at.iter().map(|j| j.1).collect();
        let moves: Vec<u64> = at.iter().map(|j| j.2 as u64).collect();
        println!(
            "| {n} ({} joins) | {} | {} | {} |",
            at.len(),
            spread(&times),
            summary_count(&moves),
            fair(n)
        );
    }
    println!("\n| at 8 members | p50 / p99 / max |\n|---|---|");
    println!(
        "| SIGKILL: its shards owned again ({} kills) | {} |",
        reowned.len(),
        spread(&reowned)
    );
    println!("| SIGKILL: balanced again | {} |", spread(&kill_balanced));
    println!(
        "| SIGKILL: shards moved | {} |",
        summary_count(&kill_moves.iter().map(|&m| m as u64).collect::<Vec<_>>())
    );
    println!(
        "| graceful leave: its shards owned again, from the request ({} leaves) | {} |",
        leave_owned.len(),
        spread(&leave_owned)
    );
    println!(
        "| graceful leave: balanced again ({} leaves) | {} |",
        leave_balanced.len(),
        spread(&leave_balanced)
    );
    println!(
        "| graceful leave: shards moved | {} |",
        summary_count(&leave_moves.iter().map(|&m| m as u64).collect::<Vec<_>>())
    );
    println!(
        "| two-owner time, all shards, whole run (is_owner) | {} µs |",
        two_owner
    );
    println!("\n| server CPU (% of one core, idle server subtracted) | |\n|---|---|");
    println!("| idle server | {idle:.2} % (raw) |");
    println!(
        "| 8 members, {} shards | {:.2} % |",
        o.count,
        (shards_cpu - idle).max(0.0)
    );
    if let Some((cpu, locks, b)) = old {
        println!(
            "| 8 processes × {} electors (the old way) | {:.2} %, {locks} lock sessions, {b} backends |",
            o.count,
            (cpu - idle).max(0.0)
        );
        println!(
            "| ratio old / shards | {:.1}× |",
            (cpu - idle).max(0.0) / (shards_cpu - idle).max(0.01)
        );
    }
}

/// A random wait within one interval: a kill or a leave right after a balance would always
/// come just after the members' checks (which that balance aligned), and measure the worst
/// phase every time.
fn random_phase(rng: &mut Rng, interval: Duration) -> Duration {
    Duration::from_micros(rng.below(interval.as_micros() as u64))
}

/// One more member: the time from its session to balance, and the shards moved.
async fn join(fleet: &mut Fleet, joins: &mut Vec<(usize, u64, usize)>) {
    let before = fleet.owner_map();
    let index = fleet.spawn(false);
    let i = fleet.interval;
    let joined = fleet
        .until(10 * i, |f| {
            f.reports
                .lock()
                .unwrap()
                .joined
                .iter()
                .any(|j| j.0 == index)
        })
        .await
        .expect("the new member's session within 10·I");
    let joined = {
        let r = fleet.reports.lock().unwrap();
        r.joined
            .iter()
            .find(|j| j.0 == index)
            .map_or(joined, |j| j.1)
    };
    let balanced = fleet
        .until(20 * i, Fleet::balanced)
        .await
        .expect("balanced after a join");
    joins.push((
        fleet.procs.len(),
        balanced.saturating_sub(joined),
        moved(&before, &fleet.owner_map()),
    ));
}

fn moved(before: &[usize], after: &[usize]) -> usize {
    before.iter().zip(after).filter(|(b, a)| b != a).count()
}

fn summary_count(values: &[u64]) -> String {
    let v = sorted(values.to_vec());
    match (percentile(&v, 0.5), percentile(&v, 1.0)) {
        (Some(a), Some(b)) => format!("{a} (max {b})"),
        _ => "-".into(),
    }
}

/// The old way: 8 processes of `count` electors, one per unit; its server CPU, lock sessions
/// and backends once every key has a leader.
async fn old_way(
    db: &TestDb,
    admin: &tokio_postgres::Client,
    postmaster: i32,
    o: &Options,
) -> (f64, i64, i64) {
    let mut fleet = Fleet::new(db.url(), o.count, o.interval);
    for _ in 0..8 {
        fleet.spawn(true);
    }
    let leaders = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::oid AND mode = 'ExclusiveLock' AND granted";
    let deadline = tokio::time::Instant::now() + 30 * o.interval;
    loop {
        let n: i64 = admin
            .query_one(leaders, &[&(OLD_CLASS as u32)])
            .await
            .unwrap()
            .get(0);
        if n == i64::from(o.count) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(2 * o.interval).await;
    let sessions = lock_sessions(admin, OLD_CLASS).await;
    let b = backends(admin).await;
    let cpu = cpu_window(postmaster, o.window).await;
    fleet.stop_all().await;
    (cpu, sessions, b)
}

/// The server's CPU over `window`, in % of one core.
async fn cpu_window(postmaster: i32, window: Duration) -> f64 {
    let (start, _) = server_ticks(postmaster);
    tokio::time::sleep(window).await;
    let (end, _) = server_ticks(postmaster);
    (end - start) as f64 / (window.as_secs_f64() * clock_ticks_per_second()) * 100.0
}

async fn lock_sessions(admin: &tokio_postgres::Client, class: i32) -> i64 {
    admin
        .query_one(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::oid",
            &[&(class as u32)],
        )
        .await
        .unwrap()
        .get(0)
}

async fn backends(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}
