//! Fenced writes: a leader cut off from the database keeps believing it leads until its next
//! check fails, and meanwhile another replica takes over. Its writes go through the
//! application's pool, which still works, so only the fence stops them. Every step is printed,
//! and the table of writes at the end shows that each write carries the epoch of the term that
//! made it, and none of the deposed leader's landed after the new leader started.
//!
//!     cargo run --example fenced
//!
//! With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's binaries. It
//! exits with status 1 if the deposed leader's write commits.

mod common;

use std::time::Duration;

use pg_elector::{Elector, LockKey, Term};
use pg_elector_testkit::{FaultProxy, PgServer};
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);

/// An elector's `run`, spawned.
type Running = tokio::task::JoinHandle<Result<(), pg_elector::Error>>;

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
    common::init_tracing();
    let say = common::say_since_now();

    let server = PgServer::shared()?;
    let db = server.create_database().await?;
    let admin = db.connect().await?;
    admin
        .batch_execute(
            "CREATE TABLE ledger (replica text, epoch bigint, what text, \
             at timestamptz DEFAULT clock_timestamp())",
        )
        .await?;
    // The application's pool, for the writes of both replicas.
    let pool = db.pool(4);
    // alpha reaches the database through a link that the example can cut.
    let link = FaultProxy::start(server.addr()).await?;
    let key = LockKey::from_name("example/fenced-ledger");
    let start = |name: &str,
                 elections: deadpool_postgres::Pool|
     -> Result<(Elector, CancellationToken, Running), pg_elector::Error> {
        let elector = Elector::builder(elections, key)
            .check_interval(INTERVAL)
            .identity(name)
            .fencing(true)
            .build()?;
        let shutdown = CancellationToken::new();
        let running = elector.spawn(shutdown.clone());
        Ok((elector, shutdown, running))
    };

    let (alpha, alpha_stop, alpha_run) = start("alpha", db.pool_via(link.addr(), 2))?;
    let alpha_term = alpha.wait_for_leadership().await;
    say(format!(
        "alpha leads, epoch {}",
        alpha_term.epoch().unwrap_or_default()
    ));
    let (beta, beta_stop, beta_run) = start("beta", db.pool(2))?;
    write(&pool, &alpha_term, "alpha", "invoice 1 sent").await?;
    say("alpha wrote 'invoice 1 sent'".into());

    say("alpha's link to the database goes silent, and the server ends its session".into());
    link.blackhole();
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

    // alpha finds out when its next check gets no answer: one to two intervals after the cut.
    // beta tried within one, so alpha almost always still leads here, as far as it can tell.
    say(format!(
        "alpha finishes its tick with the term it started with (alpha.is_leader() = {}):",
        alpha.is_leader()
    ));
    let stale = write(&pool, &alpha_term, "alpha", "invoice 2 sent (again)").await;
    match &stale {
        Ok(()) => say("  the write went through: the fence did not stop it".into()),
        Err(e) if e.is::<pg_elector::Fenced>() => say(format!("  refused: {e}")),
        Err(e) => return Err(format!("alpha's write failed, but not by the fence: {e}").into()),
    }

    link.pass();
    let mut alpha_leads = alpha.subscribe();
    tokio::time::timeout(2 * INTERVAL, alpha_leads.wait_for(|now| !now.is_leader)).await??;
    say("alpha's link comes back: it finds its session ended and stops leading".into());
    if let Some(leader) = beta.current_leader().await? {
        say(format!(
            "the server says who leads: {} (pid {}, epoch {})",
            leader.identity,
            leader.pid,
            leader.epoch.unwrap_or_default()
        ));
    }
    alpha_stop.cancel();
    beta_stop.cancel();
    alpha_run.await??;
    beta_run.await??;

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
    let late: i64 = admin
        .query_one(
            "SELECT count(*) FROM ledger WHERE replica = 'alpha' AND at > \
             (SELECT min(at) FROM ledger WHERE replica = 'beta')",
            &[],
        )
        .await?
        .get(0);
    if stale.is_ok() || late > 0 {
        return Err("the deposed leader's write committed after the new leader's".into());
    }
    Ok(())
}
