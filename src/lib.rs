#![doc = include_str!("../README.md")]

// The inside, for a reader who opens the crate to change it (one concept a file; every file
// that speaks SQL is under `postgres/` or is the schedule's `store/`):
//
// - `elector.rs` the handle (and `ManualControl`); `builder.rs` its builders, the only pair
//   of files that import each other. Both build on `state.rs`, the shared state machine
//   (promote, demote, publish, lease, in-flight, cooldown, run slot), which imports none of
//   the handle, the builders or the election loops.
// - `term.rs` the term and the one "why leadership ended" type (`LossCause`, which
//   `metrics::Change::Lost` carries); `lease.rs` the local lease and its clock; `key.rs`,
//   `error.rs`, `metrics/` (`mod.rs` the shared types, `enabled.rs` the Prometheus half,
//   `disabled.rs` the no-op one without the `prometheus` feature), `in_flight.rs` (what a
//   drain waits for), `sync.rs`.
// - `local.rs` the local electors' `run`; `postgres/mod.rs` the election's, a short loop over
//   `standby.rs` (tries, through `borrower.rs`'s one borrow at a time, and the waiting
//   session of `waiter.rs`), `begin.rs` (what stands
//   between a grant and a term), `lead.rs` (checks and the watch) and `give_back.rs` (drain
//   and unlock, with `handover.rs`'s marker). `session.rs` holds the lock session's SQL (its errors in
//   `session_error.rs`),
//   `fence.rs` the epoch table, `leader.rs` `current_leader`; `settings.rs`, `loss.rs`,
//   `repeats.rs` and `ident.rs` are the leaves they share. Design §8's map has the loop in
//   `postgres/mod.rs` alone: its four steps are files of their own so that none is long.
//   `lock_table.rs` tells a full shared lock table and names the setting to raise.
// - `shards/` the groups of shards: `mod.rs` the handle (each shard an `Elector` of mode
//   `Shard` over the same `state.rs` as a single elector, so terms, drain, fencing targets and
//   the background plane are the elector's own), `builder.rs` over `ElectorBuilder` (one
//   validation), `assign.rs` the pure assignment, `loops.rs` a `WhileLeader` per shard. The
//   member's loop is `postgres/shards/`: it joins with the standby's try (`session.rs`, the
//   shared lock), and its `member.rs` checks, tries and unlocks with `sql.rs` (and drains the
//   moved shards with `drains.rs`), reusing the watch, the settle, the lease length and its
//   renewal (`lead::renew`), the bounds, the "ours alone" pooler test (`ours_alone!`), what a
//   check proves (`Check::of`, `loss::proven`), `Loss`, `Repeats` and `lock_table`. Why a
//   group of one shard is not the single elector underneath is told to users in
//   `shards/mod.rs`: a member's session holds many keys, so it has no fast takeover (a waiting
//   session per shard), no handover marker (no waiting session to mark), no resign (the
//   assignment would give the shard back), and is found out behind a transaction pooler within
//   two checks rather than one (a member that joined tries no more). What the two share is
//   everything below the loop.
// - `background/` the launchers; `schedule/` the leader schedules: `mod.rs` the builder and
//   `run`, `task.rs` one job's loop, `due.rs` one due, `plan.rs` the pure catch-up decision,
//   `store/` the SQL, `context.rs` what the job tasks share (beyond the design's map: without
//   it `task.rs` and `due.rs` would import each other), `job.rs`, `handle.rs`, `error.rs`.

pub mod background;
mod builder;
mod elector;
mod error;
mod in_flight;
mod key;
mod lease;
mod local;
mod metrics;
mod pooled;
mod postgres;
pub mod schedule;
pub mod shards;
mod state;
mod sync;
mod term;

pub use builder::LocalBuilder;
pub use builder::{DEFAULT_CHECK_INTERVAL, ElectorBuilder, MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL};
pub use elector::{Elector, ManualControl};
pub use error::{Error, Fenced};
pub use key::LockKey;
pub use metrics::{
    CHANGES_NAME, CHECK_DURATION_NAME, DEFAULT_GAUGE_NAME, EPOCH_NAME, SHARD_MOVES_NAME,
    SHARDS_OWNED_NAME,
};
pub use postgres::{LeaderInfo, current_leader};
pub use term::{Leadership, LossCause, Term, TermEnd};
