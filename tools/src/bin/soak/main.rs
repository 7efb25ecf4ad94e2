//! Chaos soak (issue 12): random faults, one at a time or overlapping, against a fleet of
//! replica processes, and checks from outside the replicas that the docs' guarantees held
//! ("Guarantees, in multiples of I", "Fast takeover", "Writes a deposed leader cannot make").
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin soak -- --duration 60s                  # CI's run; a random seed, printed
//! cargo run --release -p pg-elector-tools --bin soak -- --seed 4242 --duration 60s      # the same draws again
//! cargo run --release -p pg-elector-tools --bin soak -- --mode poll --faults stop,partition --verbose
//! cargo run --release -p pg-elector-tools --bin soak -- --shards 8 --duration 60s       # shard mode
//! cargo run --release -p pg-elector-tools --bin soak -- --duration 60s --cluster sync   # CI's key-mode run
//! cargo run --release -p pg-elector-tools --bin soak -- --duration 60s --shards 8 --cluster async --follow multi-host  # CI's shard run
//! scripts/soak-long                                           # ≈ 100 min: poll, fast, mixed, shards, failover
//! ```
//!
//! Options (after `--`): `--seed N` (default: from the clock, or `SOAK_SEED`), `--duration`
//! (default `60s`; `90`, `5m`, `1h` work too), `--replicas N` (default 5), `--interval-ms`
//! (the check interval I, default 250), `--mode poll|fast|mixed` (default `mixed`),
//! `--faults all|<kind>[,<kind>…]`, `--overlap P` (default 0.25), `--shards N` (shard mode,
//! below; 1 to 64), `--cluster sync|async` and `--follow moving-address|multi-host` (the
//! database fails over too, below), `--no-preferences` (key mode without preferences and
//! handover faults, below), `--no-keep-one`,
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
//! `replica-<n>` (n counts every process spawned), I, a drain timeout of I (7 s in key mode,
//! where a leader schedule runs beside it, above its longest run), and fast takeover
//! per `--mode`: `mixed` draws it from the seed at every spawn, so both kinds stand by side by
//! side and a slot changes kind over the run. Its elector's pool has two connections, the
//! application's pool (the ticker's, which the schedule shares) three. The ticker calls
//! `do_work` every I/10 and writes one row inside a transaction after `Term::fence`: replica, epoch, the server's `clock_timestamp()`.
//! The database has `idle_in_transaction_session_timeout` = 2·I, as the docs ask of a
//! fencing application. Slot 0 is never killed nor restarted (`--no-keep-one` lifts that), so
//! one process lives through the run and its memory is measured over all of it.
//!
//! # The faults
//!
//! After a gap drawn from [I/4, 2·I], the next fault starts: with probability `--overlap`
//! at once, possibly while earlier ones still run; otherwise once every fault has healed and
//! the fleet is steady again (every slot's process up, exactly one leader). Its kind is drawn
//! with weight 2, restarts 1; it aims at the leader with probability 0.6, else at a random
//! replica whose slot no running fault holds. Bounds, from the docs' table, each with a
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
//! | `long-partition` (key mode) | the leader's proxy blackholed for [3.5 s, 4.5 s], past the schedule's stale threshold, a second into a long run | 5·I, or heal + 1·I | never | ≤ 2·I |
//! | `join-partition` (shard mode) | a replica killed, started again once the others own every shard, its proxy blackholed as soon as its member lock (or, half of the time, its live mark) shows granted, for [4·I, 8·I] | 1·I (a gap begun during it: 1·I) | never | — |
//! | `sync-standby` | `synchronous_standby_names = '*'` and synchronous commits, no standby, for [4 s, 5.5 s] (with `--cluster`: the standby's WAL link blackholed) | the end + 1·I | never | — |
//! | `failover` (with `--cluster`) | a crash (the standby first cut off its WAL for [0, 1.5 s]) or a switchover of the primary, the standby promoted, the old primary back as the standby | the promoted server taking writes + 1·I | never | ≤ 100 ms |
//! | `handover-live` (`--preferences`) | `request_handover` to a live standby, by identity or the most preferred | 3·I (the leader's next check, the drain, the target's next try) | never | ≤ 1·I (its next check) |
//! | `handover-dying` (`--preferences`) | the same, the target SIGKILLed right after the request, respawned after [0, I] | 3·I and one try (I + max(I, 1 s)) | never | ≤ 1·I |
//! | `handover-missing` (`--preferences`) | `request_handover` to an identity no live standby has: must return `HandoverError::NoSuchStandby` | (nothing changes) | never | — |
//!
//! A graceful restart or a resign of a leader with a run of its schedule in progress drains up
//! to that run's end (at most the drain timeout, 7 s): its bounds get that time.
//!
//! "≤ 100 ms" stands for the docs' "≤ 20 ms + scheduling". A graceful shutdown that has
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
//!   fault a leader can hear has one, but for a terminate or a reset of a leader that hears it: it
//!   steps down within 1 ms, before the next term begins (which waits 5 ms), unless its process
//!   waits longer for the CPU; 20 ms from the injection are allowed for that (`SCHEDULING`; the
//!   README allows "a few milliseconds of overlap" on an overloaded machine). A session the server ends while
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
//!   lock or waiting session (6). A leak persists, so a checkpoint every 20 s sees every leak
//!   of the faults before it.
//! - **Runs of one due at once** (key mode; `soak/app.rs`, `check/runs.rs`). Each replica runs a
//!   leader schedule on its application's pool (the ticker's): one job due every 2 s, with
//!   `rerun_abandoned`, under a drain timeout of 7 s; before a `long-partition` every replica's
//!   runs that start within 3.5 s are made 5–6.5 s long (the parent's `long` command), and the
//!   leader is cut off a second into its next run. Each run says when
//!   it starts and ends (a dropped run too; a killed process ends its runs); two runs of one due
//!   at once are a violation, unless a runner was SIGSTOPped during its run (listed apart).
//! - **Pool connections stuck** (`soak/probes.rs`, `check/pool.rs`). One interval after each
//!   fault healed, with no fault in effect, every live replica borrows every connection of its
//!   application's pool and asks each `SELECT 1`; one that does not answer within 1 s is stuck
//!   (and closed). During `sync-standby`, the connections idle in the pool are probed every
//!   interval too.
//! - **Memory.** Each replica's RSS (`/proc/<pid>/status`) every 2 s; for each process that
//!   lived 30 s or more, the growth from its first sample at 10 s of age to its last is a
//!   violation beyond 16 MiB and 50 %.
//!
//! # Preferences
//!
//! With `--preferences` (the default in key mode; `--no-preferences` turns it off, and shard
//! mode has none: groups of shards do not use preferences) every replica is built with
//! `ElectorBuilder::preference`, numbered as in a rolling deploy (`soak/prefs.rs`): the first
//! fleet draws 1 to 3, every process a fault starts again is a pod of the latest release, one
//! in three of a new, higher one. The soak reads the library's own live rows of
//! `pg_elector_candidates` every 20 ms, draws the three handover faults above
//! (`soak/handover.rs`), and checks (`check/prefs.rs`): after every fault heals, the most
//! preferred live replica leads within the docs' bound (4·I plus the leader's drain, plus a
//! try per pool connection after a cut link; a move to a newly live, more preferred standby
//! within 2·I plus the drain, 3·I with fast takeover; a live handover target within 2·I plus
//! the drain; a term taken on request keeps the lead until it ends); the leaderless gaps of
//! the handovers by their own bounds (above), and a move's (drain + 1·I) for every gap; and
//! that a handover request costs the other standbys no pool connection (none there before it
//! replaced meanwhile) and opens at most one lock session and the key's three waiting
//! sessions. The report adds a column (from each fault's heal to the most preferred leading)
//! and a paragraph on the preferences, the requests' answers and their cost.
//!
//! # Shard mode
//!
//! With `--shards N` every replica process runs one group of N shards
//! ([`Shards`], group `soak`, the same options) instead of one
//! elector, and ticks each shard it owns as it ticked the key: one fenced row per shard tick,
//! with the shard's index. The watcher reads each shard's `is_leader()` every millisecond and
//! tags its lines with the shard; the sampler reads every shard's holder and epoch row in one
//! statement. Every check above then runs **per shard**, on that shard's reports, rows and
//! samples: "leader" reads "owner of the shard", and a fault hits a shard when it hit the
//! replica that owned the shard at the injection (a terminate, when it ended that replica's
//! lock session; a restart hits every shard). The bounds are the single elector's (the
//! README's shard bounds are the same), and the backends' bound too (all of a replica's shards
//! live on one lock session). One allowance is shard mode's own: a shard moves whenever the
//! members change (a respawned replica joining, a replica back after a partition), sometimes
//! after the fault's own bound is over; its owner ends the term, drains (≤ the drain timeout,
//! I) and unlocks, and the new owner takes it at its next try, so such a gap may last 2·I +
//! slack from its start; the report lists those gaps. Shards have no fast takeover and no
//! resign: shard mode runs in poll mode and never injects `resign`. Memory and backends are
//! checked once, not per shard. `--sabotage split-key` gives each process a group of its own.
//!
//! # The database failing over
//!
//! With `--cluster sync` or `--cluster async` the soak runs on a [`Cluster`]: a private
//! primary and a hot standby streaming from it through a proxy, synchronous or not. Each
//! replica slot's link is, with `--follow moving-address` (the default), one proxy in front of
//! the primary that a failover re-points at the standby once the primary has stopped (a
//! virtual IP, a DNS name); with `--follow multi-host`, one proxy per server, and the replica's
//! URL names both with `target_session_attrs=read-write`. A partition or a reset acts on all
//! of a slot's proxies. The soak's own connections (the sampler, the checkpoints, the rows) use
//! a multi-host URL straight to both servers, so they follow the primary.
//!
//! The fault `failover` (weight 4, so that a 20-minute run has well over 100) claims the
//! server like a restart. A crash first blackholes the standby's WAL link for a drawn time
//! (the standby lags: with `async` the commits of that time are lost, with `sync` they wait),
//! then `pg_ctl stop -m immediate`; a switchover is `-m fast`. Then the promotion, the claims
//! of the schedule that the promoted server holds (those made before the stop), and the old
//! primary made the new standby with a fresh base backup. Its bounds count from the stop; its
//! heal is the first moment a connection reached the promoted server out of recovery (polled
//! every 5 ms). With `sync`, a crash's leaderless allowance starts at the cut: every COMMIT
//! waits from then, and a fenced transaction of a killed leader left waiting in its COMMIT
//! holds the epoch row. For the same reason a server restart in a synchronous cluster is over
//! only when the standby streams again (it reconnects after `wal_retrieve_retry_interval`,
//! 5 s); in an asynchronous one the server stays claimed until then. If no failover was
//! drawn by half the run, the next draw's kind is `failover`.
//!
//! The checks of the failovers (`check/failover.rs`), besides every check above, each with a
//! column of the report's failover table:
//!
//! - **No term without a primary.** No replica starts to lead (the read before its first
//!   leading read) after the old primary stopped, with its first leading read more than
//!   100 ms (and the soak's own stalls, which may delay the prober) before the promoted server
//!   took writes.
//! - **A leader within 1·I** of the promoted server taking writes, for every key (shard),
//!   plus the slack and the machine's stalls, unless another fault was in effect after the
//!   promotion within that bound (its own bounds judge the gap; the table counts these);
//!   p50 / p99 / max in the table.
//! - **Nobody leads through a server in recovery.** Both servers, straight, every 10 ms: is it
//!   in recovery (asked before and after), and who holds a key's lock exclusively there (a
//!   standby's question holds it shared for one statement, and is refused after it); a
//!   replica's session holding one there is a violation.
//! - **Epochs rise across failovers.** Per lane, each term's epoch (the replicas' reports) is
//!   above every epoch of a term that certainly began before it possibly began; the fenced
//!   rows' checks above hold across servers too (one machine clock).
//! - **The schedule's claims** (key mode). A claim of a run begun on the old primary (since
//!   the previous failover's stop) that the promoted server lacks is a violation, but with an
//!   asynchronous standby for a crash, for a claim made from the cut on (or in the 250 ms
//!   before it, plus the machine's stalls: the replication lag); such a due may run once more
//!   after the crash, and both are listed; its two runs may overlap until the old run's
//!   heartbeats have not landed for two thirds of the stale threshold (2 s) after the crash,
//!   plus the slack (the docs' asynchronous caveat; counted apart). Any other due (and
//!   attempt) that runs twice is a violation, with one server too.
//! - **Backends.** At each checkpoint, no replica backend on the standby (asked for a second,
//!   since a multi-host connect passes through it).
//! - **Enough failovers.** A run that completed fewer than `--min-failovers` (default 1 with
//!   `--cluster`) fails; so does a failover the harness could not complete, and a standby that
//!   does not stream again within 30 s of a restart.
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
//! [`PgServer::spawn`]: pg_elector_testkit::PgServer::spawn
//! [`FaultProxy`]: pg_elector_testkit::FaultProxy
//! [`Cluster`]: pg_elector_testkit::server::failover::Cluster

