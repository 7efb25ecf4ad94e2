//! The child side: one replica process, built from its settings in the environment.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pg_elector::{Elector, LockKey};
use tokio_util::sync::CancellationToken;

use super::{
    ENV_ADDR, ENV_FAST, ENV_FENCED, ENV_INTERVAL_MS, ENV_JOB_MS, ENV_KEY, ENV_NAME, ENV_PREFERENCE,
    ENV_URL, MARK, WOKE_GAP_US, log_to_stderr, unix_us,
};
use crate::database::{config_with_addr, pool_from_config};

/// Runs one replica with its settings in the environment (see [`Fleet::spawn`](super::Fleet::spawn)), on a
/// current-thread runtime, until its shutdown or the end of its stdin.
pub fn child() {
    on_current_thread(child_main());
}

/// Runs `future` to its end on a current-thread runtime, what a replica process runs on.
pub fn on_current_thread<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// The environment variable `name` of a replica's settings; panics when it is not set.
pub fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"))
}

/// The setting `name` as a lock key, `class,object`; panics when it is not one.
pub fn key_setting(name: &str) -> LockKey {
    let (class, object) = setting(name)
        .split_once(',')
        .map(|(c, o)| (c.parse().expect("int4"), o.parse().expect("int4")))
        .expect("class,object");
    LockKey::new(class, object)
}

/// The setting `name` as a number of milliseconds; panics when it is not one.
pub fn ms_setting(name: &str) -> Duration {
    Duration::from_millis(setting(name).parse().expect("milliseconds"))
}

fn say(at: u64, what: &str) {
    println!("{MARK}{at} {what}");
}

/// What a replica process builds from its settings.
struct ChildSettings {
    interval: Duration,
    fenced: bool,
    name: String,
    /// The pool for the replica's work (the elector has one of its own), with an
    /// `idle_in_transaction_session_timeout` of 1 s.
    app: deadpool_postgres::Pool,
    elector: Elector,
    /// Cancelled by `stop` on stdin.
    shutdown: CancellationToken,
}

