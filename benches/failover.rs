//! Failover figures (design §6): for each fault, how long no replica leads, how long two do,
//! how soon the old leader demotes and how soon a new one leads, at I = 1 s; and, with every
//! leader tick writing one fenced row, the gap between the old term's last write and the new
//! term's first, by the server's clock (negative would mean interleaved writes).
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

#[path = "../tests/replica/mod.rs"]
mod replica;

use std::sync::Arc;
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_harness::{FaultProxy, PgServer, ShutdownMode, TestDb};
use replica::{Event, What, leaders, transitions, unix_us, us};

/// The arguments that make this binary a replica.
const CHILD: &[&str] = &["--replica"];
const INTERVAL: Duration = Duration::from_secs(1);
const KEY: LockKey = LockKey::new(0x6661_696c, 1); // "fail"
const SLOTS: usize = 3;
const DEFAULT_REPS: usize = 20;
const QUICK_REPS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--replica") {
        replica::child();
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

// ---------------------------------------------------------------------------------------------
// The fleet, as seen by the parent.

/// The replica processes (see `tests/replica/mod.rs`), one live per slot.
struct Fleet {
    replicas: replica::Fleet,
    /// The slot of each replica.
    slots: Vec<usize>,
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
        let mut replicas = replica::Fleet::new(CHILD, db.url(), KEY, INTERVAL);
        replicas.fenced = true;
        let mut fleet = Fleet {
            replicas,
            slots: Vec::new(),
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
        let index = self.replicas.spawn(Some(self.proxies[slot].addr()));
        self.slots.push(slot);
        self.live[slot] = index;
        index
    }

    /// Waits until every live replica has started, exactly one leads, and it has ticked one I
    /// after the last start (every standby is on its periodic tries). Returns the leader.
    async fn steady(&self) -> Result<usize, String> {
        let live = self.live;
        let n = self.replicas.procs.len();
        self.replicas
            .wait(Duration::from_secs(60), |events| {
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
                        e.replica == leader
                            && e.what == What::Tick
                            && e.at > last_start + us(INTERVAL)
                    })
                    .then_some(leader)
            })
            .await
            .ok_or_else(|| "no steady single leader within 60 s".to_owned())
    }
}

/// Over `[from, to]` (µs): how long no replica said it led, and how long two or more did.
fn integrate(events: &[Event], n: usize, from: u64, to: u64) -> (u64, u64) {
    let transitions = transitions(events);
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
    /// From the old term's last fenced write to the new term's first, by the server's clock;
    /// negative would mean the writes of two terms interleaved.
    write_gap: Option<i64>,
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
        let slot = self.fleet.slots[old];
        tokio::time::sleep(self.random_phase()).await;
        let mut restart = None;
        let t0 = match scenario {
            Scenario::Graceful => {
                let at = unix_us();
                self.fleet
                    .replicas
                    .stop(old)
                    .await
                    .map_err(|e| e.to_string())?;
                at
            }
            Scenario::Sigkill => self
                .fleet
                .replicas
                .try_sigkill(old)
                .map_err(|e| e.to_string())?,
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
        let n = self.fleet.replicas.procs.len();
        let settled = self
            .fleet
            .replicas
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
                self.fleet.replicas.reap(old).await;
                self.fleet.spawn(slot);
            }
            Scenario::Sigkill => {
                self.fleet.replicas.reap(old).await;
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
        let events = self.fleet.replicas.events();
        let (none, both) = integrate(&events, n, t0, old_end.at.max(new.at));
        Ok(Sample {
            none,
            both,
            demoted: (old_end.what != What::Killed).then(|| old_end.at.saturating_sub(t0)),
            takeover: new.at.saturating_sub(accepting.unwrap_or(t0)),
            write_gap: self.write_gap().await,
        })
    }

    /// The gap (µs) between the last fenced write of the second-newest epoch and the first of
    /// the newest, once the new leader has written (it ticks every I/10); `None` if it has not
    /// within 2 s.
    async fn write_gap(&self) -> Option<i64> {
        let query = "WITH e AS (SELECT DISTINCT epoch FROM replica_writes ORDER BY epoch DESC LIMIT 2) \
             SELECT (extract(epoch FROM \
                       (SELECT min(at) FROM replica_writes WHERE epoch = (SELECT max(epoch) FROM e)) \
                     - (SELECT max(at) FROM replica_writes WHERE epoch = (SELECT min(epoch) FROM e))) \
                     * 1e6)::int8 \
             WHERE (SELECT count(*) FROM e) = 2";
        for _ in 0..200 {
            if let Ok(Some(row)) = self.admin.query_opt(query, &[]).await {
                return row.get(0);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
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
    admin
        .batch_execute(
            "CREATE TABLE replica_writes (replica text NOT NULL, epoch bigint NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .expect("the writes table");
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
                        "{} #{rep}: no leader {:.1} ms, two leaders {:.1} ms, old demoted {}, new leader {:.1} ms, write gap {}",
                        scenario.name(),
                        s.none as f64 / 1e3,
                        s.both as f64 / 1e3,
                        s.demoted
                            .map_or("-".into(), |d| format!("{:.1} ms", d as f64 / 1e3)),
                        s.takeover as f64 / 1e3,
                        s.write_gap
                            .map_or("-".into(), |g| format!("{:.1} ms", g as f64 / 1e3)),
                    );
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!("{} #{rep}: FAILED: {e}", scenario.name());
                    let logs = bench.fleet.replicas.board.logs.lock().unwrap();
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
        "| scenario | runs | no leader | two leaders | old leader demoted | new leader (takeover) | last old write → first new write |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (scenario, samples, failed) in &results {
        let stat = |values: Vec<u64>| summary(values);
        let demoted: Vec<u64> = samples.iter().filter_map(|s| s.demoted).collect();
        let gaps: Vec<i64> = samples.iter().filter_map(|s| s.write_gap).collect();
        let interleaved = gaps.iter().filter(|&&g| g < 0).count();
        println!(
            "| {} | {}{} | {} | {} | {} | {}{} | {}{} |",
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
            stat(gaps.iter().map(|&g| g.max(0) as u64).collect()),
            if interleaved > 0 {
                format!(" ({interleaved} INTERLEAVED)")
            } else {
                String::new()
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
