//! Shards: spread the leader's work across the replicas.
//!
//! A group of `count` shards (tenants, partitions, independent sweeps) is split among the
//! replicas that run it: each shard has exactly one owner at a time, each replica owns about
//! `count / replicas` of them, and a replica that dies, joins or leaves moves only its share.
//! All of a replica's shards live on **one** lock session (one backend beyond the pool, however
//! many shards), checked with one statement per interval.
//!
//! - **Members** are the replicas whose lock session holds the group's shared lock, as the
//!   server's `pg_locks` shows it: no table, no heartbeat rows. Identities need not be unique.
//!   A member counts in the assignment only once it has shown that it hears the server: its
//!   first check passed, it took a second shared lock of the group (its live mark), and the
//!   others have seen it start another statement since (its next check, half an interval
//!   later). So a join cut off right after its grant, or right after its mark, moves no shard
//!   (see the [shards guide](crate::guide::shards) for servers that hide other sessions'
//!   activity).
//! - **Assignment**: every member computes the same target owner for every shard from the same
//!   member list and the same holders, both read by its check: a quota of ⌊S/N⌋ or ⌈S/N⌉
//!   shards per member, each keeping what it holds up to its quota, the rest by rendezvous
//!   hashing. A join moves the newcomer's share alone, a leave the leaver's shards alone.
//! - **Ownership is the lock**: a member owns a shard while its session holds the shard's
//!   advisory lock (a [`LockKey`] of the group's class and the shard's index). It takes a
//!   target shard with a try; it gives a shard whose target moved away only after that shard's
//!   term has ended and its work has drained (up to the drain timeout), then unlocks that shard
//!   alone. Members that briefly disagree on the member list only race for locks; the server
//!   decides, so a shard never has two owners.
//! - **Per shard**, everything a single [`Elector`] gives: a [`Term`] (with its own epoch under
//!   fencing), [`do_work`](Shards::do_work), and [`elector`](Shards::elector), a handle on the
//!   shard for the launchers of [`background`](crate::background) and for
//!   [`Schedule`](crate::schedule::Schedule).
//!
//! ```no_run
//! use std::time::Duration;
//! use pg_elector::shards::Shards;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! let shards = Shards::builder(pool, "billing/tenants", 64)
//!     .check_interval(Duration::from_secs(1))
//!     .build()?;
//! let shutdown = CancellationToken::new();
//! let membership = shards.spawn(shutdown.clone());
//! for shard in shards.owned() {
//!     // Runs only while this replica owns the shard; elsewhere Ok(None).
//!     shards
//!         .do_work(shard, |_term| async move {
//!             // ... reconcile the tenants of shard.index() ...
//!             Ok::<_, std::io::Error>(())
//!         })
//!         .await?;
//! }
//! shutdown.cancel(); // drains and unlocks every shard; the others take them over
//! membership.await??;
//! # Ok(()) }
//! ```
//!
//! **Bounds**, in check intervals I: a killed replica's shards are owned again within 1·I of
//! the server freeing them; a replica that leaves gracefully drains and unlocks, and the others
//! own its shards within 1·I of the unlock; a joining replica reaches its share within
//! 2.5·I plus the moved shards' drain; a partitioned replica ends all its terms within 2·I, before
//! the server can free its locks (4·I); a replica whose lock session ends under it steps down
//! within milliseconds, and a shard it held starts its next term 5 ms after the grant.
//!
//! **Limits.** Every held shard takes a slot of the server's shared lock table, which holds
//! `max_locks_per_transaction × (max_connections + max_prepared_transactions)` locks in all
//! (6 400 with the defaults), shared with every other lock of the server. When the table is
//! full, the shards that do not fit stay unowned, an ERROR line names the setting to raise
//! (once a minute), and the shards already held stay held.
//!
//! **A group of one shard is not an [`Elector`].** Underneath they share the try, the lock
//! session and its bounds, the check, the local lease, the drain and fencing. But a member's
//! one session holds the locks of many shards, and that changes four things:
//!
//! - *No fast takeover.* A standby elector can keep a second session waiting on the server for
//!   its one key. A member would need one waiting session per shard: the backends a group
//!   exists to save. So a shard whose owner is gone is taken at another member's next check,
//!   within 1·I, not within milliseconds.
//! - *No handover marker.* A leader that gives its lock up gracefully marks the waiting
//!   session it hands the lock to, so that the next term starts at once. A member that unlocks
//!   a shard has no one to mark: no session waits for that shard, and the next owner's try
//!   comes at its own next check. So every shard's term starts 5 ms after its lock is granted,
//!   the pause that lets an owner whose session was ended under it step down first.
//! - *No resign.* Which member owns a shard is computed from the member list, the same way on
//!   every member, so a member that gave a shard up would find it its own again at its next
//!   check. The `resign` of [`elector(shard)`](Shards::elector) does nothing and returns
//!   `false`. To move work off a replica, stop it: its shards drain and move to the others.
//! - *Behind a transaction pooler, a member is found out within two checks, not one.* Such a
//!   pooler gives each statement whichever server session is free, so a session lock means
//!   nothing there. A replica finds this out when its check lands on a server session that is
//!   not its own, or on its own after another replica's try passed through it. Standby electors
//!   try every interval, so a leader meets such a try before its next check. A member that has
//!   joined tries no more through the pool, so the try that gives it away comes only from a
//!   replica still joining, which may be one interval later. Either way, no shard ever has two
//!   owners. The pooler would keep the server session that holds the member's locks open
//!   after the member lets go, so a member found out ends that server session (known from a
//!   check that proved it its own): its shards and its live mark do not outlive it there. A
//!   member found out before any check passed holds only the group's shared lock there, which
//!   counts for nothing, until the pooler closes that server session.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::Error;
use crate::{Elector, LockKey, Term};

