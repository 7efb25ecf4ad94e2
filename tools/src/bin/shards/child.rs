//! The child: one replica process, a member of the group (or, the old way, 1 024 electors).
//!
//! Lines on stdout, each `MARK <word> …` with the wall clock in µs: `joined <us>` once the
//! member's session is established, `gain <shard> <us>` and `lose <shard> <us>` whenever
//! `is_owner` changes (sampled every millisecond), `up` once the electors run, `left <us>` after
//! a graceful leave. stdin: `leave` leaves gracefully; end of file means the parent is gone.

use std::io::Write;
use std::time::Duration;

use pg_elector::shards::Shards;
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::replica;
use pg_elector_testkit::replica::{log_to_stderr, on_current_thread, setting, unix_us};
use pg_elector_testkit::server::config::pool_from_config;
use pg_elector_tools::rng::xorshift;
use tokio_util::sync::CancellationToken;

use crate::{ENV_COUNT, ENV_ELECTORS, ENV_INTERVAL_MS, ENV_URL, GROUP, MARK, OLD_CLASS, OLD_POOL};

pub(super) fn main() {
    on_current_thread(run());
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARK}{line}");
    let _ = out.flush();
}

async fn run() {
    let old_way = std::env::var(ENV_ELECTORS).is_ok();
    // The old way's standbys warn of every try the loaded server answers late; its errors stay.
    log_to_stderr(if old_way {
        "pg_elector=error"
    } else {
        "pg_elector=warn"
    });
    let number = |name: &str| -> u64 { setting(name).parse().expect("a number") };
    let interval = Duration::from_millis(number(ENV_INTERVAL_MS));
    let count = number(ENV_COUNT) as u32;
    let config: tokio_postgres::Config = setting(ENV_URL).parse().expect("a connection URL");
    // A member borrows from its pool only to join; 1 024 standby electors need more room.
    let pool = pool_from_config(config, if old_way { OLD_POOL } else { 4 });
    let shutdown = CancellationToken::new();
    let leave = shutdown.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            match line {
                Ok(line) if line.trim() == "leave" => leave.cancel(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        leave.cancel();
    });
    if old_way {
        electors(pool, count, interval, shutdown).await;
    } else {
        member(pool, count, interval, shutdown).await;
    }
}

/// One member of the group, reporting every change of what it owns.
async fn member(
    pool: deadpool_postgres::Pool,
    count: u32,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let shards = Shards::builder(pool, GROUP, count)
        .check_interval(interval)
        .build()
        .expect("a valid group");
    let run = shards.spawn(shutdown.clone());
    let ids: Vec<_> = shards.all().collect();
    let mut owned = vec![false; ids.len()];
    let mut joined = false;
    while !run.is_finished() {
        if !joined && shards.is_member() {
            joined = true;
            say(format!("joined {}", unix_us()));
        }
        let now = unix_us();
        for (i, id) in ids.iter().enumerate() {
            let is = shards.is_owner(*id);
            if is != owned[i] {
                owned[i] = is;
                say(format!("{} {i} {now}", if is { "gain" } else { "lose" }));
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = run.await;
    for (i, was) in owned.iter().enumerate() {
        if *was {
            say(format!("lose {i} {}", unix_us()));
        }
    }
    say(format!("left {}", unix_us()));
}

/// The old way: one elector per unit, each starting at a random moment within I.
async fn electors(
    pool: deadpool_postgres::Pool,
    count: u32,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut seed = unix_us() ^ u64::from(std::process::id()) | 1;
    let mut runs = Vec::new();
    for i in 0..count {
        let elector = Elector::builder(pool.clone(), LockKey::new(OLD_CLASS, i as i32))
            .check_interval(interval)
            .build()
            .expect("a valid elector");
        let delay = Duration::from_micros(xorshift(&mut seed) % replica::us(interval));
        let shutdown = shutdown.clone();
        runs.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            elector.run(shutdown).await
        }));
    }
    say("up".to_owned());
    for run in runs {
        let _ = run.await;
    }
    say(format!("left {}", unix_us()));
}
