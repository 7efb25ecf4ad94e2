//! Failover figures (design §6): for each fault, how long no replica leads, how long two do,
//! how soon the old leader demotes and how soon a new one leads, at I = 1 s.
//!
//! ```sh
//! cargo bench --bench failover                 # 20 runs per scenario (about 6 minutes)
//! cargo bench --bench failover -- --quick      # 5 runs per scenario
//! cargo bench --bench failover -- --reps 50    # or FAILOVER_REPS=50
//! ```
//!
//! Three replicas run as child processes (this binary run again with `--replica`), each
//! connected to a private PostgreSQL (started by the harness) through its own loopback
//! [`FaultProxy`], which passes bytes except in the partition scenario. Each child prints every
//! leadership transition with a µs UNIX timestamp, read from a watcher thread that polls
//! `is_leader()` every millisecond, so every figure is ±1 ms. The scenarios:
//!
//! - graceful: the leader's shutdown token is cancelled (it demotes, then unlocks);
//! - SIGKILL: the leader's process is killed;
//! - terminate: `pg_terminate_backend` on the lock session;
//! - partition: the leader's proxy blackholes (E14);
//! - restart fast / immediate: `pg_ctl restart -m fast|immediate`; the takeover is counted from
//!   the moment the server accepts connections again.
//!
//! Before each fault the bench waits a random part of I, so the fault falls at a random phase
//! of the replicas' check ticks.

use std::convert::Infallible;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pg_elector::{Elector, LockKey};
use pg_elector_harness::{
    FaultProxy, PgServer, ShutdownMode, TestDb, config_with_addr, pool_from_config,
};
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const ENV_URL: &str = "PG_ELECTOR_REPLICA_URL";
const ENV_ADDR: &str = "PG_ELECTOR_REPLICA_ADDR";
const ENV_KEY: &str = "PG_ELECTOR_REPLICA_KEY";
const ENV_INTERVAL_MS: &str = "PG_ELECTOR_REPLICA_INTERVAL_MS";
const MARK: &str = "@replica ";

const INTERVAL: Duration = Duration::from_secs(1);
const KEY: LockKey = LockKey::new(0x6661_696c, 1); // "fail"
const SLOTS: usize = 3;
const DEFAULT_REPS: usize = 20;
const QUICK_REPS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--replica") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(replica());
        return;
    }
    if !has("--bench") {
        // `cargo test --benches` runs bench targets without `--bench`: nothing to do there.
        eprintln!("failover: run it with `cargo bench --bench failover`");
        return;
    }
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .or_else(|| std::env::var("FAILOVER_REPS").ok())
        .map(|n| n.parse().expect("--reps takes a number"))
        .unwrap_or(if has("--quick") {
            QUICK_REPS
        } else {
            DEFAULT_REPS
        });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(bench(reps));
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as u64
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

// ---------------------------------------------------------------------------------------------
// A replica process.

fn say(at: u64, what: &str) {
    println!("{MARK}{at} {what}");
}

