//! The elector handle: who leads, terms, and gated work.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::builder::ElectorBuilder;
use crate::error::Error;
use crate::key::LockKey;
use crate::local::LocalKind;
use crate::metrics::{Change, Metrics};
use crate::postgres::settings::PgSettings;
use crate::state::Shared;
use crate::term::{Leadership, Term, TermEnd};

/// One replica's part in the election: a cheap, cloneable handle.
///
/// Build it once per process with [`Elector::builder`], start the election with
/// [`run`](Elector::run) (usually as a background task), and gate background work with
/// [`do_work`](Elector::do_work), [`term`](Elector::term) or [`is_leader`](Elector::is_leader).
/// Clones share one election.
///
/// ```no_run
/// use std::time::Duration;
/// use pg_elector::{Elector, LockKey};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// let elector = Elector::builder(pool, LockKey::new(0x7377_6570, 1)).build()?;
/// let shutdown = CancellationToken::new();
/// let election = tokio::spawn({
///     let (elector, shutdown) = (elector.clone(), shutdown.clone());
///     async move { elector.run(shutdown).await }
/// });
///
/// let mut every = tokio::time::interval(Duration::from_secs(30));
/// for _ in 0..10 {
///     every.tick().await;
///     // Runs on the leader only; a standby gets Ok(None).
///     let swept = elector
///         .do_work(|term| async move {
///             // ... one sweep, which may watch `term.token()` to stop early ...
///             Ok::<_, std::io::Error>(42)
///         })
///         .await?;
///     println!("swept {swept:?}");
/// }
///
/// shutdown.cancel(); // the leader unlocks, and a standby takes over within one interval
/// election.await??;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Elector {
    pub(crate) shared: Arc<Shared>,
    mode: Arc<Mode>,
}

/// Who decides leadership.
pub(crate) enum Mode {
    /// The advisory-lock election.
    Postgres(PgSettings),
    /// Local modes: leader from the start, or promoted and demoted by hand.
    Local(LocalKind),
    /// One shard of a group, promoted and demoted by the group's `run`; with the state of the
    /// group's member, whose `run` slot says whether the group runs.
    Shard(PgSettings, Arc<Shared>),
}

impl Elector {
    /// Starts configuring an elector that competes for `key` with connections from `pool`.
    ///
    /// The pool is used for the standby's tries, which borrow a connection for one query and
    /// give it back. The connection that wins the lock is taken out of the pool for good, so
    /// the pool's recycling and lifetime limits never close it.
    pub fn builder(pool: Pool, key: LockKey) -> ElectorBuilder {
        ElectorBuilder::new(pool, key)
    }

    pub(crate) fn from_mode(mode: Mode, metrics: Option<Metrics>) -> Self {
        Self {
            shared: Arc::new(Shared::new(metrics)),
            mode: Arc::new(mode),
        }
    }

    /// Whether this is the handle of one shard of a group (`Shards::elector`), which the
    /// group's `run` runs.
    pub(crate) fn is_shard(&self) -> bool {
        matches!(*self.mode, Mode::Shard(..))
    }

    /// For the handle of one shard of a group: whether the group's `run` is in progress.
    /// `None` for any other elector.
    pub(crate) fn group_runs(&self) -> Option<bool> {
        match &*self.mode {
            Mode::Shard(_, member) => Some(member.is_running()),
            _ => None,
        }
    }

    /// The election's settings; `None` for a local elector.
    pub(crate) fn pg(&self) -> Option<&PgSettings> {
        match &*self.mode {
            Mode::Postgres(pg) | Mode::Shard(pg, _) => Some(pg),
            Mode::Local(_) => None,
        }
    }

    /// The key this elector competes for; `None` for a local elector.
    pub fn key(&self) -> Option<LockKey> {
        self.pg().map(|pg| pg.key)
    }

    /// This replica's identity (see [`ElectorBuilder::identity`]); `None` for a local
    /// elector.
    pub fn identity(&self) -> Option<&str> {
        self.pg().map(|pg| pg.identity.as_str())
    }

    /// The check interval I; `None` for a local elector.
    pub fn check_interval(&self) -> Option<Duration> {
        self.pg().map(|pg| pg.interval)
    }

