//! Building an [`Elector`]: on PostgreSQL, or a local one; both over one set of metrics options.

use std::time::Duration;

use deadpool_postgres::Pool;
#[cfg(feature = "prometheus")]
use prometheus::Registry;

use crate::elector::{Elector, Mode};
use crate::identity::{default_identity, kept_whole};
use crate::metrics::MetricsSpec;
use crate::postgres::settings::PgSettings;
use crate::postgres::{CandidatesTable, DEFAULT_FENCING_TABLE, FenceTable};
use crate::{BuildError, Error, LockKey};

/// The default check interval: 5 s.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The smallest check interval `build` accepts.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// The largest check interval `build` accepts: 4 × interval must fit `idle_session_timeout`
/// (at most 2³¹ − 1 ms).
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(i32::MAX as u64 / 4);

/// Configures an [`Elector`]; made by [`Elector::builder`].
///
/// ```
/// use std::time::Duration;
/// use pg_elector::{Elector, LockKey};
///
/// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
/// let registry = prometheus::Registry::new();
/// let elector = Elector::builder(pool, LockKey::new(0x7377_6570, 1))
///     .check_interval(Duration::from_secs(2))
///     .registry(&registry)
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug)]
pub struct ElectorBuilder {
    pool: Pool,
    key: LockKey,
    check_interval: Duration,
    metrics: MetricsSpec,
    identity: Option<String>,
    fencing: bool,
    fencing_schema: Option<String>,
    fencing_table: String,
    drain_timeout: Option<Duration>,
    fast_takeover: bool,
    prepared_statements: Option<bool>,
    preference: Option<u64>,
    /// The candidates table's schema and name, when not the default.
    candidates_table: Option<(Option<String>, String)>,
}

impl ElectorBuilder {
    pub(crate) fn new(pool: Pool, key: LockKey) -> Self {
        Self {
            pool,
            key,
            check_interval: DEFAULT_CHECK_INTERVAL,
            metrics: MetricsSpec::default(),
            identity: None,
            fencing: false,
            fencing_schema: None,
            fencing_table: DEFAULT_FENCING_TABLE.to_owned(),
            drain_timeout: None,
            fast_takeover: false,
            prepared_statements: None,
            preference: None,
            candidates_table: None,
        }
    }

    /// Who this replica is, as the lock session's `application_name` (in `pg_stat_activity`
    /// and [`current_leader`](crate::current_leader)), the epoch row's holder and the
    /// `identity` field of the election's log lines. Default `<hostname>-<pid>` (the host name
    /// cut to its end, to fit). PostgreSQL keeps the first 63 bytes, and shows a character
    /// outside printable ASCII otherwise; with a [`preference`](Self::preference), which finds
    /// standbys by their identity, [`build`](Self::build) refuses such an identity. Give each
    /// replica of a key its own: preferences cannot tell apart two live replicas with one
    /// identity, and when either has a preference that is logged at ERROR.
    pub fn identity(mut self, name: impl Into<String>) -> Self {
        self.identity = Some(name.into());
        self
    }

    /// Fencing epochs (default off): every new term bumps a per-key epoch row in a table, in
    /// the lock session, before it starts; [`Term::epoch`](crate::Term::epoch) says the term's
    /// epoch and [`Term::fence`](crate::Term::fence) checks it inside the caller's transaction,
    /// so that a deposed leader's writes fail instead of landing after the next leader's.
    ///
    /// An epoch is at least the server's clock in milliseconds (since 1970) when its term
    /// began: large numbers that always increase, with gaps, not 1, 2, 3. Through the clock,
    /// a term on a promoted standby that never received the old primary's latest epochs still
    /// gets a larger one, as long as the two servers' clocks agree to within the failover's
    /// duration (see [`Term::epoch`](crate::Term::epoch)).
    ///
    /// The table (default `pg_elector_epochs`, see [`fencing_table`](Self::fencing_table)) is
    /// created on the first grant when it is missing; a role that may not create it gets an
    /// error in the log naming the statement to run once as a role that may. The role needs
    /// `SELECT, INSERT, UPDATE` on it.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// The epoch table's name (default `pg_elector_epochs`) and, optionally, its schema
    /// (default: the first schema of the `search_path`). Names are quoted as identifiers, so
    /// they are taken as written, case included. Turns fencing on. The schema is not created:
    /// while it is missing, the log says so in an error naming the statement to run, as for a
    /// role that may not create the table.
    pub fn fencing_table(mut self, schema: Option<&str>, table: &str) -> Self {
        self.fencing = true;
        self.fencing_schema = schema.map(str::to_owned);
        self.fencing_table = table.to_owned();
        self
    }

