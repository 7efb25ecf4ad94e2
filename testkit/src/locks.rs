//! What the server says about a key: the sessions that hold or wait for its advisory lock.

use pg_elector::LockKey;

/// One session that holds or waits for a key's advisory lock, as `pg_locks` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSession {
    /// The backend's pid.
    pub pid: i32,
    /// Its `application_name` (an elector's identity).
    pub name: String,
    /// Whether it holds the lock (else it waits for it).
    pub granted: bool,
}

/// Every session of the client's database that holds or waits for `key` (the elector's
/// two-int4 form) as an elector's lock session does, holders first: exclusively, or shared for a
/// group of shards' member key (object −1). A standby's try asks with a shared lock that lasts
/// one statement; it is not one of them.
pub async fn lock_sessions(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<Vec<LockSession>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT l.pid, coalesce(a.application_name, ''), l.granted FROM pg_catalog.pg_locks l \
             LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' \
             AND (l.mode = 'ExclusiveLock' OR l.objid = 4294967295) \
             AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 \
             AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
             ORDER BY l.granted DESC, l.pid",
            &[&(key.class() as u32), &(key.object() as u32)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| LockSession {
            pid: row.get(0),
            name: row.get(1),
            granted: row.get(2),
        })
        .collect())
}

/// Every advisory lock held as an elector's lock session holds it (exclusively, as a leader or a
/// shard's owner; or a group of shards' member key, object −1, shared) in the client's
/// database in the elector's two-int4 form, with the holder's `application_name`: one query for
/// many keys (a group's shards).
pub async fn advisory_holders(
    client: &tokio_postgres::Client,
) -> Result<Vec<(LockKey, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT l.classid, l.objid, coalesce(a.application_name, '') FROM pg_catalog.pg_locks l \
             LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
             AND (l.mode = 'ExclusiveLock' OR l.objid = 4294967295) AND l.objsubid = 2 \
             AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let (class, object): (u32, u32) = (row.get(0), row.get(1));
            (LockKey::new(class as i32, object as i32), row.get(2))
        })
        .collect())
}

/// The pids of the sessions that hold `key` in the client's database (at most one).
pub async fn holders(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Result<Vec<i32>, tokio_postgres::Error> {
    Ok(lock_sessions(client, key)
        .await?
        .into_iter()
        .filter(|s| s.granted)
        .map(|s| s.pid)
        .collect())
}

/// How many advisory locks the client's own session holds: 0 on a connection a pool hands out,
/// whatever an elector did with it before.
pub async fn own_advisory_locks(
    client: &tokio_postgres::Client,
) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_locks \
             WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Ends backend `pid` (`pg_terminate_backend`) and waits up to 5 s until it is gone from
/// `pg_stat_activity`; whether it went.
pub async fn terminate(
    client: &tokio_postgres::Client,
    pid: i32,
) -> Result<bool, tokio_postgres::Error> {
    client
        .execute("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
        .await?;
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(5) {
        let left = client
            .query(
                "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await?;
        if left.is_empty() {
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    Ok(false)
}
