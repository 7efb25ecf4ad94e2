//! The whole bench: calibration, the runs of every plan, the sweep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_elector_tools::procfs::{clock_ticks_per_second, stat};
use pg_elector_tools::stats::{percentile, sorted};

use crate::monitor::{Monitor, start_probe};
use crate::options::Options;
use crate::report::{bucket, print_tables};
use crate::run::Run;
use crate::server::{Server, connect, connections_needed, server_ticks};
use crate::snapshot::{Outcome, Plan, Row};

pub(crate) async fn bench(options: Options) {
    let started = Instant::now();
    let plans = plans(&options);
    let need = plans
        .first()
        .map_or(300, |p| connections_needed(p, options.pool));
    let mut server = Server::start(options.statements, need, &options.settings).await;
    let ticks_per_s = clock_ticks_per_second();
    eprintln!(
        "fleet: PostgreSQL at {} (postmaster {}, max_connections {}, pg_stat_statements {}), I = {:?}, \
         {} s per run after a {} s warm-up, pool {} per process{}",
        server.pg.addr(),
        server.postmaster,
        server.max_connections,
        if server.statements { "on" } else { "off" },
        options.interval,
        options.duration.as_secs(),
        options.warmup.as_secs(),
        options.pool,
        if options.settings.is_empty() {
            String::new()
        } else {
            format!(", server settings {}", options.settings.join(", "))
        },
    );

    let idle = idle_cores(&server, &options, ticks_per_s).await;
    eprintln!("fleet: idle server: {idle:.4} cores");
    let floor = calibrate(&server, &options, ticks_per_s).await;
    eprintln!("fleet: a paced `SELECT 1` costs {floor:.1} µs of its backend's CPU");

    let mut results: Vec<(Plan, Outcome)> = Vec::new();
    for plan in plans {
        results.push((
            plan,
            run_plan(&mut server, &options, ticks_per_s, idle, plan).await,
        ));
    }

    let sweep_note = if options.sweep {
        sweep(&mut server, &options, ticks_per_s, idle, &mut results).await
    } else {
        Vec::new()
    };

    print_tables(&options, &server, idle, floor, &results);
    for note in sweep_note {
        println!("- sweep {note}");
    }
    println!();
    println!("Total run time {:.0} s.", started.elapsed().as_secs_f64());
}

/// Every (size, shape, mode) of the options, in that order.
fn plans(options: &Options) -> Vec<Plan> {
    let mut plans = Vec::new();
    for &electors in &options.sizes {
        for &shape in &options.shapes {
            for &mode in &options.modes {
                plans.push(Plan {
                    shape,
                    mode,
                    electors,
                    per_proc: options.per_proc,
                    bare: false,
                });
            }
            if options.bare_try {
                plans.push(Plan {
                    shape,
                    mode: pg_elector_tools::Mode::Poll,
                    electors,
                    per_proc: options.per_proc,
                    bare: true,
                });
            }
        }
    }
    plans
}

/// The sweep: doubles the largest fleet until the checks' p99 passes I/10 or a run fails; a
/// note per shape and mode where it stopped.
async fn sweep(
    server: &mut Server,
    options: &Options,
    ticks_per_s: f64,
    idle: f64,
    results: &mut Vec<(Plan, Outcome)>,
) -> Vec<String> {
    let mut sweep_note = Vec::new();
    let largest = options.sizes.iter().copied().max().unwrap_or(1000);
    for &shape in &options.shapes {
        for &mode in &options.modes {
            let mut electors = largest * 2;
            while electors <= options.sweep_max {
                let plan = Plan {
                    shape,
                    mode,
                    electors,
                    per_proc: options.per_proc,
                    bare: false,
                };
                let outcome = run_plan(server, options, ticks_per_s, idle, plan).await;
                let stop = match &outcome {
                    Ok(row) => !passes(row, options).unwrap_or(false),
                    Err(_) => true,
                };
                results.push((plan, outcome));
                if stop {
                    sweep_note.push(format!(
                        "{} / {}: stopped at {electors} electors",
                        shape.name(),
                        mode.name()
                    ));
                    break;
                }
                electors *= 2;
            }
        }
    }
    sweep_note
}

