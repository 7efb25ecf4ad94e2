//! The job tables: one row per job (its schedule and the latest due instant claimed) and one
//! row per run (its history). Every due instant is claimed by compare-and-set on the job's
//! row, so that no due run starts twice, whoever claims it.

use jiff::Timestamp;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

mod runs;
mod sql;

use super::ScheduleError;
use sql::Tables;

/// One of the two tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    Jobs,
    Runs,
}

/// A heartbeat's confirmation: an empty transactional WAL message (no table, no row, no lock;
/// prefix `pg_elector`, which logical decoding consumers may see and ignore) whose commit
/// waits for the synchronous standby as a claim's does (`synchronous_commit` raised to `on`
/// from `off` or `local`, stricter settings kept). Answered, it says that the beats committed
/// before it was sent are on the standby too (WAL is one stream: any connection would do).
const CONFIRM: &str = "SELECT pg_catalog.pg_logical_emit_message(true, 'pg_elector', ''), \
     pg_catalog.set_config('synchronous_commit', \
       CASE WHEN pg_catalog.current_setting('synchronous_commit') IN ('off', 'local') THEN 'on' \
       ELSE pg_catalog.current_setting('synchronous_commit') END, true)";

/// The columns versions after the first added, with their types: in the tables this version
/// creates, and added (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`) to tables an earlier version
/// made.
const ADDED_COLUMNS: &[(Table, &str, &str)] = &[
    // The heartbeat period the running replica promised: its run is stale after a few of
    // them, whatever the reader's own poll interval.
    (Table::Runs, "heartbeat_period", "interval"),
    // Dues whose run was abandoned and is still to be rerun: set when the run is called
    // abandoned, in the same statement; a due leaves it only by its rerun's claim.
    (Table::Jobs, "rerun_dues", "timestamptz[]"),
    // A due that did not run is a row with outcome `skipped`: why, and how many dues (ending
    // at its due) it stands for.
    (Table::Runs, "reason", "text"),
    (Table::Runs, "skipped_dues", "bigint"),
];

/// What [`Store::ensure`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// The tables were there, with every column.
    Ready,
    /// It created them.
    Created,
    /// They were there without the columns of this version, and it added them.
    Upgraded,
}

/// How a run ended, as the `outcome` column and the `outcome` label of
/// `pg_elector_job_runs_total` say it. [`Store::finish`] writes the end a run reports; the
/// statements themselves write `running` (a claim), `abandoned` and `skipped`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The job returned `Ok`.
    Succeeded,
    /// The job returned `Err` or panicked.
    Failed,
    /// The run was cut off, and a later term called it abandoned.
    Abandoned,
}

impl Outcome {
    /// The outcome as the tables and the metric say it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Abandoned => "abandoned",
        }
    }
}

/// A job's row as the leader reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JobRow {
    pub(crate) schedule: String,
    pub(crate) last_due: Option<Timestamp>,
    pub(crate) claimed_term: Option<String>,
    pub(crate) trigger_requested: Option<Timestamp>,
    /// Dues whose abandoned run is still to be rerun, oldest first.
    pub(crate) rerun_dues: Vec<Timestamp>,
}

/// A run another term left `running`, now recorded as abandoned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Abandoned {
    pub(crate) due: Timestamp,
    pub(crate) attempt: u32,
    /// `scheduled`, `rerun` or `triggered`.
    pub(crate) kind: String,
    pub(crate) claimed_by: String,
    /// Whether it is to be rerun (recorded in the job's row, in the same statement).
    pub(crate) rerun: bool,
}

/// A claim this replica made, inside its transaction, before the COMMIT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// The run's attempt number.
    pub(crate) attempt: u32,
    /// The claim's transaction id (`xid8` as text), to read its outcome back when the answer
    /// to its COMMIT is lost.
    pub(crate) xid: String,
}

/// One run of a job, as its row is named: the job, the due and the attempt (the first four
/// parameters of every statement about one run), and the term that claimed it. A statement
/// that speaks for the runner (a beat, the end) also names the term: after an asynchronous
/// failover that lost the claim, another term may claim the same due and attempt again, and
/// the old runner must not beat or end for that run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunRef<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) job: &'a str,
    pub(crate) due: Timestamp,
    pub(crate) attempt: u32,
    /// The claiming term's id (the row's `claimed_term`).
    pub(crate) term: &'a str,
}

/// What became of a claim whose COMMIT got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimStatus {
    /// Committed: the run's row is there.
    Committed,
    /// Its transaction aborted: nothing was claimed.
    Aborted,
    /// Still committing (or committed and not yet visible: waiting for a synchronous standby).
    Unsettled,
}