    /// How long a graceful handover (shutdown or [`resign`](crate::Elector::resign)) waits for
    /// work still running on this replica after its term ended: `do_work` calls and
    /// while-leader loops. Default: one check interval. The lock is given up when the work is
    /// done or the limit passes, whichever is first; what still runs then is named in a WARN
    /// line. While it waits, the leader keeps checking its session every interval. A handover
    /// to a more preferred standby ([`preference`](Self::preference)) drains the same way, at
    /// the leader's next check after that standby appears: size the limit for the longest work
    /// that should end in place rather than be cut off.
    pub fn drain_timeout(mut self, limit: Duration) -> Self {
        self.drain_timeout = Some(limit);
        self
    }

    /// Fast takeover (default off): up to three standbys per key also keep a session of their
    /// own waiting for the lock on the server, so that one of them leads within milliseconds
    /// of the leader letting go (a graceful release, a killed process, an ended session)
    /// instead of at a standby's next try, up to one interval later.
    ///
    /// It costs one more backend per waiting standby, outside the pool's size, at most three
    /// per key: a fleet of 50 replicas on one key holds 3 waiting sessions besides the
    /// leader's (the others only try; a long queue of waiting sessions on one key makes
    /// PostgreSQL's deadlock checks stall the server). Everything else stays as
    /// without it: the standby still tries every interval (so a waiting session that breaks,
    /// or a server restart, only falls back to that), and a grant on the waiting session goes
    /// through the same checks (read replica, pooler), bounds, identity and epoch before its
    /// term starts, as after a try: when the old leader's session ended without an unlock, the
    /// term starts 5 ms after the grant (every leader looks at its connection every 1 ms, so
    /// one whose session was ended under it has stepped down by then); after a graceful unlock
    /// it starts at once. Turn it on for every replica of a key.
    ///
    /// ```
    /// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
    /// use pg_elector::{Elector, LockKey};
    ///
    /// let elector = Elector::builder(pool, LockKey::from_name("billing/sweep"))
    ///     .fast_takeover(true)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn fast_takeover(mut self, on: bool) -> Self {
        self.fast_takeover = on;
        self
    }

    /// Prepared statements for a standby's tries and the leader's checks: `true` on every pool
    /// connection, `false` on none. By default (without this call) on each pool connection that
    /// reaches PostgreSQL directly, and unnamed elsewhere.
    ///
    /// A prepared statement is parsed and planned once per connection; an unnamed one at every
    /// try and check. Prepared, a refused try costs the server about what a bare prepared
    /// `pg_try_advisory_lock` costs, and the leader's check about a third of its unnamed form
    /// (the figures are in the crate's `BENCHMARKS.md`).
    ///
    /// By default the elector asks each new pool connection once (`SELECT pg_backend_pid()`,
    /// unnamed) whether the backend serving it is the one its cancel key names. PostgreSQL
    /// gives a connection the key of its own backend; a pooler gives its own keys, since one
    /// client connection of a pooler meets many server sessions. So behind any pooler the
    /// statements go unnamed: behind a transaction-mode pooler that does not keep prepared
    /// statements per client (PgBouncer before 1.21, or with `max_prepared_statements = 0`),
    /// the driver's statement names (`s0`, `s1`, ..., the same in every process) could meet
    /// another client's statement of the same name on a shared server session, and a statement
    /// of that client's could run with the elector's values.
    ///
    /// The test is a heuristic: a pooler that hands a client a real backend's key (pgagroal
    /// replays the key of the server session the client logged in on) passes it. Every
    /// prepared answer also names the backend that gave it, and the first from another backend
    /// than the key names turns prepared statements off for good, with a WARN line; behind
    /// such a pooler, turn them off (`false`) from the start.
    ///
    /// Turn it on (`true`) behind a pooler that keeps prepared statements per client: a
    /// session-mode pooler, or PgBouncer 1.21 or later with `max_prepared_statements` above 0.
    /// A shard group's statements go unnamed whatever this says. Whatever the choice,
    /// the elector turns prepared statements off for good, with an INFO line, the first time a
    /// server session does not have one (a `DEALLOCATE ALL` or `DISCARD ALL` between
    /// statements, for one, which the server also logs as an ERROR, once per elector) or a try
    /// finds a transaction pooler.
    ///
    /// ```
    /// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
    /// use pg_elector::{Elector, LockKey};
    ///
    /// // Behind PgBouncer 1.21 or later, with `max_prepared_statements = 200`.
    /// let elector = Elector::builder(pool, LockKey::from_name("billing/sweep"))
    ///     .prepared_statements(true)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepared_statements = Some(on);
        self
    }

    /// How much this replica prefers to lead (default: none, which counts as 0). A live standby
    /// whose preference is strictly higher than the leader's gets the lead: the leader sees it
    /// at its next check, ends its term gracefully (its work drains, up to the
    /// [drain timeout](Self::drain_timeout)), unlocks, and the lock goes to the most preferred
    /// live standby, not to whichever tries first. Equal preferences never move the lead.
    ///
    /// For a rolling deploy, give each deploy a higher preference than the last (the time the
    /// pipeline deployed, in seconds): the first new replica to stand by takes the lead from
    /// the old leader, and the lead moves once per deploy. A number tied to the release (a
    /// version, a build number) goes down on a rollback, and the lead then moves at each
    /// replacement, as without preferences (the guide ["Who leads"](crate::guide::preferences) says more).
    ///
    /// A replica with a preference says it is alive at each try, in a row of the table
    /// `pg_elector_candidates` (created when missing), on a connection of the pool it tries
    /// from: a small write per check interval, no extra backend. A replica that stops
    /// gracefully removes its row; one that stops trying (frozen, cut off) stops counting two
    /// check intervals after its last try, and the free lock is left to it at most that long.
    /// A replica that cannot keep the lead it is handed stays quiet for a while after each
    /// failure (four intervals, doubling), so that the lead does not move back and forth. A
    /// replica built without a preference writes nothing and counts as 0, and can't be named
    /// in [`request_handover`](crate::request_handover); it still leaves the lock to a more
    /// preferred live standby. Identities must be unique per key for this (the default is).
    /// The guide ["Who leads"](crate::guide::preferences) has the details and the measured figures.
    ///
    /// ```
    /// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
    /// use pg_elector::{Elector, LockKey};
    ///
    /// // When the pipeline deployed this replica (rollbacks included), from the environment.
    /// let deployed_at: u64 = std::env::var("DEPLOYED_AT").ok().and_then(|t| t.parse().ok()).unwrap_or(0);
    /// let elector = Elector::builder(pool, LockKey::from_name("billing/sweep"))
    ///     .preference(deployed_at)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn preference(mut self, preference: u64) -> Self {
        self.preference = Some(preference);
        self
    }

    /// The candidates table of preferred leaders ([`preference`](Self::preference)): its name
    /// (default `pg_elector_candidates`) and, optionally, its schema (default: the first
    /// schema of the `search_path`). Names are quoted as identifiers, so they are taken as
    /// written, case included. Every replica of a key, and every
    /// [`request_handover_in`](crate::request_handover_in) for it, must name the same table:
    /// a replica that reads another table neither sees the others' preferences nor hands over
    /// on request. The schema is not created: while it is missing, a replica with a preference
    /// says so in an error naming the statement to run ([`Elector::candidates_ddl`]), and the
    /// election goes on as without preferences.
    ///
    /// ```
    /// # fn example(pool: deadpool_postgres::Pool) -> Result<(), pg_elector::Error> {
    /// use pg_elector::{Elector, LockKey};
    ///
    /// let elector = Elector::builder(pool, LockKey::from_name("billing/sweep"))
    ///     .preference(2)
    ///     .candidates_table(Some("ops"), "leader_candidates")
    ///     .build()?;
    /// assert!(elector.candidates_ddl().unwrap().contains(r#""ops"."leader_candidates""#));
    /// # Ok(()) }
    /// ```
    pub fn candidates_table(mut self, schema: Option<&str>, table: &str) -> Self {
        self.candidates_table = Some((schema.map(str::to_owned), table.to_owned()));
        self
    }

    /// The one interval I that drives the election (default 5 s; zero means the default).
    ///
    /// A standby tries the lock every I; the leader checks its session every I and each check
    /// may take at most I; the lock session's `idle_session_timeout` is 4·I. Smaller intervals
    /// give faster takeover and cost one query per I per replica.
    ///
    /// [`build`](Self::build) rejects an interval below 10 ms or above 2³¹ − 1 ms / 4.
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.check_interval = if every.is_zero() {
            DEFAULT_CHECK_INTERVAL
        } else {
            every
        };
        self
    }

    /// Registers the elector's metrics in `registry`. Default: no metrics.
    ///
    /// | metric | type | labels |
    /// |---|---|---|
    /// | `pg_elector_leader` (see [`gauge_name`](Self::gauge_name)) | gauge: 1 while this replica leads, else 0 | `key` |
    /// | `pg_elector_leadership_changes_total` | counter of promotions and demotions | `key`, `cause` |
    /// | `pg_elector_check_duration_seconds` | histogram of the leader's checks | `key` |
    /// | `pg_elector_epoch` | gauge: the fencing epoch of this replica's latest term (with fencing) | `key` |
    ///
    /// `key` is `class:object`. `cause` is `acquired` for a promotion, and for a demotion one of
    /// `released` (shutdown), `resigned`, `handed_over` (to a preferred standby, or on request), `connection_closed`, `lease_expired`, `lock_gone`, `pooler`,
    /// `check_timeout`, `check_failed`, `abandoned` (`run` dropped while leading), `demoted`
    /// (a manual elector). Electors given the same registry share the collectors; summed over
    /// the replicas, the gauge is 1 per key in steady state.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &Registry) -> Self {
        self.metrics.registry = Some(registry.clone());
        self
    }

    /// The leader gauge's name (default `pg_elector_leader`), for example
    /// `scheduler_is_leader`.
    #[cfg(feature = "prometheus")]
    pub fn gauge_name(mut self, name: impl Into<String>) -> Self {
        self.metrics.gauge_name = name.into();
        self
    }

    /// Checks the configuration and makes the elector. It does nothing until
    /// [`Elector::run`] is called.
    ///
    /// # Errors
    ///
    /// [`BuildError::IntervalTooSmall`] and [`BuildError::IntervalTooLarge`] for an interval out of
    /// range; [`BuildError::InvalidFencingTable`] and [`BuildError::InvalidCandidatesTable`] for an empty or
    /// overlong table or schema name;
    /// [`BuildError::InvalidIdentity`] for an identity with a NUL byte, or, with a
    /// [`preference`](Self::preference), one over 63 bytes or with a character outside
    /// printable ASCII;
    /// `BuildError::MetricClash` or `BuildError::Metric` when the registry refuses a metric.
    pub fn build(self) -> Result<Elector, Error> {
        let interval = self.check_interval;
        if interval < MIN_CHECK_INTERVAL {
            return Err(BuildError::IntervalTooSmall { interval }.into());
        }
        if interval > MAX_CHECK_INTERVAL {
            return Err(BuildError::IntervalTooLarge { interval }.into());
        }
        let candidates = match &self.candidates_table {
            Some((schema, table)) => CandidatesTable::new(schema.as_deref(), table)
                .map_err(|name| BuildError::InvalidCandidatesTable { name })?,
            None => CandidatesTable::default(),
        };
        let metrics = self.metrics.register(&self.key.to_string())?;
        let identity = self.identity.unwrap_or_else(default_identity);
        if identity.contains('\0') || (self.preference.is_some() && !kept_whole(&identity)) {
            return Err(BuildError::InvalidIdentity { identity }.into());
        }
        let fencing = match self.fencing {
            true => Some(FenceTable::new(
                self.fencing_schema.as_deref(),
                &self.fencing_table,
            )?),
            false => None,
        };
        Ok(Elector::from_mode(
            Mode::Postgres(PgSettings {
                pool: self.pool,
                key: self.key,
                interval,
                identity,
                fencing,
                drain_timeout: self.drain_timeout.unwrap_or(interval),
                fast_takeover: self.fast_takeover,
                prepared_statements: self.prepared_statements,
                preference: self.preference,
                candidates,
            }),
            metrics,
        ))
    }
}
