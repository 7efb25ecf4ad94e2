//! Three cron jobs on two replicas, with a failover in the middle: every due instant runs
//! exactly once, and the new leader continues the schedule where the old one stopped.
//!
//!     cargo run --example cron             # the jobs shortened to seconds: about 40 s
//!     cargo run --example cron -- --real   # the real expressions (runs until Ctrl-C)
//!
//! The jobs are a lending platform's (retention cleanup at 02:00, position snapshots at
//! midnight, an indexer health check every 5 minutes). Shortened, they run every 15, 10 and
//! 5 seconds. With `DATABASE_URL` unset it starts a private PostgreSQL from the machine's
//! binaries.

mod common;

use std::time::Duration;

use pg_elector::schedule::{Job, JobRun, Schedule};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::PgServer;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() {
    if let Err(e) = demo().await {
        eprintln!("cron example failed: {e}");
        std::process::exit(1);
    }
}

fn jobs(real: bool) -> Result<Vec<Job>, pg_elector::schedule::ScheduleError> {
    let (cleanup, snapshot, health) = if real {
        ("0 2 * * *", "0 0 * * *", "*/5 * * * *")
    } else {
        ("*/15 * * * * *", "*/10 * * * * *", "*/5 * * * * *")
    };
    Ok(vec![
        Job::cron("retention-cleanup", cleanup)?,
        Job::cron("position-snapshot", snapshot)?,
        Job::cron("indexer-health", health)?,
    ])
}

/// One replica: an elector whose gauge is `scheduler_is_leader`, and the schedule.
struct Replica {
    name: &'static str,
    elector: Elector,
    registry: Registry,
    shutdown: CancellationToken,
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing();
    let real = std::env::args().any(|a| a == "--real");
    let say = common::say_since_now();

    let server = PgServer::shared()?;
    let db = server.create_database().await?;
    let admin = db.connect().await?;
    admin
        .batch_execute("CREATE TABLE job_log (job text, due timestamptz, replica text)")
        .await?;
    let key = LockKey::from_name("lending/cron");
    let start = |name: &'static str| -> Result<Replica, Box<dyn std::error::Error>> {
        let registry = Registry::new();
        let elector = Elector::builder(db.pool(2), key)
            .check_interval(INTERVAL)
            .identity(name)
            .fencing(true)
            .registry(&registry)
            .gauge_name("scheduler_is_leader")
            .build()?;
        let shutdown = CancellationToken::new();
        elector.spawn(shutdown.clone());
        let mut schedule = Schedule::new(&elector, db.pool(2)).poll_interval(INTERVAL);
        for job in jobs(real)? {
            let pool = db.pool(1);
            schedule = schedule.job(job, move |run: JobRun| {
                let pool = pool.clone();
                async move {
                    // What the job does: here, it writes down who ran which due instant.
                    let client = pool.get().await.map_err(|e| e.to_string())?;
                    client
                        .execute(
                            "INSERT INTO job_log VALUES ($1, $2, $3)",
                            &[&run.job, &run.due, &name],
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(())
                }
            });
        }
        tokio::spawn(schedule.run(shutdown.clone()));
        Ok(Replica {
            name,
            elector,
            registry,
            shutdown,
        })
    };

    let alpha = start("alpha")?;
    let first = alpha.elector.wait_for_leadership().await;
    say(format!(
        "alpha leads (epoch {}) and runs the schedule",
        first.epoch().unwrap_or_default()
    ));
    let beta = start("beta")?;
    say("beta stands by".into());
    if real {
        say("running the real schedule until Ctrl-C".into());
        tokio::signal::ctrl_c().await?;
        alpha.shutdown.cancel();
        beta.shutdown.cancel();
        return Ok(());
    }

