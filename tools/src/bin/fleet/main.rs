//! Fleet cost (design §6, issue 10): what a fleet of electors at I = 1 s costs one PostgreSQL
//! server, in CPU, backends and queries, and how fast the leaders' checks stay meanwhile.
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin fleet                                # both shapes, both modes, 1 000 electors, 60 s
//! cargo run --release -p pg-elector-tools --bin fleet -- --mode poll                 # poll mode only
//! cargo run --release -p pg-elector-tools --bin fleet -- --quick                     # 200 electors, 10 s per run
//! cargo run --release -p pg-elector-tools --bin fleet -- --shape one-key --electors 2000,4000 --per-proc 40
//! cargo run --release -p pg-elector-tools --bin fleet -- --mode poll --sweep         # then double the fleet until p99 > I/10
//! ```
//!
//! Flags: `--shape keys|one-key|both` (default both), `--mode poll|fast|both` (default both),
//! `--electors N[,N…]` (default 1000), `--per-proc E` electors per replica process (default
//! 20), `--pool P` pool size per process (default 4), `--duration S` (default 60),
//! `--warmup S` (default 5), `--baseline S` idle measurement (default 10), `--interval-ms`
//! (default 1000), `--no-statements` (no `pg_stat_statements`), `--sweep` and `--sweep-max N`
//! (default 16000), `--set name=value` (a server setting, repeatable), `--quick`.
//!
//! The fleet is made of replica processes (this binary run again with `--fleet-child`), each
//! running `--per-proc` electors on one current-thread tokio runtime, all sharing one
//! deadpool pool (`RecyclingMethod::Fast`, as the harness builds them) and one prometheus
//! registry. Each elector starts at a random moment within the first I, so the fleet's tries
//! spread over the interval as a fleet deployed over time would.
//!
//! Why a pool of 4 for 20 electors: a standby holds a pool connection for one round trip
//! (about a millisecond) per I, so 20 standbys keep about 0.02 connections busy on average;
//! deadpool opens connections only when none is idle, so the pool grows past one only when two
//! tries of the process overlap, and 4 leaves room for bursts (a slow server, ticks that
//! collide) without letting 50 processes hold more than 200 pooled backends. A leader's
//! connection leaves the pool when its lock is granted, so a process's backends are at most 4
//! plus its leaders (plus, in fast mode, one waiting session per standby).
//!
//! - shape `keys`: every process runs one elector per key (`--per-proc` keys), so each key has
//!   one elector per process: 50 processes × 20 keys is 20 leaders and 980 standbys.
//! - shape `one-key`: every elector of every process competes for one key: 1 leader, 999
//!   standbys.
//! - mode `fast`: `ElectorBuilder::fast_takeover(true)`, which keeps one waiting session per
//!   standby on the server.
//!
//! The server is a private PostgreSQL started by the harness (never `DATABASE_URL`: its CPU is
//! read from /proc). The harness has no setting for `max_connections` (it writes 300) or
//! preloaded libraries, so the bench sets them with `ALTER SYSTEM` and restarts the server:
//! `pg_stat_statements` (with `track_planning`), and per run a `max_connections` of what the
//! run's pools, leaders and waiting sessions could use plus a fifth (at least 300). Per run, not
//! the largest run's for all: reading `pg_locks`, as the leader's check does, visits every
//! backend slot, so the check costs more on a server with more of them (about 0.3 ms at 300,
//! 2.3 ms at 3 000 with EXPLAIN ANALYZE on a 2-core CI machine). Each run gets a fresh
//! database. Over the window (after the fleet is up, every key has a leader, and a warm-up),
//! the bench measures:
//!
//! - server CPU: utime + stime of the postmaster and every process it forked (live ones read
//!   at both ends, exited ones through the postmaster's cutime + cstime), minus the bench's own
//!   two sessions, minus the idle server's CPU measured before any fleet ran;
//! - backends of the fleet in `pg_stat_activity`, every second (mean and max; in fast mode also
//!   those waiting on a lock), and the sessions the server opened during the window
//!   (`pg_stat_database.sessions`) with the backends at both ends: sessions opened that match
//!   the growth are pools growing, the rest would be churn;
//! - tries and checks per second, and the server's mean planning + execution time of each,
//!   from `pg_stat_statements` (told apart by their text). Not from
//!   `pg_stat_database.xact_commit`: PostgreSQL 15 did not count the tries there (a backend's
//!   database counters were flushed only with other pending statistics, and the try reads no
//!   table);
//! - the leaders' check latency, from `pg_elector_check_duration_seconds` gathered from every
//!   process at both ends of the window and merged: its exact mean (sum / count), and p50 / p99
//!   as the bound of the bucket they fall in (the crate's histogram has the default buckets,
//!   5 ms, 10 ms, 25 ms, 50 ms, 100 ms, …), and the share of checks within I/10;
//! - a probe: the bench's own session runs a statement shaped like the check (one unnamed
//!   statement, reading `pg_locks`) every I/10 and times it, for a precise latency of a check
//!   on this server at this load;
//! - leadership changes in the window (there should be none), and WARN lines of the fleet;
//! - the client side: CPU (utime + stime) and RSS of the replica processes;
//! - the whole machine's busy CPU (/proc/stat), which shows whatever else ran meanwhile.
//!
//! For scale, it also times a paced `SELECT 1` on one session (server CPU per round trip).
//!
//! Everything runs on one machine: the replica processes compete with the server for the same
//! cores, so a fleet that saturates the machine also delays the leaders' own checks. The
//! derived "largest fleet" figures say which is measured and which is extrapolated from the
//! server CPU per standby.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_harness::{PgServer, ShutdownMode, TestDb, replica};
use pg_elector_tools::block_on;
use pg_elector_tools::procfs::{children_of, clock_ticks_per_second, machine_ticks, rss_kb, stat};
use pg_elector_tools::rng::xorshift;
use pg_elector_tools::stats::{percentile, sorted};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio_postgres::types::Type;

