#![doc = include_str!("../README.md")]

// The inside, file by file, for a reader who opens the crate to change it: ARCHITECTURE.md.

pub mod background;
mod builder;
mod elector;
mod error;
mod fence;
pub mod guide;
mod ident;
mod identity;
mod in_flight;
mod key;
mod lease;
mod local;
mod local_builder;
mod metrics;
mod pool;
mod pooled;
mod postgres;
#[cfg(feature = "schedule")]
pub mod schedule;
pub mod shards;
mod state;
pub mod status;
mod sync;
mod term;

pub use builder::{DEFAULT_CHECK_INTERVAL, ElectorBuilder, MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL};
pub use elector::Elector;
pub use error::{BuildError, CurrentLeaderError, Error, Fenced, HandoverError};
pub use key::LockKey;
pub use local_builder::{LocalBuilder, ManualControl};
pub use metrics::{
    CHANGES_NAME, CHECK_DURATION_NAME, DEFAULT_GAUGE_NAME, EPOCH_NAME, SHARD_MOVES_NAME,
    SHARDS_HELD_UNOWNED_NAME, SHARDS_OWNED_NAME,
};
pub use pool::pool_from_url;
pub use postgres::{HandoverTo, LeaderInfo, current_leader, request_handover, request_handover_in};
pub use term::{Leadership, LossCause, Term, TermEnd};
