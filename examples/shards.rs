//! Four replicas spread 32 shards among themselves; one is killed, one joins, one leaves
//! gracefully. After each step it prints who owns what, how many shards moved and how long the
//! group took to settle; it exits non-zero if a shard ever had two owners, or stayed unowned
//! longer than its bound (two intervals).
//!
//!     cargo run --example shards
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries. The
//! replicas are tasks of this process, each with a pool and a lock session of its own; a
//! killed replica's `run` is aborted, which closes its session without an unlock, as the
//! kernel does for a crashed process.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::shards::Shards;
use pg_elector_testkit::PgServer;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);
const COUNT: u32 = 32;
const GROUP: &str = "example/tenants";
/// The longest a shard may stay unowned while the replicas run: one interval for the others to
/// see a member go, one for their tries, with slack for a loaded machine.
const UNOWNED_BOUND: Duration = Duration::from_millis(2 * 500 + 200);

struct Replica {
    name: String,
    shards: Shards,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), pg_elector::Error>>,
}

/// What the monitor saw: samples with two owners of a shard, the longest unowned stretch.
#[derive(Default)]
struct Seen {
    two_owners: u64,
    longest_unowned: Duration,
}

#[tokio::main]
async fn main() {
    match run().await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("shards example failed: {e}");
            std::process::exit(2);
        }
    }
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    common::init_tracing();
    let say = common::say_since_now();
    let server = PgServer::shared()?;
    let db = server.create_database().await?;
    say(format!(
        "PostgreSQL at {} ({}); {COUNT} shards of group {GROUP:?}, checked every {INTERVAL:?}",
        server.addr(),
        if server.is_private() {
            "a private server"
        } else {
            "DATABASE_URL"
        }
    ));
    let start = |name: &str| {
        let shards = Shards::builder(db.pool(2), GROUP, COUNT)
            .check_interval(INTERVAL)
            .identity(name)
            .build()
            .expect("a valid configuration");
        let shutdown = CancellationToken::new();
        let task = shards.spawn(shutdown.clone());
        Replica {
            name: name.to_owned(),
            shards,
            shutdown,
            task,
        }
    };
    let replicas: Arc<Mutex<Vec<Replica>>> = Arc::default();
    let (seen, stop_monitor) = monitor(replicas.clone());

    for name in ["replica-a", "replica-b", "replica-c", "replica-d"] {
        replicas.lock().unwrap().push(start(name));
    }
    let mut before = settle(&replicas, &say, "four replicas start", &BTreeMap::new()).await;

    let killed = take(&replicas, "replica-c");
    killed.task.abort();
    let _ = killed.task.await;
    before = settle(&replicas, &say, "replica-c is killed", &before).await;

    replicas.lock().unwrap().push(start("replica-e"));
    before = settle(&replicas, &say, "replica-e joins", &before).await;

    let leaver = take(&replicas, "replica-b");
    leaver.shutdown.cancel();
    leaver.task.await??;
    settle(&replicas, &say, "replica-b leaves gracefully", &before).await;

    let rest: Vec<Replica> = std::mem::take(&mut *replicas.lock().unwrap());
    for r in rest {
        r.shutdown.cancel();
        r.task.await??;
    }
    stop_monitor.cancel();
    let seen = seen.lock().unwrap();
    say(format!(
        "samples with a shard of two owners: {}; longest a shard was unowned: {:?} (bound {UNOWNED_BOUND:?})",
        seen.two_owners, seen.longest_unowned
    ));
    Ok(seen.two_owners == 0 && seen.longest_unowned <= UNOWNED_BOUND)
}

fn take(replicas: &Mutex<Vec<Replica>>, name: &str) -> Replica {
    let mut replicas = replicas.lock().unwrap();
    let at = replicas
        .iter()
        .position(|r| r.name == name)
        .expect("a running replica");
    replicas.remove(at)
}

/// Waits until every shard has one owner and the shares are balanced, then prints who owns
/// what and how many shards changed owner since `before`.
async fn settle(
    replicas: &Mutex<Vec<Replica>>,
    say: &impl Fn(String),
    step: &str,
    before: &BTreeMap<u32, String>,
) -> BTreeMap<u32, String> {
    let began = Instant::now();
    loop {
        let owners = owners(replicas);
        let n = replicas.lock().unwrap().len();
        let mut shares: BTreeMap<&String, usize> = BTreeMap::new();
        for name in owners.values() {
            *shares.entry(name).or_default() += 1;
        }
        let (lo, hi) = (COUNT as usize / n, (COUNT as usize).div_ceil(n));
        let balanced = owners.len() == COUNT as usize
            && shares.len() == n
            && shares.values().all(|&k| k == lo || k == hi);
        if balanced || began.elapsed() > 10 * INTERVAL {
            let moved = owners
                .iter()
                .filter(|(s, o)| before.get(s) != Some(o))
                .count();
            say(format!(
                "{step}: {} after {:?}, {moved} shards moved",
                if balanced { "balanced" } else { "NOT balanced" },
                began.elapsed()
            ));
            for (name, count) in &shares {
                let mine: Vec<String> = owners
                    .iter()
                    .filter(|(_, o)| o == name)
                    .map(|(s, _)| s.to_string())
                    .collect();
                say(format!("    {name} owns {count:>2}: {}", mine.join(" ")));
            }
            return owners;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every owned shard and its owner's name.
fn owners(replicas: &Mutex<Vec<Replica>>) -> BTreeMap<u32, String> {
    let replicas = replicas.lock().unwrap();
    let mut owners = BTreeMap::new();
    for r in replicas.iter() {
        for shard in r.shards.owned() {
            owners.insert(shard.index(), r.name.clone());
        }
    }
    owners
}

/// Samples every replica's `is_owner` for every shard every millisecond.
fn monitor(replicas: Arc<Mutex<Vec<Replica>>>) -> (Arc<Mutex<Seen>>, CancellationToken) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = CancellationToken::new();
    tokio::spawn({
        let (seen, stop) = (seen.clone(), stop.clone());
        async move {
            let mut unowned_since: Vec<Option<Instant>> = vec![None; COUNT as usize];
            let mut all_owned_once = false;
            while !stop.is_cancelled() {
                let handles: Vec<Shards> = replicas
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|r| r.shards.clone())
                    .collect();
                let now = Instant::now();
                let mut all = true;
                {
                    let mut seen = seen.lock().unwrap();
                    for index in 0..COUNT {
                        let owners = handles
                            .iter()
                            .filter(|s| s.shard(index).is_some_and(|id| s.is_owner(id)))
                            .count();
                        seen.two_owners += u64::from(owners > 1);
                        let since = &mut unowned_since[index as usize];
                        if owners == 0 {
                            all = false;
                            let from = *since.get_or_insert(now);
                            if all_owned_once {
                                seen.longest_unowned = seen.longest_unowned.max(now - from);
                            }
                        } else {
                            *since = None;
                        }
                    }
                }
                all_owned_once |= all;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    (seen, stop)
}