const CHILD_FLAG: &str = "--fleet-child";
/// The class half of every key of the fleet ("flee").
const CLASS: i32 = 0x666c_6565;
/// Tags the bench's own statements, so that `pg_stat_statements` keeps them apart.
const TAG: &str = "/* fleet-bench */ ";
/// The `application_name` of the bench's own sessions.
const APP: &str = "fleet-bench";
const MARK: &str = "@fleet ";

const ENV_URL: &str = "PG_ELECTOR_FLEET_URL";
const ENV_INDEX: &str = "PG_ELECTOR_FLEET_INDEX";
const ENV_ELECTORS: &str = "PG_ELECTOR_FLEET_ELECTORS";
const ENV_SHAPE: &str = "PG_ELECTOR_FLEET_SHAPE";
const ENV_INTERVAL_MS: &str = "PG_ELECTOR_FLEET_INTERVAL_MS";
const ENV_POOL: &str = "PG_ELECTOR_FLEET_POOL";
const ENV_FAST: &str = "PG_ELECTOR_FLEET_FAST";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == CHILD_FLAG) {
        child::main();
        return;
    }
    let options = Options::parse(&args);
    block_on(bench(options));
}

// ---------------------------------------------------------------------------------------------
// Options.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Every process runs one elector per key.
    Keys,
    /// Every elector competes for one key.
    OneKey,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Keys => "keys",
            Shape::OneKey => "one-key",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Poll,
    Fast,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Fast => "fast",
        }
    }
}

#[derive(Clone, Debug)]
struct Options {
    shapes: Vec<Shape>,
    modes: Vec<Mode>,
    sizes: Vec<usize>,
    per_proc: usize,
    pool: usize,
    duration: Duration,
    warmup: Duration,
    baseline: Duration,
    interval: Duration,
    statements: bool,
    sweep: bool,
    sweep_max: usize,
    /// Server settings (`name=value`) applied with `ALTER SYSTEM` before the first run.
    settings: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Self {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let value = |flag: &str| {
            args.iter().position(|a| a == flag).map(|i| {
                args.get(i + 1)
                    .cloned()
                    .unwrap_or_else(|| panic!("{flag} takes a value"))
            })
        };
        let number = |flag: &str| {
            value(flag).map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{flag} takes a number, not {v:?}"))
            })
        };
        let quick = has("--quick");
        let shapes = match value("--shape").as_deref() {
            None | Some("both") => vec![Shape::Keys, Shape::OneKey],
            Some("keys") => vec![Shape::Keys],
            Some("one-key") => vec![Shape::OneKey],
            Some(other) => panic!("--shape takes keys, one-key or both, not {other:?}"),
        };
        let modes = match value("--mode").as_deref() {
            None | Some("both") => vec![Mode::Poll, Mode::Fast],
            Some("poll") => vec![Mode::Poll],
            Some("fast") => vec![Mode::Fast],
            Some(other) => panic!("--mode takes poll, fast or both, not {other:?}"),
        };
        let sizes = value("--electors").map_or_else(
            || vec![if quick { 200 } else { 1000 }],
            |list| {
                list.split(',')
                    .map(|n| n.trim().parse().expect("--electors takes numbers"))
                    .collect()
            },
        );
        let secs = |flag: &str, full: u64, quick_value: u64| {
            Duration::from_secs(number(flag).unwrap_or(if quick { quick_value } else { full }))
        };
        let options = Options {
            shapes,
            modes,
            sizes,
            per_proc: number("--per-proc").unwrap_or(20) as usize,
            pool: number("--pool").unwrap_or(4) as usize,
            duration: secs("--duration", 60, 10),
            warmup: secs("--warmup", 5, 2),
            baseline: secs("--baseline", 10, 3),
            interval: Duration::from_millis(number("--interval-ms").unwrap_or(1000)),
            statements: !has("--no-statements"),
            sweep: has("--sweep"),
            sweep_max: number("--sweep-max").unwrap_or(16_000) as usize,
            settings: args
                .iter()
                .enumerate()
                .filter(|(_, a)| *a == "--set")
                .map(|(i, _)| {
                    let setting = args.get(i + 1).expect("--set takes name=value");
                    assert!(
                        setting.contains('=') && !setting.contains(';'),
                        "--set takes name=value, not {setting:?}"
                    );
                    setting.clone()
                })
                .collect(),
        };
        assert!(
            options.per_proc > 0 && options.pool > 0,
            "--per-proc and --pool must be > 0"
        );
        assert!(
            options.sizes.iter().all(|&n| n > 0),
            "--electors must be > 0"
        );
        options
    }
}