mod app;
mod check;
mod child;
mod ctx;
mod db;
mod excerpts;
mod failover;
mod faults;
mod fleet;
mod handover;
mod inject;
mod injector;
mod join;
mod link;
mod options;
mod prefs;
mod prefs_report;
mod probes;
mod report;
mod servers;
mod stalls;
mod sync;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::shards::Shards;
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::server::config::pool_from_config;
use pg_elector_tools::args::or_exit;
use pg_elector_tools::block_on;
use pg_elector_tools::rng::Rng;
use tokio_util::sync::CancellationToken;

use crate::check::{Checkpoint, ProcInfo};
use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::faults::{Claims, Fault};
use crate::fleet::Fleet;
use crate::options::{Mode, Options, USAGE};
use crate::servers::Servers;

/// The key every replica elects on ("soak").
const KEY: LockKey = LockKey::new(0x736f_616b, 1);
/// How often the sampler reads `pg_locks` and the epoch row.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// With `--cluster`, how often each server is asked whether it is in recovery and who holds a
/// lock of the soak's keys there.
const RECOVERY_EVERY: Duration = Duration::from_millis(10);
/// How often the backends and the memory are looked at in a quiet moment.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(20);
/// How often the replicas' RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(2);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has(child::FLAG) {
        child::main();
        return;
    }
    let options = or_exit(Options::parse(&args), "soak", USAGE);
    let code = block_on(soak(options));
    std::process::exit(code);
}

