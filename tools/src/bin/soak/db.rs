//! The soak's own look at the server, from outside the replicas: the tables, the `pg_locks`
//! sampler, the rows written, the backends and the clock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pg_elector::LockKey;
use tokio_util::sync::CancellationToken;

use crate::child::unix_us;

/// The `application_name` of every connection of the soak's own (never terminated by the
/// faults, never counted as a replica's backend).
pub(crate) const CHECKER: &str = "soak-checker";

/// Who holds the lock in a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Nobody.
    None,
    /// Replica process `n` (its lock session is named `replica-<n>`).
    Replica(usize),
    /// A session that is not a replica's (it should never happen).
    Unknown,
}

/// Consecutive samples that saw the same holder and epoch, none more than [`RUN_GAP_US`]
/// after the previous one. Times are the server's clock (µs since the UNIX epoch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    /// The first sample.
    pub(crate) first: u64,
    /// The last sample.
    pub(crate) last: u64,
    /// Who held the lock.
    pub(crate) holder: Holder,
    /// The epoch row (`None` before the first term).
    pub(crate) epoch: Option<i64>,
}

/// Samples further apart than this start a new run: a run says the holder did not change
/// in between, to within this.
pub(crate) const RUN_GAP_US: u64 = 30_000;

/// The sampler's result.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    /// Per lane (the one key, or each shard), the runs in time order.
    pub(crate) runs: Mutex<Vec<Vec<Run>>>,
    /// Samples taken.
    pub(crate) count: AtomicU64,
    /// Times the sampler had to reconnect.
    pub(crate) reconnects: AtomicU64,
}

impl Samples {
    fn push(&self, lane: usize, at: u64, holder: Holder, epoch: Option<i64>) {
        if lane == 0 {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        let mut lanes = self.runs.lock().unwrap();
        if lanes.len() <= lane {
            lanes.resize_with(lane + 1, Vec::new);
        }
        let runs = &mut lanes[lane];
        if let Some(last) = runs.last_mut() {
            if last.holder == holder && last.epoch == epoch && at <= last.last + RUN_GAP_US {
                last.last = at.max(last.last);
                return;
            }
        }
        runs.push(Run {
            first: at,
            last: at,
            holder,
            epoch,
        });
    }
}

/// The replica process named by an `application_name` (`replica-<n>` or `replica-<n>/…`).
pub(crate) fn replica_of(name: &str) -> Option<usize> {
    name.strip_prefix("replica-")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Connects as the checker.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = config.clone();
    config
        .application_name(CHECKER)
        .connect_timeout(Duration::from_secs(2));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Creates the writes table and the epoch table, and sets the database's
/// `idle_in_transaction_session_timeout` to 2·I, as the docs ask of a fencing application.
pub(crate) async fn prepare(
    client: &tokio_postgres::Client,
    database: &str,
    interval: Duration,
    epochs_ddl: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(&format!(
            "CREATE TABLE soak_writes (replica text NOT NULL, shard int NOT NULL, \
               epoch bigint NOT NULL, at timestamptz NOT NULL); \
             {epochs_ddl}; \
             ALTER DATABASE \"{}\" SET idle_in_transaction_session_timeout = '{}ms'",
            database.replace('"', "\"\""),
            (2 * interval).as_millis()
        ))
        .await
}

/// The objects of `keys`, as `pg_locks.objid` shows them.
pub(crate) fn objects(keys: &[LockKey]) -> Vec<u32> {
    keys.iter().map(|k| k.object() as u32).collect()
}

/// Samples each key's holder and epoch row every `period`, in one statement, from a
/// connection of its own (reconnecting after a server restart), until `stop`. The keys share
/// a class (the one key, or one group's shards).
pub(crate) async fn sample(
    config: tokio_postgres::Config,
    keys: Vec<LockKey>,
    period: Duration,
    samples: &Samples,
    stop: CancellationToken,
) {
    // Per key, the time first, then the holder, then the epoch: the epoch comes from the
    // statement's snapshot, taken before the clock is read, so an epoch seen here had
    // committed before the sample's time.
    let query = "SELECT (extract(epoch FROM pg_catalog.clock_timestamp()) * 1e6)::int8, \
         (SELECT a.application_name FROM pg_catalog.pg_locks l \
            JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
          WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
            AND l.classid = $1 AND l.objid = k.objid \
            AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                                 WHERE datname = pg_catalog.current_database()) \
          LIMIT 1), \
         (SELECT epoch FROM pg_elector_epochs WHERE class = $2 AND object = k.object) \
         FROM unnest($3::oid[], $4::int4[]) WITH ORDINALITY AS k(objid, object, lane) \
         ORDER BY k.lane";
    let class = keys[0].class();
    let objids = objects(&keys);
    let objects: Vec<i32> = keys.iter().map(|k| k.object()).collect();
    while !stop.is_cancelled() {
        let client = match connect(&config).await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(statement) = client.prepare(query).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = stop.cancelled() => return,
            }
            let rows = match client
                .query(&statement, &[&(class as u32), &class, &objids, &objects])
                .await
            {
                Ok(rows) => rows,
                Err(_) => break,
            };
            for (lane, row) in rows.iter().enumerate() {
                let at: i64 = row.get(0);
                let holder = match row.get::<_, Option<String>>(1) {
                    None => Holder::None,
                    Some(name) => replica_of(&name).map_or(Holder::Unknown, Holder::Replica),
                };
                samples.push(lane, at as u64, holder, row.get(2));
            }
        }
        samples.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// One fenced row: the replica process, its lane, its epoch, and the server's clock at the
/// insert.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    /// The replica process (`None`: a name that is not a replica's).
    pub(crate) replica: Option<usize>,
    /// The shard (0 in key mode).
    pub(crate) lane: usize,
    /// The term's epoch.
    pub(crate) epoch: i64,
    /// µs since the UNIX epoch, by the server's clock.
    pub(crate) at: u64,
}

/// Every row written, ordered by time (and by epoch at equal times).
pub(crate) async fn rows(
    client: &tokio_postgres::Client,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT replica, shard, epoch, (extract(epoch FROM at) * 1e6)::int8 \
             FROM soak_writes ORDER BY at, epoch",
            &[],
        )
        .await?
        .iter()
        .map(|row| Row {
            replica: replica_of(row.get(0)),
            lane: row.get::<_, i32>(1) as usize,
            epoch: row.get(2),
            at: row.get::<_, i64>(3) as u64,
        })
        .collect())
}

/// The backends of the soak's database, per `application_name`, but the checker's.
pub(crate) async fn backends(
    client: &tokio_postgres::Client,
) -> Result<Vec<(String, i64)>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT coalesce(application_name, ''), count(*) FROM pg_catalog.pg_stat_activity \
             WHERE datname = pg_catalog.current_database() AND backend_type = 'client backend' \
               AND application_name IS DISTINCT FROM $1 GROUP BY 1 ORDER BY 1",
            &[&CHECKER],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// The server's clock minus this machine's, in µs (from the quickest of a few round trips).
pub(crate) async fn clock_offset(client: &tokio_postgres::Client) -> Option<i64> {
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..10 {
        let before = unix_us();
        let row = client
            .query_one(
                "SELECT (extract(epoch FROM pg_catalog.clock_timestamp()) * 1e6)::int8",
                &[],
            )
            .await
            .ok()?;
        let after = unix_us();
        let server: i64 = row.get(0);
        let offset = server - ((before + after) / 2) as i64;
        if best.is_none_or(|(rtt, _)| after - before < rtt) {
            best = Some((after - before, offset));
        }
    }
    best.map(|(_, offset)| offset)
}
