//! What a held key costs its leader's process in CPU: the leader looks at its lock connection
//! (and its local lease) every millisecond between checks, so that it steps down within about
//! a millisecond when the server ends its session.
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin watch                          # 20 keys, 30 s per phase, I = 5 s
//! cargo run --release -p pg-elector-tools --bin watch -- --keys 50 --seconds 60
//! ```
//!
//! One process (this one, a tokio runtime of two workers) runs `--keys` electors twice: first
//! as standbys of keys another connection holds, then each leading a key of its own; each phase
//! lasts `--seconds`, after a warm-up of 2 s. The process's own CPU (utime + stime from
//! `/proc/self/stat`; the server runs in processes of its own) is read at both ends of each
//! phase. The difference between the phases, per key and per second, is what leading costs
//! on top of standing by: the watch, plus one check per I (at I = 5 s, a trivial part).

use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey};
use pg_elector_testkit::PgServer;
use pg_elector_tools::block_on;
use pg_elector_tools::procfs::{clock_ticks_per_second, own_cpu_ticks};
use tokio_util::sync::CancellationToken;

const USAGE: &str =
    "usage: cargo run --release -p pg-elector-tools --bin watch -- [--keys N] [--seconds S]";

fn main() {
    let mut keys = 20usize;
    let mut seconds = 30u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().and_then(|v| v.parse::<u64>().ok());
        match arg.as_str() {
            "--keys" => keys = value().unwrap_or_else(|| panic!("{USAGE}")) as usize,
            "--seconds" => seconds = value().unwrap_or_else(|| panic!("{USAGE}")),
            // What `cargo bench` passed when this was a bench: ignored.
            "--bench" => {}
            other => panic!("unknown option {other:?}; {USAGE}"),
        }
    }
    block_on(measure(keys, Duration::from_secs(seconds)));
}

async fn measure(keys: usize, span: Duration) {
    let server = tokio::task::spawn_blocking(PgServer::spawn)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let db = server.create_database().await.unwrap();
    let interval = Duration::from_secs(5);
    let elector = |key: LockKey| {
        Elector::builder(db.pool(1), key)
            .check_interval(interval)
            .build()
            .unwrap()
    };
    let holder = db.connect().await.unwrap();
    let held = LockKey::new(0x7761, 0);
    holder
        .execute(
            "SELECT pg_advisory_lock($1, $2)",
            &[&held.class(), &held.object()],
        )
        .await
        .unwrap();

    let standbys: Vec<Elector> = (0..keys).map(|_| elector(held)).collect();
    let standby_cpu = phase("standbys", &standbys, span, |e| !e.is_leader()).await;
    let leaders: Vec<Elector> = (0..keys)
        .map(|n| elector(LockKey::new(0x7761, n as i32 + 1)))
        .collect();
    let leader_cpu = phase("leaders", &leaders, span, Elector::is_leader).await;

    let per_key_us = (leader_cpu - standby_cpu).max(0.0) * 1e6 / keys as f64;
    println!(
        "watch: {keys} keys, {span:?} per phase, I = {interval:?}: standbys {:.2} % of a core, \
         leaders {:.2} %; leading costs {per_key_us:.0} µs of CPU per second per held key \
         ({:.3} % of a core)",
        standby_cpu * 100.0,
        leader_cpu * 100.0,
        per_key_us / 1e4,
    );
}

/// Runs `electors` until each satisfies `ready`, warms up 2 s, and returns the process's CPU
/// over `span` in cores (CPU seconds per second).
async fn phase(
    name: &str,
    electors: &[Elector],
    span: Duration,
    ready: impl Fn(&Elector) -> bool,
) -> f64 {
    let shutdown = CancellationToken::new();
    let runs: Vec<_> = electors.iter().map(|e| e.spawn(shutdown.clone())).collect();
    let started = Instant::now();
    while !electors.iter().all(&ready) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: not ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (t0, cpu0) = (Instant::now(), own_cpu_ticks());
    tokio::time::sleep(span).await;
    let (took, cpu1) = (t0.elapsed(), own_cpu_ticks());
    assert!(
        electors.iter().all(&ready),
        "{name}: changed during the phase"
    );
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let cores = (cpu1 - cpu0) as f64 / clock_ticks_per_second() / took.as_secs_f64();
    eprintln!("{name}: {:.2} % of a core", cores * 100.0);
    cores
}
