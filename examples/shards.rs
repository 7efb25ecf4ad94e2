//! Four replicas spread 32 shards among themselves; one is killed, one joins, one leaves
//! gracefully. After each step it prints who owns what, how many shards moved and how long the
//! group took to settle; it exits non-zero if a shard ever had two owners, if the killed
//! replica's shards were not owned again within one interval (and some slack), or if any shard
//! stayed unowned longer than two intervals (and some slack).
//!
//!     cargo run --example shards
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries. The
//! replicas are tasks of this one process, each with a pool and a lock session of its own.
//! The "kill" aborts a replica's task: its lock session is dropped without an unlock, so the
//! server frees its locks when the connection closes, as it does for a crashed process (the
//! bench `cargo run --release -p pg-elector-tools --bin shards` SIGKILLs real processes).
//! Every replica stays watched until its `run` has returned, so the leaver's drain and unlock,
//! and the killed replica's end, are checked for two owners too.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::shards::{ShardId, Shards};
use pg_elector_testkit::PgServer;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);
const COUNT: u32 = 32;
const GROUP: &str = "example/tenants";
/// Room for the statements of a check and a try, the 5 ms a gained shard waits before its term
/// starts, and a loaded machine.
const SLACK: Duration = Duration::from_millis(200);
/// A killed replica's shards are owned again within one interval after the server frees them
/// (the others' next check sees it gone and takes them): measured from the abort, which frees
/// them within milliseconds.
const KILL_BOUND: Duration = Duration::from_millis(500 + 200);
/// The longest any shard may stay unowned: a join or a leave also moves shards between the
/// others (the quotas shift), released at one member's check and taken at another's; balance
/// returns within two intervals.
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
    // Every replica ever started, watched by the monitor until the end: one whose run has
    // returned owns nothing, and would count as a second owner if it still said it did.
    let watched: Arc<Mutex<Vec<Shards>>> = Arc::default();
    let (seen, stop_monitor) = monitor(watched.clone());
    let start = |name: &str| {
        let shards = Shards::builder(db.pool(2), GROUP, COUNT)
            .check_interval(INTERVAL)
            .identity(name)
            .build()
            .expect("a valid configuration");
        watched.lock().unwrap().push(shards.clone());
        let shutdown = CancellationToken::new();
        let task = shards.spawn(shutdown.clone());
        Replica {
            name: name.to_owned(),
            shards,
            shutdown,
            task,
        }
    };
    // The replicas whose run is under way: the shares are balanced among these.
    let replicas: Mutex<Vec<Replica>> = Mutex::default();

    let began = Instant::now();
    for name in ["replica-a", "replica-b", "replica-c", "replica-d"] {
        replicas.lock().unwrap().push(start(name));
    }
    let mut before = settle(
        &replicas,
        &say,
        "four replicas start",
        &BTreeMap::new(),
        began,
    )
    .await;

    let killed = take(&replicas, "replica-c");
    let theirs = killed.shards.owned();
    let began = Instant::now();
    killed.task.abort();
    let _ = killed.task.await;
    let reowned = owned_again(&replicas, &theirs, began).await;
    let kill_ok = reowned.is_some_and(|after| after <= KILL_BOUND);
    say(format!(
        "replica-c's run is aborted (its session dropped without an unlock): its {} shards {}; \
         bound for a kill: 1·I after the server frees them, + {SLACK:?} = {KILL_BOUND:?} from the abort",
        theirs.len(),
        match reowned {
            Some(after) => format!("owned again after {after:?}"),
            None => format!("NOT all owned again after {:?}", 10 * INTERVAL),
        }
    ));
    before = settle(&replicas, &say, "replica-c is killed", &before, began).await;

    let began = Instant::now();
    replicas.lock().unwrap().push(start("replica-e"));
    before = settle(&replicas, &say, "replica-e joins", &before, began).await;

    let leaver = take(&replicas, "replica-b");
    let began = Instant::now();
    leaver.shutdown.cancel();
    leaver.task.await??;
    settle(
        &replicas,
        &say,
        "replica-b leaves gracefully",
        &before,
        began,
    )
    .await;

    let rest: Vec<Replica> = std::mem::take(&mut *replicas.lock().unwrap());
    for r in rest {
        r.shutdown.cancel();
        r.task.await??;
    }
    stop_monitor.cancel();
    let seen = seen.lock().unwrap();
    say(format!(
        "samples with a shard of two owners: {}; longest a shard was unowned: {:?} \
         (bound for any shard: 2·I + {SLACK:?} = {UNOWNED_BOUND:?})",
        seen.two_owners, seen.longest_unowned
    ));
    Ok(seen.two_owners == 0 && seen.longest_unowned <= UNOWNED_BOUND && kill_ok)
}

/// How long after `since` every one of `shards` had an owner among `replicas` (sampled every
/// millisecond); `None` if not within ten intervals.
async fn owned_again(
    replicas: &Mutex<Vec<Replica>>,
    shards: &[ShardId],
    since: Instant,
) -> Option<Duration> {
    while since.elapsed() < 10 * INTERVAL {
        let owned = {
            let replicas = replicas.lock().unwrap();
            shards
                .iter()
                .all(|&s| replicas.iter().any(|r| r.shards.is_owner(s)))
        };
        if owned {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
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
/// what, how many shards changed owner since `before`, and how long after `began` (the
/// step's start) the group was balanced.
async fn settle(
    replicas: &Mutex<Vec<Replica>>,
    say: &impl Fn(String),
    step: &str,
    before: &BTreeMap<u32, String>,
    began: Instant,
) -> BTreeMap<u32, String> {
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

/// Samples every watched replica's `is_owner` for every shard every millisecond.
fn monitor(watched: Arc<Mutex<Vec<Shards>>>) -> (Arc<Mutex<Seen>>, CancellationToken) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = CancellationToken::new();
    tokio::spawn({
        let (seen, stop) = (seen.clone(), stop.clone());
        async move {
            let mut unowned_since: Vec<Option<Instant>> = vec![None; COUNT as usize];
            let mut all_owned_once = false;
            while !stop.is_cancelled() {
                let handles: Vec<Shards> = watched.lock().unwrap().clone();
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
