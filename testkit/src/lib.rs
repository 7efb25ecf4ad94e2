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
// Without `protocol`, the child-process protocol's items are public in the module only for the
// workspace's own use (`replica`, below): unreachable, and some unused, by design.
#[cfg_attr(not(feature = "protocol"), allow(unreachable_pub, dead_code))]
mod fleet;
mod host;
mod load;
mod locks;
mod members;
mod pg_server;
mod pgbouncer;
mod private_server;
mod proxy;
mod recorder;
pub mod replicas;
mod runtime;
mod shard_members;
mod slots;
mod standby;
mod watchdog;

pub use database::TestDb;
pub use error::KitError;
pub use faults::Who;
pub use fenced_writes::FencedWrites;
pub use pg_server::PgServer;
pub use proxy::FaultProxy;
pub use recorder::Timeline;

/// Replicas of a service as child processes, which a test can freeze (SIGSTOP), thaw and kill;
/// [`Fleet::serve_child`] is the child's side. Feature `replica`, on by default; the rest of
/// that API is in [`replicas::processes`].
#[cfg(feature = "replica")]
pub use fleet::Fleet;

/// A test's replicas of one service: in this process, one elector each on one key, each with a
/// pool of its own through a [`FaultProxy`] of its own, each running the service the test gave
/// ([`ReplicasBuilder::service`](replicas::MembersBuilder::service)). The faults
/// ([`kill_session`](replicas::Members::kill_session),
/// [`partition`](replicas::Members::partition), ...) act on one replica, or on whoever leads;
/// the waiting helpers say when a leader leads; [`seen`](replicas::Members::seen) tells who led
/// when, and [`assert_no_two_leaders`](replicas::timeline::Seen::assert_no_two_leaders) whether
/// two ever overlapped.
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

/// The database side of a test, beyond [`PgServer`] and [`TestDb`]: how a server stops, its
/// TLS certificates, a failover, a pooler, what the server says about a key, and connection
/// settings.
pub mod server {
    pub use crate::pg_server::ShutdownMode;
    pub use crate::private_server::TlsFiles;

    /// A database failover: a primary and a standby with clients that follow a promotion
    /// ([`Cluster`](crate::server::failover::Cluster)).
    pub mod failover {
        pub use crate::cluster::{Cluster, Follow};
    }

    /// A private PgBouncer in front of a server, for the pooler faults.
    pub mod pooler {
        pub use crate::pgbouncer::{Pgbouncer, PoolMode};
    }

    /// What the server says about a key: the sessions that hold or wait for its advisory
    /// lock, and ending a backend.
    pub mod sql {
        pub use crate::locks::{
            LockSession, advisory_holders, holders, lock_sessions, own_advisory_locks, terminate,
        };
    }

    /// Connection settings and pools as the kit makes them, and the client crates they come
    /// from.
    pub mod config {
        pub use crate::database::{config_with_addr, pool_from_config};

        /// The `deadpool-postgres` this crate builds pools with.
        pub use deadpool_postgres;
        /// The `tokio-postgres` this crate's configurations and clients come from.
        pub use tokio_postgres;
    }
}

/// The child-process protocol of [`replicas::processes`]: the environment a replica process
/// reads, the lines it says on stdout and how the parent parses them. For this workspace's
/// process tests and tools only (feature `protocol`, off by default): not part of the kit's API.
#[cfg(feature = "protocol")]
#[doc(hidden)]
pub mod replica {
    pub use crate::fleet::{
        Board, ENV_ADDR, ENV_FAST, ENV_FENCED, ENV_INTERVAL_MS, ENV_JOB_MS, ENV_KEY, ENV_NAME,
        ENV_PREFERENCE, ENV_URL, Proc, WOKE_GAP_US, for_each_line, key_setting, leaders,
        log_to_stderr, ms_setting, on_current_thread, parse, setting, transitions, unix_us, us,
    };
}