pub(crate) mod assign;
mod builder;
pub(crate) mod group;
mod loops;
mod member;

pub use builder::ShardsBuilder;
pub(crate) use group::Inner;
pub use group::{Ownership, ShardId};
pub use loops::ShardLoops;

/// One replica's part in a group of shards: a cheap, cloneable handle.
///
/// Build it with [`Shards::builder`], start it with [`run`](Self::run) (or
/// [`spawn`](Self::spawn)), and gate each shard's work with [`do_work`](Self::do_work),
/// [`term`](Self::term) or [`is_owner`](Self::is_owner). Clones share one membership.
#[derive(Clone)]
pub struct Shards {
    pub(crate) inner: Arc<Inner>,
}

impl Shards {
    /// Starts configuring a group of `count` shards named `group`, competed for with
    /// connections from `pool`. Every replica of the group must use the same name and count:
    /// members that see another count among the members say so at ERROR, and each count's
    /// members share the shards among themselves only (see the [shards guide](crate::guide::shards) on changing the count).
    ///
    /// The group's keys are derived from its name: class from
    /// [`LockKey::from_name`]`("pg_elector/shards/<group>")`, object the shard's index (and −1
    /// for the membership lock).
    pub fn builder(
        pool: deadpool_postgres::Pool,
        group: impl Into<String>,
        count: u32,
    ) -> ShardsBuilder {
        ShardsBuilder::new(pool, group.into(), count)
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// How many shards the group has.
    pub fn count(&self) -> u32 {
        self.inner.shards.len() as u32
    }

    /// The shard of this index; `None` when `index >= count`.
    pub fn shard(&self, index: u32) -> Option<ShardId> {
        (index < self.count()).then(|| ShardId {
            index,
            key: LockKey::new(self.inner.class, index as i32),
        })
    }

    /// Every shard of the group, in index order.
    pub fn all(&self) -> impl Iterator<Item = ShardId> + '_ {
        (0..self.count()).filter_map(|i| self.shard(i))
    }

