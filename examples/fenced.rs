//! Fenced writes: a leader that stalls mid-tick and wakes up after another replica took over
//! cannot write any more. Every step is printed, and the table of writes at the end shows
//! that each write carries the epoch of the term that made it, and none of the deposed
//! leader's landed after the new leader started.
//!
//!     cargo run --example fenced
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries.

use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey, Term};
use pg_elector_harness::PgServer;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() {
    if let Err(e) = demo().await {
        eprintln!("fenced example failed: {e}");
        std::process::exit(1);
    }
}

/// One fenced write: in its own transaction, the fence first, then the row, then the commit.
async fn write(
    pool: &deadpool_postgres::Pool,
    term: &Term,
    replica: &str,
    what: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    term.fence(&tx).await?;
    tx.execute(
        "INSERT INTO ledger (replica, epoch, what) VALUES ($1, $2, $3)",
        &[&replica, &term.epoch().map(|e| e as i64), &what],
    )
    .await?;
    tx.commit().await?;
    Ok(())
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
    let db = server.create_database().await?;
    let admin = db.connect().await?;
    admin
        .batch_execute(
            "CREATE TABLE ledger (replica text, epoch bigint, what text, \
             at timestamptz DEFAULT clock_timestamp())",
        )
        .await?;
    let pool = db.pool(4);
    let key = LockKey::from_name("example/fenced-ledger");
    let start = |name: &str| -> Result<(Elector, CancellationToken), pg_elector::Error> {
        let elector = Elector::builder(db.pool(2), key)
            .check_interval(INTERVAL)
            .identity(name)
            .fencing(true)
            .build()?;
        let shutdown = CancellationToken::new();
        elector.spawn(shutdown.clone());
        Ok((elector, shutdown))
    };

    let (alpha, alpha_stop) = start("alpha")?;
    let alpha_term = alpha.wait_for_leadership().await;
    say(format!(
        "alpha leads, epoch {}",
        alpha_term.epoch().unwrap_or_default()
    ));
    let (beta, beta_stop) = start("beta")?;
    write(&pool, &alpha_term, "alpha", "invoice 1 sent").await?;
    say("alpha wrote 'invoice 1 sent'".into());

    say("alpha stalls mid-tick (a long pause), and its database session is cut".into());
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'alpha'",
            &[],
        )
        .await?;
    let beta_term = tokio::time::timeout(3 * INTERVAL, beta.wait_for_leadership()).await?;
    say(format!(
        "beta took over, epoch {}",
        beta_term.epoch().unwrap_or_default()
    ));
    write(&pool, &beta_term, "beta", "invoice 2 sent").await?;
    say("beta wrote 'invoice 2 sent'".into());

    say("alpha wakes up and finishes its tick with the term it started with:".into());
    match write(&pool, &alpha_term, "alpha", "invoice 2 sent (again)").await {
        Ok(()) => say("  the write went through: this should not happen".into()),
        Err(e) => say(format!("  refused: {e}")),
    }

    println!();
    println!(
        "{:<8} {:>5}  {:<24} server time",
        "replica", "epoch", "write"
    );
    for row in admin
        .query(
            "SELECT replica, epoch, what, to_char(at, 'HH24:MI:SS.MS') FROM ledger ORDER BY at",
            &[],
        )
        .await?
    {
        let (replica, epoch, what, at): (String, i64, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("{replica:<8} {epoch:>5}  {what:<24} {at}");
    }
    if let Some(leader) = beta.current_leader().await? {
        println!(
            "\ncurrent leader: {} (pid {}, epoch {})",
            leader.identity,
            leader.pid,
            leader.epoch.unwrap_or_default()
        );
    }
    alpha_stop.cancel();
    beta_stop.cancel();
    drop(alpha);
    drop(beta);
    Ok(())
}
