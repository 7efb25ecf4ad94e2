//! Groups of shards as the database shows them: each member (its session, and the shard count
//! it runs once it marked itself live), the shards each owns, and those nobody owns. One
//! statement over `pg_locks`.

use std::collections::{BTreeMap, HashSet};

use tokio_postgres::Row;

use super::{Session, key_of};
use crate::shards::group::{MEMBER_OBJECT, count_of_live};
use crate::{CurrentLeaderError, Error};

/// One group of shards as [`groups`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The class of the group's keys ([`group_class`] of its name); a shard's key is this
    /// class and the shard's index.
    pub class: i32,
    /// How many shards the group has, as its live members say (the largest count, should
    /// members run different counts).
    pub count: u32,
    /// Its members: live ones, and sessions that hold a shard of the group without being
    /// live (yet, or any more), in the order of their backend's pid.
    pub members: Vec<Member>,
    /// The shards (indexes `0..count`) that nobody owns.
    pub unowned: Vec<u32>,
}

/// One member of a group of shards.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// The member's lock session.
    pub session: Session,
    /// The shard count it runs, once it marked itself live: `None` for a session that holds
    /// shards of the group without a live mark.
    pub count: Option<u32>,
    /// The shards it owns, by index, ascending.
    pub owned: Vec<u32>,
}

/// The class of every key of the group of shards named `group`, as
/// [`Shards::builder`](crate::shards::Shards::builder) derives it: to tell a group of
/// [`groups`] by its name.
pub fn group_class(group: &str) -> i32 {
    crate::shards::group::group_class(group)
}

/// The granted advisory locks of the database in two-number form, either mode: key, whether
/// exclusive, pid, identity, address.
const LOCKS: &str = "SELECT l.classid::text::int8, l.objid::text::int8, \
     l.mode = 'ExclusiveLock', l.pid, coalesce(a.application_name, ''), \
     pg_catalog.host(a.client_addr) \
     FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.pid IS NOT NULL \
     AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                       WHERE datname = pg_catalog.current_database()) \
     ORDER BY 1, l.pid, 2";

/// Every group of shards with a live member in the database, ordered by class: its members,
/// the shards each owns, the shards nobody owns. A group is known by its members' live marks
/// (a second shared lock of the group's class a member takes beside the membership's, whose
/// object tells its shard count); a group none of whose members is live yet does not show. Reads `pg_locks` and `pg_stat_activity` (without
/// `pg_read_all_stats`, the addresses read `None`).
///
/// The shards' own keys show in [`read`](super::read) too, each as a key of its own.
///
/// # Errors
///
/// [`Error::CurrentLeader`] with [`CurrentLeaderError::Query`] when the statement fails.
///
/// # Cancel safety
///
/// Cancel safe: it only reads. It puts no timeout on the statement.
pub async fn groups(client: &tokio_postgres::Client) -> Result<Vec<GroupStatus>, Error> {
    let rows = client
        .query(LOCKS, &[])
        .await
        .map_err(CurrentLeaderError::Query)?;
    Ok(collect(&rows).map_err(CurrentLeaderError::Query)?)
}

/// One lock row: its key, whether exclusive, and the session.
struct Held {
    class: i32,
    object: i32,
    exclusive: bool,
    session: Session,
}

fn held(row: &Row) -> Result<Held, tokio_postgres::Error> {
    let key = key_of(row.try_get(0)?, row.try_get(1)?);
    let addr: Option<String> = row.try_get(5)?;
    Ok(Held {
        class: key.class(),
        object: key.object(),
        exclusive: row.try_get(2)?,
        session: Session {
            pid: row.try_get(3)?,
            identity: row.try_get(4)?,
            client_addr: addr.and_then(|a| a.parse().ok()),
        },
    })
}

fn collect(rows: &[Row]) -> Result<Vec<GroupStatus>, tokio_postgres::Error> {
    let locks = rows.iter().map(held).collect::<Result<Vec<_>, _>>()?;
    Ok(from_locks(locks))
}

