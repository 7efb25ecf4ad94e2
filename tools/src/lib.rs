//! What the process-level benchmarks of `pg-elector` share: percentiles ([`stats`]), seeded
//! random numbers ([`rng`]), the `/proc` readers ([`procfs`]), the option parser ([`args`])
//! and the runtime they run on ([`block_on`]).
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