// ---------------------------------------------------------------------------------------------
// The child: one replica process with many electors.

mod child {
    use std::io::Write;
    use std::time::Duration;

    use pg_elector::{CHANGES_NAME, CHECK_DURATION_NAME, DEFAULT_GAUGE_NAME, Elector, LockKey};
    use pg_elector_harness::pool_from_config;
    use prometheus::Registry;
    use tokio_util::sync::CancellationToken;

    use super::*;

    pub(super) fn main() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(run());
    }

    async fn run() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "pg_elector=warn".into()),
            )
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
        let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
        let number = |name: &str| -> u64 { env(name).parse().expect("a number") };
        let index = number(ENV_INDEX);
        let electors = number(ENV_ELECTORS) as i32;
        let one_key = env(ENV_SHAPE) == Shape::OneKey.name();
        let interval = Duration::from_millis(number(ENV_INTERVAL_MS));
        let fast = std::env::var(ENV_FAST).is_ok();
        let config: tokio_postgres::Config = env(ENV_URL).parse().expect("a connection URL");
        let pool = pool_from_config(config, number(ENV_POOL) as usize);
        let registry = Registry::new();

        let shutdown = CancellationToken::new();
        let mut seed = replica::unix_us() ^ (index << 32) ^ u64::from(std::process::id()) | 1;
        for i in 0..electors {
            let key = LockKey::new(CLASS, if one_key { 0 } else { i });
            let elector = Elector::builder(pool.clone(), key)
                .check_interval(interval)
                .identity(format!("fleet-{index}-{i}"))
                .fast_takeover(fast)
                .registry(&registry)
                .build()
                .expect("a valid elector");
            let delay = Duration::from_micros(xorshift(&mut seed) % replica::us(interval));
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                elector.run(shutdown).await
            });
        }

        // stdin: `snap` prints the metrics; end of file means the parent is gone.
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                match line {
                    Ok(line) if line.trim() == "snap" => {
                        let snap = snap(&registry);
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "{MARK}snap {snap}");
                        let _ = out.flush();
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            std::process::exit(0);
        });

        // Every elector has called `run` once the longest start delay has passed.
        tokio::time::sleep(interval + Duration::from_millis(50)).await;
        println!("{MARK}ready");
        std::future::pending::<()>().await;
    }

    /// The process's metrics on one line: `leaders acquired lost count sum b1:c1,b2:c2,…`,
    /// the histogram merged over keys (cumulative counts per upper bound).
    fn snap(registry: &Registry) -> String {
        let mut leaders = 0.0;
        let mut acquired = 0.0;
        let mut lost = 0.0;
        let mut count = 0u64;
        let mut sum = 0.0;
        let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
        for family in registry.gather() {
            let name = family.name();
            for metric in family.get_metric() {
                if name == DEFAULT_GAUGE_NAME {
                    leaders += metric.get_gauge().value();
                } else if name == CHANGES_NAME {
                    let cause = metric
                        .get_label()
                        .iter()
                        .find(|l| l.name() == "cause")
                        .map(|l| l.value().to_owned())
                        .unwrap_or_default();
                    let value = metric.get_counter().value();
                    if cause == "acquired" {
                        acquired += value;
                    } else {
                        lost += value;
                    }
                } else if name == CHECK_DURATION_NAME {
                    let histogram = metric.get_histogram();
                    count += histogram.sample_count();
                    sum += histogram.sample_sum();
                    for bucket in &histogram.bucket {
                        *buckets.entry(bucket.upper_bound().to_bits()).or_default() +=
                            bucket.cumulative_count();
                    }
                }
            }
        }
        let buckets: Vec<String> = buckets
            .iter()
            .map(|(bound, c)| format!("{}:{c}", f64::from_bits(*bound)))
            .collect();
        format!(
            "{leaders} {acquired} {lost} {count} {sum} {}",
            buckets.join(",")
        )
    }
}