async fn soak(options: Options) -> i32 {
    let wall = Instant::now();
    eprintln!(
        "soak: seed {} (replay with --seed {}), {} of faults, {} replicas, {} mode, I = {} ms",
        options.seed,
        options.seed,
        options::parse_duration("1s").map_or(String::new(), |_| format!("{:?}", options.duration)),
        options.replicas,
        options.mode.name(),
        options.interval.as_millis()
    );
    let mut run = match Started::start(options).await {
        Ok(run) => run,
        Err(code) => return code,
    };
    let (injection_start, injected_for) = injector::run(&run.ctx, &mut run.rng).await;
    run.finish(wall, injection_start, injected_for).await
}

/// The servers, without the faults that need private ones when they are not; `Err` with the
/// exit code when no fault is left.
async fn servers(options: &mut Options) -> Result<Arc<Servers>, i32> {
    let servers = Servers::start(options)
        .await
        .unwrap_or_else(|e| panic!("soak: {e}"));
    if !servers.private {
        let before = options.faults.len();
        options.faults.retain(|k| !k.needs_private());
        if options.faults.len() < before {
            eprintln!("soak: DATABASE_URL is set: no server restarts (they need a private server)");
        }
        if options.faults.is_empty() {
            eprintln!("soak: no fault left to inject");
            return Err(2);
        }
    }
    Ok(Arc::new(servers))
}

