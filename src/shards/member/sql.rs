//! The statements of a shard member's lock session: the check, the tries, the unlocks. Each is
//! one unnamed statement, bounded on the client's clock, as the single elector's are.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::marks::Mark;
use crate::postgres::session::{Check, LockSession, SessionError, bounded, ours_alone};

/// The comment that opens [`MARK_LIVE`], by which the others tell, in `pg_stat_activity`, a
/// holder whose latest statement is still the one that took its mark.
macro_rules! mark_live_tag {
    () => {
        "/* pg-elector: live mark */"
    };
}

/// The member's check, once per interval: the session answers, is still ours alone (this
/// grant's mark and no other elector's visit: see [`ours_alone`], as the leader's check), and
/// lists the group's locks: the shards this session holds, the members (every session
/// holding the group's shared lock, by pid), the members' live marks (the other shared
/// locks of the group's class: by pid, and by object, which tells the member's shard count),
/// and every shard's holder in the group's database (one int8 each: the shard in the high
/// half, the holder's pid in the low; unordered), which the assignment keeps where balance
/// allows.
/// `$1` is the group's class, `$2` the member key's object, `$3` the mark.
///
/// It takes no lock of the server's shared lock table, so that it still runs when that table
/// is full: the group's locks are read from `pg_locks` alone (no shared catalog such as
/// `pg_database`, and no other backend's activity, whose read may look up role memberships in
/// `pg_auth_members`), and the database is the one of this session's own membership lock.
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
             AND database = (SELECT database FROM db)), \
       ARRAY(SELECT pid FROM held WHERE objid <> $2 AND mode = 'ShareLock' \
             AND database = (SELECT database FROM db) ORDER BY pid, objid), \
       ARRAY(SELECT objid::int4 FROM held WHERE objid <> $2 AND mode = 'ShareLock' \
             AND database = (SELECT database FROM db) ORDER BY pid, objid), \
       ARRAY(SELECT (objid::int8 << 32) | pid FROM held WHERE objid <> $2 \
             AND mode = 'ExclusiveLock' AND database = (SELECT database FROM db))"
);

/// Whether each backend of `$1` (holders of live marks, seen by an earlier check) has started
/// another statement since it took its mark: its latest statement is not [`MARK_LIVE`].
/// `true`, `false` (also for a backend gone), or NULL where the server hides its activity
/// (another role without `pg_read_all_stats`, or `track_activities` off). Read after the
/// check that saw the marks, so the statement read for a holder is the one that took its mark
/// or a later one, never an earlier one. `pg_stat_get_activity` itself, not the
/// `pg_stat_activity` view, which joins `pg_database` and `pg_authid`.
const HEARD: &str = concat!(
    "SELECT p.pid, CASE WHEN a.pid IS NULL THEN false WHEN a.query_start IS NULL THEN NULL \
       ELSE a.query NOT LIKE '",
    mark_live_tag!(),
    "%' END \
     FROM pg_catalog.unnest($1::int4[]) AS p(pid) \
     LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(p.pid) AS a ON true"
);