// ---------------------------------------------------------------------------------------------
// /proc.

/// The server's CPU so far (clock ticks): the postmaster, its live children, and its reaped
/// children; and how many children it has now.
fn server_ticks(postmaster: i32) -> (u64, usize) {
    let pm = stat(postmaster).unwrap_or_default();
    let children = children_of(postmaster);
    let live: u64 = children.iter().map(|(_, s)| s.own).sum();
    (pm.own + pm.reaped + live, children.len())
}

// ---------------------------------------------------------------------------------------------
// The server.

struct Server {
    pg: Arc<PgServer>,
    postmaster: i32,
    max_connections: usize,
    statements: bool,
}

impl Server {
    async fn start(statements: bool, max_connections: usize, extra: &[String]) -> Self {
        let pg = Arc::new(
            tokio::task::spawn_blocking(PgServer::spawn)
                .await
                .expect("spawn the server")
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let mut server = Server {
            pg,
            postmaster: 0,
            max_connections: 0,
            statements: false,
        };
        let admin = connect(server.pg.config()).await;
        let mut settings = vec![format!("max_connections = {max_connections}")];
        settings.extend(extra.iter().map(|s| {
            let (name, value) = s.split_once('=').expect("name=value");
            format!("{} = '{}'", name.trim(), value.trim().replace('\'', "''"))
        }));
        if statements {
            // The library must exist, or the server would not start again.
            let lib: Option<String> = admin
                .query_opt(
                    "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'",
                    &[],
                )
                .await
                .ok()
                .flatten()
                .map(|r| r.get(0));
            match lib {
                Some(dir)
                    if std::path::Path::new(&dir)
                        .join("pg_stat_statements.so")
                        .exists() =>
                {
                    settings.push("shared_preload_libraries = 'pg_stat_statements'".into());
                    server.statements = true;
                }
                _ => eprintln!("fleet: pg_stat_statements is not installed: no tries per second"),
            }
        }
        for setting in &settings {
            admin
                .batch_execute(&format!("ALTER SYSTEM SET {setting}"))
                .await
                .expect("ALTER SYSTEM");
        }
        drop(admin);
        server.restart(max_connections).await;
        server
    }

    async fn restart(&mut self, max_connections: usize) {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.restart(ShutdownMode::Fast))
            .await
            .expect("restart the server")
            .unwrap_or_else(|e| panic!("{e}"));
        let pid_file = self
            .pg
            .data_dir()
            .expect("a private server")
            .join("postmaster.pid");
        self.postmaster = std::fs::read_to_string(&pid_file)
            .expect("postmaster.pid")
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid in postmaster.pid");
        let admin = connect(self.pg.config()).await;
        if self.statements {
            // Known to the server only once the library is loaded; a reload applies it.
            admin
                .batch_execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
                .await
                .expect("pg_stat_statements.track_planning");
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .expect("pg_stat_statements.track_planning");
        }
        let row = admin
            .query_one("SHOW max_connections", &[])
            .await
            .expect("max_connections");
        let shown: String = row.get(0);
        self.max_connections = shown.parse().expect("a number");
        assert_eq!(
            self.max_connections, max_connections,
            "max_connections after the restart"
        );
    }

    /// Sets `max_connections` to `need` (a restart) when it differs. Not just raised: reading
    /// `pg_locks`, as the leader's check does, costs time in proportion to it, so each run
    /// gets the server it needs rather than the largest run's.
    async fn ensure(&mut self, need: usize) {
        if need == self.max_connections {
            return;
        }
        let admin = connect(self.pg.config()).await;
        admin
            .batch_execute(&format!("ALTER SYSTEM SET max_connections = {need}"))
            .await
            .expect("ALTER SYSTEM");
        drop(admin);
        self.restart(need).await;
    }
}