/// Who claims a run.
#[derive(Clone, Debug)]
pub(crate) struct Claimant<'a> {
    pub(crate) identity: &'a str,
    pub(crate) term_id: &'a str,
    pub(crate) epoch: Option<u64>,
    /// How often the claimant's run says it is alive.
    pub(crate) heartbeat: std::time::Duration,
}

/// The two tables and their statements, names quoted as identifiers.
#[derive(Debug)]
pub(crate) struct Store {
    ddl: String,
    exists: String,
    upgrade: String,
    register: String,
    load: String,
    abandon: String,
    heartbeat: String,
    claim_due: String,
    claim_rerun: String,
    claim_trigger: String,
    insert_run: String,
    claim_status: String,
    finish: String,
    skip: String,
    record_skipped: String,
    trigger: String,
    reschedule: String,
}

/// How long creating or upgrading the tables waits for a lock on them (another session's
/// query, a long report over the runs) before it gives up until the next poll: while it waits,
/// every claim waits behind it.
const UPGRADE_LOCK_WAIT_MS: u64 = 200;

impl Store {
    /// The tables `<prefix>jobs` and `<prefix>job_runs` in `schema` (or the `search_path`).
    pub(crate) fn new(schema: Option<&str>, prefix: &str) -> Result<Self, ScheduleError> {
        let tables = Tables::new(schema, prefix)?;
        Ok(Self {
            ddl: tables.ddl(),
            exists: tables.exists(),
            upgrade: tables.upgrade(),
            register: tables.register(),
            load: tables.load(),
            abandon: tables.abandon(),
            heartbeat: tables.heartbeat(),
            claim_due: tables.claim_due(),
            claim_rerun: tables.claim_rerun(),
            claim_trigger: tables.claim_trigger(),
            insert_run: tables.insert_run(),
            claim_status: tables.claim_status(),
            finish: tables.finish(),
            skip: tables.skip(),
            record_skipped: tables.record_skipped(),
            trigger: tables.trigger(),
            reschedule: tables.reschedule(),
        })
    }

    /// The statements that create the tables, for a migration.
    pub(crate) fn ddl(&self) -> &str {
        &self.ddl
    }

