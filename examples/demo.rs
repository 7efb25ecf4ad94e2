//! Three replicas elect a leader; the leader's session is killed; later the new leader hands
//! over by graceful shutdown. Every step is printed with measured milliseconds.
//!
//!     cargo run --example demo
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries.

use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey, TermEnd};
use pg_elector_harness::PgServer;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "pg_elector=warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let started = Instant::now();
    let say = |text: String| println!("[{:>6} ms] {text}", started.elapsed().as_millis());

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
    let pid = leader_pid(&admin).await?;
    say(format!(
        "{} leads (backend pid {pid} holds the lock in pg_locks); the others stand by",
        replicas[first].name
    ));
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

    // 2. Graceful handover.
    let leaving = replicas.remove(second);
    say(format!(
        "{} shuts down gracefully: ends its term, unlocks, closes its session",
        leaving.name
    ));
    let handover = Instant::now();
    leaving.shutdown.cancel();
    leaving.task.await??;
    say(format!(
        "{} released the lock in {} ms",
        leaving.name,
        handover.elapsed().as_millis()
    ));
    let third = wait_for_leader(&replicas, 4 * INTERVAL)
        .await
        .ok_or("no handover")?;
    say(format!(
        "{} took over {} ms after the release",
        replicas[third].name,
        handover.elapsed().as_millis()
    ));
    say(format!("leaders now: {}", leading(&replicas)));

    for replica in replicas {
        replica.shutdown.cancel();
        replica.task.await??;
    }
    say("all replicas shut down; no lock is held".to_owned());
    if leader_pid(&admin).await.is_ok() {
        return Err("the lock is still held after shutdown".into());
    }
    Ok(())
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

async fn leader_pid(admin: &tokio_postgres::Client) -> Result<i32, Box<dyn std::error::Error>> {
    let row = admin
        .query_opt(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = $1 AND objid = $2 AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&(KEY.class() as u32), &(KEY.object() as u32)],
        )
        .await?
        .ok_or("no backend holds the lock")?;
    Ok(row.get(0))
}