async fn connect(mut config: tokio_postgres::Config) -> tokio_postgres::Client {
    config.application_name(APP);
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("a bench connection");
    tokio::spawn(connection);
    client
}

/// What a run needs of `max_connections`.
fn connections_needed(plan: &Plan, pool: usize) -> usize {
    let waiting = if plan.mode == Mode::Fast {
        plan.electors
    } else {
        0
    };
    let need = plan.procs() * pool + plan.keys() + waiting + 20;
    (need + need / 5).max(300)
}

// ---------------------------------------------------------------------------------------------
// One run.

#[derive(Clone, Copy, Debug)]
struct Plan {
    shape: Shape,
    mode: Mode,
    electors: usize,
    per_proc: usize,
}

impl Plan {
    fn procs(&self) -> usize {
        self.electors.div_ceil(self.per_proc)
    }

    fn keys(&self) -> usize {
        match self.shape {
            Shape::Keys => self.per_proc.min(self.electors),
            Shape::OneKey => 1,
        }
    }

    fn label(&self) -> String {
        format!(
            "{} ({} × {})",
            self.electors,
            self.procs(),
            self.per_proc.min(self.electors)
        )
    }
}

struct Proc {
    child: Child,
    /// Kept open: the child exits when it closes.
    stdin: ChildStdin,
    pid: i32,
    lines: mpsc::UnboundedReceiver<String>,
}

/// The merged metrics of the fleet.
#[derive(Clone, Debug, Default)]
struct FleetSnap {
    leaders: f64,
    acquired: f64,
    lost: f64,
    count: u64,
    sum: f64,
    /// Upper bound (bits of the f64) → cumulative count.
    buckets: BTreeMap<u64, u64>,
}

impl FleetSnap {
    fn add(&mut self, line: &str) -> Option<()> {
        let mut words = line.split_whitespace();
        self.leaders += words.next()?.parse::<f64>().ok()?;
        self.acquired += words.next()?.parse::<f64>().ok()?;
        self.lost += words.next()?.parse::<f64>().ok()?;
        self.count += words.next()?.parse::<u64>().ok()?;
        self.sum += words.next()?.parse::<f64>().ok()?;
        for pair in words
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let (bound, count) = pair.split_once(':')?;
            *self
                .buckets
                .entry(bound.parse::<f64>().ok()?.to_bits())
                .or_default() += count.parse::<u64>().ok()?;
        }
        Some(())
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Statements {
    try_calls: i64,
    /// Execution plus planning time, ms.
    try_ms: f64,
    check_calls: i64,
    check_ms: f64,
    /// Calls of every other statement of the fleet (not the bench's own).
    other_calls: i64,
}

struct Snapshot {
    /// When every process had answered with its metrics.
    at: Instant,
    /// When /proc was read (for the CPU rates: under overload the parts of a snapshot can be
    /// seconds apart).
    proc_at: Instant,
    /// When `pg_stat_statements` was read (for the statement rates).
    stmts_at: Instant,
    server: u64,
    /// The bench's own backends.
    own: u64,
    clients: u64,
    machine: u64,
    sessions: Option<i64>,
    statements: Option<Statements>,
    fleet: FleetSnap,
    /// The fleet's backends.
    backends: i64,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    backends: i64,
    waiting: i64,
    server_children: usize,
    rss_kb: u64,
}

/// A run's row, or why it failed (with what was seen of the fleet's logs).
type Outcome = Result<Row, (String, Row)>;

/// The probe's latencies (µs), each with when it was sent.
type Probes = Arc<Mutex<Vec<(Instant, u64)>>>;

/// The outcome of one run.
#[derive(Debug, Default)]
struct Row {
    max_connections: usize,
    window: f64,
    leaders: f64,
    server_cores: f64,
    backends_mean: f64,
    backends_max: i64,
    waiting_max: i64,
    server_children_max: usize,
    sessions: Option<i64>,
    /// The fleet's backends at the start and the end of the window.
    backends_ends: (i64, i64),
    tries: Option<f64>,
    checks: f64,
    try_exec_us: Option<f64>,
    check_exec_us: Option<f64>,
    other: Option<f64>,
    check_count: u64,
    check_mean_ms: f64,
    check_p50: Option<f64>,
    check_p99: Option<f64>,
    within_tenth: Option<f64>,
    probe: Vec<u64>,
    changes: f64,
    client_cores: f64,
    /// Every CPU's busy time: the server, the fleet, the bench, and anything else running.
    machine_cores: f64,
    rss_total_kb: u64,
    rss_max_kb: u64,
    /// The fleet's WARN and ERROR lines over the whole run (start-up included).
    warnings: usize,
    /// The same by message and error, most frequent first.
    warning_kinds: Vec<(String, usize)>,
    /// The fleet's log lines (indices) written during the window.
    log_window: (usize, usize),
    window_warnings: usize,
    window_warning_kinds: Vec<(String, usize)>,
    log_tail: Vec<String>,
}

/// One of the bench's own sessions, and its backend's pid.
struct Monitor {
    client: tokio_postgres::Client,
    pid: i32,
}

impl Monitor {
    async fn open(db: &TestDb) -> Self {
        let client = connect(db.config()).await;
        let pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("a pid")
            .get(0);
        Monitor { client, pid }
    }

