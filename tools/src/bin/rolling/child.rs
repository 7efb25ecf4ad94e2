//! The child: one replica process, running one elector or one member of the group of shards,
//! with its settings in the environment ([`Settings`]).
//!
//! Lines on stdout, each `@rolling <µs> <word> [shard]` stamped with the wall clock (µs since
//! the UNIX epoch): `started` once the elector or member is built, `leader` and `standby` at
//! each change of `is_leader()`, `member` once `is_member()` is true, `gain <shard>` and
//! `lose <shard>` at each change of `is_owner`, `exited` once the run returned after SIGTERM
//! (and the last `standby` or `lose` was said). `is_leader()` and `is_owner` are read every
//! millisecond. SIGTERM cancels the shutdown token (a graceful stop: the elector drains and
//! unlocks); the end of stdin (the parent is gone) ends the process at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pg_elector::Elector;
use pg_elector::shards::Shards;
use pg_elector_testkit::replica::{log_to_stderr, on_current_thread, setting, unix_us};
use pg_elector_testkit::server::config::pool_from_config;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::{GROUP, KEY};

pub(crate) const MARK: &str = "@rolling ";
pub(crate) const ENV_URL: &str = "PG_ELECTOR_ROLLING_URL";
pub(crate) const ENV_NAME: &str = "PG_ELECTOR_ROLLING_NAME";
pub(crate) const ENV_INTERVAL_US: &str = "PG_ELECTOR_ROLLING_INTERVAL_US";
/// Set: `preference(<value>)`.
pub(crate) const ENV_PREFERENCE: &str = "PG_ELECTOR_ROLLING_PREFERENCE";
/// Set: `fast_takeover(true)`.
pub(crate) const ENV_FAST: &str = "PG_ELECTOR_ROLLING_FAST";
/// Set: a member of a group of this many shards instead of an elector.
pub(crate) const ENV_SHARDS: &str = "PG_ELECTOR_ROLLING_SHARDS";

/// The pool of each replica: what a small service gives its elector.
const POOL: usize = 4;

struct Settings {
    name: String,
    interval: Duration,
    preference: Option<u64>,
    fast: bool,
    shards: Option<u32>,
    pool: deadpool_postgres::Pool,
}

impl Settings {
    fn from_env() -> Self {
        let name = setting(ENV_NAME);
        let mut config: tokio_postgres::Config = setting(ENV_URL).parse().expect("a URL");
        // Every connection of the pool carries the identity, so that the parent can see this
        // replica's tries in pg_stat_activity before it ever holds the lock.
        config.application_name(&name);
        let number = |v: String| v.parse::<u64>().expect("a number");
        Settings {
            interval: Duration::from_micros(number(setting(ENV_INTERVAL_US))),
            preference: std::env::var(ENV_PREFERENCE).ok().map(number),
            fast: std::env::var(ENV_FAST).is_ok(),
            shards: std::env::var(ENV_SHARDS).ok().map(|v| number(v) as u32),
            pool: pool_from_config(config, POOL),
            name,
        }
    }
}

pub(crate) fn main() {
    on_current_thread(run());
}

fn say(what: &str) {
    println!("{MARK}{} {what}", unix_us());
}

async fn run() {
    log_to_stderr("pg_elector=warn");
    let settings = Settings::from_env();
    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            term.recv().await;
            shutdown.cancel();
        }
    });
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            if line.is_err() {
                break;
            }
        }
        std::process::exit(0);
    });
    match settings.shards {
        Some(count) => member(&settings, count, shutdown).await,
        None => elector(&settings, shutdown).await,
    }
}

async fn elector(s: &Settings, shutdown: CancellationToken) {
    let mut builder = Elector::builder(s.pool.clone(), KEY)
        .check_interval(s.interval)
        .identity(s.name.as_str())
        .fast_takeover(s.fast);
    if let Some(preference) = s.preference {
        builder = builder.preference(preference);
    }
    let elector = builder.build().expect("a valid elector");
    say("started");
    let reported = watch_leadership(&elector);
    if let Err(e) = elector.run(shutdown).await {
        eprintln!("{}: run: {e}", s.name);
    }
    while reported.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    say("exited");
}

/// Says every change of `is_leader()`, read every millisecond on a thread of its own; whether
/// it last said `leader`.
fn watch_leadership(elector: &Elector) -> Arc<AtomicBool> {
    let reported = Arc::new(AtomicBool::new(false));
    let (elector, said) = (elector.clone(), reported.clone());
    std::thread::spawn(move || {
        loop {
            let now = elector.is_leader();
            if now != said.load(Ordering::Relaxed) {
                say(if now { "leader" } else { "standby" });
                said.store(now, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    reported
}

async fn member(s: &Settings, count: u32, shutdown: CancellationToken) {
    let shards = Shards::builder(s.pool.clone(), GROUP, count)
        .check_interval(s.interval)
        .identity(s.name.as_str())
        .build()
        .expect("a valid group");
    say("started");
    let run = shards.spawn(shutdown);
    let ids: Vec<_> = shards.all().collect();
    let mut owned = vec![false; ids.len()];
    let mut member = false;
    while !run.is_finished() {
        if !member && shards.is_member() {
            member = true;
            say("member");
        }
        for (i, id) in ids.iter().enumerate() {
            let is = shards.is_owner(*id);
            if is != owned[i] {
                owned[i] = is;
                say(&format!("{} {i}", if is { "gain" } else { "lose" }));
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if let Ok(Err(e)) = run.await {
        eprintln!("{}: run: {e}", s.name);
    }
    for (i, _) in owned.iter().enumerate().filter(|(_, was)| **was) {
        say(&format!("lose {i}"));
    }
    say("exited");
}
