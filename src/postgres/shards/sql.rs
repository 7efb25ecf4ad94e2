//! The statements of a shard member's lock session: the check, the tries, the unlocks. Each is
//! one unnamed statement, bounded on the client's clock, as the single elector's are.

use std::time::Duration;

use tokio_postgres::types::Type;

use crate::postgres::session::{Check, LockSession, SessionError, bounded, ours_alone};

/// The member's check, once per interval: the session answers, is still ours alone (this
/// grant's mark and no other elector's visit: see [`ours_alone`], as the leader's check), and
/// lists the group's locks: the shards this session holds, and the members (every session
/// holding the group's shared lock, by pid). `$1` is the group's class, `$2` the member key's
/// object, `$3` the mark.
///
/// It takes no lock of the server's shared lock table, so that it still runs when that table
/// is full: the group's locks are read from `pg_locks` alone (no shared catalog such as
/// `pg_database`), and the database is the one of this session's own membership lock.
const CHECK: &str = concat!(
    "WITH held AS MATERIALIZED ( \
       SELECT pid, objid, mode, database FROM pg_catalog.pg_locks \
       WHERE locktype = 'advisory' AND classid = $1 AND objsubid = 2 AND granted), \
     db AS (SELECT database FROM held WHERE pid = pg_catalog.pg_backend_pid() AND objid = $2 \
            LIMIT 1) \
     SELECT pg_catalog.pg_backend_pid(), ",
    ours_alone!("$3"),
    ", ARRAY(SELECT objid::int8 FROM held WHERE pid = pg_catalog.pg_backend_pid() \
             AND mode = 'ExclusiveLock' AND objid <> $2), \
       ARRAY(SELECT pid FROM held WHERE objid = $2 AND mode = 'ShareLock' \
             AND database = (SELECT database FROM db))"
);

/// The tries of the shards this member should own and does not hold (never one it holds: the
/// lock would stack). Only on a session that is still ours alone ([`ours_alone`], `$3` the
/// mark), so that behind a transaction pooler no lock is ever taken on someone else's server
/// session.
const TRY: &str = concat!(
    "SELECT s FROM pg_catalog.unnest($2::int4[]) AS s WHERE CASE WHEN ",
    ours_alone!("$3"),
    " THEN pg_catalog.pg_try_advisory_lock($1::int4, s) ELSE false END"
);

/// Unlocks the given shards in one statement; the shards it found not held.
const UNLOCK: &str = "SELECT s FROM pg_catalog.unnest($2::int4[]) AS s \
     WHERE NOT pg_catalog.pg_advisory_unlock($1::int4, s)";

const UNLOCK_ALL: &str = "SELECT pg_catalog.pg_advisory_unlock_all()";

/// What a member's check found.
#[derive(Debug)]
pub(super) struct View {
    /// The lock session's backend.
    pub(super) pid: i32,
    /// The session is ours alone: this grant's mark and no other elector's visit.
    pub(super) ours_alone: bool,
    /// The shards (indices) this session holds.
    pub(super) held: Vec<u32>,
    /// The members' pids, this one's included while it holds the shared lock.
    pub(super) members: Vec<i32>,
}

impl View {
    /// What the check proves of the member's session, read as a leader's check is read: the
    /// membership lock is the lock it holds.
    pub(super) fn check(&self) -> Check {
        Check::of(self.ours_alone, self.members.contains(&self.pid))
    }
}

pub(super) async fn check(
    session: &LockSession,
    class: i32,
    member_object: i32,
    bound: Duration,
) -> Result<View, SessionError> {
    let (class, object) = (class as u32, member_object as u32);
    let row = bounded(bound, async {
        let rows = session
            .client()
            .query_typed(
                CHECK,
                &[
                    (&class, Type::OID),
                    (&object, Type::OID),
                    (&session.mark(), Type::TEXT),
                ],
            )
            .await?;
        rows.into_iter()
            .next()
            .map(|row| {
                Ok::<_, tokio_postgres::Error>((
                    row.try_get::<_, i32>(0)?,
                    row.try_get::<_, bool>(1)?,
                    row.try_get::<_, Vec<i64>>(2)?,
                    row.try_get::<_, Vec<i32>>(3)?,
                ))
            })
            .transpose()
    })
    .await?;
    // A SELECT without FROM always returns one row.
    let Some((pid, ours_alone, held, members)) = row else {
        return Err(SessionError::Unexpected(None));
    };
    Ok(View {
        pid,
        ours_alone,
        held: held
            .into_iter()
            .filter_map(|s| u32::try_from(s).ok())
            .collect(),
        members,
    })
}

/// Tries `shards`; returns those granted. A full lock table fails the statement: see
/// [`lock_table::full`](crate::postgres::lock_table::full).
pub(super) async fn try_lock(
    session: &LockSession,
    class: i32,
    shards: &[i32],
    bound: Duration,
) -> Result<Vec<u32>, SessionError> {
    let rows = bounded(
        bound,
        session.client().query_typed(
            TRY,
            &[
                (&class, Type::INT4),
                (&shards, Type::INT4_ARRAY),
                (&session.mark(), Type::TEXT),
            ],
        ),
    )
    .await?;
    rows.iter()
        .map(|row| row.try_get::<_, i32>(0).map(|s| s as u32))
        .collect::<Result<_, _>>()
        .map_err(SessionError::Query)
}

/// Unlocks `shards` (held by this session without a term) in one statement; returns those the
/// server found not held.
pub(super) async fn unlock(
    session: &LockSession,
    class: i32,
    shards: &[u32],
    bound: Duration,
) -> Result<Vec<u32>, SessionError> {
    let shards: Vec<i32> = shards.iter().map(|&s| s as i32).collect();
    let rows = bounded(
        bound,
        session
            .client()
            .query_typed(UNLOCK, &[(&class, Type::INT4), (&shards, Type::INT4_ARRAY)]),
    )
    .await?;
    Ok(rows
        .iter()
        .filter_map(|r| r.try_get::<_, i32>(0).ok())
        .map(|s| s as u32)
        .collect())
}

/// Unlocks every advisory lock of the session, the membership's and every shard's.
pub(super) async fn unlock_all(session: &LockSession, bound: Duration) -> Result<(), SessionError> {
    bounded(bound, session.client().query_typed(UNLOCK_ALL, &[])).await?;
    Ok(())
}