/// Builds the replica from its settings, says `started`, and ends the process when stdin
/// closes (the parent is gone).
fn child_setup() -> ChildSettings {
    log_to_stderr("pg_elector=info");
    let interval = ms_setting(ENV_INTERVAL_MS);
    let key = key_setting(ENV_KEY);
    let mut config: tokio_postgres::Config = setting(ENV_URL).parse().expect("a connection URL");
    if let Ok(addr) = std::env::var(ENV_ADDR) {
        config = config_with_addr(&config, addr.parse().expect("a socket address"));
    }
    let fenced = std::env::var(ENV_FENCED).is_ok();
    // As the kit's in-process replicas: a transaction left open by a frozen leader ends on its
    // own, so that the next term can take the epoch row.
    let mut app_config = config.clone();
    app_config.options(format!(
        "{} -c idle_in_transaction_session_timeout={}",
        config.get_options().unwrap_or_default(),
        crate::members::TEST_IDLE_IN_TRANSACTION.as_millis()
    ));
    let app = pool_from_config(app_config, 2);
    let name = setting(ENV_NAME);
    let mut builder = Elector::builder(pool_from_config(config, 2), key)
        .check_interval(interval)
        .identity(name.as_str())
        .fencing(fenced)
        .fast_takeover(std::env::var(ENV_FAST).is_ok());
    if let Ok(preference) = std::env::var(ENV_PREFERENCE) {
        builder = builder.preference(preference.parse().expect("a preference (u64)"));
    }
    let elector = builder.build().expect("a valid elector");
    tracing::info!(name = %name, pid = std::process::id(), "replica starts");
    say(unix_us(), "started");

    // stdin: `stop` asks for a graceful shutdown; end of file means the parent is gone.
    let shutdown = CancellationToken::new();
    std::thread::spawn({
        let shutdown = shutdown.clone();
        move || {
            for line in std::io::stdin().lines() {
                match line {
                    Ok(line) if line.trim() == "stop" => shutdown.cancel(),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            std::process::exit(0);
        }
    });
    ChildSettings {
        interval,
        fenced,
        name,
        app,
        elector,
        shutdown,
    }
}

/// The watcher: every transition of `is_leader()`, read every millisecond, said on stdout;
/// whether it last said `leader`.
fn watch_leadership(elector: &Elector) -> Arc<AtomicBool> {
    let reported = Arc::new(AtomicBool::new(false));
    std::thread::spawn({
        let (elector, reported) = (elector.clone(), reported.clone());
        move || {
            let mut last = unix_us();
            loop {
                let before = unix_us();
                let now = elector.is_leader();
                if before.saturating_sub(last) > WOKE_GAP_US {
                    say(before, if now { "woke leader" } else { "woke standby" });
                }
                last = before;
                if now != reported.load(Ordering::Relaxed) {
                    say(unix_us(), if now { "leader" } else { "standby" });
                    reported.store(now, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    reported
}

/// Lets the watcher report the demotion, then says `exited`.
async fn say_exited(reported: &AtomicBool) {
    while reported.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    say(unix_us(), "exited");
}

/// Runs a replica of *your* service in this process, with its settings in the environment
/// (see [`Fleet::spawn`](super::Fleet::spawn)), on a current-thread runtime: `service` gets
/// the replica's elector (its identity `replica-<n>`, fenced when the fleet was built with
/// [`fenced(true)`](super::FleetBuilder::fenced)), a pool for its work and a shutdown
/// cancelled by [`Fleet::stop`](super::Fleet::stop), and runs the election itself, as `main`
/// would (a `Supervisor` with `.election`, say). Every transition is said on stdout as for
/// [`child`], so the parent's [`Fleet`](super::Fleet) can freeze, thaw and kill the process and
/// see who led. [`Fleet::serve_child`](super::Fleet::serve_child) is this behind the
/// [`is_child`](super::is_child) check.
///
/// ```no_run
/// use pg_elector_testkit::replicas::processes;
///
/// /// Run again by the fleet as `replica_child --exact --ignored --nocapture`.
/// #[test]
/// #[ignore = "a replica process the tests of this file start"]
/// fn replica_child() {
///     if processes::is_child() {
///         processes::child_with(|r| async move {
///             let _ = r.elector.run(r.shutdown).await; // ... or your service
///         });
///     }
/// }
/// ```
pub fn child_with<F, Fut>(service: F)
where
    F: FnOnce(crate::replicas::Replica) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    on_current_thread(async move {
        let child = child_setup();
        let reported = watch_leadership(&child.elector);
        let index = child.name.rsplit('-').next().and_then(|n| n.parse().ok());
        service(crate::replicas::Replica {
            index: index.unwrap_or_default(),
            elector: child.elector.clone(),
            pool: child.app.clone(),
            shutdown: child.shutdown.clone(),
        })
        .await;
        say_exited(&reported).await;
    });
}

async fn child_main() {
    let ChildSettings {
        interval,
        fenced,
        name,
        app,
        elector,
        shutdown,
    } = child_setup();
    if let Ok(ms) = std::env::var(ENV_JOB_MS) {
        let period = Duration::from_millis(ms.parse().expect("milliseconds"));
        tokio::spawn(job_schedule(&elector, &app, &name, interval, period).run(shutdown.clone()));
    }
    let reported = watch_leadership(&elector);

    // The leader ticker: a tick every I/10, stamped when do_work is called.
    let ticker = async {
        let mut every = tokio::time::interval(interval / 10);
        loop {
            every.tick().await;
            let called = unix_us();
            let (app, name) = (&app, &name);
            let _ = elector
                .do_work(|term| async move {
                    say(called, "tick");
                    if fenced {
                        // Any failure (fenced, or the database unreachable) just skips the
                        // write: the parent reads what landed.
                        let _ = fenced_write(app, &term, name).await;
                    }
                    Ok::<_, Infallible>(())
                })
                .await;
        }
    };
    tokio::select! {
        result = elector.run(shutdown.clone()) => result.expect("run returns Ok"),
        () = ticker => unreachable!(),
    }
    say_exited(&reported).await;
}

/// The schedule of [`ENV_JOB_MS`]: one job, `tick`, every `period`, each run logged.
fn job_schedule(
    elector: &Elector,
    app: &deadpool_postgres::Pool,
    name: &str,
    interval: Duration,
    period: Duration,
) -> pg_elector::schedule::Schedule {
    let (app, name) = (app.clone(), name.to_owned());
    pg_elector::schedule::Schedule::new(elector, app.clone())
        .poll_interval(interval)
        .job(
            pg_elector::schedule::Job::every("tick", period)
                .catch_up(pg_elector::schedule::CatchUp::All),
            move |run| {
                let (app, name) = (app.clone(), name.clone());
                async move {
                    let client = app.get().await.map_err(|e| e.to_string())?;
                    client
                        .execute(
                            "INSERT INTO job_log (job, due, replica, kind) VALUES ($1, $2, $3, $4)",
                            &[&run.job, &run.due, &name, &format!("{:?}", run.kind)],
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(())
                }
            },
        )
}

/// One fenced row of this replica's term, stamped by the server.
async fn fenced_write(
    app: &deadpool_postgres::Pool,
    term: &pg_elector::Term,
    name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = app.get().await?;
    let tx = client.transaction().await?;
    term.fence(&tx).await?;
    let epoch = term.epoch().map(|e| e as i64);
    tx.execute(
        "INSERT INTO replica_writes (replica, epoch) VALUES ($1, $2)",
        &[&name, &epoch],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
