//! A service with a background plane: two leader tickers, a while-leader loop and the
//! election, all supervised, with `/metrics` and `/readyz`.
//!
//!     cargo run --example service
//!
//! Run two or more instances against one database and only one of them runs the loops. With
//! `DATABASE_URL` unset, the first instance starts a private PostgreSQL from the machine's
//! binaries and a fresh database, and prints `DATABASE_URL=<url>`: start the others with that
//! URL. (The private server lives as long as that first instance.)
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DATABASE_URL` | a private server | the database the instances share |
//! | `LISTEN` | `127.0.0.1:8080` | the HTTP address (`127.0.0.1:0`: any free port) |
//! | `CHECK_INTERVAL_MS` | `1000` | the elector's check interval |
//! | `IDENTITY` | `<hostname>-<pid>` | this instance's name, as the server shows its lock session |
//! | `DRAIN_TIMEOUT_MS` | the check interval | how long a handover waits for ticks still running |
//! | `TICK_MS` | `500` | the tickers' period |
//! | `READYZ_LOOPS` | `1` | `0`: the loops' health is on `/loops` only, not in `/readyz` |
//!
//! Routes:
//!
//! - `GET /metrics`: the registry in Prometheus text format (`pg_elector_leader` is 1 on the
//!   leader, `service_ticks_total{loop,outcome}` counts ticks);
//! - `GET /readyz`: 200 `ok`, or 503 naming what fails;
//! - `GET /loops`: the loops' own health, 200 or 503 naming the failing loops;
//! - `GET /leader`: who leads, as the server sees it: `<identity> pid=<backend pid>
//!   addr=<client address>`, or `nobody`;
//! - `POST /resign?cooldown_ms=N`: hands leadership over gracefully (the ticks running now
//!   finish first) and keeps this instance from leading for N ms (default 30 000). For rolling
//!   deploys: call it on an instance before it is stopped (a Kubernetes `preStop` hook), so
//!   the work moves once, to an instance that stays, rather than to each instance restarted
//!   in turn; answers `resigned` or `not leading`;
//! - `POST /fail-ticks?count=N`: the next N leader ticks of `sweep` fail (default 1), which
//!   turns this instance's `/loops` (and, by default, `/readyz`) to 503 while it leads, until a
//!   later tick succeeds.
//!
//! **A failing loop in `/readyz`, or not.** By default `/readyz` fails the leader while one of
//! its loops fails, as the reference systems do on purpose: an operator sees the failure where
//! they look first. Under Kubernetes that takes the leader out of its Service's endpoints
//! (no more traffic), but it keeps the lock and stays the leader, so the failing job does not
//! move to another replica; it only moves if the pod is restarted (a liveness probe, or a
//! human). With `READYZ_LOOPS=0` the loops' health is on `/loops` alone: point an alert (or a
//! dashboard) at it, and `/readyz` then fails only when a worker stopped for good.
//!
//! The instance prints `listening on http://<addr>` once it serves, and stops gracefully on
//! SIGINT or SIGTERM (the leader unlocks, so another instance takes over within one interval).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use pg_elector::background::{LeaderTicker, Readiness, Supervisor, WhileLeader};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::server::config::pool_from_config;
use pg_elector_testkit::{PgServer, TestDb};
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

const KEY: LockKey = LockKey::new(0x7376_6365, 1); // "svce"

#[derive(Clone)]
struct App {
    elector: Elector,
    registry: Registry,
    readiness: Readiness,
    loops: Readiness,
    fail_ticks: Arc<AtomicU32>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = serve().await {
        eprintln!("service failed: {e}");
        std::process::exit(1);
    }
}