/// The groups the locks show: live marks first (a shared lock of a count's object, on a
/// session that holds the class's membership lock too: they make a class a group), then the
/// shards of those classes.
fn from_locks(locks: Vec<Held>) -> Vec<GroupStatus> {
    let joined: HashSet<(i32, i32)> = locks
        .iter()
        .filter(|l| !l.exclusive && l.object == MEMBER_OBJECT)
        .map(|l| (l.class, l.session.pid))
        .collect();
    let mut groups: BTreeMap<i32, BTreeMap<i32, Member>> = BTreeMap::new();
    for lock in locks.iter().filter(|l| !l.exclusive) {
        if !joined.contains(&(lock.class, lock.session.pid)) {
            continue;
        }
        if let Some(count) = count_of_live(lock.object) {
            let members = groups.entry(lock.class).or_default();
            let member = members
                .entry(lock.session.pid)
                .or_insert_with(|| member(&lock.session));
            member.count = Some(count);
        }
    }
    for lock in locks.into_iter().filter(|l| l.exclusive && l.object >= 0) {
        if let Some(members) = groups.get_mut(&lock.class) {
            let index = lock.object.unsigned_abs();
            members
                .entry(lock.session.pid)
                .or_insert_with(|| member(&lock.session))
                .owned
                .push(index);
        }
    }
    groups
        .into_iter()
        .map(|(class, members)| group(class, members.into_values().collect()))
        .collect()
}

fn member(session: &Session) -> Member {
    Member {
        session: session.clone(),
        count: None,
        owned: Vec::new(),
    }
}

/// A group of `members`: its count, their shards sorted, and the shards nobody owns.
fn group(class: i32, mut members: Vec<Member>) -> GroupStatus {
    let count = members.iter().filter_map(|m| m.count).max().unwrap_or(0);
    let mut owned = vec![false; count as usize];
    for member in &mut members {
        member.owned.sort_unstable();
        for &index in &member.owned {
            if let Some(slot) = owned.get_mut(index as usize) {
                *slot = true;
            }
        }
    }
    let unowned = (0..count).filter(|&i| !owned[i as usize]).collect();
    GroupStatus {
        class,
        count,
        members,
        unowned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::group::live_object;

    fn lock(class: i32, object: i32, exclusive: bool, pid: i32) -> Held {
        Held {
            class,
            object,
            exclusive,
            session: Session {
                pid,
                identity: format!("m{pid}"),
                client_addr: None,
            },
        }
    }

    #[test]
    fn members_their_shards_and_the_unowned_ones() {
        let groups = from_locks(vec![
            lock(7, -1, false, 10),
            lock(7, live_object(4), false, 10),
            lock(7, 0, true, 10),
            lock(7, 2, true, 10),
            lock(7, -1, false, 11),
            lock(7, live_object(4), false, 11),
            lock(7, 1, true, 12),
            // Other classes' plain locks, exclusive and shared: no group, not even a shared
            // lock of a live mark's object without the membership lock.
            lock(8, 0, true, 10),
            lock(9, -1, false, 13),
            lock(5, live_object(2), false, 14),
        ]);
        assert_eq!(groups.len(), 1, "{groups:?}");
        let g = &groups[0];
        assert_eq!((g.class, g.count, g.unowned.clone()), (7, 4, vec![3]));
        let members: Vec<_> = g
            .members
            .iter()
            .map(|m| (m.session.pid, m.count, m.owned.clone()))
            .collect();
        assert_eq!(
            members,
            [
                (10, Some(4), vec![0, 2]),
                (11, Some(4), vec![]),
                (12, None, vec![1])
            ]
        );
    }

    #[test]
    fn members_running_different_counts_show_the_largest() {
        let groups = from_locks(vec![
            lock(7, -1, false, 10),
            lock(7, live_object(2), false, 10),
            lock(7, -1, false, 11),
            lock(7, live_object(3), false, 11),
            lock(7, 0, true, 10),
        ]);
        assert_eq!(
            (groups[0].count, groups[0].unowned.clone()),
            (3, vec![1, 2])
        );
    }
}
