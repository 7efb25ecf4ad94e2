//! Failover figures (design §6, issues 3 and 10): for each fault, how long until a new leader
//! leads (**takeover**), how long two replicas both said they led (**two leaders**), how soon
//! the old leader demoted, how long nobody led, and, with every leader tick writing one fenced
//! row, the gap between the old term's last write and the new term's first by the server's
//! clock (negative would mean interleaved writes). Each at I = 1 s and I = 5 s, in two modes:
//! **poll** (the default: a standby tries the lock once per I) and **fast**
//! (`ElectorBuilder::fast_takeover(true)`, design F1).
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin failover                                  # everything: 2 modes × 2 I × 7 faults × 20 runs
//! cargo run --release -p pg-elector-tools --bin failover -- --mode poll --interval 1      # one (mode, I) part
//! cargo run --release -p pg-elector-tools --bin failover -- --mode both --interval 5 --scenario freeze,partition
//! cargo run --release -p pg-elector-tools --bin failover -- --quick                       # 5 runs per fault
//! ```
//!
//! Options (after `--`):
//!
//! - `--mode poll|fast|both` (default `both`): the fast mode starts every replica with
//!   `PG_ELECTOR_REPLICA_FAST` set, so its elector has `fast_takeover(true)`.
//! - `--interval 1|5|both` (default `both`): the check interval I in seconds; also any list
//!   such as `0.5,2` (`ms` and `s` suffixes work too).
//! - `--scenario <name>[,<name>…]` (default `all`): `graceful`, `sigkill`, `terminate`, `reset`,
//!   `partition`, `freeze`, `restart-fast`, `restart-immediate`; `restart` is both restarts.
//! - `--reps N` (or `FAILOVER_REPS=N`; default 20): runs per fault. `--quick`: 5.
//! - `FAILOVER_NO_FENCING=1` in the environment: replicas without fencing and without writes,
//!   so that a takeover does not include the epoch bump's WAL flush.
//!
//! How long the parts take (poll mode, 20 runs, from a `--quick` run of 5 × 4; one run is
//! the wait for a steady leader, a random phase in [0, I) and the fault's own time, so it
//! scales with I; 2 vCPU, 2026-12):
//!
//! | fault | I = 1 s | I = 5 s |
//! |---|---|---|
//! | graceful, SIGKILL (a fresh replica starts after each) | ≈ 40 s each | ≈ 3.2 min each |
//! | terminate | ≈ 25 s | ≈ 1.7 min |
//! | partition (≈ 4·I per run) | ≈ 1.5 min | ≈ 7.5 min |
//! | freeze (≈ 5·I per run) | ≈ 1.8 min | ≈ 9 min |
//! | restart fast, immediate | ≈ 20 s each | ≈ 1.5 min each |
//! | one (mode, I) part, all seven faults | ≈ 6 min | ≈ 28 min |
//!
//! So `--mode poll --interval both` takes about 35 minutes and everything about 65 (the fast
//! mode saves only the takeover wait, about I/2 per run of graceful, SIGKILL and terminate);
//! `--quick` takes a quarter of that. Each (mode, I) part prints its table when it ends, so a
//! long run can be read as it goes.
//!
//! Three replicas run as child processes (this binary run again with `--replica`), each
//! connected to a private PostgreSQL (started by the harness; the restarts need a private one)
//! through its own loopback [`FaultProxy`], which passes bytes
//! except in the partition. Each (mode, I) part gets a database of its own and a fleet of its
//! own. Each child prints every leadership transition with a µs UNIX timestamp, read from a
//! watcher thread that polls `is_leader()` every millisecond, so every figure is ±1 ms. Every
//! run starts from a steady fleet with one leader that has led for at least one I since the
//! last replica started, then waits a random part of I, so the fault falls at a random phase
//! of the replicas' check ticks, and then:
//!
//! - `graceful`: the leader's shutdown token is cancelled (it demotes, then unlocks); a fresh
//!   replica takes its place before the next run;
//! - `sigkill`: the leader's process is killed; a fresh replica takes its place;
//! - `terminate`: `pg_terminate_backend` on the lock session (E15: the old leader lives on and
//!   notices by itself within 1 ms; the new term waits 5 ms after a grant that was not handed
//!   over, so the two-leader column must read 0);
//! - `reset`: the leader's proxy resets every connection (a TCP RST both ways), which the old
//!   leader hears as the server does: as a terminate, two leaders must read 0;
//! - `partition`: the leader's proxy blackholes (E14), and passes again after the takeover;
//! - `freeze`: the leader's process is SIGSTOPped (E13, E18); once another replica leads it is
//!   SIGCONTed and watched for one more I, in which it must neither lead nor tick;
//! - `restart-fast` / `restart-immediate`: `pg_ctl restart -m fast|immediate`; the takeover is
//!   counted from the moment the server accepts connections again, "no leader" from the fault.
//!
//! **How the frozen leader is counted.** A stopped process cannot act, but its watcher thread
//! is stopped too, so it reports its demotion only when it runs again, stamped after the
//! SIGCONT: counted naively, its whole freeze after the takeover would look like two leaders.
//! What matters is whether it acts as leader once it runs again, and E18 says it must not: its
//! local lease has expired by then. The watcher says what its first read after the gap found
//! (`woke leader|standby`, see `tests/replica/mod.rs`), so the old leader's term is counted as
//! ending at the SIGSTOP when that read found it standby and none of its ticks or leader
//! reports arrived after the SIGCONT; otherwise it counts as leading again from that read (or
//! from the SIGCONT, if a tick arrived first) until it said standby, which shows up as
//! two-leader time, and the run is flagged. The "old leader demoted" column of a freeze shows
//! the time from SIGCONT to its standby report instead (the watcher's wake-up). Each database
//! has `idle_in_transaction_session_timeout = 2·I`, as the README asks of a fencing
//! application, so a leader frozen inside a fenced transaction cannot hold off the next term.
//!
//! With fewer than 100 runs the nearest-rank p99 is the maximum; the output says so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_harness::{FaultProxy, PgServer, ShutdownMode, TestDb, replica};
use pg_elector_tools::args::{Args, names};
use pg_elector_tools::block_on;
use pg_elector_tools::rng::xorshift;
use pg_elector_tools::stats::{percentile, sorted, summary};
use replica::{Event, What, leaders, transitions, unix_us, us};
use rustix::process::Signal;