/// The lock keys the checks look at, one per lane: [`KEY`], or in shard mode the group's
/// shards in index order; and the fencing table's DDL.
fn keys(servers: &Servers, shards: usize) -> (Vec<LockKey>, String) {
    let pool = || pool_from_config(servers.checker.clone(), 1);
    if shards == 0 {
        let elector = Elector::builder(pool(), KEY)
            .fencing(true)
            .build()
            .expect("an elector");
        return (vec![KEY], elector.fencing_ddl().expect("fencing is on"));
    }
    let group = Shards::builder(pool(), fleet::SHARD_GROUP, shards as u32)
        .fencing(true)
        .build()
        .expect("a group of shards");
    let keys = group.all().map(|shard| shard.key()).collect();
    (keys, group.fencing_ddl().expect("fencing is on"))
}

/// The soak's tables and settings in `database`; the server's version and its clock minus
/// this machine's (µs).
async fn prepare(servers: &Servers, i: Duration, ddl: &str) -> (String, i64) {
    let admin = db::connect(&servers.checker).await.expect("a connection");
    db::prepare(&admin, &servers.db_name, i, ddl)
        .await
        .expect("the soak's tables and settings");
    let server_version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or_default();
    let offset = db::clock_offset(&admin).await.unwrap_or(0);
    (server_version, offset)
}

