//! The tables.

use pg_elector_tools::Mode;
use pg_elector_tools::stats::{percentile, sorted};

use crate::bench::{CALIBRATION_RATE, passes};
use crate::options::{Options, Shape};
use crate::server::Server;
use crate::snapshot::{Outcome, Plan, Row};

pub(crate) fn bucket(bound: Option<f64>) -> String {
    match bound {
        None => "-".into(),
        Some(b) if b.is_infinite() => "> 10 s".into(),
        Some(b) => format!("≤ {} ms", b * 1e3),
    }
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// Every table and summary of the runs `results`, on stdout.
pub(crate) fn print_tables(
    options: &Options,
    server: &Server,
    idle: f64,
    floor: f64,
    results: &[(Plan, Outcome)],
) {
    print_intro(options, server, idle);
    print_server_table(results);
    print_client_table(results);
    print_scale(options, idle, floor, results);
    print_logs(results);
    print_largest(options, results);
}

/// The cores of this machine.
fn cores() -> f64 {
    std::thread::available_parallelism().map_or(2, |n| n.get()) as f64
}

/// What a run is and what the server CPU counts.
fn print_intro(options: &Options, server: &Server, idle: f64) {
    let i_ms = options.interval.as_millis();
    println!();
    println!(
        "Fleet cost at I = {i_ms} ms: {} s per run after the fleet is up and a {} s warm-up; one private \
         PostgreSQL (pg_stat_statements {}, max_connections set per run to what its pools, leaders \
         and waiting sessions could use, plus a fifth{}) on the same machine as the replica \
         processes; pool of {} per process. Server CPU is the postmaster and all its processes, minus \
         the bench's two sessions and minus the idle server ({idle:.4} cores). Machine busy is every \
         CPU's busy time (of 2): the server, the fleet, the bench, and whatever else ran meanwhile.",
        options.duration.as_secs(),
        options.warmup.as_secs(),
        if server.statements { "on" } else { "off" },
        options
            .settings
            .iter()
            .map(|s| format!(", {s}"))
            .collect::<String>(),
        options.pool,
    );
    println!();
}

/// One row per run: the server's side.
fn print_server_table(results: &[(Plan, Outcome)]) {
    println!(
        "| shape | mode | electors (procs × per proc) | max_connections | leaders | server CPU (cores) | per standby (µs CPU/s) | backends mean / max | waiting max | sessions opened (backends start → end) | tries/s | checks/s | try / check plan + exec (µs, server) | other stmts/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (plan, outcome) in results {
        match outcome {
            Ok(row) => {
                let standbys = plan.electors as f64 - row.leaders.max(0.0);
                println!(
                    "| {} | {} | {} | {} | {:.0} | {:.3} | {:.1} | {:.0} / {} | {} | {} ({} → {}) | {} | {:.1} | {} / {} | {} |",
                    plan.shape.name(),
                    plan.mode_name(),
                    plan.label(),
                    row.max_connections,
                    row.leaders,
                    row.server_cores,
                    row.server_cores / standbys * 1e6,
                    row.backends_mean,
                    row.backends_max,
                    row.waiting_max,
                    row.sessions.map_or("-".into(), |s| s.to_string()),
                    row.backends_ends.0,
                    row.backends_ends.1,
                    opt(row.tries, 0),
                    row.checks,
                    opt(row.try_exec_us, 1),
                    opt(row.check_exec_us, 1),
                    opt(row.other, 1),
                );
            }
            Err((e, _)) => println!(
                "| {} | {} | {} | FAILED: {} ||||||||||||",
                plan.shape.name(),
                plan.mode_name(),
                plan.label(),
                e.replace('|', "/")
            ),
        }
    }
    println!();
}

/// One row per run: check latency and the client's side.
fn print_client_table(results: &[(Plan, Outcome)]) {
    println!(
        "Check latency: the crate's histogram merged over every process (mean exact; p50 / p99 as \
         the upper bound of their bucket), and the probe (a check-shaped statement every I/10 from \
         the bench, ms). Client: the replica processes' CPU and resident memory."
    );
    println!();
    println!(
        "| shape | mode | electors | checks | check mean (ms) | check p50 / p99 (bucket) | ≤ I/10 | probe p50 / p99 / max (ms) | leadership changes | client CPU (cores) | client µs CPU/s per elector | client RSS total (max) / per proc (MiB) | machine busy (cores) | WARN lines in window (whole run) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (plan, outcome) in results {
        let Ok(row) = outcome else { continue };
        let probe = |p: f64| {
            percentile(&sorted(row.probe.clone()), p)
                .map_or("-".into(), |v| format!("{:.2}", v as f64 / 1e3))
        };
        let procs = plan.procs() as f64;
        println!(
            "| {} | {} | {} | {} | {:.2} | {} / {} | {} | {} / {} / {} | {:.0} | {:.3} | {:.1} | {:.0} ({:.0}) / {:.1} | {:.2} | {} ({}) |",
            plan.shape.name(),
            plan.mode_name(),
            plan.electors,
            row.check_count,
            row.check_mean_ms,
            bucket(row.check_p50),
            bucket(row.check_p99),
            row.within_tenth
                .map_or("-".into(), |f| format!("{:.2} %", f * 100.0)),
            probe(0.50),
            probe(0.99),
            probe(1.0),
            row.changes,
            row.client_cores,
            row.client_cores / plan.electors as f64 * 1e6,
            row.rss_total_kb as f64 / 1024.0,
            row.rss_max_kb as f64 / 1024.0,
            row.rss_total_kb as f64 / 1024.0 / procs,
            row.machine_cores,
            row.window_warnings,
            row.warnings,
        );
    }
}

/// Derived: per-standby cost, and the largest fleet the server's CPU would take.
fn print_scale(options: &Options, idle: f64, floor: f64, results: &[(Plan, Outcome)]) {
    println!();
    println!(
        "For scale: one `SELECT 1` (an unnamed statement, as the elector sends them) paced at \
         {CALIBRATION_RATE}/s on one session costs {floor:.1} µs of its backend's CPU on this machine."
    );
    println!();
    let cores = cores();
    let ok: Vec<(&Plan, &Row)> = results
        .iter()
        .filter_map(|(p, r)| r.as_ref().ok().map(|r| (p, r)))
        .collect();
    for (plan, row) in &ok {
        let standbys = plan.electors as f64 - row.leaders.max(0.0);
        let per_standby = row.server_cores / standbys;
        let per_query = row.tries.map(|t| row.server_cores / (t + row.checks) * 1e6);
        let ceiling = (cores - idle) / per_standby;
        println!(
            "- {} / {} / {} electors: {:.1} µs of server CPU per standby per second ({} µs per query), \
             {:.3} backends per standby{}; a {cores}-core server's CPU would be used up at ≈ {:.0} \
             standbys (extrapolated from this run, the server alone on the machine){}",
            plan.shape.name(),
            plan.mode_name(),
            plan.electors,
            per_standby * 1e6,
            opt(per_query, 1),
            row.backends_mean / standbys,
            if row.waiting_max > 0 {
                format!(" ({} waiting on the lock at most)", row.waiting_max)
            } else {
                String::new()
            },
            ceiling,
            match passes(row, options) {
                Some(true) => "; checks within I/10 at p99: yes".to_owned(),
                Some(false) => "; checks within I/10 at p99: NO".to_owned(),
                None => String::new(),
            }
        );
    }
}

/// What the fleet logged, for runs that logged anything.
fn print_logs(results: &[(Plan, Outcome)]) {
    for (plan, outcome) in results {
        let (Ok(row) | Err((_, row))) = outcome;
        if row.warning_kinds.is_empty() {
            continue;
        }
        for (when, count, kinds) in [
            (
                "in the window",
                row.window_warnings,
                &row.window_warning_kinds,
            ),
            (
                "over the whole run, start-up included",
                row.warnings,
                &row.warning_kinds,
            ),
        ] {
            if kinds.is_empty() {
                continue;
            }
            println!();
            println!(
                "Fleet log, {} / {} / {} electors, {when} ({count} WARN or ERROR lines):",
                plan.shape.name(),
                plan.mode_name(),
                plan.electors,
            );
            for (kind, count) in kinds.iter().take(5) {
                println!("- {count} × {}", kind.replace('|', "/"));
            }
        }
    }
}

/// The largest fleet measured with the checks within I/10 at p99, per shape and mode.
fn print_largest(options: &Options, results: &[(Plan, Outcome)]) {
    let cores = cores();
    println!();
    for shape in [Shape::Keys, Shape::OneKey] {
        for mode in [Mode::Poll, Mode::Fast] {
            let runs: Vec<&(Plan, Outcome)> = results
                .iter()
                .filter(|(p, _)| p.shape == shape && p.mode == mode)
                .collect();
            if runs.is_empty() {
                continue;
            }
            let good = runs
                .iter()
                .filter(|(_, r)| r.as_ref().ok().and_then(|r| passes(r, options)) == Some(true))
                .map(|(p, _)| p.electors)
                .max();
            let bad = runs
                .iter()
                .filter(|(_, r)| r.as_ref().ok().and_then(|r| passes(r, options)) != Some(true))
                .map(|(p, _)| p.electors)
                .min();
            println!(
                "- measured, {} / {}: checks within I/10 at p99 up to {} electors{} \
                 (server and fleet sharing this machine's {cores} cores)",
                shape.name(),
                mode.name(),
                good.map_or("no".into(), |n| n.to_string()),
                bad.map_or(String::new(), |n| format!(", not at {n}")),
            );
        }
    }
}