    async fn query(&self, sql: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.client.query(&format!("{TAG}{sql}"), &[]).await
    }

    async fn leaders(&self) -> i64 {
        self.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .await
        .ok()
        .and_then(|rows| rows.first().map(|r| r.get(0)))
        .unwrap_or(-1)
    }

    /// The fleet's backends now, and how many of them wait on a lock.
    async fn backends(&self) -> (i64, i64) {
        self.query(&format!(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND datname = current_database() \
             AND application_name <> '{APP}'"
        ))
        .await
        .ok()
        .and_then(|rows| rows.first().map(|r| (r.get(0), r.get(1))))
        .unwrap_or((-1, -1))
    }

    /// The sessions the server has opened in this database (there from PostgreSQL 14).
    async fn sessions(&self) -> Option<i64> {
        self.query("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            .await
            .ok()
            .and_then(|rows| rows.first().map(|r| r.get(0)))
    }

    async fn statements(&self) -> Option<Statements> {
        let rows = self
            .query(&format!(
                "SELECT \
                 coalesce(sum(calls) FILTER (WHERE {TRY}), 0)::int8, \
                 coalesce(sum(total_exec_time + total_plan_time) FILTER (WHERE {TRY}), 0)::float8, \
                 coalesce(sum(calls) FILTER (WHERE {CHECK}), 0)::int8, \
                 coalesce(sum(total_exec_time + total_plan_time) FILTER (WHERE {CHECK}), 0)::float8, \
                 coalesce(sum(calls) FILTER (WHERE NOT ({TRY}) AND NOT ({CHECK}) \
                   AND query NOT LIKE '{}%' AND query NOT LIKE 'SELECT pg_backend_pid()%'), 0)::int8 \
                 FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                TAG.trim_end()
            ))
            .await
            .ok()?;
        let r = rows.first()?;
        Some(Statements {
            try_calls: r.get(0),
            try_ms: r.get(1),
            check_calls: r.get(2),
            check_ms: r.get(3),
            other_calls: r.get(4),
        })
    }
}

/// The try, as `pg_stat_statements` shows it (the waiting session's statement of fast
/// takeover also starts with `SELECT answer,`, but does not try).
const TRY: &str = "query LIKE 'SELECT answer,%' AND query LIKE '%pg_try_advisory_lock(%'";
/// The leader's check, as `pg_stat_statements` shows it (its `SELECT 1` becomes `SELECT $4`).
const CHECK: &str = "query LIKE 'SELECT EXISTS (SELECT % FROM pg_catalog.pg_locks%'";

/// The probe: a statement shaped like the leader's check (the same `pg_locks` read, one
/// unnamed statement), one more column so that `pg_stat_statements` keeps it apart.
const PROBE: &str = "/* fleet-bench */ SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
     WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND granted AND pid = pg_catalog.pg_backend_pid() \
     AND database = (SELECT oid FROM pg_catalog.pg_database \
                     WHERE datname = pg_catalog.current_database())), \
     coalesce(pg_catalog.current_setting('pg_elector.session', true), '') = $3::text, \
     coalesce(pg_catalog.current_setting('pg_elector.visited', true), '') = '', 'probe'";

/// Runs the probe every `every` until dropped; each latency (µs) with its time.
fn start_probe(
    client: Arc<tokio_postgres::Client>,
    every: Duration,
) -> (tokio::task::JoinHandle<()>, Probes) {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let handle = tokio::spawn({
        let samples = samples.clone();
        async move {
            let key = LockKey::new(CLASS, 0);
            let mark = String::from("probe");
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let started = Instant::now();
                let ok = client
                    .query_typed(
                        PROBE,
                        &[
                            (&(key.class() as u32), Type::OID),
                            (&(key.object() as u32), Type::OID),
                            (&mark, Type::TEXT),
                        ],
                    )
                    .await
                    .is_ok();
                if ok {
                    let took = started.elapsed().as_micros() as u64;
                    samples.lock().unwrap().push((started, took));
                }
            }
        }
    });
    (handle, samples)
}

