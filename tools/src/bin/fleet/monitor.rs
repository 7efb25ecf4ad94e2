//! The bench's own sessions: leaders, backends, statements, and the check-shaped probe.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_testkit::TestDb;
use tokio_postgres::types::Type;

use crate::server::connect;
use crate::snapshot::{Probes, Statements};
use crate::{APP, CLASS, TAG};

/// One of the bench's own sessions, and its backend's pid.
pub(crate) struct Monitor {
    pub(crate) client: tokio_postgres::Client,
    pub(crate) pid: i32,
}

impl Monitor {
    pub(crate) async fn open(db: &TestDb) -> Self {
        let client = connect(db.config()).await;
        let pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("a pid")
            .get(0);
        Monitor { client, pid }
    }

    pub(crate) async fn query(
        &self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.client.query(&format!("{TAG}{sql}"), &[]).await
    }

    pub(crate) async fn leaders(&self) -> i64 {
        self.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND mode = 'ExclusiveLock' AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .await
        .ok()
        .and_then(|rows| rows.first().map(|r| r.get(0)))
        .unwrap_or(-1)
    }

    /// The fleet's backends now, and how many of them wait on a lock.
    pub(crate) async fn backends(&self) -> (i64, i64) {
        self.query(&format!(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND datname = current_database() \
             AND application_name <> '{APP}'"
        ))
        .await
        .ok()
        .and_then(|rows| rows.first().map(|r| (r.get(0), r.get(1))))
        .unwrap_or((-1, -1))
    }

    /// The sessions the server has opened in this database (there from PostgreSQL 14).
    pub(crate) async fn sessions(&self) -> Option<i64> {
        self.query("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            .await
            .ok()
            .and_then(|rows| rows.first().map(|r| r.get(0)))
    }

    pub(crate) async fn statements(&self) -> Option<Statements> {
        let rows = self
            .query(&format!(
                "SELECT \
                 coalesce(sum(calls) FILTER (WHERE {TRY}), 0)::int8, \
                 coalesce(sum(total_exec_time + total_plan_time) FILTER (WHERE {TRY}), 0)::float8, \
                 coalesce(sum(calls) FILTER (WHERE {CHECK}), 0)::int8, \
                 coalesce(sum(total_exec_time + total_plan_time) FILTER (WHERE {CHECK}), 0)::float8, \
                 coalesce(sum(calls) FILTER (WHERE NOT ({TRY}) AND NOT ({CHECK}) \
                   AND query NOT LIKE '{}%' AND query NOT LIKE 'SELECT pg_backend_pid()%'), 0)::int8 \
                 FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                TAG.trim_end()
            ))
            .await
            .ok()?;
        let r = rows.first()?;
        Some(Statements {
            try_calls: r.get(0),
            try_ms: r.get(1),
            check_calls: r.get(2),
            check_ms: r.get(3),
            other_calls: r.get(4),
        })
    }
}

/// The try, as `pg_stat_statements` shows it (the waiting session's statement of fast
/// takeover also starts with `SELECT answer,`, but does not try).
/// The bare try of `--bare-try` ([`crate::BARE_TRY`]) counts as a try too, and so does the
/// question a standby asks before its try (whether the lock is free).
pub(crate) const TRY: &str = "(query LIKE 'SELECT answer,%' AND query LIKE '%pg_try_advisory_lock(%' \
     OR query LIKE '/* fleet bare try */%' OR query LIKE 'SELECT CASE WHEN pg_catalog.current_setting(%pg_try_advisory_xact_lock_shared(%')";
/// The leader's check, as `pg_stat_statements` shows it (its `SELECT 1` becomes `SELECT $4`).
pub(crate) const CHECK: &str = "query LIKE 'SELECT EXISTS (SELECT % FROM pg_catalog.pg_locks%'";

/// The probe: a statement shaped like the leader's check (the same `pg_locks` read, one
/// unnamed statement), one more column so that `pg_stat_statements` keeps it apart.
pub(crate) const PROBE: &str = "/* fleet-bench */ SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
     WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND granted AND pid = pg_catalog.pg_backend_pid() \
     AND database = (SELECT oid FROM pg_catalog.pg_database \
                     WHERE datname = pg_catalog.current_database())), \
     coalesce(pg_catalog.current_setting('pg_elector.session', true), '') = $3::text, \
     coalesce(pg_catalog.current_setting('pg_elector.visited', true), '') = '', 'probe'";

/// Runs the probe every `every` until dropped; each latency (µs) with its time.
pub(crate) fn start_probe(
    client: Arc<tokio_postgres::Client>,
    every: Duration,
) -> (tokio::task::JoinHandle<()>, Probes) {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let handle = tokio::spawn({
        let samples = samples.clone();
        async move {
            let key = LockKey::new(CLASS, 0);
            let mark = String::from("probe");
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let started = Instant::now();
                let ok = client
                    .query_typed(
                        PROBE,
                        &[
                            (&(key.class() as u32), Type::OID),
                            (&(key.object() as u32), Type::OID),
                            (&mark, Type::TEXT),
                        ],
                    )
                    .await
                    .is_ok();
                if ok {
                    let took = started.elapsed().as_micros() as u64;
                    samples.lock().unwrap().push((started, took));
                }
            }
        }
    });
    (handle, samples)
}