    /// How long a graceful handover waits for the work still running (see
    /// [`ElectorBuilder::drain_timeout`]); for a local elector, [`DEFAULT_CHECK_INTERVAL`]
    /// (5 s), the default of an elector on PostgreSQL. The launchers of
    /// [`background`](crate::background) let their work in flight finish within it at a graceful
    /// stop.
    ///
    /// [`DEFAULT_CHECK_INTERVAL`]: crate::DEFAULT_CHECK_INTERVAL
    pub fn drain_timeout(&self) -> Duration {
        self.pg()
            .map_or(crate::DEFAULT_CHECK_INTERVAL, |pg| pg.drain_timeout)
    }

    /// The longest a graceful stop of this elector takes once its shutdown is cancelled: the
    /// drain, one check while draining and the unlock on PostgreSQL; the drain timeout of a
    /// local elector. A [`Supervisor`](crate::background::Supervisor) waits at least this long
    /// for its workers.
    pub(crate) fn graceful_stop_bound(&self) -> Duration {
        self.pg()
            .map_or_else(|| self.drain_timeout(), PgSettings::handover_bound)
    }

    /// Whether this replica leads now: one atomic load, plus a clock read on the leader for
    /// its local lease. Callable from any thread, inside or outside a runtime.
    ///
    /// Two reads that both find `true` may belong to two terms: a leader that loses its lock
    /// session while nobody else waits for the lock can take it again within milliseconds,
    /// under a new term (and a new epoch, with fencing). Code that must not carry anything
    /// from one term into the next holds a [`Term`] (from [`term`](Self::term) or
    /// [`do_work`](Self::do_work)), whose token is cancelled when its term ends, or compares
    /// [`Leadership::changes`] from [`subscribe`](Self::subscribe).
    #[inline]
    pub fn is_leader(&self) -> bool {
        self.shared.lease().is_live()
    }

    /// The current term: live on the leader, ended with [`TermEnd::NotLeader`] on a standby.
    pub fn term(&self) -> Term {
        self.shared.term()
    }

    /// Like [`term`](Self::term), but the returned term also ends (with
    /// [`TermEnd::ParentCancelled`]) when `parent` is cancelled.
    pub fn term_with(&self, parent: &CancellationToken) -> Term {
        self.shared.term_with(parent)
    }

    /// Waits until this replica leads, and returns the live term; at once when it leads now.
    ///
    /// Someone must be running [`run`](Self::run) (or promoting a manual elector) for this to
    /// complete.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect.
    pub async fn wait_for_leadership(&self) -> Term {
        let mut changes = self.shared.subscribe();
        loop {
            let term = self.term();
            if term.is_leader() {
                return term;
            }
            // A closed channel cannot happen while `self` holds the sender; a term that is
            // live but whose lease expired is demoted by `run` shortly, which is a change.
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// A receiver of this replica's leadership, told of every promotion and demotion.
    ///
    /// It holds the latest [`Leadership`]: whether this replica leads, how many changes there
    /// have been, why the last term ended and, for a lost term, its
    /// [`LossCause`](crate::LossCause). A receiver that falls behind sees the latest
    /// state, and [`Leadership::changes`] says how many changes it missed. For a `Stream`, wrap
    /// it in `tokio_stream::wrappers::WatchStream`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use pg_elector::{Elector, LossCause, TermEnd};
    ///
    /// let (elector, control) = Elector::manual();
    /// let mut leadership = elector.subscribe();
    /// assert!(!leadership.borrow().is_leader);
    ///
    /// control.promote();
    /// leadership.changed().await.unwrap();
    /// assert!(leadership.borrow_and_update().is_leader);
    ///
    /// control.demote();
    /// leadership.changed().await.unwrap();
    /// let now = leadership.borrow_and_update().clone();
    /// assert!(!now.is_leader);
    /// assert_eq!(now.last_end, Some(TermEnd::LeadershipLost));
    /// assert_eq!(now.loss_cause, Some(LossCause::Demoted));
    /// assert_eq!(now.changes, 2);
    /// # }
    /// ```
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.shared.subscribe()
    }

    /// Runs one unit of background work on the leader only.
    ///
    /// | replica | `f` called | result |
    /// |---|---|---|
    /// | standby | no | `Ok(None)` |
    /// | leader, still leading when `f` returns | yes | `Ok(Some(v))` or `Err(e)` from `f` |
    /// | leader, leadership lost while `f` ran | yes | `Ok(None)`, logged at INFO |
    ///
    /// `f` receives the term, so it can stop early when leadership ends; `do_work` never
    /// aborts it. A demotion is never reported as a failed tick.
    ///
    /// # Errors
    ///
    /// `f`'s error, when `f` fails while this replica still leads.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `f`'s future; the election is not affected.
    pub async fn do_work<T, E, F, Fut>(&self, f: F) -> Result<Option<T>, E>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        static NAME: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        self.do_work_named(NAME.get_or_init(|| "do_work".into()), f)
            .await
    }

