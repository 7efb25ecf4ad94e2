//! Chaos soak (issue 12): random faults, one at a time or overlapping, against a fleet of
//! replica processes, and checks from outside the replicas that the README's guarantees held
//! ("Guarantees, in multiples of I", "Fast takeover", "Writes a deposed leader cannot make").
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin soak -- --duration 60s                  # CI's run; a random seed, printed
//! cargo run --release -p pg-elector-tools --bin soak -- --seed 4242 --duration 60s      # the same draws again
//! cargo run --release -p pg-elector-tools --bin soak -- --mode poll --faults stop,partition --verbose
//! scripts/soak-long                                           # ≈ 1 h: poll, fast and mixed
//! ```
//!
//! Options (after `--`): `--seed N` (default: from the clock, or `SOAK_SEED`), `--duration`
//! (default `60s`; `90`, `5m`, `1h` work too), `--replicas N` (default 5), `--interval-ms`
//! (the check interval I, default 250), `--mode poll|fast|mixed` (default `mixed`),
//! `--faults all|<kind>[,<kind>…]`, `--overlap P` (default 0.25), `--no-keep-one`,
//! `--out FILE` (the report, also written there), `--verbose` (each fault as it is injected),
//! `--sabotage split-key` (checks the checker, below). It exits 1 on any violation, 2 on a
//! bad option.
//!
//! # The fleet
//!
//! A private PostgreSQL from the harness ([`PgServer::spawn`]; with `DATABASE_URL` set, that
//! server, and no restarts), one database, one [`FaultProxy`] per replica slot, and N replica
//! processes (this binary again, with `--soak-replica`; see `soak/child.rs`), each connected
//! through its slot's proxy. Each runs one elector on one key with fencing, identity
//! `replica-<n>` (n counts every process spawned), I, a drain timeout of I, and fast takeover
//! per `--mode`: `mixed` draws it from the seed at every spawn, so both kinds stand by side by
//! side and a slot changes kind over the run. Its elector's pool and the ticker's own pool
//! have two connections each. The ticker calls `do_work` every I/10 and writes one row
//! inside a transaction after `Term::fence`: replica, epoch, the server's `clock_timestamp()`.
//! The database has `idle_in_transaction_session_timeout` = 2·I, as the README asks of a
//! fencing application. Slot 0 is never killed nor restarted (`--no-keep-one` lifts that), so
//! one process lives through the run and its memory is measured over all of it.
//!
//! # The faults
//!
//! After a gap drawn from [I/4, 2·I], the next fault starts: with probability `--overlap`
//! at once, possibly while earlier ones still run; otherwise once every fault has healed and
//! the fleet is steady again (every slot's process up, exactly one leader). Its kind is drawn
//! with weight 2, restarts 1; it aims at the leader with probability 0.6, else at a random
//! replica whose slot no running fault holds. Bounds, from the README's table, each with a
//! slack of **I/2 + 250 ms** for a loaded 2-core machine (both modes get the poll bounds: a fast
//! standby whose waiting session broke falls back to them; the table shows what fast takeover
//! achieved):
//!
//! | fault (`--faults` name) | what | new leader by | two leaders | old leader demoted |
//! |---|---|---|---|---|
//! | `kill` | SIGKILL; respawn after [0, I] | 1·I | never | (gone) |
//! | `stop` | SIGSTOP for [max(I/2, 150 ms), 6·I], SIGCONT | 5·I, or SIGCONT + 1·I | never | frozen > 3·I: never acts on resume |
//! | `terminate-lock` | `pg_terminate_backend` of the lock's holder | 1·I | ≤ 100 ms | ≤ 100 ms |
//! | `terminate-random` | `pg_terminate_backend` of any backend of a replica | 1·I | ≤ 100 ms if it was the holder | the same |
//! | `partition` | proxy blackhole for [I/2, 8·I], then pass | 5·I, or heal + 1·I | never | ≤ 2·I (when it lasted longer) |
//! | `reset` | proxy reset (RST on every connection) | 1·I | ≤ 100 ms | ≤ 100 ms |
//! | `restart-fast`, `restart-immediate` | `pg_ctl restart -m …` | accepting again + 1·I | never | ≤ 100 ms |
//! | `exhaust` | dummy borrowers hold the elector's pool for [I, 4·I] | the end + 1·I | never | — |
//! | `graceful` | `stop` on stdin (drain, unlock, exit); respawn after [0, I] | 2·I (drain ≤ I, then 1·I) | never | ≤ 100 ms |
//! | `resign` | `resign` with a cooldown in [0, 4·I] | 2·I | never | ≤ 100 ms |
//!
//! "≤ 100 ms" stands for the README's "≤ 20 ms + scheduling". A graceful shutdown that has
//! not exited after I + 2 s + slack + 1 s is a violation too.
//!
//! **Scheduling.** On a machine loaded far beyond its cores every process stalls now and then,
//! for hundreds of milliseconds, the soak's own included. Two things keep such stalls from
//! passing for violations, and the report shows how much they mattered. A fault's time is when
//! it took effect: the proxies run as tasks in the soak's own process, so a reset counts from
//! when every connection it had has closed (its RSTs sent), and a blackhole or a heal from
//! when that process's runtime next ran a task after the change; signals, queries and restarts
//! act at once. And each bound is extended by the time, within it, that a thread of the soak
//! that sleeps 1 ms at a time ran more than 20 ms late (the machine stalled), or a task on its
//! runtime that does the same (the proxies, which run there, held every replica's traffic); a
//! demotion or an overlap bound is also extended by the gaps of more than 100 ms between the
//! old leader's own watcher reads. The seed fixes every draw (gaps, kinds, aims, lengths,
//! modes) in a fixed order; which process a fault hits, and so the run,
//! also depends on timing. A replay reruns the same schedule of draws, which is what finds a
//! scenario again in practice.
//!
//! # The checks
//!
//! All from outside the replicas, after the faults are over and the fleet has settled:
//!
//! - **Reported state.** Each replica's watcher reads `is_leader()` every millisecond and
//!   stamps each read on both sides (µs, the machine's clock; see `soak/child.rs`), so each term
//!   is known to have certainly lasted from the first leading read to the last, and possibly
//!   from the read before to the read after. A SIGSTOPped replica counts as not leading from
//!   the SIGSTOP to the SIGCONT (its watcher is stopped too, and it cannot act): what matters
//!   is what it does on resume, checked apart. *Two leaders*: two replicas certainly leading at
//!   once; every instant of it must fall within the allowance of a fault that has one, and no
//!   fault a leader can hear has one (a terminate or a reset of a leader that hears it included:
//!   it steps down within 1 ms, before the next term begins). A session the server ends while
//!   its leader cannot hear it (a terminate or a restart while
//!   that leader is partitioned; a terminate, a reset or a restart while it is frozen) lets a
//!   standby lead before the old leader can notice: that overlap is allowed until it can, by
//!   the partition's demotion bound (2·I, or 100 ms after the heal if sooner) or 100 ms after
//!   the SIGCONT. The README's table does not cover that combination; the report lists each.
//!   *Leaderless*: no replica possibly leading; every leaderless instant must fall within the
//!   bound of some fault (from its injection to the later of injection plus "new leader by"
//!   and heal plus "after heal", plus the slack), except a gap that begins with no fault in
//!   effect (a leader that stepped down by itself, say a check slower than I on a loaded
//!   machine), which is allowed 1·I and the slack, and listed. No leader within 10 s of the
//!   start is a violation too.
//! - **Demotion.** The leader a fault hit may have led no longer than its bound (table).
//!   A leader frozen longer than 3·I + 50 ms must read standby at its first read after the
//!   SIGCONT, and write no row of its old epoch after it.
//! - **Fenced rows**, ordered by the server's `clock_timestamp()`: epochs never go back (a row
//!   of epoch e after a row of a later epoch means two terms' writes interleaved); each epoch's
//!   rows come from one replica; no row of epoch e is written after the sampler saw a later
//!   epoch current (a fenced transaction holds the epoch row, so the next bump commits after
//!   it: this one needs no allowance); and no row of one replica while `pg_locks` had shown
//!   another holding the lock for more than 30 ms (the sampling's resolution), outside the
//!   overlap allowance of a session ended under a leader that could not hear it.
//! - **`pg_locks`**, sampled every 5 ms from a connection of the soak's own (named
//!   `soak-checker`, never a fault's target), with the epoch row in the same statement:
//!   consecutive samples with the same holder and epoch, none more than 30 ms apart, make a
//!   run, within which the holder did not change.
//! - **Backends.** Every 20 s, and at the start and the end, a checkpoint waits for a quiet
//!   fleet and 2 s + 2·I after the last heal, then counts the database's client backends per
//!   `application_name` (each replica's pools name their connections `replica-<n>/pool` and
//!   `/app`; the elector names its lock and waiting sessions `replica-<n>`): none may belong
//!   to a process that has ended, and no live replica may have more than its two pools and one
//!   lock or waiting session (5). A leak persists, so a checkpoint every 20 s sees every leak
//!   of the faults before it.
//! - **Memory.** Each replica's RSS (`/proc/<pid>/status`) every 2 s; for each process that
//!   lived 30 s or more, the growth from its first sample at 10 s of age to its last is a
//!   violation beyond 16 MiB and 50 %.
//!
//! # The report
//!
//! A markdown table, per fault kind: how many were injected, how many hit the leader, how many
//! overlapped earlier ones, the leaderless time p50 / p99 / max (nearest rank) over those that
//! hit the leader (from the fault to the next one, so a fault's gap is attributed to the
//! latest fault before it), the most two-leader time, the bounds, and the violations
//! attributed to it. Then the rows, the samples, the backends, the memory, the overlaps that
//! were within an allowance, and each violation with its offset from the start of the
//! injection and the command that replays it. `--out FILE` writes the same text to a file;
//! the faults, the sampled lock holders, the stalls and the log lines of the replicas around
//! the first violations go to stderr.
//!
//! `--sabotage split-key` checks the checker: every process elects on a key of its own, so
//! they all lead at once and write rows of unrelated epochs; such a run must fail (it reports
//! two leaders, rows of one epoch from two replicas, interleaved epochs, rows after a later
//! epoch and rows while another replica held the lock).
//!
//! [`PgServer::spawn`]: pg_elector_harness::PgServer::spawn
//! [`FaultProxy`]: pg_elector_harness::FaultProxy

