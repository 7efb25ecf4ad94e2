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
//   `error.rs`, `metrics.rs`, `in_flight.rs` (what a drain waits for), `sync.rs`.
// - `local.rs` the local electors' `run`; `postgres/mod.rs` the election's, a short loop over
//   `standby.rs` (tries and the waiting session of `waiter.rs`), `begin.rs` (what stands
//   between a grant and a term), `lead.rs` (checks and the watch) and `give_back.rs` (drain
//   and unlock, with `handover.rs`'s marker). `session.rs` holds the lock session's SQL,
//   `fence.rs` the epoch table, `leader.rs` `current_leader`; `settings.rs`, `loss.rs`,
//   `repeats.rs` and `ident.rs` are the leaves they share. Design §8's map has the loop in
//   `postgres/mod.rs` alone: its four steps are files of their own so that none is long.
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