/// The arguments that make this binary a replica.
const CHILD: &[&str] = &["--replica"];
const KEY: LockKey = LockKey::new(0x6661_696c, 1); // "fail"
const SLOTS: usize = 3;
const DEFAULT_REPS: usize = 20;
const QUICK_REPS: usize = 5;

const USAGE: &str = "usage: cargo run --release -p pg-elector-tools --bin failover -- [--mode poll|fast|both] \
[--interval 1|5|both|<seconds>[,…]] [--scenario all|graceful|sigkill|terminate|reset|partition|freeze|restart|restart-fast|restart-immediate[,…]] \
[--reps N] [--quick]";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--replica") {
        replica::child();
        return;
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("failover: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    block_on(bench(options));
}

// ---------------------------------------------------------------------------------------------
// Options.

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

#[derive(Debug)]
struct Options {
    modes: Vec<Mode>,
    intervals: Vec<Duration>,
    scenarios: Vec<Scenario>,
    reps: usize,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options {
            modes: vec![Mode::Poll, Mode::Fast],
            intervals: vec![Duration::from_secs(1), Duration::from_secs(5)],
            scenarios: Scenario::ALL.to_vec(),
            reps: std::env::var("FAILOVER_REPS")
                .ok()
                .map(|n| n.parse().map_err(|_| "FAILOVER_REPS takes a number"))
                .transpose()?
                .unwrap_or(DEFAULT_REPS),
        };
        let mut reps_given = std::env::var("FAILOVER_REPS").is_ok();
        let mut quick = false;
        let mut args = Args::new(args);
        while let Some(flag) = args.next_flag() {
            match flag {
                "--quick" => quick = true,
                "--reps" => {
                    options.reps = args
                        .value()?
                        .parse()
                        .map_err(|_| "--reps takes a number".to_owned())?;
                    reps_given = true;
                }
                "--mode" => {
                    options.modes = match args.value()?.as_str() {
                        "poll" => vec![Mode::Poll],
                        "fast" => vec![Mode::Fast],
                        "both" | "all" => vec![Mode::Poll, Mode::Fast],
                        other => return Err(format!("unknown mode {other:?}")),
                    }
                }
                "--interval" => {
                    let v = args.value()?;
                    options.intervals = if v == "both" || v == "all" {
                        vec![Duration::from_secs(1), Duration::from_secs(5)]
                    } else {
                        v.split(',').map(parse_interval).collect::<Result<_, _>>()?
                    };
                }
                "--scenario" | "--scenarios" => {
                    options.scenarios = names(&args.value()?, Scenario::by_name)?;
                }
                _ => args.other()?,
            }
        }
        if quick && !reps_given {
            options.reps = QUICK_REPS;
        }
        if options.reps == 0 {
            return Err("--reps must be at least 1".into());
        }
        Ok(options)
    }
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1.0)
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .map(|s| Duration::from_secs_f64(s * scale))
        .ok_or_else(|| format!("--interval: {text:?} is not a number of seconds"))
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
    interval: Duration,
}