/// Takes the member's live mark (`$2`, a shared lock of the group's class `$1`), only on a
/// session that is still ours alone ([`ours_alone`], `$3` the mark): whether it did.
const MARK_LIVE: &str = concat!(
    mark_live_tag!(),
    " SELECT CASE WHEN ",
    ours_alone!("$3"),
    " THEN pg_catalog.pg_try_advisory_lock_shared($1::int4, $2::int4) ELSE false END"
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

/// Unlocks the given shards in one statement, only on a session that is still ours alone
/// ([`ours_alone`], `$3` the mark): whether it is, and the shards it found not held. Behind a
/// transaction pooler no lock of someone else's server session is ever freed.
const UNLOCK: &str = concat!(
    "SELECT ours, CASE WHEN ours THEN ARRAY(SELECT s FROM pg_catalog.unnest($2::int4[]) AS s \
       WHERE NOT pg_catalog.pg_advisory_unlock($1::int4, s)) END \
     FROM (SELECT ",
    ours_alone!("$3"),
    " AS ours OFFSET 0) AS session"
);

/// Unlocks every lock of the group this session holds (the membership's and every shard's),
/// and no other, only on a session that is still ours alone ([`ours_alone`], `$3` the mark):
/// whether it is. `$1` is the group's class as `pg_locks` shows it, `$2` the same as the
/// unlock functions take it. A lock of the application's on the same server session stays.
const UNLOCK_GROUP: &str = concat!(
    "SELECT ours, CASE WHEN ours THEN (SELECT count(*) FROM ( \
       SELECT objid, mode FROM pg_catalog.pg_locks \
       WHERE locktype = 'advisory' AND classid = $1 AND objsubid = 2 AND granted \
         AND pid = pg_catalog.pg_backend_pid()) AS held \
       WHERE CASE WHEN mode = 'ShareLock' \
         THEN pg_catalog.pg_advisory_unlock_shared($2::int4, objid::int4) \
         ELSE pg_catalog.pg_advisory_unlock($2::int4, objid::int4) END) END \
     FROM (SELECT ",
    ours_alone!("$3"),
    " AS ours OFFSET 0) AS session"
);

/// Ends the backend `$3` if it still holds the group's membership lock (class `$1`, object
/// `$2`): a member's own lock session, left open by a transaction pooler. Whether it did.
const END_BACKEND: &str = "SELECT coalesce(bool_or(pg_catalog.pg_terminate_backend(pid)), false) \
     FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 \
     AND objsubid = 2 AND mode = 'ShareLock' AND granted AND pid = $3";

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
    /// The live marks, each with its holder.
    pub(super) marks: Vec<Mark>,
    /// Every held shard of the group (any session's), with its holder's pid.
    pub(super) holders: Vec<(u32, i32)>,
}

impl View {
    /// Whether this session holds the live mark `object`.
    pub(super) fn is_live(&self, object: i32) -> bool {
        self.marks
            .iter()
            .any(|m| m.pid == self.pid && m.object == object)
    }

    /// The live marks of members that hold another mark than `object`, each once, sorted.
    pub(super) fn other_marks(&self, object: i32) -> Vec<i32> {
        let mut other: Vec<i32> = self
            .marks
            .iter()
            .filter(|m| m.object != object && self.members.contains(&m.pid))
            .map(|m| m.object)
            .collect();
        other.sort_unstable();
        other.dedup();
        other
    }

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
                    row.try_get::<_, Vec<i32>>(4)?,
                    row.try_get::<_, Vec<i32>>(5)?,
                    row.try_get::<_, Vec<i64>>(6)?,
                ))
            })
            .transpose()
    })
    .await?;
    // A SELECT without FROM always returns one row.
    let Some((pid, ours_alone, held, members, marked, objects, holders)) = row else {
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
        marks: marked
            .into_iter()
            .zip(objects)
            .map(|(pid, object)| Mark { pid, object })
            .collect(),
        holders: holders.into_iter().filter_map(shard_and_holder).collect(),
    })
}

/// A shard and its holder's pid from the check's int8 (the shard in the high half, the pid in
/// the low); `None` for a shard number no group has (the high half negative).
fn shard_and_holder(packed: i64) -> Option<(u32, i32)> {
    let shard = u32::try_from(packed >> 32).ok()?;
    Some((shard, packed as u32 as i32))
}

/// Whether each of `pids` (holders of live marks) has spoken since its mark: `None` where the
/// server hides it. See [`HEARD`].
pub(super) async fn heard(
    session: &LockSession,
    pids: &[i32],
    bound: Duration,
) -> Result<Vec<(i32, Option<bool>)>, SessionError> {
    let rows = bounded(
        bound,
        session
            .client()
            .query_typed(HEARD, &[(&pids, Type::INT4_ARRAY)]),
    )
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(SessionError::Query)
}

