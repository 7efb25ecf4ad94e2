//! Rolling deploys: how often the lead moves while every replica of a service is replaced one
//! at a time, with and without `ElectorBuilder::preference`, in poll and fast-takeover mode; and
//! how often each shard of a group moves through the same deploys.
//!
//! ```sh
//! cargo run --release -p pg-elector-tools --bin rolling                                  # 20 deploys, I = 1 s, every part
//! cargo run --release -p pg-elector-tools --bin rolling -- --deploys 1 --interval 200ms  # a smoke run
//! cargo run --release -p pg-elector-tools --bin rolling -- --only pref-fast,nopref-fast  # some parts only
//! ```
//!
//! Options (after `--`): `--deploys N` (default 20), `--interval I` (default 1 s; `200ms`, `2s`
//! or seconds), `--pause P` (default none: how long a deploy waits after a new replica stands
//! by before it stops an old one, as a readiness delay would), `--replicas R` (default 5),
//! `--shards S` (default 64), `--only <part>[,…]` (default `all`): `nopref-poll`,
//! `nopref-fast`, `pref-poll`, `pref-fast`, `shards`; also `pref`, `nopref`, `poll`, `fast`
//! (two electors parts each) and `electors` (all four).
//!
//! **The fleet.** R replica processes (this binary run again with `--rolling-child`), all
//! against one private PostgreSQL started by the test kit, each part in a database of its own.
//! A replica of version v runs one elector on one key with identity `v<v>-r<n>`, and, in the
//! `pref` parts, `preference(v)`; the `fast` parts add `fast_takeover(true)`. The first fleet
//! is version 1; deploy d brings version d + 1.
//!
//! **One deploy** replaces the R replicas one at a time, oldest first: start a replica of the
//! new version, wait until it stands by, then SIGTERM the oldest replica (its shutdown token is
//! cancelled: the elector drains and unlocks) and wait for the process to exit. "Stands by"
//! means the server has seen its first try: a backend of its pool (whose `application_name` is
//! the replica's identity, set on the pool's connections) whose latest statement is a try of
//! the lock (its text names an advisory-lock function), or that holds the lock. With a
//! preference the replica writes its candidates row just before each try, so the leader can
//! see it from then on. (A replica stands by some 10 ms after its start on an idle machine:
//! its first try comes at once.) `ROLLING_TRACE=1` prints how long each step took.
//!
//! Without a pause a step takes a few tens of ms, far less than I, so a leader that is among
//! the old replicas is mostly stopped before a check of its own could see the new one: with a
//! preference the lead then moves at the grant (an old standby leaves the free lock to the
//! more preferred one), not through the leader's handover. `--pause 2s` (at least 2·I) lets
//! the leader see the new replica and hand over first. After the last old replica exits the
//! bench waits for a single leader and 3·I more, so that a move the deploy set off is counted
//! in it; that is the deploy's end.
//!
//! **Measured.** Each replica reads `is_leader()` every millisecond on a thread of its own and
//! prints every change with the wall clock (µs since the UNIX epoch, `CLOCK_REALTIME`, the
//! clock the parent stamps with too; the processes share one machine, so the stamps compare to
//! about a millisecond, barring a clock step during the run). Per deploy:
//!
//! - leadership moves: terms that began in the deploy on a replica other than the last leader;
//! - leaderless time per move: the old leader's `is_leader` false → the new leader's true;
//! - two leaders: time two replicas' `is_leader` were both true (must be 0);
//! - whether the leader at the end runs the new version;
//! - from the server's side, a sampler on its own connection reads the holder of the key's
//!   exclusive advisory lock in `pg_locks` every millisecond: holder changes (pid) and the time
//!   nobody held the lock. A standby that is granted the lock and gives it back at once for a
//!   more preferred one shows up here as a holder, though it never led.
//!
//! The shards part runs a group of S shards (`Shards`, no preference: shards have none, and no
//! fast takeover) on R member processes through the same deploys; a new member stands by once
//! `is_member()` says so, and a deploy ends once every shard has one owner and every member its
//! share (⌊S/R⌋ or ⌈S/R⌉), plus I. Per deploy: how many times each shard changed owner
//! (`is_owner`, per member, read every millisecond), the median and max over the shards, and
//! the total.
//!
//! The electors' table (one row per configuration) is printed once its parts have run, the
//! shards' table after it; every deploy's figures go to stderr as it ends. A deploy takes its
//! steps (some 30 ms each, plus `--pause`) and 3·I of waiting at its end; a shards deploy waits
//! for the balance instead. From the smoke run at I = 200 ms, the default run (I = 1 s) should
//! take about 6 minutes; with `--pause 2s`, about 25.

mod child;
mod deploy;
mod lanes;
mod options;
mod procs;
mod report;
mod sampler;
mod shards;

use pg_elector::LockKey;
use pg_elector_testkit::PgServer;
use pg_elector_tools::args::or_exit;
use pg_elector_tools::block_on;

use crate::options::Options;

/// The argument that makes this binary a replica.
pub(crate) const CHILD_FLAG: &str = "--rolling-child";
/// The elector parts' key.
pub(crate) const KEY: LockKey = LockKey::new(0x726f_6c6c, 1); // "roll"
/// The shards part's group.
pub(crate) const GROUP: &str = "bench/rolling";

const USAGE: &str = "usage: cargo run --release -p pg-elector-tools --bin rolling -- [--deploys N] \
[--interval 1s|200ms|<seconds>] [--pause 0|2s|…] [--replicas R] [--shards S] \
[--only all|electors|pref|nopref|poll|fast|nopref-poll|nopref-fast|pref-poll|pref-fast|shards[,…]]";

fn main() {
    if std::env::args().nth(1).as_deref() == Some(CHILD_FLAG) {
        return child::main();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = or_exit(Options::parse(&args), "rolling", USAGE);
    block_on(bench(options));
}

async fn bench(options: Options) {
    let server = tokio::task::spawn_blocking(PgServer::spawn)
        .await
        .expect("the server's start")
        .unwrap_or_else(|e| panic!("{e}"));
    report::print_header(&options, &server).await;
    let mut rows = Vec::new();
    for &config in &options.configs {
        rows.push((config, deploy::run_part(&server, &options, config).await));
    }
    if !rows.is_empty() {
        report::print_electors(&options, &rows);
    }
    if options.shards {
        let outcome = shards::run_part(&server, &options).await;
        report::print_shards(&options, &outcome);
    }
}
