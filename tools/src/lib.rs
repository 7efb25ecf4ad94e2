//! What the process-level benchmarks of `pg-elector` share: percentiles ([`stats`]), seeded
//! random numbers ([`rng`]), the `/proc` readers ([`procfs`]), the option parser ([`args`])
//! the runtime they run on ([`block_on`]) and how their standbys take over ([`Mode`]).
//!
//! The benchmarks themselves are the binaries of this crate (`src/bin/`); README.md and
//! BENCHMARKS.md say how to run each.

pub mod args;
pub mod procfs;
pub mod rng;
pub mod stats;

use std::future::Future;

/// Runs `future` to its end on a multi-thread runtime of two workers, what every benchmark's
/// parent runs on.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// How the standbys of a run take over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A standby tries the lock once per check interval (the default).
    Poll,
    /// `ElectorBuilder::fast_takeover(true)`: a standby waits on the lock.
    Fast,
}

impl Mode {
    /// `poll` or `fast`, as the options and the tables name it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Fast => "fast",
        }
    }
}
