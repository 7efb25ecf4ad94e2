#![doc = include_str!("../README.md")]

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
mod state;
mod sync;
mod term;

pub use builder::LocalBuilder;
pub use builder::{DEFAULT_CHECK_INTERVAL, ElectorBuilder, MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL};
pub use elector::{Elector, ManualControl};
pub use error::{Error, Fenced};
pub use key::LockKey;
pub use metrics::{CHANGES_NAME, CHECK_DURATION_NAME, DEFAULT_GAUGE_NAME, EPOCH_NAME};
pub use postgres::{LeaderInfo, current_leader};
pub use term::{Leadership, LossCause, Term, TermEnd};