fn env_ms(name: &str, default: u64) -> Result<Duration, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{name}={v:?}: {e}")),
        Err(_) => Ok(Duration::from_millis(default)),
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let interval = env_ms("CHECK_INTERVAL_MS", 1000)?;
    let period = env_ms("TICK_MS", 500)?;
    let drain = env_ms("DRAIN_TIMEOUT_MS", interval.as_millis().try_into()?)?;
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into());

    // The database: DATABASE_URL, or a fresh one on a private server (kept until exit).
    let (url, _db): (String, Option<TestDb>) = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => (url.trim().to_owned(), None),
        _ => {
            let db = PgServer::shared()?.create_database().await?;
            (db.url(), Some(db))
        }
    };
    println!("DATABASE_URL={url}");
    let pool = pool_from_config(url.parse()?, 4);

    let registry = Registry::new();
    let mut builder = Elector::builder(pool, KEY)
        .check_interval(interval)
        .drain_timeout(drain)
        .registry(&registry);
    if let Ok(identity) = std::env::var("IDENTITY") {
        builder = builder.identity(identity);
    }
    let elector = builder.build()?;
    let ticks = IntCounterVec::new(
        Opts::new("service_ticks_total", "Leader ticks by loop and outcome."),
        &["loop", "outcome"],
    )?;
    registry.register(Box::new(ticks.clone()))?;

    // Two probe sets: `loops` holds every loop's last outcome, `readiness` what /readyz
    // reports. See the module docs for the choice between them.
    let loops = Readiness::new();
    let readiness = Readiness::new();
    let loops_in_readyz = std::env::var("READYZ_LOOPS").map_or(true, |v| v != "0");
    let fail_ticks = Arc::new(AtomicU32::new(0));

    // Two leader tickers (`sweep` fails on demand) and a self-paced loop: a batch every 100 ms
    // while this term lasts.
    let probe = |name: &str| {
        let probe = loops.probe(name);
        if loops_in_readyz {
            readiness.add(&probe);
        }
        probe
    };
    let sweep = LeaderTicker::new("sweep", &elector, period).probe(&probe("sweep"));
    let expire = LeaderTicker::new("expire", &elector, period).probe(&probe("expire"));
    let outbox = WhileLeader::new("outbox", &elector).probe(&probe("outbox"));

    let supervisor = Supervisor::new()
        .election(&elector)
        .ticker(sweep, {
            let (ticks, fail_ticks) = (ticks.clone(), fail_ticks.clone());
            move |_term| {
                let fail = fail_ticks
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                ticks
                    .with_label_values(&["sweep", if fail { "failed" } else { "ok" }])
                    .inc();
                async move {
                    match fail {
                        true => Err("failure requested through /fail-ticks"),
                        false => Ok(()),
                    }
                }
            }
        })
        .ticker(expire, {
            let ticks = ticks.clone();
            move |_term| {
                ticks.with_label_values(&["expire", "ok"]).inc();
                async { Ok::<_, std::io::Error>(()) }
            }
        })
        .while_leader(outbox, {
            let ticks = ticks.clone();
            move |term| {
                let ticks = ticks.clone();
                async move {
                    while term.is_leader() {
                        ticks.with_label_values(&["outbox", "ok"]).inc();
                        tokio::select! {
                            _ = term.cancelled() => {}
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                    Ok::<_, std::io::Error>(())
                }
            }
        });
    // A worker that stopped for good (past its restart budget) fails both.
    readiness.add(&supervisor.probe());
    loops.add(&supervisor.probe());

    let app = App {
        elector: elector.clone(),
        registry,
        readiness,
        loops,
        fail_ticks,
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .route("/loops", get(loop_health))
        .route("/fail-ticks", post(fail))
        .route("/leader", get(leader))
        .route("/resign", post(resign))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);

    // Cancelled at SIGTERM or SIGINT; a failed HTTP server cancels it too.
    let shutdown = pg_elector::background::shutdown_on_signal();
    let http =
        axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let (http, ()) = tokio::join!(
        async {
            let served = http.await;
            shutdown.cancel(); // a failed server stops the rest too
            served
        },
        supervisor.run(shutdown.clone()),
    );
    http?;
    Ok(())
}

async fn metrics(State(app): State<App>) -> (StatusCode, String) {
    let mut text = Vec::new();
    match TextEncoder::new().encode(&app.registry.gather(), &mut text) {
        Ok(()) => (StatusCode::OK, String::from_utf8_lossy(&text).into_owned()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn readyz(State(app): State<App>) -> (StatusCode, String) {
    report(&app.readiness)
}

async fn loop_health(State(app): State<App>) -> (StatusCode, String) {
    report(&app.loops)
}

fn report(probes: &Readiness) -> (StatusCode, String) {
    let report = probes.check();
    let status =
        StatusCode::from_u16(report.status_code()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (status, report.body())
}

async fn fail(
    State(app): State<App>,
    Query(params): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    let count = match params.get("count").map(|c| c.parse::<u32>()) {
        None => 1,
        Some(Ok(n)) => n,
        Some(Err(e)) => return (StatusCode::BAD_REQUEST, format!("count: {e}\n")),
    };
    app.fail_ticks.store(count, Ordering::SeqCst);
    (
        StatusCode::OK,
        format!("the next {count} sweep ticks on the leader fail\n"),
    )
}

async fn leader(State(app): State<App>) -> (StatusCode, String) {
    match app.elector.current_leader().await {
        Ok(Some(leader)) => (
            StatusCode::OK,
            format!(
                "{} pid={} addr={}\n",
                leader.identity,
                leader.pid,
                leader
                    .client_addr
                    .map_or("unix-socket".to_owned(), |addr| addr.to_string())
            ),
        ),
        Ok(None) => (StatusCode::OK, "nobody\n".to_owned()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

async fn resign(
    State(app): State<App>,
    Query(params): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    let cooldown = match params.get("cooldown_ms").map(|c| c.parse::<u64>()) {
        None => Duration::from_secs(30),
        Some(Ok(ms)) => Duration::from_millis(ms),
        Some(Err(e)) => return (StatusCode::BAD_REQUEST, format!("cooldown_ms: {e}\n")),
    };
    tracing::info!(?cooldown, "resigning");
    match app.elector.resign(cooldown).await {
        true => (StatusCode::OK, "resigned\n".to_owned()),
        false => (StatusCode::OK, "not leading\n".to_owned()),
    }
}