/// The replica processes, staggered so that their ticks do not share one phase, and what the
/// faults share; and when the first started.
async fn start_fleet(
    options: &Options,
    servers: &Arc<Servers>,
    keys: Vec<LockKey>,
    rng: &mut Rng,
    candidates: Arc<prefs::Candidates>,
) -> (Arc<Ctx>, u64) {
    let i = options.interval;
    let links = fleet::Links {
        targets: servers.addrs.clone(),
        follow: options.follow,
    };
    let mut fleet = Fleet::new(options.replicas, links, servers.url.clone(), KEY, i).await;
    fleet.split_key = options.split_key;
    fleet.shards = options.shards;
    fleet.schedule = Some(options.seed);
    if options.preferences {
        (fleet.preferences, fleet.release) = prefs::first(options.replicas, rng);
    }
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
        keys,
        live: Mutex::new(fleet.live.clone()),
        fleet: tokio::sync::Mutex::new(fleet),
        board,
        faults: Mutex::new(Vec::new()),
        claims: Mutex::new(Claims {
            slots: vec![false; options.replicas],
            server: false,
        }),
        servers: servers.clone(),
        db: servers.checker.clone(),
        runtime_violations: Mutex::new(Vec::new()),
        checkpoints: Mutex::new(Vec::new()),
        probes: Mutex::new(Vec::new()),
        failovers: Mutex::new(Vec::new()),
        candidates,
        handover_pool: options
            .preferences
            .then(|| handover::pool(&servers.checker)),
        handovers: Mutex::new(Vec::new()),
        requested: Mutex::new(None),
        options: options.clone(),
    });
    (ctx, start)
}

/// A soak whose fleet is up, before the faults.
struct Started {
    options: Options,
    servers: Arc<Servers>,
    server_version: String,
    offset: i64,
    stalls: stalls::Monitors,
    samples: Arc<db::Samples>,
    stop_sampling: CancellationToken,
    sampler: tokio::task::JoinHandle<()>,
    /// With `--cluster`, what the watch on a server in recovery saw.
    recovery: Arc<failover::RecoveryWatch>,
    recovery_watch: tokio::task::JoinHandle<()>,
    /// With `--preferences`: the reader of the live rows.
    candidates_watch: Option<tokio::task::JoinHandle<()>>,
    rng: Rng,
    ctx: Arc<Ctx>,
    /// Samples the memory and respawns the replicas that died by themselves.
    rss: tokio::task::JoinHandle<()>,
    /// When the fleet started (µs).
    start: u64,
}

