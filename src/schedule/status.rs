//! The schedules a database holds: each job, its next due, its last run and outcome, its
//! skipped dues and the reruns it owes.

use std::time::SystemTime;

use tokio_postgres::Row;

use super::job::Spec;
use crate::{CurrentLeaderError, Error};

/// One job of a stored schedule, as [`jobs`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobStatus {
    /// The schedule's namespace (by default its elector's key, as `CLASS:OBJECT`).
    pub namespace: String,
    /// The job's name.
    pub job: String,
    /// Its schedule as stored: `cron <expression> <zone>` or `every <ms>ms`.
    pub schedule: String,
    /// The first due after the last one claimed (after now when none was): in the past when
    /// no leader has claimed it yet. `None` when the stored schedule cannot be read.
    pub next_due: Option<SystemTime>,
    /// The last run claimed, if any.
    pub last_run: Option<LastRun>,
    /// Dues that did not run (by the catch-up policy, or abandoned and not rerun), in all.
    pub skipped: u64,
    /// Dues whose run was abandoned and that are still to be rerun.
    pub reruns_owed: u64,
}

/// A job's last run claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LastRun {
    /// The due it ran for.
    pub due: Option<SystemTime>,
    /// The identity of the replica that claimed it.
    pub by: Option<String>,
    /// When it started.
    pub started_at: Option<SystemTime>,
    /// When it ended; `None` while it runs.
    pub finished_at: Option<SystemTime>,
    /// `running`, `succeeded`, `failed` or `abandoned`.
    pub outcome: Option<String>,
    /// The error a failed run returned.
    pub error: Option<String>,
}

/// Whether the default schedule tables exist.
const EXIST: &str = "SELECT pg_catalog.to_regclass('pg_elector_jobs') IS NOT NULL \
     AND pg_catalog.to_regclass('pg_elector_job_runs') IS NOT NULL";

/// Every job with its last run, skipped dues and owed reruns.
const JOBS: &str = "SELECT j.namespace, j.job, j.schedule, j.last_due, j.claimed_by, \
     j.started_at, j.finished_at, j.outcome, j.error, \
     coalesce(pg_catalog.cardinality(j.rerun_dues), 0)::int8, \
     (SELECT coalesce(sum(coalesce(r.skipped_dues, 1)), 0)::int8 FROM pg_elector_job_runs r \
      WHERE r.namespace = j.namespace AND r.job = j.job AND r.outcome = 'skipped') \
     FROM pg_elector_jobs j ORDER BY j.namespace, j.job";

/// Every job of the schedules stored in the default tables (`pg_elector_jobs` and
/// `pg_elector_job_runs`; none when they do not exist), ordered by namespace and name. Read
/// only; the role needs `SELECT` on both tables.
///
/// # Errors
///
/// [`Error::CurrentLeader`] with [`CurrentLeaderError::Query`] when a statement fails, for
/// example on tables an earlier version made that no replica has upgraded yet.
///
/// # Cancel safety
///
/// Cancel safe: it only reads. It puts no timeout on the statements.
pub async fn jobs(client: &tokio_postgres::Client) -> Result<Vec<JobStatus>, Error> {
    Ok(read_jobs(client).await.map_err(CurrentLeaderError::Query)?)
}

async fn read_jobs(
    client: &tokio_postgres::Client,
) -> Result<Vec<JobStatus>, tokio_postgres::Error> {
    let exist: bool = client.query_one(EXIST, &[]).await?.try_get(0)?;
    if !exist {
        return Ok(Vec::new());
    }
    let now = SystemTime::now();
    client
        .query(JOBS, &[])
        .await?
        .iter()
        .map(|row| job(row, now))
        .collect()
}

fn job(row: &Row, now: SystemTime) -> Result<JobStatus, tokio_postgres::Error> {
    let schedule: String = row.try_get(2)?;
    let last_due: Option<SystemTime> = row.try_get(3)?;
    let started_at: Option<SystemTime> = row.try_get(5)?;
    let next_due = Spec::parse(&schedule)
        .ok()
        .and_then(|spec| spec.next_due_after(last_due.unwrap_or(now)));
    let last_run = (last_due.is_some() || started_at.is_some())
        .then(|| -> Result<LastRun, tokio_postgres::Error> {
            Ok(LastRun {
                due: last_due,
                by: row.try_get(4)?,
                started_at,
                finished_at: row.try_get(6)?,
                outcome: row.try_get(7)?,
                error: row.try_get(8)?,
            })
        })
        .transpose()?;
    let count = |i: usize| -> Result<u64, tokio_postgres::Error> {
        Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
    };
    Ok(JobStatus {
        namespace: row.try_get(0)?,
        job: row.try_get(1)?,
        schedule,
        next_due,
        last_run,
        skipped: count(10)?,
        reruns_owed: count(9)?,
    })
}
