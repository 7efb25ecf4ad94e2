//! The text of the job tables' statements, made once per [`Store`](super::Store) from the
//! tables' names, each quoted as an identifier (never pasted).

use super::{ADDED_COLUMNS, Table};
use crate::ident::{self, quote};
use crate::schedule::{STALE_BEATS, STALE_FLOOR, ScheduleError};

/// A job's row, and the runs of that job.
const KEY: &str = "namespace = $1 AND job = $2";

/// The columns of a `skipped` row.
const SKIPPED_COLUMNS: &str = "namespace, job, due, attempt, kind, claimed_by, claimed_term, \
    epoch, started_at, finished_at, outcome, reason, skipped_dues";

/// The columns later versions added to `table`, with their types.
fn added(table: Table) -> Vec<(&'static str, &'static str)> {
    ADDED_COLUMNS
        .iter()
        .filter(|(t, _, _)| *t == table)
        .map(|(_, column, kind)| (*column, *kind))
        .collect()
}

/// `columns` as a `CREATE TABLE` lists them, each followed by a comma.
fn in_create(columns: &[(&str, &str)]) -> String {
    columns
        .iter()
        .map(|(column, kind)| format!("{column} {kind}, "))
        .collect()
}

/// The `ALTER TABLE` that adds `columns` to `table` when they are missing; `None` for none.
fn alter(table: &str, columns: &[(&str, &str)]) -> Option<String> {
    (!columns.is_empty()).then(|| {
        let adds: Vec<String> = columns
            .iter()
            .map(|(column, kind)| format!("ADD COLUMN IF NOT EXISTS {column} {kind}"))
            .collect();
        format!("ALTER TABLE {table} {}", adds.join(", "))
    })
}

