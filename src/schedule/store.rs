//! The job tables: one row per job (its schedule and the latest due instant claimed) and one
//! row per run (its history). Every due instant is claimed by compare-and-set on the job's
//! row, so that no due run starts twice, whoever claims it.

use jiff::Timestamp;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::ScheduleError;

/// PostgreSQL's longest identifier, in bytes.
const MAX_IDENTIFIER: usize = 63;

/// A job's row as the leader reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JobRow {
    pub(crate) schedule: String,
    pub(crate) last_due: Option<Timestamp>,
    pub(crate) outcome: Option<String>,
    pub(crate) claimed_term: Option<String>,
    pub(crate) trigger_requested: Option<Timestamp>,
}

/// Who claims a run.
#[derive(Clone, Debug)]
pub(crate) struct Claimant<'a> {
    pub(crate) identity: &'a str,
    pub(crate) term_id: &'a str,
    pub(crate) epoch: Option<u64>,
}

/// The two tables and their statements, names quoted as identifiers.
#[derive(Debug)]
pub(crate) struct Store {
    ddl: String,
    register: String,
    load: String,
    abandon_job: String,
    abandon_runs: String,
    claim_due: String,
    claim_rerun: String,
    claim_trigger: String,
    insert_run: String,
    finish_job: String,
    finish_run: String,
    skip_to: String,
    trigger: String,
    reschedule: String,
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Store {
    /// The tables `<prefix>jobs` and `<prefix>job_runs` in `schema` (or the `search_path`).
    pub(crate) fn new(schema: Option<&str>, prefix: &str) -> Result<Self, ScheduleError> {
        let name = |table: &str| -> Result<String, ScheduleError> {
            let table = format!("{prefix}{table}");
            for part in schema.iter().copied().chain([table.as_str()]) {
                if part.is_empty() || part.len() > MAX_IDENTIFIER || part.contains('\0') {
                    return Err(ScheduleError::InvalidTable {
                        name: part.to_owned(),
                    });
                }
            }
            Ok(match schema {
                Some(schema) => format!("{}.{}", quote(schema), quote(&table)),
                None => quote(&table),
            })
        };
        let (jobs, runs) = (name("jobs")?, name("job_runs")?);
        let key = "namespace = $1 AND job = $2";
        Ok(Self {
            ddl: format!(
                "CREATE TABLE IF NOT EXISTS {jobs} (namespace text NOT NULL, job text NOT NULL, \
                 schedule text NOT NULL, registered text NOT NULL, last_due timestamptz, \
                 claimed_by text, claimed_term text, claimed_epoch bigint, \
                 started_at timestamptz, finished_at timestamptz, outcome text, error text, \
                 trigger_requested timestamptz, PRIMARY KEY (namespace, job)); \
                 CREATE TABLE IF NOT EXISTS {runs} (namespace text NOT NULL, job text NOT NULL, \
                 due timestamptz NOT NULL, attempt int4 NOT NULL, kind text NOT NULL, \
                 claimed_by text NOT NULL, claimed_term text NOT NULL, epoch bigint, \
                 started_at timestamptz NOT NULL, finished_at timestamptz, outcome text NOT NULL, \
                 error text, PRIMARY KEY (namespace, job, due, attempt))"
            ),
            // A deploy whose code registers another schedule overrides the stored one; a
            // schedule changed at run time stays until then. `xmax = 0`: the row is new.
            register: format!(
                "INSERT INTO {jobs} AS j (namespace, job, schedule, registered, last_due) \
                 VALUES ($1, $2, $3, $3, $4) ON CONFLICT (namespace, job) DO UPDATE \
                 SET schedule = CASE WHEN j.registered <> EXCLUDED.registered \
                                     THEN EXCLUDED.schedule ELSE j.schedule END, \
                     registered = EXCLUDED.registered \
                 RETURNING (xmax = 0)"
            ),
            load: format!(
                "SELECT schedule, last_due, outcome, claimed_term, trigger_requested \
                 FROM {jobs} WHERE {key}"
            ),
            abandon_job: format!(
                "UPDATE {jobs} SET outcome = 'abandoned', finished_at = clock_timestamp() \
                 WHERE {key} AND outcome = 'running' AND claimed_term <> $3 RETURNING last_due"
            ),
            abandon_runs: format!(
                "UPDATE {runs} SET outcome = 'abandoned', finished_at = clock_timestamp() \
                 WHERE {key} AND outcome = 'running' AND claimed_term <> $3"
            ),
            claim_due: format!(
                "UPDATE {jobs} SET last_due = $3, claimed_by = $4, claimed_term = $5, \
                 claimed_epoch = $6, started_at = clock_timestamp(), finished_at = NULL, \
                 outcome = 'running', error = NULL \
                 WHERE {key} AND (last_due IS NULL OR last_due < $3) RETURNING 1"
            ),
            claim_rerun: format!(
                "UPDATE {jobs} SET claimed_by = $4, claimed_term = $5, claimed_epoch = $6, \
                 started_at = clock_timestamp(), finished_at = NULL, outcome = 'running', \
                 error = NULL WHERE {key} AND last_due = $3 AND outcome = 'abandoned' RETURNING 1"
            ),
            claim_trigger: format!(
                "UPDATE {jobs} SET trigger_requested = NULL \
                 WHERE {key} AND trigger_requested IS NOT NULL RETURNING 1"
            ),
            insert_run: format!(
                "INSERT INTO {runs} (namespace, job, due, attempt, kind, claimed_by, claimed_term, \
                 epoch, started_at, outcome) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp(), 'running')"
            ),
            finish_job: format!(
                "UPDATE {jobs} SET finished_at = clock_timestamp(), outcome = $5, error = $6 \
                 WHERE {key} AND last_due = $3 AND claimed_term = $4"
            ),
            finish_run: format!(
                "UPDATE {runs} SET finished_at = clock_timestamp(), outcome = $5, error = $6 \
                 WHERE {key} AND due = $3 AND attempt = $4"
            ),
            skip_to: format!(
                "UPDATE {jobs} SET last_due = $3 WHERE {key} AND (last_due IS NULL OR last_due < $3)"
            ),
            trigger: format!("UPDATE {jobs} SET trigger_requested = clock_timestamp() WHERE {key}"),
            reschedule: format!("UPDATE {jobs} SET schedule = $3 WHERE {key}"),
        })
    }

    /// The statements that create the tables, for a migration.
    pub(crate) fn ddl(&self) -> &str {
        &self.ddl
    }

    /// Creates the tables when they are missing.
    pub(crate) async fn ensure(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<(), ScheduleError> {
        match client.batch_execute(&self.ddl).await {
            Ok(()) => Ok(()),
            // Two replicas creating them at once: the other one won.
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                Err(ScheduleError::CannotCreate {
                    ddl: self.ddl.clone(),
                    source: e,
                })
            }
            Err(e) => Err(ScheduleError::Database(e)),
        }
    }

    /// Registers a job; `true` when its row was created now. A new row's `last_due` is
    /// `initial`: dues up to it count as handled (a new job does not catch up on its past).
    pub(crate) async fn register(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        schedule: &str,
        initial: Option<Timestamp>,
    ) -> Result<bool, ScheduleError> {
        let rows = client
            .query_typed(
                &self.register,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&schedule, Type::TEXT),
                    (&initial, Type::TIMESTAMPTZ),
                ],
            )
            .await?;
        Ok(rows.first().is_some_and(|row| row.get(0)))
    }

    pub(crate) async fn load(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
    ) -> Result<Option<JobRow>, ScheduleError> {
        let rows = client
            .query_typed(&self.load, &[(&namespace, Type::TEXT), (&job, Type::TEXT)])
            .await?;
        Ok(rows.first().map(|row| JobRow {
            schedule: row.get(0),
            last_due: row.get(1),
            outcome: row.get(2),
            claimed_term: row.get(3),
            trigger_requested: row.get(4),
        }))
    }

    /// Marks a run left `running` by another term as abandoned; returns its due instant.
    pub(crate) async fn abandon(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        term_id: &str,
    ) -> Result<Option<Timestamp>, ScheduleError> {
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
            (&namespace, Type::TEXT),
            (&job, Type::TEXT),
            (&term_id, Type::TEXT),
        ];
        client.query_typed(&self.abandon_runs, &params).await?;
        let rows = client.query_typed(&self.abandon_job, &params).await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// Claims one run in `tx` (compare-and-set on the job's row); `false` when someone else
    /// claimed it first (or it is no longer due).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        namespace: &str,
        job: &str,
        due: Timestamp,
        kind: super::RunKind,
        attempt: u32,
        who: &Claimant<'_>,
    ) -> Result<bool, ScheduleError> {
        let epoch = who.epoch.map(|e| e as i64);
        let claimed = match kind {
            super::RunKind::Triggered => {
                tx.query_typed(
                    &self.claim_trigger,
                    &[(&namespace, Type::TEXT), (&job, Type::TEXT)],
                )
                .await?
            }
            super::RunKind::Scheduled | super::RunKind::Rerun => {
                let statement = match kind {
                    super::RunKind::Rerun => &self.claim_rerun,
                    _ => &self.claim_due,
                };
                tx.query_typed(
                    statement,
                    &[
                        (&namespace, Type::TEXT),
                        (&job, Type::TEXT),
                        (&due, Type::TIMESTAMPTZ),
                        (&who.identity, Type::TEXT),
                        (&who.term_id, Type::TEXT),
                        (&epoch, Type::INT8),
                    ],
                )
                .await?
            }
        };
        if claimed.is_empty() {
            return Ok(false);
        }
        tx.query_typed(
            &self.insert_run,
            &[
                (&namespace, Type::TEXT),
                (&job, Type::TEXT),
                (&due, Type::TIMESTAMPTZ),
                (&(attempt as i32), Type::INT4),
                (&kind.label(), Type::TEXT),
                (&who.identity, Type::TEXT),
                (&who.term_id, Type::TEXT),
                (&epoch, Type::INT8),
            ],
        )
        .await?;
        Ok(true)
    }

    /// Records how a run ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn finish(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        due: Timestamp,
        attempt: u32,
        term_id: &str,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), ScheduleError> {
        client
            .query_typed(
                &self.finish_run,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&due, Type::TIMESTAMPTZ),
                    (&(attempt as i32), Type::INT4),
                    (&outcome, Type::TEXT),
                    (&error, Type::TEXT),
                ],
            )
            .await?;
        client
            .query_typed(
                &self.finish_job,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&due, Type::TIMESTAMPTZ),
                    (&term_id, Type::TEXT),
                    (&outcome, Type::TEXT),
                    (&error, Type::TEXT),
                ],
            )
            .await?;
        Ok(())
    }

    /// Counts the dues up to `due` as handled without running them.
    pub(crate) async fn skip_to(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        due: Timestamp,
    ) -> Result<(), ScheduleError> {
        client
            .query_typed(
                &self.skip_to,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&due, Type::TIMESTAMPTZ),
                ],
            )
            .await?;
        Ok(())
    }

    /// Asks the leader for a run now; `false` when the job is unknown.
    pub(crate) async fn trigger(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
    ) -> Result<bool, ScheduleError> {
        let n = client
            .execute_typed(
                &self.trigger,
                &[(&namespace, Type::TEXT), (&job, Type::TEXT)],
            )
            .await?;
        Ok(n == 1)
    }

    /// Changes a job's schedule (from its next due on); `false` when the job is unknown.
    pub(crate) async fn reschedule(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        schedule: &str,
    ) -> Result<bool, ScheduleError> {
        let n = client
            .execute_typed(
                &self.reschedule,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&schedule, Type::TEXT),
                ],
            )
            .await?;
        Ok(n == 1)
    }
}
