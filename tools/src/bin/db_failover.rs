//! Leaderless time across a database failover: a private primary with a streaming standby,
//! three electors (in this process, started at random phases of the interval) following it by
//! a multi-host URL or by an address that moves; the primary crashes (immediate stop), the
//! standby is promoted 2·I to 3·I later (a random phase), and the time from the promoted server
//! accepting writes to the first new leader is measured, in both modes. Every run starts a
//! fresh primary and standby.
//!
//! The phases come from a seed, printed first: `--seed N` draws them again (the timings of
//! the servers and the electors still differ from run to run).
//!
//!     cargo run --release -p pg-elector-tools --bin db_failover [-- --runs 10 --interval-ms 1000]
//!     cargo run --release -p pg-elector-tools --bin db_failover -- --seed 4242   # the same draws

use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey};
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_testkit::server::failover::{Cluster, Follow};
use pg_elector_tools::args::{Args, or_exit};
use pg_elector_tools::rng::{Rng, time_seed};
use pg_elector_tools::stats::summary;
use tokio_util::sync::CancellationToken;

const USAGE: &str = "usage: db_failover [--runs N (default 10)] [--interval-ms MS (default 1000)] \
                     [--seed N (default: from the clock)]";

struct Options {
    runs: usize,
    interval: Duration,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        runs: 10,
        interval: Duration::from_secs(1),
        seed: time_seed(),
    };
    let mut args = Args::new(args);
    while let Some(flag) = args.next_flag() {
        match flag {
            "--runs" => {
                options.runs = args.value()?.parse().map_err(|e| format!("--runs: {e}"))?;
            }
            "--interval-ms" => {
                let ms: u64 = args
                    .value()?
                    .parse()
                    .map_err(|e| format!("--interval-ms: {e}"))?;
                options.interval = Duration::from_millis(ms.max(50));
            }
            "--seed" => options.seed = args.seed()?,
            _ => args.other()?,
        }
    }
    Ok(options)
}

/// One failover's figures.
struct Run {
    /// From the promoted server accepting writes to the first new leader.
    after_writable: Duration,
    /// From the crash to the first new leader.
    leaderless: Duration,
    /// The most replicas leading at one sample.
    most: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = or_exit(parse(&args), "db_failover", USAGE);
    println!(
        "db_failover: seed {} (replay with --seed {})",
        options.seed, options.seed
    );
    pg_elector_tools::block_on(async {
        println!(
            "{} failovers per row, I = {:?}, 3 electors, the standby promoted 2·I to 3·I after the crash",
            options.runs, options.interval
        );
        let mut rng = Rng::new(options.seed);
        println!(
            "| follow | mode | leader after the promoted server accepts writes, p50 / p99 / max | leaderless from the crash, p50 / p99 / max | two leaders |"
        );
        println!("|---|---|---|---|---|");
        for follow in [Follow::MultiHost, Follow::MovingAddress] {
            for fast in [false, true] {
                let mut runs = Vec::new();
                for _ in 0..options.runs {
                    match failover(follow, fast, options.interval, &mut rng).await {
                        Ok(run) => runs.push(run),
                        Err(e) => {
                            eprintln!("db_failover: {e}");
                            std::process::exit(1);
                        }
                    }
                }
                report(follow, fast, &runs);
            }
        }
    });
}

fn report(follow: Follow, fast: bool, runs: &[Run]) {
    let ms = |d: &Duration| d.as_micros() as u64;
    let show = |us: u64| format!("{:.1} ms", us as f64 / 1000.0);
    println!(
        "| {follow:?} | {} | {} | {} | {} |",
        if fast { "fast takeover" } else { "poll" },
        summary(runs.iter().map(|r| ms(&r.after_writable)).collect(), show),
        summary(runs.iter().map(|r| ms(&r.leaderless)).collect(), show),
        runs.iter().filter(|r| r.most > 1).count(),
    );
}

/// One crash and promotion.
async fn failover(
    follow: Follow,
    fast: bool,
    interval: Duration,
    rng: &mut Rng,
) -> Result<Run, String> {
    let phase = |rng: &mut Rng| {
        Duration::from_micros(rng.below(u64::try_from(interval.as_micros()).unwrap_or(u64::MAX)))
    };
    let cluster = Cluster::start(follow, false)
        .await
        .map_err(|e| e.to_string())?;
    let key = LockKey::new(0x4637, 9);
    let shutdown = CancellationToken::new();
    let mut electors = Vec::new();
    for n in 0..3 {
        let elector = Elector::builder(cluster.pool(2), key)
            .check_interval(interval)
            .identity(format!("replica-{n}"))
            .fast_takeover(fast)
            .build()
            .map_err(|e| e.to_string())?;
        // Replicas start at different times: their tries come at different phases.
        tokio::time::sleep(phase(rng)).await;
        elector.spawn(shutdown.clone());
        electors.push(elector);
    }
    let leading = |electors: &[Elector]| electors.iter().filter(|e| e.is_leader()).count();
    let mut most = 0;
    wait(Duration::from_secs(30), || leading(&electors) == 1).await?;
    tokio::time::sleep(interval).await;

    cluster
        .stop_primary(ShutdownMode::Immediate)
        .await
        .map_err(|e| e.to_string())?;
    let crashed = Instant::now();
    let gap_end = crashed + 2 * interval + phase(rng);
    while Instant::now() < gap_end {
        most = most.max(leading(&electors));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let writable = cluster.promote().await.map_err(|e| e.to_string())?;
    let led = loop {
        let now = leading(&electors);
        most = most.max(now);
        if now >= 1 {
            break Instant::now();
        }
        if writable.elapsed() > Duration::from_secs(60) {
            return Err("no leader within 60 s of the promotion".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let settle = Instant::now() + 2 * interval;
    while Instant::now() < settle {
        most = most.max(leading(&electors));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    shutdown.cancel();
    Ok(Run {
        after_writable: led.saturating_duration_since(writable),
        leaderless: led - crashed,
        most,
    })
}

/// Waits (every millisecond) until `cond` holds, at most `limit`.
async fn wait(limit: Duration, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("no single leader within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}