mod check;
mod child;
mod db;
mod faults;
mod fleet;
mod options;
mod report;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey};
use pg_elector_harness::PgServer;
use pg_elector_tools::block_on;
use pg_elector_tools::rng::Rng;
use tokio_util::sync::CancellationToken;

use crate::check::{Checkpoint, ProcInfo, Violation};
use crate::child::unix_us;
use crate::faults::{Claims, Fault, Kind, Plan};
use crate::fleet::{Board, Fleet};
use crate::options::{Mode, Options, USAGE};

/// The key every replica elects on ("soak").
const KEY: LockKey = LockKey::new(0x736f_616b, 1);
/// How often the sampler reads `pg_locks` and the epoch row.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// How often the backends and the memory are looked at in a quiet moment.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(20);
/// How often the replicas' RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(2);

/// What the injector, the fault tasks and the checkpoints share.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The run's options.
    pub(crate) options: Options,
    /// The lock key.
    pub(crate) key: LockKey,
    /// The replica processes.
    pub(crate) fleet: tokio::sync::Mutex<Fleet>,
    /// The live process of each slot (a copy of the fleet's, readable without waiting).
    pub(crate) live: Mutex<Vec<usize>>,
    /// What the replicas said.
    pub(crate) board: Arc<Board>,
    /// Every fault so far.
    pub(crate) faults: Mutex<Vec<Fault>>,
    /// Slots and server held by running faults.
    pub(crate) claims: Mutex<Claims>,
    /// The server.
    pub(crate) server: Arc<PgServer>,
    /// The soak database, straight to the server.
    pub(crate) db: tokio_postgres::Config,
    /// Violations seen while the faults ran (a graceful shutdown that hung).
    pub(crate) runtime_violations: Mutex<Vec<Violation>>,
    /// The backends at quiet moments.
    pub(crate) checkpoints: Mutex<Vec<Checkpoint>>,
}