/// What the run left for the checks.
struct Collected {
    rows: Vec<db::Row>,
    procs: Vec<ProcInfo>,
    events: Vec<fleet::Event>,
    faults: Vec<Fault>,
    /// Per lane.
    runs: Vec<Vec<db::Run>>,
    checkpoints: Vec<Checkpoint>,
    /// Every stall, the runtime's among them.
    stalls: Vec<(u64, u64)>,
    /// The stalls of the runtime that runs the proxies.
    runtime_stalls: Vec<(u64, u64)>,
    /// When the checks end (µs).
    end: u64,
    /// The probes of the application pools.
    probes: Vec<probes::Sent>,
    /// The failovers.
    failovers: Vec<failover::Failover>,
    /// With `--preferences`: the reads of the live rows, and what the handovers cost.
    candidates: Vec<prefs::Sample>,
    handovers: Vec<handover::Cost>,
}

impl Started {
    /// The server, the database, the monitors, the sampler (from before the first replica
    /// starts), then the fleet, until it has one leader and a first checkpoint.
    async fn start(mut options: Options) -> Result<Self, i32> {
        let servers = servers(&mut options).await?;
        let (keys, ddl) = keys(&servers, options.shards);
        let (server_version, offset) = prepare(&servers, options.interval, &ddl).await;
        let stalls = stalls::Monitors::start();
        let samples = Arc::new(db::Samples::default());
        let stop_sampling = CancellationToken::new();
        let sampler = tokio::spawn({
            let (config, samples, keys) = (servers.checker.clone(), samples.clone(), keys.clone());
            let stop = stop_sampling.clone();
            async move { db::sample(config, keys, SAMPLE_EVERY, &samples, stop).await }
        });
        let recovery = Arc::new(failover::RecoveryWatch::default());
        // One server is never in recovery: nothing to watch.
        let watched = if options.cluster.is_some() {
            servers.addrs.clone()
        } else {
            Vec::new()
        };
        let recovery_watch = tokio::spawn(failover::watch_recovery(
            servers.checker.clone(),
            watched,
            keys.clone(),
            RECOVERY_EVERY,
            recovery.clone(),
            stop_sampling.clone(),
        ));
        let candidates = Arc::new(prefs::Candidates::default());
        let candidates_watch = options.preferences.then(|| {
            let (config, candidates, key) = (servers.checker.clone(), candidates.clone(), keys[0]);
            let stop = stop_sampling.clone();
            tokio::spawn(async move { prefs::sample(config, key, offset, &candidates, stop).await })
        });
        let mut rng = Rng::new(options.seed);
        let (ctx, start) = start_fleet(&options, &servers, keys, &mut rng, candidates).await;
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
        Ok(Started {
            options,
            servers,
            server_version,
            offset,
            stalls,
            samples,
            stop_sampling,
            sampler,
            recovery,
            recovery_watch,
            candidates_watch,
            rng,
            ctx,
            rss,
            start,
        })
    }

    /// The end: every fault over, the fleet settled, a last count; then everything the checks
    /// read, the fleet killed.
    async fn collect(&mut self) -> Collected {
        let ctx = &self.ctx;
        let deadline = Instant::now() + Duration::from_secs(60);
        while ctx.any_active() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ctx.checkpoint().await;
        let end = unix_us();
        self.stop_sampling.cancel();
        let _ = (&mut self.sampler).await;
        let _ = (&mut self.recovery_watch).await;
        if let Some(watch) = self.candidates_watch.as_mut() {
            let _ = watch.await;
        }
        self.rss.abort();
        let rows = match db::connect(&self.servers.checker).await {
            Ok(client) => db::rows(&client).await.unwrap_or_else(|e| {
                eprintln!("soak: cannot read the rows: {e}");
                Vec::new()
            }),
            Err(e) => {
                eprintln!("soak: cannot read the rows: {e}");
                Vec::new()
            }
        };
        let procs = proc_infos(&mut *ctx.fleet.lock().await, end);
        let events = ctx.board.events();
        let faults = ctx.faults.lock().unwrap().clone();
        let runs = self.samples.runs.lock().unwrap().clone();
        let checkpoints = ctx.checkpoints.lock().unwrap().clone();
        let probes = ctx.probes.lock().unwrap().clone();
        let failovers = ctx.failovers.lock().unwrap().clone();
        let candidates = ctx.candidates.samples.lock().unwrap().clone();
        let handovers = ctx.handovers.lock().unwrap().clone();
        let (stalls, runtime_stalls) = self.stalls.stop().await;
        Collected {
            rows,
            procs,
            events,
            faults,
            runs,
            checkpoints,
            stalls,
            runtime_stalls,
            end,
            probes,
            failovers,
            candidates,
            handovers,
        }
    }

