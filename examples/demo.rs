//! Three replicas elect a leader; the leader's session is killed; the new leader hands over
//! by graceful shutdown while a tick is still running (the tick finishes first); the next one
//! resigns, as before a rolling deploy. Every step is printed with measured milliseconds, and
//! who leads as the server sees it (`current_leader`: the replica's identity and backend).
//!
//!     cargo run --example demo
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries.

mod common;

use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey, TermEnd, current_leader};
use pg_elector_testkit::PgServer;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);
/// How long a graceful handover waits for work still running (the default is one interval).
const DRAIN: Duration = Duration::from_secs(2);
/// How long a tick runs.
const TICK: Duration = Duration::from_millis(300);
const KEY: LockKey = LockKey::new(0x6465_6d6f, 1); // "demo"
const NAMES: [&str; 3] = ["replica-a", "replica-b", "replica-c"];

struct Replica {
    name: &'static str,
    elector: Elector,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), pg_elector::Error>>,
}

#[tokio::main]
async fn main() {
    if let Err(e) = demo().await {
        eprintln!("demo failed: {e}");
        std::process::exit(1);
    }
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing();
    let say = common::say_since_now();

    let server = PgServer::shared()?;
    say(format!(
        "PostgreSQL at {} ({})",
        server.addr(),
        if server.is_private() {
            "a private server started for this demo"
        } else {
            "DATABASE_URL"
        }
    ));
    let db = server.create_database().await?;
    let admin = db.connect().await?;
    say(format!(
        "three replicas compete for advisory lock {KEY} in database {}, checking every {INTERVAL:?}",
        db.name()
    ));

    let mut replicas: Vec<Replica> = NAMES
        .iter()
        .map(|&name| {
            let elector = Elector::builder(db.pool(2), KEY)
                .check_interval(INTERVAL)
                .identity(name)
                .drain_timeout(DRAIN)
                .build()
                .expect("a valid configuration");
            let shutdown = CancellationToken::new();
            let task = tokio::spawn({
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move { elector.run(shutdown).await }
            });
            Replica {
                name,
                elector,
                shutdown,
                task,
            }
        })
        .collect();

    let first = wait_for_leader(&replicas, 4 * INTERVAL)
        .await
        .ok_or("no leader")?;
    say(format!(
        "{} leads; the others stand by",
        replicas[first].name
    ));
    let pid = say_who_leads(&admin, &say)
        .await?
        .ok_or("nobody holds the lock")?;
    tokio::time::sleep(2 * INTERVAL).await;
    say(format!("leaders now: {}", leading(&replicas)));

    // 1. The server ends the leader's session.
    let term = replicas[first].elector.term();
    say(format!(
        "pg_terminate_backend({pid}): the server ends {}'s lock session",
        replicas[first].name
    ));
    let cut = Instant::now();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await?;
    term.cancelled().await;
    say(format!(
        "{} demoted itself after {} ms ({:?}); its term's token is cancelled",
        replicas[first].name,
        cut.elapsed().as_millis(),
        term.end().unwrap_or(TermEnd::LeadershipLost)
    ));
    let second = wait_for_leader(&replicas, 4 * INTERVAL)
        .await
        .ok_or("no takeover")?;
    say(format!(
        "{} took over {} ms after the kill (a standby tries every {} ms)",
        replicas[second].name,
        cut.elapsed().as_millis(),
        INTERVAL.as_millis()
    ));

    // 2. Graceful handover, with a tick still running.
    let leaving = replicas.remove(second);
    let started = tokio::sync::Notify::new();
    let tick = leaving.elector.do_work(|_term| async {
        started.notify_one();
        tokio::time::sleep(TICK).await;
        Ok::<_, std::io::Error>(())
    });
    let stop = async {
        started.notified().await;
        say(format!(
            "{} shuts down gracefully while a {} ms tick runs: its term ends, the tick \
             finishes, then it unlocks",
            leaving.name,
            TICK.as_millis()
        ));
        let handover = Instant::now();
        leaving.shutdown.cancel();
        (handover, leaving.task.await)
    };
    let (ticked, (handover, ran)) = tokio::join!(tick, stop);
    ran??;
    say(format!(
        "{} released the lock in {} ms (the tick's outcome: {}, since its term ended while it ran)",
        leaving.name,
        handover.elapsed().as_millis(),
        match ticked? {
            Some(()) => "kept",
            None => "dropped",
        }
    ));
    let third = wait_for_leader(&replicas, 4 * INTERVAL)
        .await
        .ok_or("no handover")?;
    say(format!(
        "{} took over {} ms after the shutdown began",
        replicas[third].name,
        handover.elapsed().as_millis()
    ));
    say_who_leads(&admin, &say).await?;

    // 3. Resign, as before a rolling deploy: hand over, and stay out for a while.
    let cooldown = 4 * INTERVAL;
    let resigner = &replicas[third];
    say(format!(
        "{} resigns with a {} ms cooldown",
        resigner.name,
        cooldown.as_millis()
    ));
    let resigned = Instant::now();
    resigner.elector.resign(cooldown).await;
    say(format!(
        "{} gave the lock up in {} ms",
        resigner.name,
        resigned.elapsed().as_millis()
    ));
    let fourth = wait_for_leader(&replicas, 4 * INTERVAL)
        .await
        .ok_or("no takeover after the resign")?;
    say(format!(
        "{} took over {} ms after the resign",
        replicas[fourth].name,
        resigned.elapsed().as_millis()
    ));
    say(format!("leaders now: {}", leading(&replicas)));

    for replica in replicas {
        replica.shutdown.cancel();
        replica.task.await??;
    }
    say("all replicas shut down".to_owned());
    if say_who_leads(&admin, &say).await?.is_some() {
        return Err("the lock is still held after shutdown".into());
    }
    Ok(())
}

/// Prints who leads as the server sees it; returns the leader's backend pid.
async fn say_who_leads(
    admin: &tokio_postgres::Client,
    say: &impl Fn(String),
) -> Result<Option<i32>, pg_elector::Error> {
    let leader = current_leader(admin, KEY).await?;
    match &leader {
        Some(leader) => say(format!(
            "  the server says: {} leads (backend pid {}, from {})",
            leader.identity,
            leader.pid,
            leader
                .client_addr
                .map_or("a Unix socket".to_owned(), |addr| addr.to_string())
        )),
        None => say("  the server says: nobody leads".to_owned()),
    }
    Ok(leader.map(|leader| leader.pid))
}

async fn wait_for_leader(replicas: &[Replica], limit: Duration) -> Option<usize> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(i) = replicas.iter().position(|r| r.elector.is_leader()) {
            return Some(i);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

fn leading(replicas: &[Replica]) -> String {
    let names: Vec<_> = replicas
        .iter()
        .map(|r| {
            format!(
                "{}={}",
                r.name,
                if r.elector.is_leader() {
                    "LEADER"
                } else {
                    "standby"
                }
            )
        })
        .collect();
    names.join(", ")
}
