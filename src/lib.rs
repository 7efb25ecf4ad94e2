#![doc = include_str!("../README.md")]

pub mod background;
mod builder;
mod election;
mod elector;
mod error;
mod key;
mod lease;
mod local;
mod lock_session;
mod metrics;
mod term;

pub use builder::{DEFAULT_CHECK_INTERVAL, ElectorBuilder, MAX_CHECK_INTERVAL, MIN_CHECK_INTERVAL};
pub use elector::Elector;
pub use error::Error;
pub use key::LockKey;
pub use local::{LocalBuilder, ManualControl};
pub use metrics::DEFAULT_GAUGE_NAME;
pub use term::{Term, TermEnd};