/// Takes the live mark `object` of the group's `class`, on a session proven ours in the same
/// statement; `false` when it is not ours (nothing was taken).
pub(super) async fn mark_live(
    session: &LockSession,
    class: i32,
    object: i32,
    bound: Duration,
) -> Result<bool, SessionError> {
    let params: Params<'_> = &[
        (&class, Type::INT4),
        (&object, Type::INT4),
        (&session.mark(), Type::TEXT),
    ];
    let row = one_row(session, MARK_LIVE, params, bound).await?;
    row.try_get(0).map_err(SessionError::Query)
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

/// What an unlock found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unlocked {
    /// The session was ours alone; the shards it found not held (none for the group's unlock).
    Done(Vec<u32>),
    /// The session was not ours alone (a transaction pooler shares it): nothing was unlocked.
    NotOurs,
}

/// Unlocks `shards` (held by this session without a term) in one statement, on a session
/// proven ours in the same statement.
pub(super) async fn unlock(
    session: &LockSession,
    class: i32,
    shards: &[u32],
    bound: Duration,
) -> Result<Unlocked, SessionError> {
    let shards: Vec<i32> = shards.iter().map(|&s| s as i32).collect();
    let params: Params<'_> = &[
        (&class, Type::INT4),
        (&shards, Type::INT4_ARRAY),
        (&session.mark(), Type::TEXT),
    ];
    let row = one_row(session, UNLOCK, params, bound).await?;
    let not_held: Option<Vec<i32>> = row.try_get(1).map_err(SessionError::Query)?;
    Ok(match not_held {
        Some(not_held) => Unlocked::Done(not_held.into_iter().map(|s| s as u32).collect()),
        None => Unlocked::NotOurs,
    })
}

/// Unlocks every lock of the group this session holds, and no other, on a session proven
/// ours in the same statement.
pub(super) async fn unlock_group(
    session: &LockSession,
    class: i32,
    bound: Duration,
) -> Result<Unlocked, SessionError> {
    let params: Params<'_> = &[
        (&(class as u32), Type::OID),
        (&class, Type::INT4),
        (&session.mark(), Type::TEXT),
    ];
    let row = one_row(session, UNLOCK_GROUP, params, bound).await?;
    let ours: bool = row.try_get(0).map_err(SessionError::Query)?;
    Ok(if ours {
        Unlocked::Done(Vec::new())
    } else {
        Unlocked::NotOurs
    })
}

/// Ends the backend `pid` if it still holds the group's membership lock (`class`,
/// `member_object`); whether it did (also when the statement ran on that very backend, which
/// the server then ends under it).
pub(super) async fn end_backend(
    session: &LockSession,
    class: i32,
    member_object: i32,
    pid: i32,
    bound: Duration,
) -> Result<bool, SessionError> {
    let (class, object) = (class as u32, member_object as u32);
    let params: Params<'_> = &[
        (&class, Type::OID),
        (&object, Type::OID),
        (&pid, Type::INT4),
    ];
    let row = match one_row(session, END_BACKEND, params, bound).await {
        Err(SessionError::Query(e)) if e.code() == Some(&SqlState::ADMIN_SHUTDOWN) => {
            return Ok(true);
        }
        row => row?,
    };
    row.try_get(0).map_err(SessionError::Query)
}

/// A statement's parameters with their types, as `query_typed` takes them.
type Params<'a> = &'a [(&'a (dyn ToSql + Sync), Type)];

/// Runs `statement` (one unnamed statement, bounded by `bound`) and returns its one row: each
/// of these statements answers exactly one.
async fn one_row(
    session: &LockSession,
    statement: &str,
    params: Params<'_>,
    bound: Duration,
) -> Result<Row, SessionError> {
    let rows = bounded(bound, session.client().query_typed(statement, params)).await?;
    rows.into_iter()
        .next()
        .ok_or(SessionError::Unexpected(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_holder_gives_its_shard_and_pid() {
        assert_eq!(
            shard_and_holder((7 << 32) | 4_194_303),
            Some((7, 4_194_303))
        );
        assert_eq!(shard_and_holder(16_383 << 32), Some((16_383, 0)));
        // objid ≥ 2^31 shifted into the sign bit: no shard of any group.
        assert_eq!(shard_and_holder(((1u64 << 31) << 32) as i64 | 5), None);
    }
}