/// Whether the checks met p99 ≤ I/10 and no leadership changed.
pub(crate) fn passes(row: &Row, options: &Options) -> Option<bool> {
    let tenth = options.interval.as_secs_f64() / 10.0;
    Some(row.within_tenth? >= 0.99 && row.check_p99? <= tenth + 1e-9 && row.changes == 0.0)
}

pub(crate) async fn run_plan(
    server: &mut Server,
    options: &Options,
    ticks_per_s: f64,
    idle: f64,
    plan: Plan,
) -> Outcome {
    server.ensure(connections_needed(&plan, options.pool)).await;
    eprintln!(
        "fleet: {} / {} / {} electors in {} processes …",
        plan.shape.name(),
        plan.mode_name(),
        plan.electors,
        plan.procs()
    );
    let began = Instant::now();
    let run = Run {
        server,
        options,
        ticks_per_s,
        idle,
    };
    let outcome = run.run(plan).await;
    match &outcome {
        Ok(row) => eprintln!(
            "fleet: … {:.0} s (window {:.1} s): server {:.3} cores, {} server processes at most, {:.0} tries/s, {:.0} checks/s, backends {:.0} (max {}), \
             check mean {:.2} ms p99 {}, probe p99 {}, client {:.3} cores, {} warnings in the window ({} in all)",
            began.elapsed().as_secs_f64(),
            row.window,
            row.server_cores,
            row.server_children_max,
            row.tries.unwrap_or(f64::NAN),
            row.checks,
            row.backends_mean,
            row.backends_max,
            row.check_mean_ms,
            bucket(row.check_p99),
            percentile(&sorted(row.probe.clone()), 0.99)
                .map_or("-".into(), |v| format!("{:.2} ms", v as f64 / 1e3)),
            row.client_cores,
            row.window_warnings,
            row.warnings,
        ),
        Err((e, row)) => {
            eprintln!("fleet: … FAILED: {e}");
            for line in &row.log_tail {
                eprintln!("  {line}");
            }
        }
    }
    outcome
}

/// How fast the calibration sends its `SELECT 1`s.
pub(crate) const CALIBRATION_RATE: u32 = 200;

/// The server CPU (µs) of one trivial round trip: `SELECT 1` as one unnamed statement, sent
/// `CALIBRATION_RATE` times a second on one session for the baseline period, divided by the
/// count; read from that backend's own utime + stime.
pub(crate) async fn calibrate(server: &Server, options: &Options, ticks_per_s: f64) -> f64 {
    let db = server.pg.create_database().await.expect("a database");
    let client = connect(db.config()).await;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("a pid")
        .get(0);
    let before = stat(pid).unwrap_or_default().own;
    let mut every = tokio::time::interval(Duration::from_secs(1) / CALIBRATION_RATE);
    let until = Instant::now() + options.baseline;
    let mut count = 0u64;
    while Instant::now() < until {
        every.tick().await;
        client.query_typed("SELECT 1", &[]).await.expect("SELECT 1");
        count += 1;
    }
    let after = stat(pid).unwrap_or_default().own;
    drop(client);
    tokio::task::spawn_blocking(move || drop(db))
        .await
        .expect("drop the database");
    (after - before) as f64 / ticks_per_s / count.max(1) as f64 * 1e6
}

/// The idle server's CPU (cores) over the baseline period, the bench's own sessions excluded.
pub(crate) async fn idle_cores(server: &Server, options: &Options, ticks_per_s: f64) -> f64 {
    let db = server.pg.create_database().await.expect("a database");
    let monitor = Monitor::open(&db).await;
    let probe_monitor = Monitor::open(&db).await;
    let own = [monitor.pid, probe_monitor.pid];
    let (probe, _) = start_probe(Arc::new(probe_monitor.client), options.interval / 10);
    let postmaster = server.postmaster;
    let read = move || {
        let (server, _) = server_ticks(postmaster);
        let own: u64 = own.iter().filter_map(|&p| stat(p)).map(|s| s.own).sum();
        (Instant::now(), server, own)
    };
    let (t0, s0, o0) = read();
    tokio::time::sleep(options.baseline).await;
    let (t1, s1, o1) = read();
    probe.abort();
    drop(monitor);
    tokio::task::spawn_blocking(move || drop(db))
        .await
        .expect("drop the database");
    let window = t1.duration_since(t0).as_secs_f64();
    ((s1 - s0) as f64 - (o1 - o0) as f64) / ticks_per_s / window
}