async fn replica() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "pg_elector=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let interval = Duration::from_millis(env(ENV_INTERVAL_MS).parse().expect("milliseconds"));
    let (class, object) = env(ENV_KEY)
        .split_once(',')
        .map(|(c, o)| (c.parse().expect("int4"), o.parse().expect("int4")))
        .expect("class,object");
    let mut config: tokio_postgres::Config = env(ENV_URL).parse().expect("a connection URL");
    if let Ok(addr) = std::env::var(ENV_ADDR) {
        config = config_with_addr(&config, addr.parse().expect("a socket address"));
    }
    let elector = Elector::builder(pool_from_config(config, 2), LockKey::new(class, object))
        .check_interval(interval)
        .build()
        .expect("a valid elector");
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
    let reported = Arc::new(AtomicBool::new(false));
    std::thread::spawn({
        let (elector, reported) = (elector.clone(), reported.clone());
        move || {
            loop {
                let now = elector.is_leader();
                if now != reported.load(Ordering::Relaxed) {
                    say(unix_us(), if now { "leader" } else { "standby" });
                    reported.store(now, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let ticker = async {
        let mut every = tokio::time::interval(interval / 10);
        loop {
            every.tick().await;
            let called = unix_us();
            let _ = elector
                .do_work(|_term| async move {
                    say(called, "tick");
                    Ok::<_, Infallible>(())
                })
                .await;
        }
    };
    tokio::select! {
        result = elector.run(shutdown.clone()) => result.expect("run returns Ok"),
        () = ticker => unreachable!(),
    }
    while reported.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    say(unix_us(), "exited");
}

// ---------------------------------------------------------------------------------------------
// The fleet, as seen by the parent.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    Started,
    Leader,
    Standby,
    Tick,
    Exited,
    /// Recorded by the parent when it SIGKILLs a replica.
    Killed,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    replica: usize,
    at: u64,
    what: What,
}

fn parse(replica: usize, line: &str) -> Option<Event> {
    let rest = &line[line.find(MARK)? + MARK.len()..];
    let mut words = rest.split_whitespace();
    let at = words.next()?.parse().ok()?;
    let what = match words.next()? {
        "started" => What::Started,
        "leader" => What::Leader,
        "standby" => What::Standby,
        "tick" => What::Tick,
        "exited" => What::Exited,
        _ => return None,
    };
    Some(Event { replica, at, what })
}

#[derive(Default)]
struct Board {
    events: Mutex<Vec<Event>>,
    logs: Mutex<Vec<String>>,
    version: watch::Sender<u64>,
}

impl Board {
    fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
        self.version.send_modify(|v| *v += 1);
    }
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    pid: Pid,
    slot: usize,
}

struct Fleet {
    url: String,
    board: Arc<Board>,
    procs: Vec<Proc>,
    /// The live replica of each slot.
    live: [usize; SLOTS],
    /// One proxy per slot.
    proxies: Vec<FaultProxy>,
}

impl Fleet {
    async fn start(db: &TestDb, server: &PgServer) -> Self {
        let mut proxies = Vec::new();
        for _ in 0..SLOTS {
            proxies.push(FaultProxy::start(server.addr()).await.expect("a proxy"));
        }
        let mut fleet = Fleet {
            url: db.url(),
            board: Arc::default(),
            procs: Vec::new(),
            live: [0; SLOTS],
            proxies,
        };
        // Staggered starts, so that the replicas' check ticks do not share one phase.
        let mut seed = unix_us() | 1;
        for slot in 0..SLOTS {
            fleet.spawn(slot);
            tokio::time::sleep(Duration::from_micros(xorshift(&mut seed) % us(INTERVAL))).await;
        }
        fleet
    }

    fn spawn(&mut self, slot: usize) -> usize {
        let index = self.procs.len();
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .arg("--replica")
            .env(ENV_URL, &self.url)
            .env(ENV_ADDR, self.proxies[slot].addr().to_string())
            .env(ENV_KEY, format!("{},{}", KEY.class(), KEY.object()))
            .env(ENV_INTERVAL_MS, INTERVAL.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a replica process");
        let pid = Pid::from_raw(child.id().expect("a running child") as i32).expect("a pid");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdin = child.stdin.take().expect("piped stdin");
        tokio::spawn({
            let board = self.board.clone();
            async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(event) = parse(index, &line) {
                        board.push(event);
                    }
                }
            }
        });
        tokio::spawn({
            let board = self.board.clone();
            async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    board
                        .logs
                        .lock()
                        .unwrap()
                        .push(format!("replica-{index}: {line}"));
                }
            }
        });
        self.procs.push(Proc {
            child,
            stdin,
            pid,
            slot,
        });
        self.live[slot] = index;
        index
    }

    fn events(&self) -> Vec<Event> {
        self.board.events.lock().unwrap().clone()
    }

    async fn wait<R>(
        &self,
        limit: Duration,
        mut found: impl FnMut(&[Event]) -> Option<R>,
    ) -> Option<R> {
        let mut changed = self.board.version.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            changed.borrow_and_update();
            if let Some(r) = found(&self.board.events.lock().unwrap()) {
                return Some(r);
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Waits until every live replica has started, exactly one leads, and it has ticked one I
    /// after the last start (every standby is on its periodic tries). Returns the leader.
    async fn steady(&self) -> Result<usize, String> {
        let live = self.live;
        let n = self.procs.len();
        self.wait(Duration::from_secs(60), |events| {
            let started = live
                .iter()
                .map(|&r| {
                    events
                        .iter()
                        .find(|e| e.replica == r && e.what == What::Started)
                        .map(|e| e.at)
                })
                .collect::<Option<Vec<u64>>>()?;
            let last_start = started.into_iter().max()?;
            let leading = leaders(events, n);
            if leading.len() != 1 {
                return None;
            }
            let leader = leading[0];
            events
                .iter()
                .any(|e| {
                    e.replica == leader && e.what == What::Tick && e.at > last_start + us(INTERVAL)
                })
                .then_some(leader)
        })
        .await
        .ok_or_else(|| "no steady single leader within 60 s".to_owned())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            let _ = proc.child.start_kill();
        }
    }
}

fn leaders(events: &[Event], n: usize) -> Vec<usize> {
    let mut leading = vec![false; n];
    for e in events {
        match e.what {
            What::Leader => leading[e.replica] = true,
            What::Standby | What::Killed | What::Exited => leading[e.replica] = false,
            What::Started | What::Tick => {}
        }
    }
    (0..n).filter(|&i| leading[i]).collect()
}

/// Over `[from, to]` (µs): how long no replica said it led, and how long two or more did.
fn integrate(events: &[Event], n: usize, from: u64, to: u64) -> (u64, u64) {
    let mut transitions: Vec<Event> = events
        .iter()
        .filter(|e| matches!(e.what, What::Leader | What::Standby | What::Killed))
        .copied()
        .collect();
    transitions.sort_by_key(|e| (e.at, e.what == What::Leader));
    let mut leading = vec![false; n];
    let count = |leading: &[bool]| leading.iter().filter(|&&l| l).count();
    let (mut none, mut many) = (0, 0);
    let mut last = from;
    for e in transitions {
        if e.at > from {
            let until = e.at.min(to);
            if until > last {
                match count(&leading) {
                    0 => none += until - last,
                    1 => {}
                    _ => many += until - last,
                }
                last = until;
            }
        }
        if e.at > to {
            break;
        }
        leading[e.replica] = e.what == What::Leader;
    }
    if to > last {
        match count(&leading) {
            0 => none += to - last,
            1 => {}
            _ => many += to - last,
        }
    }
    (none, many)
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[derive(Clone, Copy, Debug)]
enum Scenario {
    Graceful,
    Sigkill,
    Terminate,
    Partition,
    Restart(ShutdownMode),
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful shutdown",
            Scenario::Sigkill => "SIGKILL of the leader process",
            Scenario::Terminate => "pg_terminate_backend",
            Scenario::Partition => "partition (blackhole)",
            Scenario::Restart(ShutdownMode::Immediate) => "server restart, immediate",
            Scenario::Restart(_) => "server restart, fast",
        }
    }

    fn limit(self) -> Duration {
        match self {
            Scenario::Partition => 10 * INTERVAL,
            Scenario::Restart(_) => Duration::from_secs(60),
            _ => 5 * INTERVAL,
        }
    }
}

