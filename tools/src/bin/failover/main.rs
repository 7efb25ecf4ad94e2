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
//! (`woke leader|standby`, see `testkit/src/replica.rs`), so the old leader's term is counted as
//! ending at the SIGSTOP when that read found it standby and none of its ticks or leader
//! reports arrived after the SIGCONT; otherwise it counts as leading again from that read (or
//! from the SIGCONT, if a tick arrived first) until it said standby, which shows up as
//! two-leader time, and the run is flagged. The "old leader demoted" column of a freeze shows
//! the time from SIGCONT to its standby report instead (the watcher's wake-up). Each database
//! has `idle_in_transaction_session_timeout = 2·I`, as the docs ask of a fencing
//! application, so a leader frozen inside a fenced transaction cannot hold off the next term.
//!
//! With fewer than 100 runs the nearest-rank p99 is the maximum; the output says so.
//!
//! [`FaultProxy`]: pg_elector_testkit::FaultProxy

mod bench;
mod fleet;
mod options;
mod part;
mod report;
mod scenario;

use pg_elector::LockKey;
use pg_elector_testkit::replicas::processes;
use pg_elector_tools::args::or_exit;
use pg_elector_tools::block_on;

use crate::options::Options;
use crate::part::bench;

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
        processes::child();
        return;
    }
    let options = or_exit(Options::parse(&args), "failover", USAGE);
    block_on(bench(options));
}
