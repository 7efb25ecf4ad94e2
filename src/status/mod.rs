//! What a database shows of its elections, for people and their tools (the command line's
//! `pg-elector status`): who leads each key, who waits for it, the standbys that said they are
//! alive, and a handover asked. Read-only: four statements in all, whatever the number of
//! keys.
//!
//! [`groups`] reads the groups of shards: each member, the shards it owns, the shards nobody
//! owns (one statement).
//!
//! With the `schedule` feature, `jobs` reads the stored schedules: each job's next due,
//! its last run and outcome, its skipped dues.
//!
//! A snapshot, not a decision: by the time it is read, a leader may have lost its lock. Code
//! that must know whether it leads asks its own [`Term`](crate::Term).
//!
//! ```no_run
//! # async fn example(client: &tokio_postgres::Client) -> Result<(), pg_elector::Error> {
//! use pg_elector::LockKey;
//!
//! let sweep = LockKey::from_name("billing/sweep");
//! for key in pg_elector::status::read(client).await? {
//!     let name = if key.key == sweep { "billing/sweep" } else { "?" };
//!     match &key.leader {
//!         Some(leader) => println!("{name}: {} (pid {})", leader.identity, leader.pid),
//!         None => println!("{name}: nobody leads"),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use crate::{CurrentLeaderError, Error, LeaderInfo, LockKey};

#[cfg(feature = "schedule")]
pub use crate::schedule::status::{JobStatus, LastRun, jobs};

mod groups;

pub use groups::{GroupStatus, Member, group_class, groups};

/// One key of the database as [`read`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyStatus {
    /// The key. PostgreSQL keeps only its two numbers: a key made with
    /// [`LockKey::from_name`] is recognised by comparing it with the key of each name you
    /// know.
    pub key: LockKey,
    /// Who holds the lock, with its epoch and since when its term began where the default
    /// fencing table (`pg_elector_epochs`) has this leader's row for the key (a leader
    /// without fencing shows neither, even after a fenced one).
    pub leader: Option<LeaderInfo>,
    /// Sessions waiting for the lock (standbys with fast takeover), the longest connected
    /// first.
    pub waiting: Vec<Session>,
    /// The standbys that set a preference and wrote their row in the default candidates
    /// table (`pg_elector_candidates`), most preferred first; dead ones too while a live
    /// one or a request keeps the key listed.
    pub candidates: Vec<Candidate>,
    /// A handover asked from outside that the leader would carry out: the newest request
    /// that has not run out, whose target is live and is not the leader.
    pub handover: Option<PendingHandover>,
}

/// A database session waiting for a key's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Session {
    /// Its backend process.
    pub pid: i32,
    /// Its identity (`application_name`).
    pub identity: String,
    /// Its address as the server sees it; `None` over a Unix socket or without the
    /// `pg_read_all_stats` role.
    pub client_addr: Option<IpAddr>,
}

/// A standby's row in the candidates table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Candidate {
    /// Its identity.
    pub identity: String,
    /// Its preference (a larger one is preferred).
    pub preference: u64,
    /// Whether it tried the lock within its last two check intervals: only a live standby
    /// counts for a handover or a preference.
    pub live: bool,
    /// Whether it keeps a session waiting for the lock (fast takeover).
    pub waits: bool,
    /// Since when it has been live without a break.
    pub live_since: SystemTime,
}

/// A handover asked with [`request_handover`](crate::request_handover) that has not run out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingHandover {
    /// The identity of the standby the lead goes to.
    pub to: String,
    /// When the request runs out, if the target has not led by then.
    pub until: SystemTime,
    /// How long the old leader stays a standby once it has handed over.
    pub stay_away: Duration,
}