    // A job's dues from before its registration are its past, not caught up on: the window
    // opens once the three jobs are registered (the leader may take a moment to make the
    // tables and register them on a busy machine).
    registered(&admin, 3).await?;
    let window_from = server_now(&admin, Duration::ZERO).await?;
    tokio::time::sleep(Duration::from_secs(17)).await;
    say("alpha shuts down (a deploy): it finishes its runs, gives the lock up".into());
    alpha.shutdown.cancel();
    let second = tokio::time::timeout(3 * INTERVAL, beta.elector.wait_for_leadership()).await?;
    say(format!(
        "beta took over (epoch {}) and continues the schedule",
        second.epoch().unwrap_or_default()
    ));
    tokio::time::sleep(Duration::from_secs(18)).await;
    // Only dues that had time to run: the window closes one interval ago.
    let window_to = server_now(&admin, INTERVAL).await?;

    let gauges: Vec<String> = [&alpha, &beta]
        .iter()
        .map(|r| {
            let value = r
                .registry
                .gather()
                .iter()
                .find(|f| f.name() == "scheduler_is_leader")
                .map_or(0.0, |f| f.get_metric()[0].get_gauge().value());
            format!("{}={value}", r.name)
        })
        .collect();
    say(format!("scheduler_is_leader: {}", gauges.join(", ")));
    beta.shutdown.cancel();

    // Every due instant of the window, and who ran it how often.
    println!();
    println!("{:<18} {:<12} ran on", "job", "due (UTC)");
    let rows = admin
        .query(
            "WITH dues AS (\
               SELECT 'retention-cleanup' AS job, d FROM generate_series(\
                 date_trunc('second', $1::timestamptz), $2, '1 second') d \
                 WHERE extract(second FROM d)::int % 15 = 0 \
               UNION ALL SELECT 'position-snapshot', d FROM generate_series(\
                 date_trunc('second', $1::timestamptz), $2, '1 second') d \
                 WHERE extract(second FROM d)::int % 10 = 0 \
               UNION ALL SELECT 'indexer-health', d FROM generate_series(\
                 date_trunc('second', $1::timestamptz), $2, '1 second') d \
                 WHERE extract(second FROM d)::int % 5 = 0) \
             SELECT dues.job, to_char(dues.d AT TIME ZONE 'UTC', 'HH24:MI:SS'), \
                    coalesce(string_agg(l.replica, ', '), '(not run)'), count(l.replica) \
             FROM dues LEFT JOIN job_log l ON l.job = dues.job AND l.due = dues.d \
             WHERE dues.d > $1 \
             GROUP BY dues.job, dues.d ORDER BY dues.d, dues.job",
            &[&window_from, &window_to],
        )
        .await?;
    let mut exactly_once = true;
    for row in &rows {
        let (job, due, who, n): (String, String, String, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        exactly_once &= n == 1;
        println!("{job:<18} {due:<12} {who}");
    }
    println!(
        "\n{} due instants in the window; every one ran exactly once: {}",
        rows.len(),
        if exactly_once { "yes" } else { "NO" }
    );
    if !exactly_once {
        return Err("a due instant did not run exactly once".into());
    }
    Ok(())
}

/// The server's clock, `ago` in the past.
async fn server_now(
    client: &tokio_postgres::Client,
    ago: Duration,
) -> Result<std::time::SystemTime, tokio_postgres::Error> {
    let ago_ms = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
    Ok(client
        .query_one(
            "SELECT clock_timestamp() - $1::int8 * interval '1 millisecond'",
            &[&ago_ms],
        )
        .await?
        .get(0))
}

/// Waits (at most 10 s) until `jobs` jobs are registered in the schedule's table.
async fn registered(
    client: &tokio_postgres::Client,
    jobs: i64,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        // Until the leader made it, the table is missing: that reads as none registered.
        let count = client
            .query_one("SELECT count(*) FROM pg_elector_jobs", &[])
            .await
            .map_or(0, |row| row.get::<_, i64>(0));
        if count >= jobs {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("only {count} of {jobs} jobs registered after 10 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