/// One run, in µs.
#[derive(Clone, Copy, Debug)]
struct Sample {
    none: u64,
    both: u64,
    /// From the fault to the old leader's demotion (none for a killed process).
    demoted: Option<u64>,
    /// From the fault (for a restart: from the server accepting again) to the new leader.
    takeover: u64,
}

struct Bench {
    server: Arc<PgServer>,
    db: TestDb,
    admin: tokio_postgres::Client,
    fleet: Fleet,
    seed: u64,
}

impl Bench {
    fn random_phase(&mut self) -> Duration {
        Duration::from_micros(xorshift(&mut self.seed) % us(INTERVAL))
    }

    async fn holder_pid(&self) -> Option<i32> {
        self.admin
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid = $1 AND objid = $2 AND objsubid = 2 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&(KEY.class() as u32), &(KEY.object() as u32)],
            )
            .await
            .ok()
            .flatten()
            .map(|row| row.get(0))
    }

    async fn run_once(&mut self, scenario: Scenario) -> Result<Sample, String> {
        let old = self.fleet.steady().await?;
        let slot = self.fleet.procs[old].slot;
        tokio::time::sleep(self.random_phase()).await;
        let mut restart = None;
        let t0 = match scenario {
            Scenario::Graceful => {
                let at = unix_us();
                let stdin = &mut self.fleet.procs[old].stdin;
                stdin
                    .write_all(b"stop\n")
                    .await
                    .map_err(|e| e.to_string())?;
                stdin.flush().await.map_err(|e| e.to_string())?;
                at
            }
            Scenario::Sigkill => {
                let at = unix_us();
                kill_process(self.fleet.procs[old].pid, Signal::KILL).map_err(|e| e.to_string())?;
                self.fleet.board.push(Event {
                    replica: old,
                    at,
                    what: What::Killed,
                });
                at
            }
            Scenario::Terminate => {
                let pid = self.holder_pid().await.ok_or("no lock holder")?;
                let at = unix_us();
                self.admin
                    .execute("SELECT pg_terminate_backend($1)", &[&pid])
                    .await
                    .map_err(|e| e.to_string())?;
                at
            }
            Scenario::Partition => {
                let at = unix_us();
                self.fleet.proxies[slot].blackhole();
                at
            }
            Scenario::Restart(mode) => {
                // An observer connection ends when the server closes it; then a prober
                // connects every 2 ms until the server answers again.
                let (observer, connection) = self
                    .db
                    .config()
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let config = self.db.config();
                let back = tokio::spawn(async move {
                    let _ = connection.await;
                    drop(observer);
                    loop {
                        if let Ok((client, connection)) =
                            config.connect(tokio_postgres::NoTls).await
                        {
                            tokio::spawn(connection);
                            if client.simple_query("SELECT 1").await.is_ok() {
                                return unix_us();
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                });
                let at = unix_us();
                let server = self.server.clone();
                let restarting = tokio::task::spawn_blocking(move || server.restart(mode));
                restart = Some((back, restarting));
                at
            }
        };
        let n = self.fleet.procs.len();
        let settled = self
            .fleet
            .wait(scenario.limit(), |events| {
                let old_end = events
                    .iter()
                    .find(|e| {
                        e.replica == old
                            && e.at >= t0
                            && matches!(e.what, What::Standby | What::Killed)
                    })
                    .copied()?;
                let new = events
                    .iter()
                    .filter(|e| {
                        e.what == What::Leader
                            && e.at > t0
                            && (e.replica != old || e.at > old_end.at)
                    })
                    .min_by_key(|e| e.at)
                    .copied()?;
                (leaders(events, n).len() == 1).then_some((old_end, new))
            })
            .await;
        // Undo the fault before judging, so the next run starts clean.
        let mut accepting = None;
        match scenario {
            Scenario::Graceful => {
                let _ = self.fleet.procs[old].child.wait().await;
                self.fleet.spawn(slot);
            }
            Scenario::Sigkill => {
                let _ = self.fleet.procs[old].child.wait().await;
                self.fleet.spawn(slot);
            }
            Scenario::Partition => self.fleet.proxies[slot].pass(),
            Scenario::Terminate => {}
            Scenario::Restart(_) => {
                let (back, restarting) = restart.take().expect("a restart runs");
                restarting
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                accepting = Some(back.await.map_err(|e| e.to_string())?);
                self.admin = self
                    .db
                    .config()
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map(|(client, connection)| {
                        tokio::spawn(connection);
                        client
                    })
                    .map_err(|e| e.to_string())?;
            }
        }
        let (old_end, new) = settled.ok_or_else(|| {
            format!(
                "{}: no new single leader within {:?} of the fault",
                scenario.name(),
                scenario.limit()
            )
        })?;
        let events = self.fleet.events();
        let (none, both) = integrate(&events, n, t0, old_end.at.max(new.at));
        Ok(Sample {
            none,
            both,
            demoted: (old_end.what != What::Killed).then(|| old_end.at.saturating_sub(t0)),
            takeover: new.at.saturating_sub(accepting.unwrap_or(t0)),
        })
    }
}

async fn bench(reps: usize) {
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::spawn)
            .await
            .expect("spawn the server")
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let db = server.create_database().await.expect("a database");
    let admin = {
        let (client, connection) = db
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .expect("an admin connection");
        tokio::spawn(connection);
        client
    };
    let fleet = Fleet::start(&db, &server).await;
    let mut bench = Bench {
        server,
        db,
        admin,
        fleet,
        seed: unix_us() | 1,
    };
    let scenarios = [
        Scenario::Graceful,
        Scenario::Sigkill,
        Scenario::Terminate,
        Scenario::Partition,
        Scenario::Restart(ShutdownMode::Fast),
        Scenario::Restart(ShutdownMode::Immediate),
    ];
    eprintln!(
        "failover: {reps} runs per scenario, I = {INTERVAL:?}, 3 replica processes, PostgreSQL at {}",
        bench.server.addr()
    );
    let mut results = Vec::new();
    for scenario in scenarios {
        let mut samples = Vec::new();
        let mut failures = Vec::new();
        for rep in 0..reps {
            match bench.run_once(scenario).await {
                Ok(s) => {
                    eprintln!(
                        "{} #{rep}: no leader {:.1} ms, two leaders {:.1} ms, old demoted {}, new leader {:.1} ms",
                        scenario.name(),
                        s.none as f64 / 1e3,
                        s.both as f64 / 1e3,
                        s.demoted
                            .map_or("-".into(), |d| format!("{:.1} ms", d as f64 / 1e3)),
                        s.takeover as f64 / 1e3
                    );
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!("{} #{rep}: FAILED: {e}", scenario.name());
                    let logs = bench.fleet.board.logs.lock().unwrap();
                    for line in &logs[logs.len().saturating_sub(20)..] {
                        eprintln!("  {line}");
                    }
                    failures.push(e);
                }
            }
        }
        results.push((scenario, samples, failures.len()));
    }

    println!();
    println!(
        "Failover at I = {INTERVAL:?}, 3 replica processes, {reps} runs per scenario; ms, p50 / p99 / max (nearest rank)."
    );
    println!();
    println!(
        "| scenario | runs | no leader | two leaders | old leader demoted | new leader (takeover) |"
    );
    println!("|---|---|---|---|---|---|");
    for (scenario, samples, failed) in &results {
        let stat = |values: Vec<u64>| summary(values);
        let demoted: Vec<u64> = samples.iter().filter_map(|s| s.demoted).collect();
        println!(
            "| {} | {}{} | {} | {} | {} | {}{} |",
            scenario.name(),
            samples.len(),
            if *failed > 0 {
                format!(" ({failed} failed)")
            } else {
                String::new()
            },
            stat(samples.iter().map(|s| s.none).collect()),
            stat(samples.iter().map(|s| s.both).collect()),
            if demoted.is_empty() {
                "(process gone)".into()
            } else {
                stat(demoted)
            },
            stat(samples.iter().map(|s| s.takeover).collect()),
            if matches!(scenario, Scenario::Restart(_)) {
                " after the server accepts again"
            } else {
                ""
            },
        );
    }
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn summary(mut values: Vec<u64>) -> String {
    if values.is_empty() {
        return "-".into();
    }
    values.sort_unstable();
    let at = |p: f64| {
        let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[rank - 1] as f64 / 1e3
    };
    format!("{:.1} / {:.1} / {:.1}", at(0.50), at(0.99), at(1.0))
}