    /// Collects, checks and reports; the exit code (1 on any violation).
    async fn finish(mut self, wall: Instant, injection_start: u64, injected_for: Duration) -> i32 {
        let c = self.collect().await;
        let options = &self.options;
        let job_runs = check::job_runs(&c.events, c.end);
        let lost =
            check::failover::lost_claims(&job_runs, &c.failovers, options.cluster, &c.stalls);
        let allowed = check::failover::overlaps_allowed(&lost, options.slack().as_micros() as u64);
        let input = check::Input {
            options,
            start: self.start,
            end: c.end,
            events: &c.events,
            procs: &c.procs,
            faults: &c.faults,
            runs: c.runs.first().map_or(&[][..], Vec::as_slice),
            rows: &c.rows,
            offset: self.offset,
            checkpoints: &c.checkpoints,
            stalls: &c.stalls,
            probes: &c.probes,
            due_overlaps_allowed: &allowed,
            candidates: &c.candidates,
            handovers: &c.handovers,
        };
        let mut analysis = if options.shards == 0 {
            check::analyse(&input)
        } else {
            check::analyse_shards(&input, &c.runs)
        };
        let holds = self.recovery.holds.lock().unwrap().clone();
        let seen = check::failover::Seen {
            failovers: &c.failovers,
            recovery: (*self.recovery.samples.lock().unwrap(), &holds),
            replication: options.cluster,
        };
        let (violations, failover_facts) = check::failover::check(&input, &seen);
        analysis.violations.extend(violations);
        analysis
            .violations
            .extend(self.ctx.runtime_violations.lock().unwrap().iter().cloned());
        analysis.violations.sort_by_key(|v| v.at);
        let facts = self.facts(&c, wall, injection_start, injected_for);
        let text = report::render(
            options,
            &facts,
            &c.faults,
            &c.procs,
            &analysis,
            &failover_facts,
        );
        println!();
        println!("{text}");
        if let Some(path) = &options.out {
            if let Err(e) = std::fs::write(path, &text) {
                eprintln!("soak: cannot write {}: {e}", path.display());
            }
        }
        // Log excerpts around the first violations, for the replay.
        let excerpts = excerpts::Excerpts {
            collected: &c,
            board: &self.ctx.board,
            offset: self.offset,
            injection_start,
        };
        for v in analysis.violations.iter().take(5) {
            excerpts.print(v);
        }
        if analysis.violations.is_empty() { 0 } else { 1 }
    }

    /// What the report says besides the checks.
    fn facts(
        &self,
        c: &Collected,
        wall: Instant,
        injection_start: u64,
        injected_for: Duration,
    ) -> report::Facts {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let lengths = || c.runtime_stalls.iter().map(|&(s, e)| e - s);
        report::Facts {
            server_version: self.server_version.clone(),
            private: self.servers.private,
            injected_for,
            wall: wall.elapsed(),
            start: injection_start,
            samples: (
                self.samples.count.load(relaxed),
                self.samples.reconnects.load(relaxed),
            ),
            offset: self.offset,
            runtime_stalls: (
                c.runtime_stalls.len(),
                lengths().sum(),
                lengths().max().unwrap_or(0),
            ),
        }
    }
}

/// Every replica process as the checks see it; kills them all first.
fn proc_infos(fleet: &mut Fleet, end: u64) -> Vec<ProcInfo> {
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
            preference: p.preference,
        })
        .collect()
}
