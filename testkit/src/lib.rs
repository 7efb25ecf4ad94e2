#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod binaries;
mod builder;
mod cluster;
mod database;
mod error;
mod faults;
mod fenced;
mod group;
mod locks;
mod members;
mod pgbouncer;
mod private;
mod proxy;
#[cfg(feature = "replica")]
pub mod replica;
mod replicas;
mod runtime;
mod server;
mod standby;
pub mod timeline;
mod watchdog;

use std::sync::{Mutex, MutexGuard};

pub use builder::GroupBuilder;
pub use cluster::{Cluster, Follow};
pub use database::{TestDb, config_with_addr, pool_from_config};
pub use error::KitError;
pub use faults::{PoolHold, Who};
pub use fenced::{FencedWrites, Interleaving, RecordError, Write};
pub use group::{
    Group, Leading, Role, TEST_IDLE_IN_TRANSACTION, TEST_INTERVAL, TEST_POOL_SIZE, identity,
};
pub use locks::{
    LockSession, advisory_holders, holders, lock_sessions, own_advisory_locks, terminate,
};
pub use members::{ShardMember, ShardMembers, ShardMembersBuilder};
pub use pgbouncer::{Pgbouncer, PoolMode};
pub use proxy::FaultProxy;
pub use replicas::{Replica, Replicas, ReplicasBuilder};
pub use server::{PgServer, ShutdownMode};
pub use timeline::{Overlap, Seen, Span, Timeline};

/// The `deadpool-postgres` this crate builds pools with.
pub use deadpool_postgres;
/// The `tokio-postgres` this crate's configurations and clients come from.
pub use tokio_postgres;

/// Holds the process-wide test lock; see [`serial`].
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct SerialGuard {
    _guard: MutexGuard<'static, ()>,
}

/// Takes the process-wide lock that makes timing-sensitive tests of one test
/// binary run one at a time.
///
/// Call it first thing in the test and keep the guard for the whole test:
///
/// ```no_run
/// #[tokio::test]
/// async fn failover_is_fast() {
///     let _serial = pg_elector_testkit::serial();
///     // ...
/// }
/// ```
///
/// A test that panicked while holding it does not poison it for the others.
/// The guard is not `Send`: hold it in the test's own future (as above), not
/// in a spawned task. It only orders tests within one process (a runner that
/// starts a process per test, like cargo-nextest, is not covered).
pub fn serial() -> SerialGuard {
    static LOCK: Mutex<()> = Mutex::new(());
    SerialGuard {
        _guard: LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
    }
}