    /// The handle on one shard: an [`Elector`] that leads while this replica owns the shard,
    /// for the launchers of [`background`](crate::background) (a per-shard
    /// [`LeaderTicker`](crate::background::LeaderTicker) or
    /// [`WhileLeader`](crate::background::WhileLeader)), a [`Schedule`](crate::schedule::Schedule),
    /// or code that takes an `Elector`. Its [`run`](Elector::run) returns
    /// [`Error::RunOnShard`]: the group's [`run`](Self::run) runs every shard; handed to
    /// [`Supervisor::election`](crate::background::Supervisor::election), its worker watches
    /// that the group runs and fails when it does not (nothing would lead the shard). Its
    /// [`resign`](Elector::resign) does nothing and returns `false`. `None` for a shard of
    /// another group.
    pub fn elector(&self, shard: ShardId) -> Option<&Elector> {
        self.inner
            .shards
            .get(shard.index as usize)
            .filter(|_| shard.key.class() == self.inner.class)
    }

    /// Whether this replica owns `shard` now: one atomic load and a clock read, as
    /// [`Elector::is_leader`].
    pub fn is_owner(&self, shard: ShardId) -> bool {
        self.elector(shard).is_some_and(Elector::is_leader)
    }

    /// The shards this replica owns now, in index order.
    pub fn owned(&self) -> Vec<ShardId> {
        self.all().filter(|s| self.is_owner(*s)).collect()
    }

    /// Whether this replica is a member of the group now (its lock session holds the group's
    /// shared lock and its last check passed).
    pub fn is_member(&self) -> bool {
        self.inner.member.is_leader()
    }

    /// The shard's current term: live while this replica owns it, ended with
    /// [`TermEnd::NotLeader`](crate::TermEnd::NotLeader) otherwise. A shard moved to another
    /// member ends its term with [`TermEnd::Moved`](crate::TermEnd::Moved).
    pub fn term(&self, shard: ShardId) -> Term {
        match self.elector(shard) {
            Some(elector) => elector.term(),
            None => Term::not_leader(),
        }
    }

    /// Runs one unit of the shard's work while this replica owns it, as
    /// [`Elector::do_work`] does for a leader: `Ok(None)` without calling `f` when it does not
    /// own the shard, `Ok(None)` when the shard's term ended while `f` ran, else `f`'s result.
    /// A moved shard is not unlocked until the `do_work` calls running on it have returned
    /// (up to the drain timeout).
    ///
    /// # Errors
    ///
    /// `f`'s error, when `f` fails while this replica still owns the shard.
    pub async fn do_work<T, E, F, Fut>(&self, shard: ShardId, f: F) -> Result<Option<T>, E>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.elector(shard) {
            Some(elector) => elector.do_work(f).await,
            None => Ok(None),
        }
    }

    /// A receiver of the owned set, told of every change.
    pub fn subscribe(&self) -> watch::Receiver<Ownership> {
        self.inner.ownership.subscribe()
    }

    /// The statement that creates the fencing table; `None` without fencing.
    pub fn fencing_ddl(&self) -> Option<String> {
        self.inner.member.fencing_ddl()
    }

    /// Spawns [`run`](Self::run) on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn spawn(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<Result<(), Error>> {
        let shards = self.clone();
        tokio::spawn(async move { shards.run(shutdown).await })
    }

    /// Takes part in the group until `shutdown` is cancelled: joins it (one lock session),
    /// checks that session every interval, takes the shards assigned to this replica and
    /// gives up those assigned elsewhere. At shutdown every shard's term ends, their work
    /// drains (up to the drain timeout), and every lock of the group is unlocked at once (the
    /// group's alone: other advisory locks of the session stay).
    ///
    /// Database failures are not errors here: they are logged, the shards' terms end, and
    /// the replica joins again at the next interval.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyRunning`] at once when another `run` of this group's handle is in
    /// progress.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future ends every shard's term and closes the lock session without an
    /// unlock; the server frees the locks with it.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        let span = tracing::info_span!(
            "shards",
            group = %self.inner.group,
            identity = self.inner.member.identity().unwrap_or_default(),
        );
        member::run(&self.inner, shutdown).instrument(span).await
    }
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("group", &self.inner.group)
            .field("count", &self.count())
            .field("owned", &self.owned().len())
            .finish_non_exhaustive()
    }
}
