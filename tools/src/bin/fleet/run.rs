//! One run: the fleet started, warmed up, measured and stopped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector_tools::procfs::{children_of, machine_ticks, rss_kb, stat};

use crate::TAG;
use crate::monitor::{Monitor, start_probe};
use crate::options::Options;
use crate::procs::{expect_line, is_warning, spawn_child, warning_kinds};
use crate::server::{Server, server_ticks};
use crate::snapshot::{FleetSnap, Outcome, Plan, Proc, Row, Sample, Snapshot, Statements};

pub(crate) struct Run<'a> {
    pub(crate) server: &'a Server,
    pub(crate) options: &'a Options,
    pub(crate) ticks_per_s: f64,
    /// The idle server's CPU (cores), measured before any fleet.
    pub(crate) idle: f64,
}

impl Run<'_> {
    pub(crate) async fn run(&self, plan: Plan) -> Outcome {
        let options = self.options;
        let db = self.server.pg.create_database().await.expect("a database");
        let monitor = Monitor::open(&db).await;
        if self.server.statements {
            monitor
                .client
                .batch_execute(&format!(
                    "{TAG}CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
                ))
                .await
                .expect("CREATE EXTENSION pg_stat_statements");
        }
        let probe_monitor = Monitor::open(&db).await;
        let own_pids = [monitor.pid, probe_monitor.pid];
        let (probe, probes) = start_probe(Arc::new(probe_monitor.client), options.interval / 10);

        // The fleet.
        let logs = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut procs = Vec::new();
        let mut left = plan.electors;
        for index in 0..plan.procs() {
            let n = left.min(plan.per_proc);
            left -= n;
            procs.push(spawn_child(&db, &plan, options, index, n, logs.clone()));
        }
        let result = self
            .measure(&plan, &monitor, &own_pids, &mut procs, &probes, &logs)
            .await;

        // Tear down: the fleet first, then wait for its backends to go.
        for proc in &mut procs {
            let _ = proc.child.start_kill();
        }
        for proc in &mut procs {
            let _ = proc.child.wait().await;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while monitor.backends().await.0 > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        probe.abort();
        drop(monitor);
        tokio::task::spawn_blocking(move || drop(db))
            .await
            .expect("drop the database");

        let logs = logs.lock().unwrap();
        let warnings = logs.iter().filter(|l| is_warning(l)).count();
        let tail: Vec<String> = logs[logs.len().saturating_sub(5)..].to_vec();
        let kinds = warning_kinds(&logs);
        match result {
            Ok(mut row) => {
                let (from, to) = row.log_window;
                let window = &logs[from.min(logs.len())..to.min(logs.len())];
                row.window_warnings = window.iter().filter(|l| is_warning(l)).count();
                row.window_warning_kinds = warning_kinds(window);
                row.warnings = warnings;
                row.warning_kinds = kinds;
                row.log_tail = tail;
                Ok(row)
            }
            Err(e) => Err((
                e,
                Row {
                    warnings,
                    warning_kinds: kinds,
                    log_tail: tail,
                    ..Row::default()
                },
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn measure(
        &self,
        plan: &Plan,
        monitor: &Monitor,
        own_pids: &[i32],
        procs: &mut [Proc],
        probes: &Mutex<Vec<(Instant, u64)>>,
        logs: &Mutex<Vec<String>>,
    ) -> Result<Row, String> {
        let options = self.options;
        self.until_ready(plan, monitor, procs).await?;
        tokio::time::sleep(options.warmup).await;

        let start = self.snapshot(monitor, own_pids, procs).await?;
        let log_start = logs.lock().unwrap().len();
        let end_at = start.at + options.duration;
        let samples = self.sample_window(monitor, procs, end_at).await;
        tokio::time::sleep_until(end_at.into()).await;
        let end = self.snapshot(monitor, own_pids, procs).await?;
        let log_end = logs.lock().unwrap().len();
        let leaders_now = monitor.leaders().await;

        let window = end.proc_at.duration_since(start.proc_at).as_secs_f64();
        let stmts_window = end.stmts_at.duration_since(start.stmts_at).as_secs_f64();
        let fleet_window = end.at.duration_since(start.at).as_secs_f64();
        let cores = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / self.ticks_per_s / window;
        let server_cores = cores(start.server, end.server) - cores(start.own, end.own);
        let statements = rates(start.statements, end.statements, stmts_window);
        let check_count = end.fleet.count - start.fleet.count;
        let checks_client = check_count as f64 / fleet_window;
        let histogram = Histogram::between(&start.fleet, &end.fleet);
        let quantile = |q: f64| histogram.quantile(q);
        let within_tenth = histogram.within(options.interval.as_secs_f64() / 10.0);
        let probe: Vec<u64> = probes
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= start.at && *at <= end.at)
            .map(|(_, us)| *us)
            .collect();
        let n = samples.len().max(1) as f64;
        let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
        let rss: Vec<u64> = pids.iter().map(|&p| rss_kb(p).unwrap_or(0)).collect();
        Ok(Row {
            max_connections: self.server.max_connections,
            window,
            leaders: leaders_now as f64,
            server_cores: server_cores - self.idle,
            backends_mean: samples.iter().map(|s| s.backends as f64).sum::<f64>() / n,
            backends_max: samples.iter().map(|s| s.backends).max().unwrap_or(0),
            waiting_max: samples.iter().map(|s| s.waiting).max().unwrap_or(0),
            server_children_max: samples.iter().map(|s| s.server_children).max().unwrap_or(0),
            sessions: start.sessions.zip(end.sessions).map(|(a, b)| b - a),
            backends_ends: (start.backends, end.backends),
            tries: statements.map(|s| s.0),
            checks: statements.map_or(checks_client, |s| s.1),
            try_exec_us: statements.map(|s| s.2),
            check_exec_us: statements.map(|s| s.3),
            other: statements.map(|s| s.4),
            check_count,
            check_mean_ms: if check_count > 0 {
                (end.fleet.sum - start.fleet.sum) / check_count as f64 * 1e3
            } else {
                0.0
            },
            check_p50: quantile(0.50),
            check_p99: quantile(0.99),
            within_tenth,
            probe,
            changes: (end.fleet.acquired - start.fleet.acquired)
                + (end.fleet.lost - start.fleet.lost),
            client_cores: cores(start.clients, end.clients),
            machine_cores: cores(start.machine, end.machine),
            rss_total_kb: rss.iter().sum(),
            rss_max_kb: samples.iter().map(|s| s.rss_kb).max().unwrap_or(0),
            warnings: 0,
            warning_kinds: Vec::new(),
            log_window: (log_start, log_end),
            window_warnings: 0,
            window_warning_kinds: Vec::new(),
            log_tail: Vec::new(),
        })
    }

    /// Waits until every process has started its electors and every key has a leader.
    async fn until_ready(
        &self,
        plan: &Plan,
        monitor: &Monitor,
        procs: &mut [Proc],
    ) -> Result<(), String> {
        // Every process has started its electors.
        for (i, proc) in procs.iter_mut().enumerate() {
            expect_line(proc, "ready", Duration::from_secs(60))
                .await
                .map_err(|e| format!("process {i}: {e}"))?;
        }
        // Every key has a leader.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let leaders = monitor.leaders().await;
            if leaders == plan.keys() as i64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{leaders} of {} keys have a leader after 60 s",
                    plan.keys()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// The backends, the waiting sessions, the server's processes and the fleet's memory,
    /// every second until `end_at`.
    async fn sample_window(
        &self,
        monitor: &Monitor,
        procs: &[Proc],
        end_at: Instant,
    ) -> Vec<Sample> {
        let mut samples = Vec::new();
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        while Instant::now() + Duration::from_millis(500) < end_at {
            every.tick().await;
            let (backends, waiting) = monitor.backends().await;
            let postmaster = self.server.postmaster;
            let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
            let (server_children, rss_kb) = tokio::task::spawn_blocking(move || {
                (
                    children_of(postmaster).len(),
                    pids.iter().map(|&p| rss_kb(p).unwrap_or(0)).sum::<u64>(),
                )
            })
            .await
            .expect("a /proc scan");
            samples.push(Sample {
                backends,
                waiting,
                server_children,
                rss_kb,
            });
        }
        samples
    }

    pub(crate) async fn snapshot(
        &self,
        monitor: &Monitor,
        own_pids: &[i32],
        procs: &mut [Proc],
    ) -> Result<Snapshot, String> {
        for proc in procs.iter_mut() {
            use tokio::io::AsyncWriteExt;
            proc.stdin
                .write_all(b"snap\n")
                .await
                .map_err(|e| format!("a replica process is gone: {e}"))?;
        }
        let mut fleet = FleetSnap::default();
        for (i, proc) in procs.iter_mut().enumerate() {
            let line = expect_line(proc, "snap ", Duration::from_secs(10))
                .await
                .map_err(|e| format!("process {i}: {e}"))?;
            fleet
                .add(&line)
                .ok_or_else(|| format!("process {i}: unreadable metrics {line:?}"))?;
        }
        let at = Instant::now();
        let postmaster = self.server.postmaster;
        let own_pids = own_pids.to_vec();
        let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
        let (proc_at, server, own, clients, machine) = tokio::task::spawn_blocking(move || {
            // The machine first: scanning /proc for the server's processes can take a while
            // under load, and the instant of the reads is taken as the scan's middle.
            let began = Instant::now();
            let machine = machine_ticks();
            let (server, _) = server_ticks(postmaster);
            let own = own_pids
                .iter()
                .filter_map(|&p| stat(p))
                .map(|s| s.own)
                .sum();
            let clients = pids.iter().filter_map(|&p| stat(p)).map(|s| s.own).sum();
            let proc_at = began + began.elapsed() / 2;
            (proc_at, server, own, clients, machine)
        })
        .await
        .expect("a /proc read");
        let stmts_at = Instant::now();
        let statements = if self.server.statements {
            monitor.statements().await
        } else {
            None
        };
        let sessions = monitor.sessions().await;
        let (backends, _) = monitor.backends().await;
        Ok(Snapshot {
            at,
            proc_at,
            stmts_at,
            server,
            own,
            clients,
            machine,
            sessions,
            statements,
            fleet,
            backends,
        })
    }
}

/// Tries and checks per second, plan + exec µs per try and per check, and other statements per
/// second, between two reads of `pg_stat_statements` `window` seconds apart.
fn rates(
    start: Option<Statements>,
    end: Option<Statements>,
    stmts_window: f64,
) -> Option<(f64, f64, f64, f64, f64)> {
    start.zip(end).map(|(a, b)| {
        let tries = (b.try_calls - a.try_calls) as f64;
        let checks = (b.check_calls - a.check_calls) as f64;
        (
            tries / stmts_window,
            checks / stmts_window,
            (b.try_ms - a.try_ms) * 1e3 / tries.max(1.0),
            (b.check_ms - a.check_ms) * 1e3 / checks.max(1.0),
            (b.other_calls - a.other_calls) as f64 / stmts_window,
        )
    })
}

/// The check durations the fleet's histograms counted between two snapshots.
#[derive(Debug)]
struct Histogram {
    /// Upper bound (s) → cumulative count.
    buckets: Vec<(f64, u64)>,
    count: u64,
}

impl Histogram {
    fn between(start: &FleetSnap, end: &FleetSnap) -> Self {
        let buckets = end
            .buckets
            .iter()
            .map(|(bound, c)| {
                let before = start.buckets.get(bound).copied().unwrap_or(0);
                (f64::from_bits(*bound), c - before)
            })
            .collect();
        Histogram {
            buckets,
            count: end.count - start.count,
        }
    }

    /// The upper bound of the bucket of quantile `q` (infinite past the last bound).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q * self.count as f64).ceil() as u64;
        Some(
            self.buckets
                .iter()
                .find(|(_, c)| *c >= rank)
                .map_or(f64::INFINITY, |(b, _)| *b),
        )
    }

    /// The share of the checks within `bound` (s), a bound of the histogram.
    fn within(&self, bound: f64) -> Option<f64> {
        self.buckets
            .iter()
            .find(|(b, _)| (*b - bound).abs() < 1e-9)
            .filter(|_| self.count > 0)
            .map(|(_, c)| *c as f64 / self.count as f64)
    }
}