impl Fleet {
    async fn start(db: &TestDb, server: &PgServer, interval: Duration, mode: Mode) -> Self {
        let mut proxies = Vec::new();
        for _ in 0..SLOTS {
            proxies.push(FaultProxy::start(server.addr()).await.expect("a proxy"));
        }
        let mut replicas = replica::Fleet::new(CHILD, db.url(), KEY, interval);
        // FAILOVER_NO_FENCING=1: the replicas neither fence nor write, so a takeover has no
        // epoch bump (whose commit waits for a WAL flush) in it.
        replicas.fenced = std::env::var_os("FAILOVER_NO_FENCING").is_none();
        replicas.fast = mode == Mode::Fast;
        let mut fleet = Fleet {
            replicas,
            slots: Vec::new(),
            live: [0; SLOTS],
            proxies,
            interval,
        };
        // Staggered starts, so that the replicas' check ticks do not share one phase.
        let mut seed = unix_us() | 1;
        for slot in 0..SLOTS {
            fleet.spawn(slot);
            tokio::time::sleep(Duration::from_micros(xorshift(&mut seed) % us(interval))).await;
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
        let interval = self.interval;
        self.replicas
            .wait(Duration::from_secs(60) + 4 * interval, |events| {
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
                            && e.at > last_start + us(interval)
                    })
                    .then_some(leader)
            })
            .await
            .ok_or_else(|| "no steady single leader within 60 s + 4·I".to_owned())
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Graceful,
    Sigkill,
    Terminate,
    Reset,
    Partition,
    Freeze,
    Restart(ShutdownMode),
}

impl Scenario {
    const ALL: [Scenario; 8] = [
        Scenario::Graceful,
        Scenario::Sigkill,
        Scenario::Terminate,
        Scenario::Reset,
        Scenario::Partition,
        Scenario::Freeze,
        Scenario::Restart(ShutdownMode::Fast),
        Scenario::Restart(ShutdownMode::Immediate),
    ];

