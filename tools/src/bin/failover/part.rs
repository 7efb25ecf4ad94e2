//! The runs of every (mode, I) part.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_elector_testkit::PgServer;
use pg_elector_tools::Mode;

use crate::bench::{Bench, connect};
use crate::options::Options;
use crate::report::{minutes, ms, print_comparison, print_part};
use crate::scenario::{Sample, Scenario};

/// The results of one scenario in one (mode, I) part.
pub(crate) struct Outcome {
    pub(crate) scenario: Scenario,
    pub(crate) samples: Vec<Sample>,
    pub(crate) failed: usize,
    pub(crate) took: Duration,
}

pub(crate) struct Part {
    pub(crate) mode: Mode,
    pub(crate) interval: Duration,
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) took: Duration,
}

pub(crate) async fn bench(options: Options) {
    let started = Instant::now();
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::spawn)
            .await
            .expect("spawn the server")
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let version = {
        let db = server.create_database().await.expect("a database");
        let client = connect(&db).await.expect("a connection");
        let v = client
            .query_one("SHOW server_version", &[])
            .await
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_default();
        drop(client);
        v
    };
    eprintln!(
        "failover: {} runs per fault; modes {}; I = {}; faults: {}; 3 replica processes; PostgreSQL {version} at {}",
        options.reps,
        options
            .modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", "),
        options
            .intervals
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        options
            .scenarios
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        server.addr()
    );
    let mut parts = Vec::new();
    for &interval in &options.intervals {
        for &mode in &options.modes {
            let part = run_part(server.clone(), mode, interval, &options).await;
            print_part(&part, options.reps);
            parts.push(part);
        }
    }
    print_comparison(&parts, options.reps);
    println!();
    println!("Total time: {}.", minutes(started.elapsed()));
}

pub(crate) async fn run_part(
    server: Arc<PgServer>,
    mode: Mode,
    interval: Duration,
    options: &Options,
) -> Part {
    let started = Instant::now();
    eprintln!(
        "failover: [{} I={interval:?}] starting a fresh database and fleet",
        mode.name()
    );
    let log_file = server.log_file().map(|p| p.to_path_buf());
    let mut bench = Bench::new(server, interval, mode).await;
    let mut trace = if std::env::var_os("FAILOVER_TRACE").is_some() {
        Some(Trace::start(&bench, log_file).await)
    } else {
        None
    };
    let mut outcomes = Vec::new();
    for &scenario in &options.scenarios {
        outcomes.push(run_scenario(&mut bench, scenario, options.reps, &mut trace).await);
    }
    drop(bench);
    Part {
        mode,
        interval,
        outcomes,
        took: started.elapsed(),
    }
}

/// `reps` runs of `scenario`.
async fn run_scenario(
    bench: &mut Bench,
    scenario: Scenario,
    reps: usize,
    trace: &mut Option<Trace>,
) -> Outcome {
    let (mode, interval) = (bench.mode, bench.interval);
    let scenario_started = Instant::now();
    let mut samples = Vec::new();
    let mut failed = 0;
    for rep in 0..reps {
        let tag = format!(
            "[{} I={interval:?}] {} #{rep}",
            mode.name(),
            scenario.name()
        );
        let logs_at = bench.fleet.replicas.board().logs.lock().unwrap().len();
        let events_at = bench.fleet.replicas.events().len();
        let outcome = bench.run_once(scenario).await;
        if let Some(trace) = trace {
            trace.print(bench, &tag, events_at, logs_at);
        }
        match outcome {
            Ok(s) => {
                say_sample(&tag, &s);
                samples.push(s);
            }
            Err(e) => {
                eprintln!("{tag}: FAILED: {e}");
                {
                    let logs = bench.fleet.replicas.board().logs.lock().unwrap();
                    for line in &logs[logs.len().saturating_sub(20)..] {
                        eprintln!("  {line}");
                    }
                }
                failed += 1;
                eprintln!("{tag}: starting a fresh fleet");
                bench.restart_fleet().await;
            }
        }
    }
    let took = scenario_started.elapsed();
    eprintln!(
        "[{} I={interval:?}] {}: {} runs in {}",
        mode.name(),
        scenario.name(),
        reps,
        minutes(took)
    );
    Outcome {
        scenario,
        samples,
        failed,
        took,
    }
}

/// One run's figures, on stderr.
fn say_sample(tag: &str, s: &Sample) {
    eprintln!(
        "{tag}: takeover {} ms, two leaders {} ms, {}, no leader {} ms, write gap {}{}",
        ms(s.takeover),
        ms(s.both),
        match (s.demoted, s.resumed) {
            (Some(d), _) => format!("old demoted {} ms", ms(d)),
            (None, Some(r)) => format!("SIGCONT → old says standby {} ms", ms(r)),
            (None, None) => "old demoted -".into(),
        },
        ms(s.none),
        s.write_gap
            .map_or("-".into(), |g| format!("{:.1} ms", g as f64 / 1e3)),
        s.wrong
            .as_ref()
            .map_or(String::new(), |w| format!(" — WRONG: {w}")),
    );
}

/// `FAILOVER_TRACE=1`: what the replicas (RUST_LOG) and the server logged in each run.
#[derive(Debug)]
pub(crate) struct Trace {
    log_file: Option<std::path::PathBuf>,
    /// How much of the server log was printed already.
    server_log_at: u64,
}

impl Trace {
    /// Statement end times, backend exits and wait times in the server log, in ms.
    async fn start(bench: &Bench, log_file: Option<std::path::PathBuf>) -> Self {
        for setting in [
            "ALTER SYSTEM SET log_min_duration_statement = 0",
            "ALTER SYSTEM SET log_disconnections = on",
            "ALTER SYSTEM SET log_line_prefix = '%m [%p] %a '",
            "SELECT pg_reload_conf()",
        ] {
            if let Err(e) = bench.admin.batch_execute(setting).await {
                eprintln!("failover: FAILOVER_TRACE: {setting}: {e}");
            }
        }
        let server_log_at = log_file
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len());
        Trace {
            log_file,
            server_log_at,
        }
    }

    /// The events and logs of the run tagged `tag`, which began at these indices.
    fn print(&mut self, bench: &Bench, tag: &str, events_at: usize, logs_at: usize) {
        eprintln!("--- {tag}: trace ---");
        for e in bench.fleet.replicas.events().iter().skip(events_at) {
            eprintln!("  event: {} {} {:?}", e.at, e.replica, e.what);
        }
        let logs = bench.fleet.replicas.board().logs.lock().unwrap();
        for line in logs.iter().skip(logs_at) {
            eprintln!("  {line}");
        }
        if let Some(text) = self.log_file.as_ref().and_then(|p| std::fs::read(p).ok()) {
            let from = (self.server_log_at as usize).min(text.len());
            for line in String::from_utf8_lossy(&text[from..]).lines() {
                eprintln!("  server: {line}");
            }
            self.server_log_at = text.len() as u64;
        }
        eprintln!("--- end of trace ---");
    }
}
