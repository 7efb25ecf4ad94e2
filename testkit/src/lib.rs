#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod binaries;
mod builder;
mod cluster;
mod command;
mod database;
mod error;
mod faults;
mod fenced_writes;
#[cfg(feature = "replica")]
mod fleet;
mod host;
mod load;
mod locks;
mod members;
mod pgbouncer;
mod private_server;
mod proxy;
mod recorder;
pub mod replicas;
mod runtime;
mod server;
mod shard_members;
mod slots;
mod standby;
mod watchdog;

pub use database::TestDb;
pub use error::KitError;
pub use faults::Who;
pub use fenced_writes::FencedWrites;
pub use proxy::FaultProxy;
pub use recorder::Timeline;
pub use server::{PgServer, ShutdownMode};
pub use slots::{SerialGuard, serial, timing};

/// Replicas of a service as child processes, which a test can freeze (SIGSTOP), thaw and kill;
/// [`Fleet::serve_child`] is the child's side. Feature `replica`, on by default; the rest of
/// that API is in [`processes`].
#[cfg(feature = "replica")]
pub use fleet::Fleet;

/// A test's replicas of one service: in this process, one elector each on one key, each with a
/// pool of its own through a [`FaultProxy`] of its own, each running the service the test gave
/// ([`ReplicasBuilder::service`](replicas::MembersBuilder::service)). The faults
/// ([`kill_session`](replicas::Members::kill_session),
/// [`partition`](replicas::Members::partition), ...) act on one replica, or on whoever leads;
/// the waiting helpers say when a leader leads; [`seen`](replicas::Members::seen) tells who led
/// when, and [`assert_no_two_leaders`](timeline::Seen::assert_no_two_leaders) whether two ever
/// overlapped.
///
/// Start them with [`Replicas::builder`](replicas::Members::builder). Dropping them aborts
/// every replica (as a crash would) without waiting.
pub type Replicas = replicas::Members<replicas::Replica>;

/// A test's replicas of a sharded service: in this process, each a member of one group of
/// shards, with a pool of its own through a [`FaultProxy`] of its own, each running the service
/// the test gave ([`ShardMembersBuilder::service`](replicas::MembersBuilder::service)). The
/// faults are those of [`Replicas`], on a member or on a shard's owner ([`Who::Owner`]);
/// [`seen`](replicas::Members::seen) has one lane per shard, and its overlaps are two owners of
/// one shard at once.
///
/// Start them with [`ShardMembers::builder`](replicas::Members::builder).
pub type ShardMembers = replicas::Members<replicas::ShardMember>;

/// What the server says about a key: the sessions that hold or wait for its advisory lock, and
/// ending a backend.
pub mod sql {
    pub use crate::locks::{
        LockSession, advisory_holders, holders, lock_sessions, own_advisory_locks, terminate,
    };
}

/// Connection settings and pools as the kit makes them, and the client crates they come from.
pub mod config {
    pub use crate::database::{config_with_addr, pool_from_config};

    /// The `deadpool-postgres` this crate builds pools with.
    pub use deadpool_postgres;
    /// The `tokio-postgres` this crate's configurations and clients come from.
    pub use tokio_postgres;
}

/// A database failover: a primary and a standby with clients that follow a promotion
/// ([`Cluster`](crate::failover::Cluster)).
pub mod failover {
    pub use crate::cluster::{Cluster, Follow};
}

/// A private PgBouncer in front of a server, for the pooler faults.
pub mod pooler {
    pub use crate::pgbouncer::{Pgbouncer, PoolMode};
}

/// What a [`Timeline`] saw: who led when, as `is_leader()` and the server said, and the
/// overlaps found in it.
pub mod timeline {
    pub use crate::recorder::{
        Overlap, SAMPLE_EVERY, SERVER_EVERY, Seen, ServerView, Span, TimelineBuilder,
    };
}

/// The writes a [`FencedWrites`] read, and why one could not be recorded.
pub mod fenced {
    pub use crate::fenced_writes::{Interleaving, RecordError, Write};
}

/// Replicas as child processes (feature `replica`, on by default): a
/// [`Fleet`] of the running test binary started again, which can be frozen (SIGSTOP), thawed and killed.
/// See the crate's documentation, "Replicas as processes".
#[cfg(feature = "replica")]
pub mod processes {
    pub use crate::fleet::{Event, Fleet, FleetBuilder, What, child, child_with, is_child};
}

/// The child-process protocol of [`processes`](crate::processes): the environment a replica process reads, the
/// lines it says on stdout and how the parent parses them. Used by this workspace's process
/// tests and tools; not a stable part of the kit.
#[cfg(feature = "replica")]
#[doc(hidden)]
pub mod replica {
    pub use crate::fleet::{
        Board, ENV_ADDR, ENV_FAST, ENV_FENCED, ENV_INTERVAL_MS, ENV_JOB_MS, ENV_KEY, ENV_NAME,
        ENV_PREFERENCE, ENV_URL, Proc, WOKE_GAP_US, for_each_line, key_setting, leaders,
        log_to_stderr, ms_setting, on_current_thread, parse, setting, transitions, unix_us, us,
    };
}