    /// [`do_work`](Self::do_work), counted as running under `name` for the drain.
    pub(crate) async fn do_work_named<T, E, F, Fut>(
        &self,
        name: &Arc<str>,
        f: F,
    ) -> Result<Option<T>, E>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // `term` is this call's own handle: the tick gets another one, so a tick that cancels
        // its token (to stop tasks it spawned) does not decide the answer; only leadership does.
        // A standby answers at once. A leader counts itself as running before it looks at its
        // term, so that a graceful handover that ends the term right now either sees this call
        // in its drain or this call sees the ended term.
        if !self.is_leader() {
            return Ok(None);
        }
        let running = self.shared.in_flight().enter(name.clone());
        let term = self.term();
        if !term.is_leader() {
            return Ok(None);
        }
        let outcome = f(term.handle()).await;
        drop(running);
        if term.is_leader() {
            return outcome.map(Some);
        }
        tracing::info!(
            key = self.key().map(tracing::field::display),
            identity = self.identity(),
            end = ?term.end(),
            failed = outcome.is_err(),
            "leadership ended while work ran; its outcome is dropped"
        );
        Ok(None)
    }

    /// Gives leadership up gracefully and stays a standby for at least `cooldown`, then
    /// competes again: for a rolling deploy, or to move the work off this replica.
    ///
    /// On the leader this is a graceful handover, as at shutdown: the term ends (with
    /// [`TermEnd::Resigned`]), the work still running drains (up to the
    /// [drain timeout](crate::ElectorBuilder::drain_timeout)), the lock is unlocked, and another
    /// replica can take over at its next try. Returns `true` then, once the handover is done
    /// (or, should `run` be stuck, after the drain timeout, two check intervals and the
    /// unlock's 2 s; or if leadership was lost meanwhile). On a standby it only starts the
    /// cooldown and returns `false`. The cooldown counts from this call. A manual elector is
    /// demoted; an always-leader one leads again after the cooldown if its `run` is running.
    ///
    /// # Cancel safety
    ///
    /// The handover goes on in `run` if this future is dropped.
    pub async fn resign(&self, cooldown: Duration) -> bool {
        let now = tokio::time::Instant::now();
        // A cooldown too long for the clock ("never again") is a century.
        let until = crate::lease::instant_after(now, cooldown);
        self.shared.cool_down_until(until);
        let was_leader = self.is_leader();
        match &*self.mode {
            Mode::Local(_) => {
                self.shared.demote(TermEnd::Resigned, Change::Resigned);
                self.shared.ask_resign();
                was_leader
            }
            // A shard moves by the group's assignment, not by hand.
            Mode::Shard(..) => false,
            Mode::Postgres(pg) => {
                if !self.shared.is_running() {
                    return false;
                }
                if !was_leader {
                    // A standby's `run` hears of it at once, not at its next try: with fast
                    // takeover it closes its waiting session.
                    self.shared.ask_resign();
                    return false;
                }
                let mut resigned = self.shared.resigned.subscribe();
                resigned.borrow_and_update();
                self.shared.ask_resign();
                // Bounded, should `run` stop meanwhile: the handover takes at most the drain,
                // one check while draining, and the unlock.
                let _ = tokio::time::timeout(pg.handover_bound(), resigned.changed()).await;
                true
            }
        }
    }

    /// Who leads this elector's key now, as the server sees it (see
    /// [`current_leader`](crate::current_leader)), with the epoch from this elector's fencing
    /// table when fencing is on. `None` for a local elector, or when nobody leads.
    ///
    /// Bounded: it waits at most one check interval for a pool connection and one more for the
    /// answer, so a partition or a stalled server makes it fail rather than hang. A connection
    /// whose answer did not come in time is closed rather than given back to the pool.
    ///
    /// # Errors
    ///
    /// [`Error::CurrentLeader`] with [`CurrentLeaderError::PoolTimeout`] when no pool
    /// connection comes within one check interval, [`CurrentLeaderError::Pool`] when the pool
    /// cannot hand one out (a refused connection, the pool's own timeout),
    /// [`CurrentLeaderError::Timeout`] when the answer does not come within one more, and
    /// [`CurrentLeaderError::Query`] when a query fails.
    ///
    /// [`CurrentLeaderError::PoolTimeout`]: crate::CurrentLeaderError::PoolTimeout
    /// [`CurrentLeaderError::Pool`]: crate::CurrentLeaderError::Pool
    /// [`CurrentLeaderError::Timeout`]: crate::CurrentLeaderError::Timeout
    /// [`CurrentLeaderError::Query`]: crate::CurrentLeaderError::Query
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn current_leader(&self) -> Result<Option<crate::LeaderInfo>, Error> {
        let Some(pg) = self.pg() else {
            return Ok(None);
        };
        let found =
            crate::postgres::leader_via(&pg.pool, pg.key, pg.fencing.as_deref(), pg.interval);
        Ok(found.await?)
    }

    /// The statement that creates this elector's fencing table (`CREATE TABLE IF NOT EXISTS
    /// …`), for a migration run by a role that may create tables; `None` without fencing.
    /// The elector's own role then needs `SELECT, INSERT, UPDATE` on it.
    pub fn fencing_ddl(&self) -> Option<String> {
        self.pg()
            .and_then(|pg| pg.fencing.as_ref().map(|t| t.ddl().to_owned()))
    }

    /// The statement that creates this elector's candidates table of preferred leaders
    /// (`CREATE TABLE IF NOT EXISTS …`, see
    /// [`ElectorBuilder::candidates_table`](crate::ElectorBuilder::candidates_table)), for a
    /// migration run by a role that may create tables; `None` for a local elector. A replica
    /// with a preference creates it when missing, if its role may; the role needs `SELECT,
    /// INSERT, UPDATE, DELETE` on it.
    pub fn candidates_ddl(&self) -> Option<String> {
        self.pg().map(|pg| pg.candidates.ddl().into_owned())
    }

    /// Spawns [`run`](Self::run) on the current tokio runtime: the short form of
    /// `tokio::spawn({ let e = elector.clone(); async move { e.run(shutdown).await } })`.
    /// Cancel `shutdown` and await the handle for a graceful handover.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn spawn(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<Result<(), Error>> {
        let elector = self.clone();
        tokio::spawn(async move { elector.run(shutdown).await })
    }

    /// Takes part in the election until `shutdown` is cancelled; the guide
    /// [how it works](crate::guide::how_it_works) has the rules it follows.
    ///
    /// Database failures are not errors here: they are logged at WARN, the replica stays a
    /// standby (or is demoted), and the election goes on.
    ///
    /// A standby's connection attempt from the pool that is still under way after 10 check
    /// intervals, at least 75 s, is started again with a WARN (a server that accepts TCP and
    /// never answers would hold it for good), and each attempt started again in a row may take
    /// twice as long as the one before, up to 16 times the first. So a multi-host URL whose
    /// first host drops SYNs, without `connect_timeout`, does not keep every replica a standby:
    /// if getting past the dead hosts takes C (the kernel's SYN timeout, about 127 s on Linux,
    /// per dead host), a replica leads within 3·C and six check intervals, as long as C is
    /// under 16 times the first limit. A `connect_timeout` on the pool bounds it far more
    /// tightly.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyRunning`] at once when another `run` of this elector is in progress;
    /// [`Error::RunOnShard`] at once for a shard's elector (its group's `Shards::run` runs it).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (an aborted task, a lost `select!`) ends the term with
    /// [`TermEnd::LeadershipLost`] and closes the lock connection without unlocking; the server
    /// frees the lock with the session. `run` may be called again afterwards.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), Error> {
        match &*self.mode {
            Mode::Postgres(pg) => {
                let span = tracing::info_span!(
                    "election",
                    key = %pg.key,
                    identity = %pg.identity,
                    interval = ?pg.interval,
                );
                crate::postgres::run(&self.shared, pg, shutdown)
                    .instrument(span)
                    .await
            }
            Mode::Local(kind) => crate::local::run(&self.shared, *kind, shutdown).await,
            Mode::Shard(..) => Err(Error::RunOnShard),
        }
    }
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("key", &self.key())
            .field("check_interval", &self.check_interval())
            .field("is_leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}