/// Every two-number advisory lock held or waited for in the database, whether the crate's or
/// not (any `pg_advisory_lock(int4, int4)` shows), and every key with a live candidate,
/// ordered by key. Reads `pg_locks`, `pg_stat_activity`, and the default
/// fencing and candidates tables when they exist and the role may read them (a table it may
/// not read is left out: no epochs, or no candidates; without `pg_read_all_stats` the
/// addresses read `None`).
///
/// # Errors
///
/// [`Error::CurrentLeader`] with [`CurrentLeaderError::Query`] when a statement fails.
///
/// # Cancel safety
///
/// Cancel safe: it only reads. It puts no timeout on the statements: bound it with
/// `tokio::time::timeout` if the server may not answer.
pub async fn read(client: &tokio_postgres::Client) -> Result<Vec<KeyStatus>, Error> {
    Ok(read_all(client).await.map_err(CurrentLeaderError::Query)?)
}

/// The lock rows of the database: key, granted, pid, identity, address.
const LOCKS: &str = "SELECT l.classid::text::int8, l.objid::text::int8, l.granted, l.pid, \
     coalesce(a.application_name, ''), pg_catalog.host(a.client_addr) \
     FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.objsubid = 2 \
     AND l.pid IS NOT NULL AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                             WHERE datname = pg_catalog.current_database()) \
     ORDER BY 1, 2, l.granted DESC, a.backend_start, l.pid";

/// Whether the default candidates and epoch tables exist and this role may read them (a table
/// it may not read is left out, not an error).
const TABLES: &str = "SELECT \
     coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('pg_elector_candidates'), 'SELECT'), false), \
     coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('pg_elector_epochs'), 'SELECT'), false)";

/// A candidate's row is live (as the leader's and the standbys' statements judge it).
macro_rules! live {
    ($row:literal) => {
        concat!(
            "(",
            $row,
            ".live_until > pg_catalog.statement_timestamp() AND ",
            $row,
            ".heard_at <= pg_catalog.statement_timestamp())"
        )
    };
}

/// The candidates' rows, live or not, of keys with a live row, most preferred first; and
/// whether each is the target of the key's pending handover: the newest request that has not
/// run out whose target is live, as the leader picks it.
const CANDIDATES: &str = concat!(
    "SELECT c.class, c.object, c.identity, c.preference::text, coalesce(",
    live!("c"),
    ", false), \
     c.waits, c.live_since, c.requested_until, c.stay_away_ms, \
     c.identity IS NOT DISTINCT FROM (SELECT r.identity FROM pg_elector_candidates r \
       WHERE r.class = c.class AND r.object = c.object AND ",
    live!("r"),
    " \
       AND r.requested_until > pg_catalog.statement_timestamp() \
       ORDER BY r.requested_until DESC, r.identity DESC LIMIT 1) \
     FROM pg_elector_candidates c WHERE EXISTS (SELECT 1 FROM pg_elector_candidates k \
       WHERE k.class = c.class AND k.object = c.object AND ",
    live!("k"),
    ") \
     ORDER BY c.class, c.object, c.preference DESC, c.identity"
);

/// Every epoch row: whose term it is, its epoch and since when.
const EPOCHS: &str = "SELECT class, object, epoch, since, holder FROM pg_elector_epochs";

async fn read_all(
    client: &tokio_postgres::Client,
) -> Result<Vec<KeyStatus>, tokio_postgres::Error> {
    let tables = client.query_one(TABLES, &[]).await?;
    let (candidates, fencing): (bool, bool) = (tables.try_get(0)?, tables.try_get(1)?);
    let mut keys = BTreeMap::new();
    for row in client.query(LOCKS, &[]).await? {
        add_lock(&mut keys, &row)?;
    }
    if candidates {
        for row in client.query(CANDIDATES, &[]).await? {
            add_candidate(&mut keys, &row)?;
        }
    }
    if fencing {
        for row in client.query(EPOCHS, &[]).await? {
            add_epoch(&mut keys, &row)?;
        }
    }
    Ok(keys.into_values().collect())
}