struct Run<'a> {
    server: &'a Server,
    options: &'a Options,
    ticks_per_s: f64,
    /// The idle server's CPU (cores), measured before any fleet.
    idle: f64,
}

impl Run<'_> {
    async fn run(&self, plan: Plan) -> Outcome {
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
    async fn measure(
        &self,
        plan: &Plan,
        monitor: &Monitor,
        own_pids: &[i32],
        procs: &mut [Proc],
        probes: &Mutex<Vec<(Instant, u64)>>,
        logs: &Mutex<Vec<String>>,
    ) -> Result<Row, String> {
        let options = self.options;
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
        tokio::time::sleep(options.warmup).await;

        let start = self.snapshot(monitor, own_pids, procs).await?;
        let log_start = logs.lock().unwrap().len();
        let mut samples = Vec::new();
        let end_at = start.at + options.duration;
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
        tokio::time::sleep_until(end_at.into()).await;
        let end = self.snapshot(monitor, own_pids, procs).await?;
        let log_end = logs.lock().unwrap().len();
        let leaders_now = monitor.leaders().await;

        let window = end.proc_at.duration_since(start.proc_at).as_secs_f64();
        let stmts_window = end.stmts_at.duration_since(start.stmts_at).as_secs_f64();
        let fleet_window = end.at.duration_since(start.at).as_secs_f64();
        let cores = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / self.ticks_per_s / window;
        let server_cores = cores(start.server, end.server) - cores(start.own, end.own);
        let statements = start.statements.zip(end.statements).map(|(a, b)| {
            let tries = (b.try_calls - a.try_calls) as f64;
            let checks = (b.check_calls - a.check_calls) as f64;
            (
                tries / stmts_window,
                checks / stmts_window,
                (b.try_ms - a.try_ms) * 1e3 / tries.max(1.0),
                (b.check_ms - a.check_ms) * 1e3 / checks.max(1.0),
                (b.other_calls - a.other_calls) as f64 / stmts_window,
            )
        });
        let check_count = end.fleet.count - start.fleet.count;
        let checks_client = check_count as f64 / fleet_window;
        let histogram: Vec<(f64, u64)> = end
            .fleet
            .buckets
            .iter()
            .map(|(bound, c)| {
                let before = start.fleet.buckets.get(bound).copied().unwrap_or(0);
                (f64::from_bits(*bound), c - before)
            })
            .collect();
        let quantile = |q: f64| -> Option<f64> {
            if check_count == 0 {
                return None;
            }
            let rank = (q * check_count as f64).ceil() as u64;
            Some(
                histogram
                    .iter()
                    .find(|(_, c)| *c >= rank)
                    .map_or(f64::INFINITY, |(b, _)| *b),
            )
        };
        let tenth = options.interval.as_secs_f64() / 10.0;
        let within_tenth = histogram
            .iter()
            .find(|(b, _)| (*b - tenth).abs() < 1e-9)
            .filter(|_| check_count > 0)
            .map(|(_, c)| *c as f64 / check_count as f64);
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

    async fn snapshot(
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

/// The fleet's WARN and ERROR lines counted by their message and `error` field (a tracing line
/// reads `<time> WARN <spans>: pg_elector::<module>: <message> key=… error=…`).
fn is_warning(line: &str) -> bool {
    line.contains(" WARN ") || line.contains(" ERROR ")
}

fn warning_kinds(logs: &[String]) -> Vec<(String, usize)> {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for line in logs {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        let rest = &line[at + 1..];
        let level = rest.split_whitespace().next().unwrap_or("");
        let message = rest
            .find(" pg_elector")
            .and_then(|t| rest[t + 1..].find(": ").map(|c| &rest[t + 1 + c + 2..]))
            .unwrap_or(rest);
        let text: Vec<&str> = message
            .split_whitespace()
            .take_while(|w| !w.contains('='))
            .collect();
        let error = message
            .find("error=")
            .map(|e| {
                let value: String = message[e + 6..].chars().take(80).collect();
                format!(" (error={value})")
            })
            .unwrap_or_default();
        *kinds
            .entry(format!("{level} {}{error}", text.join(" ")))
            .or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    kinds
}

fn spawn_child(
    db: &TestDb,
    plan: &Plan,
    options: &Options,
    index: usize,
    electors: usize,
    logs: Arc<Mutex<Vec<String>>>,
) -> Proc {
    let mut command = Command::new(std::env::current_exe().expect("this binary"));
    command
        .arg(CHILD_FLAG)
        .env(ENV_URL, db.url())
        .env(ENV_INDEX, index.to_string())
        .env(ENV_ELECTORS, electors.to_string())
        .env(ENV_SHAPE, plan.shape.name())
        .env(ENV_INTERVAL_MS, options.interval.as_millis().to_string())
        .env(ENV_POOL, options.pool.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if plan.mode == Mode::Fast {
        command.env(ENV_FAST, "1");
    } else {
        command.env_remove(ENV_FAST);
    }
    let mut child = command.spawn().expect("start a replica process");
    let pid = child.id().expect("a running child") as i32;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if let Some(rest) = line.strip_prefix(MARK) {
                let _ = tx.send(rest.to_owned());
            }
        }
    });
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            logs.lock().unwrap().push(format!("fleet-{index}: {line}"));
        }
    });
    Proc {
        child,
        stdin,
        pid,
        lines,
    }
}