impl Ctx {
    /// Whether some fault is still running (not healed, or its slot not respawned).
    fn any_active(&self) -> bool {
        self.faults.lock().unwrap().iter().any(|f| !f.done)
    }

    /// When the latest fault healed.
    fn last_heal(&self) -> u64 {
        self.faults
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.heal)
            .max()
            .unwrap_or(0)
    }

    /// Every slot's process has started, none is stopped, exactly one leads (any number
    /// under `--sabotage split-key`, where they all lead).
    fn steady(&self) -> bool {
        let live = self.live.lock().unwrap().clone();
        live.iter().all(|&p| {
            let s = self.board.state(p);
            s.started && !s.stopped && !s.ended
        }) && (self.board.leaders().len() == 1 || self.options.split_key)
    }

    /// Waits (at most `limit`) until no fault runs and the fleet is steady.
    async fn quiet(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if !self.any_active() && self.steady() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    /// A quiet moment long after the last heal: counts the backends, samples the memory.
    async fn checkpoint(&self) {
        let settle = Duration::from_secs(2) + self.options.interval * 2;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let since = unix_us().saturating_sub(self.last_heal());
            if self.quiet(Duration::from_secs(30)).await && since >= settle.as_micros() as u64 {
                break;
            }
            if Instant::now() >= deadline {
                eprintln!("soak: no quiet moment for a checkpoint within 60 s; counting anyway");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Ok(client) = db::connect(&self.db).await else {
            eprintln!("soak: checkpoint: cannot connect");
            return;
        };
        let Ok(backends) = db::backends(&client).await else {
            eprintln!("soak: checkpoint: cannot count the backends");
            return;
        };
        let live = self.live.lock().unwrap().clone();
        self.fleet.lock().await.sample_rss();
        self.checkpoints.lock().unwrap().push(Checkpoint {
            at: unix_us(),
            backends,
            live,
        });
    }
}

impl Ctx {
    /// A replica that exited with no fault of the soak's ending it (a panic, `run` failing)
    /// is a violation; its slot gets a new process so that the run goes on.
    async fn respawn_the_dead(&self) {
        let slots = self.claims.lock().unwrap().slots.clone();
        let mut fleet = self.fleet.lock().await;
        for (slot, &claimed) in slots.iter().enumerate() {
            let replica = fleet.live[slot];
            if claimed || !fleet.exited(replica) {
                continue;
            }
            let at = fleet.procs[replica].ended.unwrap_or_else(unix_us);
            self.runtime_violations.lock().unwrap().push(Violation {
                at,
                what: format!("replica-{replica} exited with no fault ending it"),
                fault: None,
                replicas: vec![replica],
            });
            // Ends its term and its state, as a kill would.
            self.board.push(fleet::Event {
                replica,
                at,
                what: fleet::What::Killed,
            });
            let fast = fleet.procs[replica].fast;
            let index = fleet.spawn(slot, fast);
            self.live.lock().unwrap()[slot] = index;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has(child::FLAG) {
        child::main();
        return;
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("soak: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let code = block_on(soak(options));
    std::process::exit(code);
}

async fn soak(options: Options) -> i32 {
    let wall = Instant::now();
    let i = options.interval;
    eprintln!(
        "soak: seed {} (replay with --seed {}), {} of faults, {} replicas, {} mode, I = {} ms",
        options.seed,
        options.seed,
        options::parse_duration("1s").map_or(String::new(), |_| format!("{:?}", options.duration)),
        options.replicas,
        options.mode.name(),
        i.as_millis()
    );
    let server = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            tokio::task::spawn_blocking(move || PgServer::external(url.trim())).await
        }
        _ => tokio::task::spawn_blocking(PgServer::spawn).await,
    }
    .expect("start the server");
    let server = Arc::new(server.unwrap_or_else(|e| panic!("soak: {e}")));
    let mut options = options;
    if !server.is_private() {
        let before = options.faults.len();
        options.faults.retain(|k| !k.needs_private());
        if options.faults.len() < before {
            eprintln!("soak: DATABASE_URL is set: no server restarts (they need a private server)");
        }
        if options.faults.is_empty() {
            eprintln!("soak: no fault left to inject");
            return 2;
        }
    }
    let database = server.create_database().await.expect("a database");
    let admin = db::connect(&database.config()).await.expect("a connection");
    let ddl = Elector::builder(database.pool(1), KEY)
        .fencing(true)
        .build()
        .expect("an elector")
        .fencing_ddl()
        .expect("fencing is on");
    db::prepare(&admin, database.name(), i, &ddl)
        .await
        .expect("the soak's tables and settings");
    let server_version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or_default();
    let offset = db::clock_offset(&admin).await.unwrap_or(0);
    drop(admin);

    // The stall monitor: a thread that sleeps 1 ms at a time and notes when it ran more than
    // 20 ms late, so that the bounds can give the machine's stalls back (see `check::extend`).
    let stalls: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let monitoring = Arc::new(std::sync::atomic::AtomicBool::new(true));
    std::thread::spawn({
        let (stalls, monitoring) = (stalls.clone(), monitoring.clone());
        move || {
            while monitoring.load(std::sync::atomic::Ordering::Relaxed) {
                let before = unix_us();
                std::thread::sleep(Duration::from_millis(1));
                let after = unix_us();
                if after.saturating_sub(before) > 20_000 {
                    stalls.lock().unwrap().push((before + 1_000, after));
                }
            }
        }
    });

    // The same on the soak's runtime, which runs every replica's proxy: a task there that ran
    // late held up the proxied traffic of every replica for that long, as if the whole fleet
    // were partitioned. Those stalls extend the bounds too, and the report counts them apart.
    let runtime_stalls: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let runtime_monitor = tokio::spawn({
        let (stalls, monitoring) = (runtime_stalls.clone(), monitoring.clone());
        async move {
            while monitoring.load(std::sync::atomic::Ordering::Relaxed) {
                let before = unix_us();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let after = unix_us();
                if after.saturating_sub(before) > 20_000 {
                    stalls.lock().unwrap().push((before + 1_000, after));
                }
            }
        }
    });

    // The sampler, from before the first replica starts.
    let samples = Arc::new(db::Samples::default());
    let stop_sampling = CancellationToken::new();
    let sampler = tokio::spawn({
        let (config, samples, stop) = (database.config(), samples.clone(), stop_sampling.clone());
        async move { db::sample(config, KEY, SAMPLE_EVERY, &samples, stop).await }
    });

    // The fleet, staggered so that the replicas' ticks do not share one phase.
    let mut rng = Rng::new(options.seed);
    let mut fleet = Fleet::new(options.replicas, server.addr(), database.url(), KEY, i).await;
    fleet.split_key = options.split_key;
    let start = unix_us();
    for slot in 0..options.replicas {
        let fast = match options.mode {
            Mode::Poll => false,
            Mode::Fast => true,
            Mode::Mixed => rng.chance(0.5),
        };
        fleet.spawn(slot, fast);
        tokio::time::sleep(Duration::from_millis(rng.below(i.as_millis() as u64))).await;
    }
    let board = fleet.board.clone();
    let ctx = Arc::new(Ctx {
        key: KEY,
        live: Mutex::new(fleet.live.clone()),
        fleet: tokio::sync::Mutex::new(fleet),
        board,
        faults: Mutex::new(Vec::new()),
        claims: Mutex::new(Claims {
            slots: vec![false; options.replicas],
            server: false,
        }),
        server: server.clone(),
        db: database.config(),
        runtime_violations: Mutex::new(Vec::new()),
        checkpoints: Mutex::new(Vec::new()),
        options: options.clone(),
    });
    let rss = tokio::spawn({
        let ctx = ctx.clone();
        async move {
            loop {
                tokio::time::sleep(RSS_EVERY).await;
                ctx.fleet.lock().await.sample_rss();
                ctx.respawn_the_dead().await;
            }
        }
    });
    if !ctx.quiet(Duration::from_secs(30)).await {
        eprintln!("soak: the fleet found no single leader within 30 s of its start");
    }
    ctx.checkpoint().await;

    // The faults.
    let injecting = Instant::now();
    let injection_start = unix_us();
    let until = injecting + options.duration;
    let kinds: Vec<Kind> = options.faults.clone();
    let total_weight: u64 = kinds.iter().map(|k| k.weight()).sum();
    let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
    let quiet_limit = i * 10 + Duration::from_secs(10);
    while Instant::now() < until {
        // Every draw comes from the seed, in the same order whatever happens.
        let i_ms = i.as_millis() as u64;
        let gap = Duration::from_millis(rng.between(i_ms / 4, 2 * i_ms));
        let overlap = rng.chance(options.overlap);
        let mut w = rng.below(total_weight);
        let kind = *kinds
            .iter()
            .find(|k| {
                if w < k.weight() {
                    true
                } else {
                    w -= k.weight();
                    false
                }
            })
            .expect("a kind");
        let plan = Plan {
            kind,
            at_leader: rng.chance(0.6),
            pick: rng.next_u64(),
            param: faults::draw_param(kind, i, &mut rng),
            fast: rng.chance(0.5),
        };
        let wait = !(overlap && ctx.any_active());
        if wait && !ctx.quiet(quiet_limit).await {
            eprintln!(
                "soak: +{:.1} s: no steady single leader within {} s",
                injecting.elapsed().as_secs_f64(),
                quiet_limit.as_secs()
            );
        }
        if Instant::now() >= next_checkpoint {
            ctx.checkpoint().await;
            next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
        }
        tokio::time::sleep(gap).await;
        if Instant::now() >= until {
            break;
        }
        let overlapped = ctx.any_active();
        match faults::inject(&ctx, plan, overlapped).await {
            Some(id) if options.verbose => {
                let f = ctx.faults.lock().unwrap()[id].clone();
                eprintln!(
                    "soak: +{:.3} s #{id} {}{} {}{}{}",
                    (f.inject.saturating_sub(injection_start)) as f64 / 1e6,
                    kind.name(),
                    f.replica.map_or(String::new(), |r| format!(" replica-{r}")),
                    if f.on_leader { "(leader)" } else { "" },
                    if f.param.is_zero() {
                        String::new()
                    } else {
                        format!(" {} ms", f.param.as_millis())
                    },
                    if overlapped { " overlapping" } else { "" },
                );
            }
            Some(_) => {}
            None if options.verbose => eprintln!("soak: {} had no target now", kind.name()),
            None => {}
        }
    }
    let injected_for = injecting.elapsed();

    // The end: every fault over, the fleet settled, a last count.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ctx.any_active() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ctx.checkpoint().await;
    let end = unix_us();
    stop_sampling.cancel();
    let _ = sampler.await;
    rss.abort();
    let rows = match db::connect(&database.config()).await {
        Ok(client) => db::rows(&client).await.unwrap_or_else(|e| {
            eprintln!("soak: cannot read the rows: {e}");
            Vec::new()
        }),
        Err(e) => {
            eprintln!("soak: cannot read the rows: {e}");
            Vec::new()
        }
    };
    let procs: Vec<ProcInfo> = {
        let mut fleet = ctx.fleet.lock().await;
        fleet.kill_all();
        fleet
            .procs
            .iter()
            .map(|p| ProcInfo {
                slot: p.slot,
                spawned: p.spawned,
                ended: p.ended.filter(|&e| e <= end),
                rss: p.rss.clone(),
                fast: p.fast,
            })
            .collect()
    };
    let events = ctx.board.events();
    let faults = ctx.faults.lock().unwrap().clone();
    let runs = samples.runs.lock().unwrap().clone();
    let checkpoints = ctx.checkpoints.lock().unwrap().clone();
    monitoring.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = runtime_monitor.await;
    let runtime_stalls = runtime_stalls.lock().unwrap().clone();
    let mut stalls = stalls.lock().unwrap().clone();
    stalls.extend(runtime_stalls.iter().copied());
    let mut analysis = check::analyse(&check::Input {
        options: &options,
        start,
        end,
        events: &events,
        procs: &procs,
        faults: &faults,
        runs: &runs,
        rows: &rows,
        offset,
        checkpoints: &checkpoints,
        stalls: &stalls,
    });
    analysis
        .violations
        .extend(ctx.runtime_violations.lock().unwrap().iter().cloned());
    analysis.violations.sort_by_key(|v| v.at);
    let facts = report::Facts {
        server_version,
        private: server.is_private(),
        injected_for,
        wall: wall.elapsed(),
        start: injection_start,
        samples: (
            samples.count.load(std::sync::atomic::Ordering::Relaxed),
            samples
                .reconnects
                .load(std::sync::atomic::Ordering::Relaxed),
        ),
        offset,
        runtime_stalls: (
            runtime_stalls.len(),
            runtime_stalls.iter().map(|&(s, e)| e - s).sum(),
            runtime_stalls
                .iter()
                .map(|&(s, e)| e - s)
                .max()
                .unwrap_or(0),
        ),
    };
    let text = report::render(&options, &facts, &faults, &procs, &analysis);
    println!();
    println!("{text}");
    if let Some(path) = &options.out {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("soak: cannot write {}: {e}", path.display());
        }
    }
    // Log excerpts around the first violations, for the replay.
    for v in analysis.violations.iter().take(5) {
        eprintln!(
            "--- around {}: {}",
            report::offset_text(v.at, injection_start),
            v.what
        );
        for e in events
            .iter()
            .filter(|e| e.at + 3_000_000 >= v.at && e.at <= v.at + 1_000_000)
        {
            eprintln!(
                "  event {} replica-{} {:?}",
                report::offset_text(e.at, injection_start),
                e.replica,
                e.what
            );
        }
        let window = (v.at.saturating_sub(3_000_000), v.at + 1_000_000);
        let inside = |at: u64| window.0 <= at && at <= window.1;
        for f in faults.iter().filter(|f| {
            inside(f.inject) || inside(f.heal) || (f.inject < window.0 && window.1 < f.heal)
        }) {
            eprintln!(
                "  fault {} #{} {} replica-{} leader={} until {} {}",
                report::offset_text(f.inject, injection_start),
                f.id,
                f.kind.name(),
                f.replica.map_or_else(|| "-".to_owned(), |r| r.to_string()),
                f.on_leader,
                report::offset_text(f.heal, injection_start),
                f.note
            );
        }
        // The lock's holder as the sampler saw it (this machine's clock).
        let local = |server: u64| (server as i64 - offset) as u64;
        for run in runs
            .iter()
            .filter(|r| local(r.last) >= window.0 && local(r.first) <= window.1)
        {
            eprintln!(
                "  pg_locks {} .. {} holder {:?} epoch {:?}",
                report::offset_text(local(run.first), injection_start),
                report::offset_text(local(run.last), injection_start),
                run.holder,
                run.epoch
            );
        }
        for &(s, e) in stalls.iter().filter(|&&(s, e)| inside(s) || inside(e)) {
            let whose = if runtime_stalls.contains(&(s, e)) {
                "runtime"
            } else {
                "machine"
            };
            eprintln!(
                "  stall ({whose}) {} for {} ms",
                report::offset_text(s, injection_start),
                (e - s) / 1_000
            );
        }
        for &r in &v.replicas {
            for (at, line) in
                ctx.board
                    .log_excerpt(r, v.at.saturating_sub(3_000_000), v.at + 1_000_000)
            {
                eprintln!(
                    "  log {} replica-{r}: {line}",
                    report::offset_text(at, injection_start)
                );
            }
        }
    }
    drop(database);
    if analysis.violations.is_empty() { 0 } else { 1 }
}