/// The key of a row whose first two columns are the key's numbers, as `pg_locks` (oids) or
/// the candidates table (int4) has them.
pub(super) fn key_of(class: i64, object: i64) -> LockKey {
    // An oid is the int4 read as unsigned: the cast takes the same 32 bits back.
    LockKey::new(class as u32 as i32, object as u32 as i32)
}

fn entry(keys: &mut BTreeMap<(i32, i32), KeyStatus>, key: LockKey) -> &mut KeyStatus {
    keys.entry((key.class(), key.object()))
        .or_insert_with(|| KeyStatus {
            key,
            leader: None,
            waiting: Vec::new(),
            candidates: Vec::new(),
            handover: None,
        })
}

fn add_lock(
    keys: &mut BTreeMap<(i32, i32), KeyStatus>,
    row: &Row,
) -> Result<(), tokio_postgres::Error> {
    let key = key_of(row.try_get(0)?, row.try_get(1)?);
    let addr: Option<String> = row.try_get(5)?;
    let session = Session {
        pid: row.try_get(3)?,
        identity: row.try_get(4)?,
        client_addr: addr.and_then(|a| a.parse().ok()),
    };
    let status = entry(keys, key);
    if row.try_get::<_, bool>(2)? {
        status.leader = Some(LeaderInfo {
            pid: session.pid,
            identity: session.identity,
            client_addr: session.client_addr,
            since: None,
            epoch: None,
        });
    } else {
        status.waiting.push(session);
    }
    Ok(())
}

fn add_candidate(
    keys: &mut BTreeMap<(i32, i32), KeyStatus>,
    row: &Row,
) -> Result<(), tokio_postgres::Error> {
    let key = key_of(
        i64::from(row.try_get::<_, i32>(0)?),
        i64::from(row.try_get::<_, i32>(1)?),
    );
    let identity: String = row.try_get(2)?;
    let preference: String = row.try_get(3)?;
    let status = entry(keys, key);
    // The leader never hands over to itself: a request naming it waits for nothing.
    let leads = status
        .leader
        .as_ref()
        .is_some_and(|l| same_identity(&l.identity, &identity));
    if row.try_get::<_, bool>(9)? && !leads {
        let until: Option<SystemTime> = row.try_get(7)?;
        let stay_away: Option<i64> = row.try_get(8)?;
        status.handover = until.map(|until| PendingHandover {
            to: identity.clone(),
            until,
            stay_away: Duration::from_millis(stay_away.unwrap_or(0).max(0).unsigned_abs()),
        });
    }
    status.candidates.push(Candidate {
        identity,
        preference: preference.parse().unwrap_or(u64::MAX),
        live: row.try_get(4)?,
        waits: row.try_get(5)?,
        live_since: row.try_get(6)?,
    });
    Ok(())
}

/// The epoch and start of a led key's current term, when its epoch row is the leader's (a
/// leader without fencing after a fenced one leaves an older replica's row behind).
fn add_epoch(
    keys: &mut BTreeMap<(i32, i32), KeyStatus>,
    row: &Row,
) -> Result<(), tokio_postgres::Error> {
    let (class, object): (i32, i32) = (row.try_get(0)?, row.try_get(1)?);
    let Some(leader) = keys
        .get_mut(&(class, object))
        .and_then(|status| status.leader.as_mut())
    else {
        return Ok(());
    };
    let holder: String = row.try_get(4)?;
    if same_identity(&leader.identity, &holder) {
        let epoch: i64 = row.try_get(2)?;
        leader.epoch = Some(u64::try_from(epoch).unwrap_or(0));
        leader.since = Some(row.try_get(3)?);
    }
    Ok(())
}

/// Whether `shown`, an identity as `pg_stat_activity` shows it (cut to 63 bytes), is
/// `identity`.
fn same_identity(shown: &str, identity: &str) -> bool {
    shown == identity || (shown.len() >= 63 && identity.starts_with(shown))
}