/// The next line from `proc` that starts with `prefix` (without it), within `limit`.
async fn expect_line(proc: &mut Proc, prefix: &str, limit: Duration) -> Result<String, String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, proc.lines.recv()).await {
            Err(_) => return Err(format!("no `{}` within {limit:?}", prefix.trim())),
            Ok(None) => return Err("the process ended".into()),
            Ok(Some(line)) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Ok(rest.to_owned());
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The bench.

async fn bench(options: Options) {
    let started = Instant::now();
    let mut plans = Vec::new();
    for &electors in &options.sizes {
        for &shape in &options.shapes {
            for &mode in &options.modes {
                plans.push(Plan {
                    shape,
                    mode,
                    electors,
                    per_proc: options.per_proc,
                });
            }
        }
    }
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

    // The sweep: double the largest fleet until the checks' p99 passes I/10 or a run fails.
    let mut sweep_note = Vec::new();
    if options.sweep {
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
                    };
                    let outcome = run_plan(&mut server, &options, ticks_per_s, idle, plan).await;
                    let stop = match &outcome {
                        Ok(row) => !passes(row, &options).unwrap_or(false),
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
    }

    print_tables(&options, &server, idle, floor, &results);
    for note in sweep_note {
        println!("- sweep {note}");
    }
    println!();
    println!("Total run time {:.0} s.", started.elapsed().as_secs_f64());
}

/// Whether the checks met p99 ≤ I/10 and no leadership changed.
fn passes(row: &Row, options: &Options) -> Option<bool> {
    let tenth = options.interval.as_secs_f64() / 10.0;
    Some(row.within_tenth? >= 0.99 && row.check_p99? <= tenth + 1e-9 && row.changes == 0.0)
}

async fn run_plan(
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
        plan.mode.name(),
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
const CALIBRATION_RATE: u32 = 200;

/// The server CPU (µs) of one trivial round trip: `SELECT 1` as one unnamed statement, sent
/// `CALIBRATION_RATE` times a second on one session for the baseline period, divided by the
/// count; read from that backend's own utime + stime.
async fn calibrate(server: &Server, options: &Options, ticks_per_s: f64) -> f64 {
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
async fn idle_cores(server: &Server, options: &Options, ticks_per_s: f64) -> f64 {
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

// ---------------------------------------------------------------------------------------------
// The report.

fn bucket(bound: Option<f64>) -> String {
    match bound {
        None => "-".into(),
        Some(b) if b.is_infinite() => "> 10 s".into(),
        Some(b) => format!("≤ {} ms", b * 1e3),
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn print_tables(
    options: &Options,
    server: &Server,
    idle: f64,
    floor: f64,
    results: &[(Plan, Outcome)],
) {
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
                    plan.mode.name(),
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
                plan.mode.name(),
                plan.label(),
                e.replace('|', "/")
            ),
        }
    }
    println!();
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
            plan.mode.name(),
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

    // Derived: per-standby cost, and the largest fleet.
    println!();
    println!(
        "For scale: one `SELECT 1` (an unnamed statement, as the elector sends them) paced at \
         {CALIBRATION_RATE}/s on one session costs {floor:.1} µs of its backend's CPU on this machine."
    );
    println!();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
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
            plan.mode.name(),
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

    // What the fleet logged, for runs that logged anything.
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
                plan.mode.name(),
                plan.electors,
            );
            for (kind, count) in kinds.iter().take(5) {
                println!("- {count} × {}", kind.replace('|', "/"));
            }
        }
    }

    // The largest fleet measured with the checks within I/10 at p99, per shape and mode.
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