/// The names of `columns`, comma-separated.
fn names(columns: &[(&str, &str)]) -> String {
    columns
        .iter()
        .map(|(column, _)| *column)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A run is stale once it has been silent for a few of the heartbeat periods its runner
/// promised (at least a floor); a run of an earlier version, which promised none, by the
/// reader's poll interval ($5).
fn stale() -> String {
    format!(
        "coalesce(heartbeat_at, started_at) < clock_timestamp() - greatest({beats} * \
         coalesce(heartbeat_period, make_interval(secs => $5)), \
         make_interval(secs => {floor}))",
        beats = STALE_BEATS,
        floor = STALE_FLOOR.as_secs_f64(),
    )
}

/// The quoted names of the two tables and of the index of running runs, and the statements
/// over them.
#[derive(Debug)]
pub(super) struct Tables {
    jobs: String,
    runs: String,
    running_index: String,
}

impl Tables {
    /// `<prefix>jobs`, `<prefix>job_runs` and `<prefix>job_runs_running` in `schema` (or the
    /// `search_path`); [`ScheduleError::InvalidTable`] for a name PostgreSQL would not keep.
    pub(super) fn new(schema: Option<&str>, prefix: &str) -> Result<Self, ScheduleError> {
        let name = |table: &str| -> Result<String, ScheduleError> {
            let table = format!("{prefix}{table}");
            for part in schema.iter().copied().chain([table.as_str()]) {
                if !ident::is_valid(part) {
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
        // An index takes its table's schema: its name is never qualified.
        let running_index = {
            let index = format!("{prefix}job_runs_running");
            if !ident::is_valid(&index) {
                return Err(ScheduleError::InvalidTable { name: index });
            }
            quote(&index)
        };
        Ok(Self {
            jobs,
            runs,
            running_index,
        })
    }

    /// No run of this job that another term started is still going: a new leader does not
    /// start the job beside its predecessor's run, nor overwrite that run's claim before it
    /// is settled (finished, or called abandoned). $5 is the claiming term.
    fn no_other_run(&self) -> String {
        let runs = &self.runs;
        format!(
            "NOT EXISTS (SELECT 1 FROM {runs} WHERE namespace = $1 AND job = $2 \
             AND outcome = 'running' AND claimed_term <> $5)"
        )
    }

    /// A `skipped` row's values: $5 identity, $6 term, $7 epoch of the replica that decided
    /// it; `s` the stretch. Its attempt is the due's next one.
    fn skipped_values(&self) -> String {
        let runs = &self.runs;
        format!(
            "$1, $2, s.due, (SELECT coalesce(max(attempt), 0) + 1 FROM {runs} \
               WHERE namespace = $1 AND job = $2 AND due = s.due), \
             'scheduled', $5, $6, $7, clock_timestamp(), clock_timestamp(), 'skipped', \
             s.reason, s.dues"
        )
    }

    /// The statements that create the tables, with every column, and the index.
    pub(super) fn ddl(&self) -> String {
        let Self {
            jobs,
            runs,
            running_index,
        } = self;
        let upgrade = self.upgrade();
        format!(
            "CREATE TABLE IF NOT EXISTS {jobs} (namespace text NOT NULL, job text NOT NULL, \
             schedule text NOT NULL, registered text NOT NULL, last_due timestamptz, \
             claimed_by text, claimed_term text, claimed_epoch bigint, \
             started_at timestamptz, finished_at timestamptz, outcome text, error text, \
             trigger_requested timestamptz, {jobs_new}PRIMARY KEY (namespace, job)); \
             CREATE TABLE IF NOT EXISTS {runs} (namespace text NOT NULL, job text NOT NULL, \
             due timestamptz NOT NULL, attempt int4 NOT NULL, kind text NOT NULL, \
             claimed_by text NOT NULL, claimed_term text NOT NULL, epoch bigint, \
             started_at timestamptz NOT NULL, heartbeat_at timestamptz, \
             finished_at timestamptz, outcome text NOT NULL, error text, {runs_new}\
             PRIMARY KEY (namespace, job, due, attempt)); \
             {upgrade}; \
             CREATE INDEX IF NOT EXISTS {running_index} ON {runs} (namespace, job) \
             WHERE outcome = 'running'",
            jobs_new = in_create(&added(Table::Jobs)),
            runs_new = in_create(&added(Table::Runs)),
        )
    }

    /// Both tables, with the columns later versions added.
    pub(super) fn exists(&self) -> String {
        let Self { jobs, runs, .. } = self;
        format!(
            "SELECT {} FROM {jobs} WHERE false; SELECT {} FROM {runs} WHERE false",
            names(&added(Table::Jobs)),
            names(&added(Table::Runs))
        )
    }

    /// The columns of this version added to tables an earlier version made.
    pub(super) fn upgrade(&self) -> String {
        [
            alter(&self.jobs, &added(Table::Jobs)),
            alter(&self.runs, &added(Table::Runs)),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
    }

    /// A deploy whose code registers another schedule overrides the stored one; a schedule
    /// changed at run time stays until then. `xmax = 0`: the row is new.
    pub(super) fn register(&self) -> String {
        let jobs = &self.jobs;
        format!(
            "INSERT INTO {jobs} AS j (namespace, job, schedule, registered, last_due) \
             VALUES ($1, $2, $3, $3, $4) ON CONFLICT (namespace, job) DO UPDATE \
             SET schedule = CASE WHEN j.registered <> EXCLUDED.registered \
                                 THEN EXCLUDED.schedule ELSE j.schedule END, \
                 last_due = CASE WHEN j.registered <> EXCLUDED.registered \
                                 THEN greatest(j.last_due, clock_timestamp()) ELSE j.last_due END, \
                 registered = EXCLUDED.registered \
             RETURNING (xmax = 0)"
        )
    }

    /// A job's row, its dues to rerun oldest first.
    pub(super) fn load(&self) -> String {
        let jobs = &self.jobs;
        format!(
            "SELECT schedule, last_due, claimed_term, trigger_requested, \
             ARRAY(SELECT d FROM unnest(rerun_dues) AS d ORDER BY d) \
             FROM {jobs} WHERE {KEY}"
        )
    }

    /// Runs still `running` whose runner is known to be gone: of a term named in $4 (terms of
    /// this process that have ended, or this term when its runner gave the run up), or of
    /// another term and stale (its leader died, or was deposed and stopped it).
    /// The job's row follows when it holds that claim, and keeps the dues to rerun ($6: the
    /// job asks for reruns; a triggered run is never rerun), so that the decision to rerun
    /// survives whatever happens to this leader after this statement; a due not to be rerun
    /// is recorded as skipped (by $7, epoch $8).
    pub(super) fn abandon(&self) -> String {
        let Self { jobs, runs, .. } = self;
        let stale = stale();
        format!(
            "WITH r AS (UPDATE {runs} SET outcome = 'abandoned', finished_at = clock_timestamp() \
               WHERE {KEY} AND outcome = 'running' \
               AND (claimed_term = ANY($4) OR (claimed_term <> $3 AND {stale})) \
               RETURNING due, attempt, kind, claimed_by, claimed_term, \
                         ($6 AND kind <> 'triggered') AS rerun), \
             j AS (UPDATE {jobs} AS j SET \
               outcome = CASE WHEN {holds} THEN 'abandoned' ELSE j.outcome END, \
               finished_at = CASE WHEN {holds} THEN clock_timestamp() ELSE j.finished_at END, \
               rerun_dues = CASE WHEN EXISTS (SELECT 1 FROM r WHERE r.rerun) \
                 THEN coalesce(j.rerun_dues, '{{}}') \
                      || ARRAY(SELECT r.due FROM r WHERE r.rerun ORDER BY r.due) \
                 ELSE j.rerun_dues END \
               WHERE j.namespace = $1 AND j.job = $2 AND EXISTS (SELECT 1 FROM r)), \
             s AS (INSERT INTO {runs} ({SKIPPED_COLUMNS}) \
               SELECT $1, $2, r.due, (SELECT coalesce(max(attempt), 0) + 1 FROM {runs} \
                        WHERE namespace = $1 AND job = $2 AND due = r.due), \
                      r.kind, $7, $3, $8, clock_timestamp(), clock_timestamp(), 'skipped', \
                      'abandoned', 1 \
               FROM r WHERE NOT r.rerun) \
             SELECT due, attempt, kind, claimed_by, rerun FROM r ORDER BY due, attempt",
            holds = "j.outcome = 'running' AND EXISTS (SELECT 1 FROM r \
                     WHERE r.claimed_term = j.claimed_term AND r.due = j.last_due)",
        )
    }

    /// A running run says it is alive: its own claim's row only, committed without waiting
    /// for a synchronous standby (seen at once here, the row held only for the update; the
    /// [`CONFIRM`](super::CONFIRM) after it waits for the standby).
    pub(super) fn heartbeat(&self) -> String {
        let runs = &self.runs;
        format!(
            "UPDATE {runs} SET heartbeat_at = clock_timestamp() \
             FROM (SELECT pg_catalog.set_config('synchronous_commit', 'local', true)) AS local_commit \
             WHERE {KEY} AND due = $3 AND attempt = $4 AND claimed_term = $5 \
               AND outcome = 'running'"
        )
    }

    /// A scheduled due: compare-and-set on the job's row.
    pub(super) fn claim_due(&self) -> String {
        let jobs = &self.jobs;
        let no_other_run = self.no_other_run();
        format!(
            "UPDATE {jobs} SET last_due = $3, claimed_by = $4, claimed_term = $5, \
             claimed_epoch = $6, started_at = clock_timestamp(), finished_at = NULL, \
             outcome = 'running', error = NULL \
             WHERE {KEY} AND (last_due IS NULL OR last_due < $3) AND {no_other_run} \
             RETURNING 1"
        )
    }

    /// A due whose abandoned run is to be rerun: compare-and-set on the job's row, whose list
    /// loses the due. The row's claim follows only when it is that due's (a later due may have
    /// been claimed meanwhile).
    pub(super) fn claim_rerun(&self) -> String {
        let jobs = &self.jobs;
        let no_other_run = self.no_other_run();
        format!(
            "UPDATE {jobs} AS j SET rerun_dues = array_remove(j.rerun_dues, $3), \
             claimed_by = CASE WHEN {its} THEN $4 ELSE j.claimed_by END, \
             claimed_term = CASE WHEN {its} THEN $5 ELSE j.claimed_term END, \
             claimed_epoch = CASE WHEN {its} THEN $6 ELSE j.claimed_epoch END, \
             started_at = CASE WHEN {its} THEN clock_timestamp() ELSE j.started_at END, \
             finished_at = CASE WHEN {its} THEN NULL ELSE j.finished_at END, \
             outcome = CASE WHEN {its} THEN 'running' ELSE j.outcome END, \
             error = CASE WHEN {its} THEN NULL ELSE j.error END \
             WHERE {KEY} AND $3 = ANY(j.rerun_dues) AND {no_other_run} \
             RETURNING 1",
            its = "j.last_due = $3",
        )
    }

    /// A trigger asked for. $3, $4 and $6 are unused: every claim binds the same parameters.
    pub(super) fn claim_trigger(&self) -> String {
        let jobs = &self.jobs;
        let no_other_run = self.no_other_run();
        format!(
            "UPDATE {jobs} SET trigger_requested = NULL \
             WHERE {KEY} AND trigger_requested IS NOT NULL AND {no_other_run} RETURNING 1"
        )
    }

    /// A claimed run's row. The attempt is one more than the due's earlier ones (a rerun of a
    /// rerun).
    pub(super) fn insert_run(&self) -> String {
        let runs = &self.runs;
        format!(
            "INSERT INTO {runs} (namespace, job, due, attempt, kind, claimed_by, claimed_term, \
             epoch, started_at, heartbeat_at, heartbeat_period, outcome) \
             SELECT $1, $2, $3, (SELECT coalesce(max(attempt), 0) + 1 FROM {runs} \
                                 WHERE namespace = $1 AND job = $2 AND due = $3), \
                    $4, $5, $6, $7, clock_timestamp(), clock_timestamp(), \
                    make_interval(secs => $8), 'running' \
             RETURNING attempt, pg_current_xact_id()::text"
        )
    }

    /// Whether a claim whose COMMIT got no answer was committed: the run's row is there (then
    /// it is visible: committed, and any synchronous standby has it), or the claim's
    /// transaction ($6) aborted; anything else is not settled yet.
    pub(super) fn claim_status(&self) -> String {
        let runs = &self.runs;
        format!(
            "SELECT pg_xact_status($6::text::xid8)::text, EXISTS (SELECT 1 FROM {runs} \
             WHERE {KEY} AND due = $3 AND attempt = $4 AND claimed_term = $5)"
        )
    }

    /// One statement for both rows: the job's row never says `running` for a run whose own
    /// row has ended. Only a `running` record is ended: one that another term called
    /// abandoned stays so. Answers whether it ended it, and the run's outcome in the
    /// statement's snapshot (the statements of a `WITH` share one), which is this runner's own
    /// outcome when an earlier try of the same record committed but lost its answer.
    pub(super) fn finish(&self) -> String {
        let Self { jobs, runs, .. } = self;
        format!(
            "WITH r AS (UPDATE {runs} SET finished_at = clock_timestamp(), outcome = $5, \
               error = $6 WHERE {KEY} AND due = $3 AND attempt = $4 AND claimed_term = $7 \
               AND outcome = 'running' RETURNING 1), \
             j AS (UPDATE {jobs} SET finished_at = clock_timestamp(), outcome = $5, error = $6 \
               WHERE {KEY} AND last_due = $3 AND claimed_term = $7 AND outcome = 'running' \
               AND EXISTS (SELECT 1 FROM r)) \
             SELECT (SELECT count(*) FROM r), \
                    (SELECT outcome FROM {runs} WHERE {KEY} AND due = $3 AND attempt = $4 \
                     AND claimed_term = $7)"
        )
    }

    /// Dues that do not run: the job's row counts them as handled (compare-and-set on the
    /// `last_due` the plan was made from, $4, so that they are recorded once whoever else
    /// looks), and each stretch is a `skipped` row.
    pub(super) fn skip(&self) -> String {
        let Self { jobs, runs, .. } = self;
        let skipped_values = self.skipped_values();
        format!(
            "WITH j AS (UPDATE {jobs} SET last_due = $3 \
               WHERE {KEY} AND last_due = $4 AND last_due < $3 RETURNING 1) \
             INSERT INTO {runs} ({SKIPPED_COLUMNS}) \
             SELECT {skipped_values} \
             FROM j CROSS JOIN unnest($8::timestamptz[], $9::text[], $10::int8[]) \
               AS s(due, reason, dues)"
        )
    }

    /// The same rows, without moving the job's row (a halted job's dues). $3 and $4 are
    /// unused: both statements bind the same parameters.
    pub(super) fn record_skipped(&self) -> String {
        let runs = &self.runs;
        let skipped_values = self.skipped_values();
        format!(
            "INSERT INTO {runs} ({SKIPPED_COLUMNS}) \
             SELECT {skipped_values} \
             FROM unnest($8::timestamptz[], $9::text[], $10::int8[]) AS s(due, reason, dues)"
        )
    }

    /// A run asked for now.
    pub(super) fn trigger(&self) -> String {
        let jobs = &self.jobs;
        format!("UPDATE {jobs} SET trigger_requested = clock_timestamp() WHERE {KEY}")
    }

    /// A new schedule takes effect from its next due: not a catch-up on its past.
    pub(super) fn reschedule(&self) -> String {
        let jobs = &self.jobs;
        format!(
            "UPDATE {jobs} SET schedule = $3, last_due = greatest(last_due, clock_timestamp()) \
             WHERE {KEY}"
        )
    }
}
