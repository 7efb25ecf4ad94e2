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
//! (default 16000), `--set name=value` (a server setting, repeatable), `--quick`, `--bare-try`
//! (after each shape's runs, one more whose standbys are bare tries, see below),
//! `--prepared` or `--unnamed` (the electors with `ElectorBuilder::prepared_statements(true)`
//! or `(false)`; neither: the default, prepared on connections that reach the server directly).
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
//! - `bare-try` (with `--bare-try`): the yardstick of a standby's cost. Process 0 runs electors
//!   as in `poll` (they lead); every other elector of the plan is replaced by a task that, every
//!   I from a random start, borrows a connection of the same pool and sends a bare
//!   `pg_try_advisory_lock` on the same key, prepared once per connection (deadpool's statement
//!   cache), and unlocks at once in the rare case it is granted. Its server CPU beside the
//!   `poll` row of the same run is the ratio of a refused try to a bare prepared one.
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

mod bench;
mod child;
mod monitor;
mod options;
mod procs;
mod report;
mod run;
mod server;
mod snapshot;

use pg_elector_tools::block_on;

use crate::bench::bench;
use crate::options::Options;

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
const ENV_BARE: &str = "PG_ELECTOR_FLEET_BARE";
const ENV_PREPARED: &str = "PG_ELECTOR_FLEET_PREPARED";
/// The standby of a `--bare-try` run: a bare `pg_try_advisory_lock`, prepared once per pool
/// connection, tagged for `pg_stat_statements`.
const BARE_TRY: &str =
    "/* fleet bare try */ SELECT pg_catalog.pg_try_advisory_lock($1::int4, $2::int4)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == CHILD_FLAG) {
        child::main();
        return;
    }
    let options = Options::parse(&args);
    block_on(bench(options));
}