    fn by_name(name: &str) -> Result<Vec<Scenario>, String> {
        Ok(match name {
            "all" => Scenario::ALL.to_vec(),
            "graceful" => vec![Scenario::Graceful],
            "sigkill" | "kill" => vec![Scenario::Sigkill],
            "terminate" => vec![Scenario::Terminate],
            "reset" => vec![Scenario::Reset],
            "partition" => vec![Scenario::Partition],
            "freeze" | "sigstop" => vec![Scenario::Freeze],
            "restart" => vec![
                Scenario::Restart(ShutdownMode::Fast),
                Scenario::Restart(ShutdownMode::Immediate),
            ],
            "restart-fast" => vec![Scenario::Restart(ShutdownMode::Fast)],
            "restart-immediate" => vec![Scenario::Restart(ShutdownMode::Immediate)],
            other => return Err(format!("unknown scenario {other:?}")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful shutdown",
            Scenario::Sigkill => "SIGKILL of the leader process",
            Scenario::Terminate => "pg_terminate_backend",
            Scenario::Reset => "connection reset (proxy RST)",
            Scenario::Partition => "partition (blackhole)",
            Scenario::Freeze => "frozen leader (SIGSTOP, SIGCONT)",
            Scenario::Restart(ShutdownMode::Immediate) => "server restart, immediate",
            Scenario::Restart(_) => "server restart, fast",
        }
    }

    /// How long to wait for the new leader after the fault.
    fn limit(self, interval: Duration) -> Duration {
        match self {
            Scenario::Partition => 10 * interval,
            Scenario::Freeze => 8 * interval,
            Scenario::Restart(_) => Duration::from_secs(60) + 2 * interval,
            _ => 5 * interval,
        }
    }
}

/// One run, in µs.
#[derive(Clone, Debug)]
struct Sample {
    none: u64,
    both: u64,
    /// From the fault to the old leader's demotion (none for a killed or frozen process).
    demoted: Option<u64>,
    /// Frozen leader: from SIGCONT to its standby report.
    resumed: Option<u64>,
    /// From the fault (for a restart: from the server accepting again) to the new leader.
    takeover: u64,
    /// From the old term's last fenced write to the new term's first, by the server's clock;
    /// negative would mean the writes of two terms interleaved.
    write_gap: Option<i64>,
    /// Something that must not happen (a frozen leader acting after SIGCONT).
    wrong: Option<String>,
}

struct Bench {
    server: Arc<PgServer>,
    db: TestDb,
    admin: tokio_postgres::Client,
    fleet: Fleet,
    seed: u64,
    interval: Duration,
    mode: Mode,
}

async fn connect(db: &TestDb) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = db
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

impl Bench {
    async fn new(server: Arc<PgServer>, interval: Duration, mode: Mode) -> Self {
        let db = server.create_database().await.expect("a database");
        let admin = connect(&db).await.expect("an admin connection");
        admin
            .batch_execute(&format!(
                "CREATE TABLE replica_writes (replica text NOT NULL, epoch bigint NOT NULL, \
                 at timestamptz NOT NULL DEFAULT clock_timestamp()); \
                 ALTER DATABASE \"{}\" SET idle_in_transaction_session_timeout = '{}ms'",
                db.name(),
                (2 * interval).as_millis()
            ))
            .await
            .expect("the writes table and the database's settings");
        let fleet = Fleet::start(&db, &server, interval, mode).await;
        Bench {
            server,
            db,
            admin,
            fleet,
            seed: unix_us() | 1,
            interval,
            mode,
        }
    }

    /// A fresh fleet after a failed run, whatever state the old one was left in.
    async fn restart_fleet(&mut self) {
        let fleet = Fleet::start(&self.db, &self.server, self.interval, self.mode).await;
        drop(std::mem::replace(&mut self.fleet, fleet));
        if let Ok(admin) = connect(&self.db).await {
            self.admin = admin;
        }
    }

    fn random_phase(&mut self) -> Duration {
        Duration::from_micros(xorshift(&mut self.seed) % us(self.interval))
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
        if scenario == Scenario::Freeze {
            return self.run_freeze().await;
        }
        let old = self.fleet.steady().await?;
        let slot = self.fleet.slots[old];
        let epoch = self.newest_epoch().await;
        let phase = self.random_phase();
        tokio::time::sleep(phase).await;
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
            Scenario::Reset => {
                let at = unix_us();
                self.fleet.proxies[slot].reset();
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
            Scenario::Freeze => unreachable!("run_freeze"),
        };
        let n = self.fleet.replicas.procs.len();
        let settled = self
            .fleet
            .replicas
            .wait(scenario.limit(self.interval), |events| {
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
            Scenario::Graceful | Scenario::Sigkill => {
                self.fleet.replicas.reap(old).await;
                self.fleet.spawn(slot);
            }
            Scenario::Partition => self.fleet.proxies[slot].pass(),
            Scenario::Terminate | Scenario::Reset | Scenario::Freeze => {}
            Scenario::Restart(_) => {
                let (back, restarting) = restart.take().expect("a restart runs");
                restarting
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                accepting = Some(back.await.map_err(|e| e.to_string())?);
                self.admin = connect(&self.db).await?;
            }
        }
        let (old_end, new) = settled.ok_or_else(|| {
            format!(
                "{}: no new single leader within {:?} of the fault",
                scenario.name(),
                scenario.limit(self.interval)
            )
        })?;
        let events = self.fleet.replicas.events();
        let (none, both) = integrate(&events, n, t0, old_end.at.max(new.at));
        Ok(Sample {
            none,
            both,
            demoted: (old_end.what != What::Killed).then(|| old_end.at.saturating_sub(t0)),
            resumed: None,
            takeover: new.at.saturating_sub(accepting.unwrap_or(t0)),
            write_gap: self.write_gap(epoch).await,
            wrong: None,
        })
    }

    /// The frozen leader: SIGSTOP, wait for another leader, SIGCONT, watch one more I. See the
    /// header comment for how its term is counted.
    async fn run_freeze(&mut self) -> Result<Sample, String> {
        let interval = self.interval;
        let old = self.fleet.steady().await?;
        let epoch = self.newest_epoch().await;
        let phase = self.random_phase();
        tokio::time::sleep(phase).await;
        let replicas = &self.fleet.replicas;
        let stopped = replicas
            .try_signal(old, Signal::STOP)
            .map_err(|e| e.to_string())?;
        let new = replicas
            .wait(Scenario::Freeze.limit(interval), |events| {
                events
                    .iter()
                    .find(|e| e.replica != old && e.what == What::Leader && e.at > stopped)
                    .copied()
            })
            .await;
        // Whatever happened, the old leader runs again. The process is stopped, so every event
        // it sends from here on arrives after this index.
        let index = replicas.board.events.lock().unwrap().len();
        let resumed = replicas
            .try_signal(old, Signal::CONT)
            .map_err(|e| e.to_string())?;
        let new = new.ok_or_else(|| {
            format!(
                "no other replica led within {:?} of the SIGSTOP",
                Scenario::Freeze.limit(interval)
            )
        })?;
        let standby = replicas
            .wait(interval.max(Duration::from_secs(1)) * 2, |events| {
                events[index.min(events.len())..]
                    .iter()
                    .find(|e| e.replica == old && e.what == What::Standby)
                    .copied()
            })
            .await;
        // Watch it for one more I: its next try must be refused, and it must not tick.
        tokio::time::sleep(interval).await;
        let until = unix_us();
        let events = replicas.events();
        let after: Vec<Event> = events[index..]
            .iter()
            .filter(|e| e.replica == old)
            .copied()
            .collect();
        let woke = after
            .iter()
            .find(|e| matches!(e.what, What::Woke { .. }))
            .copied();
        let acted: Vec<Event> = after
            .iter()
            .filter(|e| matches!(e.what, What::Tick | What::Leader))
            .copied()
            .collect();
        // From when it counts as leading again after the SIGCONT, if at all.
        let led_again = match woke {
            Some(Event {
                at,
                what: What::Woke { leading: true },
                ..
            }) => Some(at),
            Some(_) if acted.is_empty() => None,
            _ => Some(resumed),
        };
        let mut wrong = Vec::new();
        if let Some(at) = led_again {
            wrong.push(format!(
                "the old leader counted as leading again {:.1} ms after SIGCONT (woke: {:?})",
                at.saturating_sub(resumed) as f64 / 1e3,
                woke.map(|e| e.what)
            ));
        }
        if !acted.is_empty() {
            wrong.push(format!("it acted after SIGCONT: {acted:?}"));
        }
        if standby.is_none() {
            wrong.push("it never said standby after SIGCONT".into());
        }
        let n = self.fleet.replicas.procs.len();
        let now_leading = leaders(&events, n);
        if now_leading != vec![new.replica] {
            wrong.push(format!(
                "after the watch the leaders are {now_leading:?}, not [{}]",
                new.replica
            ));
        }
        // The effective transitions: the old leader's term ends at the SIGSTOP; what it
        // reported after the SIGCONT counts only if it led again.
        let mut effective: Vec<Event> = Vec::with_capacity(events.len() + 2);
        for (i, e) in events.iter().enumerate() {
            if i >= index && e.replica == old && led_again.is_none() {
                continue;
            }
            effective.push(*e);
        }
        effective.push(Event {
            replica: old,
            at: stopped,
            what: What::Standby,
        });
        if let Some(at) = led_again {
            effective.push(Event {
                replica: old,
                at,
                what: What::Leader,
            });
        }
        let (none, both) = integrate(&effective, n, stopped, until);
        Ok(Sample {
            none,
            both,
            demoted: None,
            resumed: standby.map(|s| s.at.saturating_sub(resumed)),
            takeover: new.at.saturating_sub(stopped),
            write_gap: self.write_gap(epoch).await,
            wrong: (!wrong.is_empty()).then(|| wrong.join("; ")),
        })
    }

    /// The newest epoch that has written so far (the steady leader's, before a fault).
    async fn newest_epoch(&self) -> Option<i64> {
        self.admin
            .query_one("SELECT max(epoch) FROM replica_writes", &[])
            .await
            .ok()
            .and_then(|row| row.get(0))
    }

    /// The gap (µs) between the last fenced write of epoch `old` (the leader's before the
    /// fault) and the first write of any later epoch, once a later epoch has written (a leader
    /// ticks every I/10); `None` if none has within 2 s + I/5. Negative: the two terms' writes
    /// interleaved. A term that began and wrote nothing in between does not count.
    async fn write_gap(&self, old: Option<i64>) -> Option<i64> {
        let old = old?;
        let query = "SELECT (extract(epoch FROM \
                       (SELECT min(at) FROM replica_writes WHERE epoch > $1) \
                     - (SELECT max(at) FROM replica_writes WHERE epoch = $1)) * 1e6)::int8 \
             WHERE EXISTS (SELECT FROM replica_writes WHERE epoch > $1)";
        let deadline = Instant::now() + Duration::from_secs(2) + self.interval / 5;
        while Instant::now() < deadline {
            if let Ok(Some(row)) = self.admin.query_opt(query, &[&old]).await {
                return row.get(0);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// The runs and the tables.

/// The results of one scenario in one (mode, I) part.
struct Outcome {
    scenario: Scenario,
    samples: Vec<Sample>,
    failed: usize,
    took: Duration,
}

struct Part {
    mode: Mode,
    interval: Duration,
    outcomes: Vec<Outcome>,
    took: Duration,
}

async fn bench(options: Options) {
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

async fn run_part(
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
    let trace = std::env::var_os("FAILOVER_TRACE").is_some();
    if trace {
        // Statement end times, backend exits and wait times in the server log, in ms.
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
    }
    let mut server_log_at = log_file
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let mut outcomes = Vec::new();
    for &scenario in &options.scenarios {
        let scenario_started = Instant::now();
        let mut samples = Vec::new();
        let mut failed = 0;
        for rep in 0..options.reps {
            let tag = format!(
                "[{} I={interval:?}] {} #{rep}",
                mode.name(),
                scenario.name()
            );
            let logs_at = bench.fleet.replicas.board.logs.lock().unwrap().len();
            let events_at = bench.fleet.replicas.events().len();
            let outcome = bench.run_once(scenario).await;
            if trace {
                // FAILOVER_TRACE=1: what the replicas (RUST_LOG) and the server logged in the run.
                eprintln!("--- {tag}: trace ---");
                for e in bench.fleet.replicas.events().iter().skip(events_at) {
                    eprintln!("  event: {} {} {:?}", e.at, e.replica, e.what);
                }
                let logs = bench.fleet.replicas.board.logs.lock().unwrap();
                for line in logs.iter().skip(logs_at) {
                    eprintln!("  {line}");
                }
                if let Some(text) = log_file.as_ref().and_then(|p| std::fs::read(p).ok()) {
                    let from = (server_log_at as usize).min(text.len());
                    for line in String::from_utf8_lossy(&text[from..]).lines() {
                        eprintln!("  server: {line}");
                    }
                    server_log_at = text.len() as u64;
                }
                eprintln!("--- end of trace ---");
            }
            match outcome {
                Ok(s) => {
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
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!("{tag}: FAILED: {e}");
                    {
                        let logs = bench.fleet.replicas.board.logs.lock().unwrap();
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
            options.reps,
            minutes(took)
        );
        outcomes.push(Outcome {
            scenario,
            samples,
            failed,
            took,
        });
    }
    drop(bench);
    Part {
        mode,
        interval,
        outcomes,
        took: started.elapsed(),
    }
}

fn p99_label(reps: usize) -> String {
    if reps < 100 {
        format!("p99 (= max of {reps})")
    } else {
        "p99".into()
    }
}

fn print_part(part: &Part, reps: usize) {
    let i_ms = part.interval.as_millis();
    println!();
    println!(
        "### {} mode, I = {:?} ({reps} runs per fault, {})",
        part.mode.name(),
        part.interval,
        minutes(part.took)
    );
    println!();
    println!(
        "ms, p50 / {} / max (nearest rank). Takeover: fault → new leader; two leaders: time two replicas both said they led.",
        p99_label(reps)
    );
    println!();
    println!(
        "| scenario | runs | takeover | two leaders | old leader demoted | no leader | last old write → first new write | time |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for o in &part.outcomes {
        let samples = &o.samples;
        let demoted: Vec<u64> = samples.iter().filter_map(|s| s.demoted).collect();
        let resumed: Vec<u64> = samples.iter().filter_map(|s| s.resumed).collect();
        let gaps: Vec<i64> = samples.iter().filter_map(|s| s.write_gap).collect();
        let interleaved = gaps.iter().filter(|&&g| g < 0).count();
        let wrong = samples.iter().filter(|s| s.wrong.is_some()).count();
        let restart = matches!(o.scenario, Scenario::Restart(_));
        println!(
            "| {}{} | {}{}{} | {}{} | {} | {} | {}{} | {}{} | {} |",
            o.scenario.name(),
            if o.scenario == Scenario::Freeze {
                " ³"
            } else {
                ""
            },
            samples.len(),
            if o.failed > 0 {
                format!(" ({} failed)", o.failed)
            } else {
                String::new()
            },
            if wrong > 0 {
                format!(" ({wrong} WRONG)")
            } else {
                String::new()
            },
            summary(samples.iter().map(|s| s.takeover).collect(), ms),
            if restart { " ¹" } else { "" },
            summary(samples.iter().map(|s| s.both).collect(), ms),
            if !demoted.is_empty() {
                summary(demoted, ms)
            } else if !resumed.is_empty() {
                format!("after SIGCONT: {}", summary(resumed, ms))
            } else {
                "(process gone)".into()
            },
            summary(samples.iter().map(|s| s.none).collect(), ms),
            if restart { " ²" } else { "" },
            summary(gaps.iter().map(|&g| g.max(0) as u64).collect(), ms),
            if interleaved > 0 {
                format!(" ({interleaved} INTERLEAVED)")
            } else {
                String::new()
            },
            minutes(o.took),
        );
    }
    println!();
    println!(
        "¹ from the server accepting connections again. ² includes the server's own downtime. \
         ³ the old leader's term counts as ending at the SIGSTOP unless it led or ticked after the \
         SIGCONT; \"old leader demoted\" is SIGCONT → its standby report."
    );
    // The targets of design §6 and what the design allows.
    let i = |k: u64| k * i_ms as u64 * 1000;
    let mut checks = Vec::new();
    for o in &part.outcomes {
        if o.samples.is_empty() {
            continue;
        }
        let max = |f: &dyn Fn(&Sample) -> Option<u64>| o.samples.iter().filter_map(f).max();
        let takeover_max = max(&|s| Some(s.takeover)).unwrap_or(0);
        let both_max = max(&|s| Some(s.both)).unwrap_or(0);
        let name = o.scenario.name();
        let check = |what: &str, value: u64, bound: u64| {
            format!(
                "- {name}: {what} {} ms ≤ {} ms: {}",
                ms(value),
                ms(bound),
                if value <= bound { "met" } else { "**missed**" }
            )
        };
        match (o.scenario, part.mode) {
            (
                Scenario::Graceful | Scenario::Sigkill | Scenario::Terminate | Scenario::Reset,
                Mode::Poll,
            ) => {
                // A try finds the lock free within I; a grant that was not handed over (every
                // try's, in a fleet without waiting standbys) starts its term 5 ms later.
                checks.push(check(
                    "takeover p99 (1·I + the 5 ms wait)",
                    p99(&o.samples, |s| s.takeover),
                    i(1) + 5_000,
                ));
            }
            (
                Scenario::Graceful | Scenario::Sigkill | Scenario::Terminate | Scenario::Reset,
                Mode::Fast,
            ) => {
                checks.push(check(
                    "takeover p99 (F1)",
                    p99(&o.samples, |s| s.takeover),
                    20_000,
                ));
            }
            (Scenario::Partition, _) => {
                checks.push(check(
                    "old leader demoted, max",
                    max(&|s| s.demoted).unwrap_or(0),
                    i(2),
                ));
                checks.push(check("new leader, max", takeover_max, i(5)));
            }
            (Scenario::Freeze, _) => {
                checks.push(check("new leader, max (E13)", takeover_max, i(5)));
                checks.push(check(
                    "SIGCONT → standby, max (E18)",
                    max(&|s| s.resumed).unwrap_or(0),
                    100_000,
                ));
            }
            _ => {}
        }
        // Every fault here hits a leader that can hear the server: never two leaders, a
        // terminate and a reset included (the new term waits out the old leader's notice).
        checks.push(check("two leaders, max", both_max, 0));
        for s in &o.samples {
            if let Some(w) = &s.wrong {
                checks.push(format!("- {}: **WRONG**: {w}", o.scenario.name()));
            }
        }
        if o.failed > 0 {
            checks.push(format!(
                "- {}: **{} of {} runs failed** (see stderr)",
                o.scenario.name(),
                o.failed,
                o.failed + o.samples.len()
            ));
        }
    }
    if !checks.is_empty() {
        println!();
        println!("Against design §6 (I = {} ms):", i_ms);
        println!();
        for line in checks {
            println!("{line}");
        }
    }
}

/// Poll against fast, per I, when both modes ran.
fn print_comparison(parts: &[Part], reps: usize) {
    let mut intervals: Vec<Duration> = parts.iter().map(|p| p.interval).collect();
    intervals.dedup();
    for interval in intervals {
        let find = |mode| {
            parts
                .iter()
                .find(|p| p.interval == interval && p.mode == mode)
        };
        let (Some(poll), Some(fast)) = (find(Mode::Poll), find(Mode::Fast)) else {
            continue;
        };
        println!();
        println!(
            "### poll vs fast, I = {interval:?} ({reps} runs each; ms, p50 / {} / max)",
            p99_label(reps)
        );
        println!();
        println!(
            "| scenario | takeover, poll | takeover, fast | two leaders, poll | two leaders, fast |"
        );
        println!("|---|---|---|---|---|");
        for p in &poll.outcomes {
            let Some(f) = fast.outcomes.iter().find(|f| f.scenario == p.scenario) else {
                continue;
            };
            let stat =
                |o: &Outcome, v: fn(&Sample) -> u64| summary(o.samples.iter().map(v).collect(), ms);
            println!(
                "| {} | {} | {} | {} | {} |",
                p.scenario.name(),
                stat(p, |s| s.takeover),
                stat(f, |s| s.takeover),
                stat(p, |s| s.both),
                stat(f, |s| s.both),
            );
        }
    }
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e3)
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn p99(samples: &[Sample], value: fn(&Sample) -> u64) -> u64 {
    let values: Vec<u64> = samples.iter().map(value).collect();
    percentile(&sorted(values), 0.99).unwrap_or(0)
}