    /// Creates the tables when they are missing, and adds the columns of this version to
    /// tables an earlier version made. A look comes first: the server checks the right to
    /// create in the schema before it looks whether the table exists, so `CREATE TABLE IF NOT
    /// EXISTS` fails for a role that may only use tables an administrator made (and `ALTER
    /// TABLE` for a role that does not own them, whether or not the columns are there).
    pub(crate) async fn ensure(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<Ensured, ScheduleError> {
        let (statements, made) = match client.batch_execute(&self.exists).await {
            Ok(()) => return Ok(Ensured::Ready),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => (&self.ddl, Ensured::Created),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
                (&self.upgrade, Ensured::Upgraded)
            }
            Err(e) => return Err(ScheduleError::Database(e)),
        };
        // One implicit transaction (a simple query of several statements), whose lock wait is
        // bounded: an `ALTER TABLE` queued behind a long query on the tables would make every
        // claim queue behind it. It fails instead, and is tried again at the next poll.
        let bounded = format!("SET LOCAL lock_timeout = '{UPGRADE_LOCK_WAIT_MS}ms'; {statements}");
        match client.batch_execute(&bounded).await {
            Ok(()) => Ok(made),
            // Two replicas creating them at once: the other one won.
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(Ensured::Ready),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(match made {
                Ensured::Upgraded => ScheduleError::CannotUpgrade {
                    ddl: self.upgrade.clone(),
                    source: e,
                },
                _ => ScheduleError::CannotCreate {
                    ddl: self.ddl.clone(),
                    source: e,
                },
            }),
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
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        // try_get: a timestamp jiff cannot hold ('infinity') is an error, not a panic.
        Ok(Some(JobRow {
            schedule: row.try_get(0)?,
            last_due: row.try_get(1)?,
            claimed_term: row.try_get(2)?,
            trigger_requested: row.try_get(3)?,
            rerun_dues: row.try_get(4)?,
        }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_as_identifiers_never_pasted() {
        let store = Store::new(Some("Ops\"; DROP SCHEMA x; --"), "My \"jobs\"; --").unwrap();
        let jobs = "\"Ops\"\"; DROP SCHEMA x; --\".\"My \"\"jobs\"\"; --jobs\"";
        let runs = "\"Ops\"\"; DROP SCHEMA x; --\".\"My \"\"jobs\"\"; --job_runs\"";
        assert!(
            store
                .ddl()
                .starts_with(&format!("CREATE TABLE IF NOT EXISTS {jobs} (")),
            "{}",
            store.ddl()
        );
        assert!(
            store
                .ddl()
                .contains(&format!("CREATE TABLE IF NOT EXISTS {runs} (")),
            "{}",
            store.ddl()
        );
        // An index lives in its table's schema: its own name is never qualified.
        assert!(
            store.ddl().contains(&format!(
                "CREATE INDEX IF NOT EXISTS \"My \"\"jobs\"\"; --job_runs_running\" ON {runs} "
            )),
            "{}",
            store.ddl()
        );
        for statement in [
            &store.register,
            &store.load,
            &store.abandon,
            &store.claim_due,
            &store.claim_rerun,
            &store.claim_status,
            &store.skip,
            &store.record_skipped,
            &store.upgrade,
            &store.finish,
            &store.trigger,
            &store.reschedule,
        ] {
            assert!(
                statement.contains(jobs) || statement.contains(runs),
                "{statement}"
            );
            // Every name of the statement is one of the two quoted ones: removing them leaves
            // no trace of the hostile text.
            let rest = statement.replace(jobs, "").replace(runs, "");
            assert!(
                !rest.contains("DROP") && !rest.contains("--"),
                "{statement}"
            );
        }
        let plain = Store::new(None, "pg_elector_").unwrap();
        assert!(
            plain
                .ddl()
                .starts_with("CREATE TABLE IF NOT EXISTS \"pg_elector_jobs\" (")
        );
        assert!(
            plain
                .exists
                .contains("FROM \"pg_elector_job_runs\" WHERE false")
        );
    }

    #[test]
    fn a_run_is_stale_after_three_of_its_own_periods_and_at_least_3_s() {
        let store = Store::new(None, "pg_elector_").unwrap();
        assert!(
            store.abandon.contains(
                "coalesce(heartbeat_at, started_at) < clock_timestamp() - greatest(3 * \
                 coalesce(heartbeat_period, make_interval(secs => $5)), \
                 make_interval(secs => 3))"
            ),
            "{}",
            store.abandon
        );
        assert!(store.insert_run.contains("make_interval(secs => $8)"));
    }

    /// The DDL makes every column, and adds the later ones to older tables.
    #[test]
    fn the_ddl_makes_and_upgrades_every_column() {
        let store = Store::new(None, "pg_elector_").unwrap();
        let ddl = store.ddl();
        for (table, column, kind) in ADDED_COLUMNS {
            let name = match table {
                Table::Jobs => "\"pg_elector_jobs\"",
                Table::Runs => "\"pg_elector_job_runs\"",
            };
            let create = ddl
                .split("; ")
                .find(|s| s.starts_with(&format!("CREATE TABLE IF NOT EXISTS {name} (")))
                .unwrap();
            assert!(create.contains(&format!(" {column} {kind}, ")), "{create}");
            let alter = format!("ADD COLUMN IF NOT EXISTS {column} {kind}");
            assert!(store.upgrade.contains(&alter), "{}", store.upgrade);
            assert!(store.exists.contains(column), "{}", store.exists);
        }
        assert!(ddl.contains(&store.upgrade), "{ddl}");
        for alter in [
            "ALTER TABLE \"pg_elector_jobs\" ADD COLUMN IF NOT EXISTS rerun_dues timestamptz[]",
            "ALTER TABLE \"pg_elector_job_runs\" ADD COLUMN IF NOT EXISTS heartbeat_period interval",
        ] {
            assert!(store.upgrade.contains(alter), "{}", store.upgrade);
        }
    }

    #[test]
    fn an_empty_overlong_or_nul_name_is_an_error() {
        for (schema, prefix) in [
            (Some(""), "p_"),
            (Some("a\0b"), "p_"),
            (Some(&*"s".repeat(64)), "p_"),
            (None, "p\0_"),
            // `<prefix>job_runs_running` must fit 63 bytes too.
            (None, &*"p".repeat(48)),
        ] {
            assert!(
                matches!(
                    Store::new(schema, prefix),
                    Err(ScheduleError::InvalidTable { .. })
                ),
                "{schema:?} {prefix:?}"
            );
        }
        assert!(Store::new(Some(&"s".repeat(63)), &"p".repeat(47)).is_ok());
        assert!(Store::new(None, "").is_ok(), "no prefix: jobs, job_runs");
    }
}
