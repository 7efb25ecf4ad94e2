//! Test harness for `pg-elector`: throwaway PostgreSQL servers, one database
//! per test, and a TCP proxy that injects network faults.
//!
//! ```no_run
//! use pg_elector_testkit::{FaultProxy, PgServer};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = PgServer::shared()?; // DATABASE_URL, or a private server
//! let db = server.create_database().await?; // dropped with `db`
//! let client = db.connect().await?;
//! client.simple_query("SELECT pg_advisory_lock(1)").await?;
//!
//! let proxy = FaultProxy::start(server.addr()).await?;
//! let pool = db.pool_via(proxy.addr(), 4);
//! let _conn = pool.get().await?;
//! proxy.blackhole(); // partition: nothing moves, nothing closes
//! proxy.reset(); // every connection gets a TCP RST
//! # Ok(())
//! # }
//! ```
//!
//! # Servers
//!
//! [`PgServer::shared`] gives the process-wide server every test can use,
//! each in its own database from [`PgServer::create_database`]. It is the
//! server at `DATABASE_URL` when that is set, else a private one.
//! [`PgServer::spawn`] always starts a new private server, for tests that
//! stop, restart or crash it ([`PgServer::restart`], [`PgServer::stop`],
//! [`PgServer::start_again`]).
//!
//! A private server lives in a new directory under the system temp dir
//! (`pg-elector-testkit-*`), listens on `127.0.0.1` on a free port, trusts
//! user `postgres` without a password, runs with durability off for speed,
//! and logs to `server.log` in that directory. When running as root, every
//! server process runs as the `postgres` user. It is stopped and its
//! directory removed when the [`PgServer`] is dropped, or — for the shared
//! server, which is never dropped, or a test process that is killed — by a
//! watchdog process that notices when the test process is gone.
//!
//! # Wrong servers: read replicas and poolers
//!
//! [`PgServer::spawn_standby`] starts a hot standby of a private server
//! (`pg_is_in_recovery()` is true there) and [`PgServer::promote`] ends its
//! recovery. [`Pgbouncer::start`] puts a private PgBouncer in front of a
//! server, in one of the [`PoolMode`]s.
//!
//! # Database failover
//!
//! [`Cluster`] is a private primary with a test database and a hot standby
//! streaming from it through a [`FaultProxy`] (blackhole it to cut the
//! standby off from the WAL), followed by clients as [`Follow`] says: a
//! multi-host URL with `target_session_attrs=read-write`, or one address that
//! moves ([`FaultProxy::retarget`]). It crashes or stops the primary,
//! promotes the standby and brings the old primary back as a standby
//! ([`PgServer::rejoin_as_standby_of`]); [`PgServer::set_synchronous_standby`]
//! makes commits wait for the standby.
//!
//! # Server binaries
//!
//! `initdb`, `postgres` and `pg_ctl` are looked for in, in order:
//!
//! 1. `PG_BINDIR`, if set: it must contain them (no fallback);
//! 2. `pg_config --bindir` (if it contains them: on Debian `pg_config` may
//!    come from `libpq-dev` and name a client-only directory);
//! 3. the newest `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu);
//! 4. the newest `/usr/pgsql-<version>/bin` (PGDG RPMs);
//! 5. `/usr/local/pgsql/bin` (source builds);
//! 6. the directory of an `initdb` found on `PATH`.
//!
//! PostgreSQL 13 or newer is needed (`DROP DATABASE ... WITH (FORCE)`).
//! Without binaries, install them (`apt-get install postgresql` on Debian or
//! Ubuntu), or set `DATABASE_URL` to use an existing server.
//!
//! # Timing-sensitive tests
//!
//! Tests in one binary run in parallel threads. Take [`serial()`] at the top
//! of tests whose timing must not suffer from the others.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod binaries;
mod cluster;
mod database;
mod error;
mod faults;
mod fenced;
mod locks;
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

pub use cluster::{Cluster, Follow};
pub use database::{TestDb, config_with_addr, pool_from_config};
pub use error::KitError;
pub use faults::{PoolHold, Who};
pub use fenced::{FencedWrites, Interleaving, RecordError, Write};
pub use locks::{LockSession, holders, lock_sessions, terminate};
pub use pgbouncer::{Pgbouncer, PoolMode};
pub use proxy::FaultProxy;
pub use replicas::{
    Leading, Replica, Replicas, ReplicasBuilder, TEST_INTERVAL, TEST_POOL_SIZE, identity,
};
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
