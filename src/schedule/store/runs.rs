//! The statements of a run's life, as [`Store`] methods: the runs an earlier term left going
//! called abandoned, the claim of a due (and its read-back), the heartbeat, the end, and the
//! dues that do not run.

use jiff::Timestamp;
use tokio_postgres::types::Type;

use tokio_postgres::types::ToSql;

use super::{Abandoned, ClaimStatus, Claimant, Claimed, Outcome, RunRef, Store};
use crate::schedule::plan::Skipped;
use crate::schedule::{RunKind, ScheduleError};

impl Store {
    /// Marks the runs of this job that other terms left `running` as abandoned when their
    /// runner is known to be gone: its term is one of `ended` (terms of this process that are
    /// over), or it has been silent for three of the heartbeat periods it promised (at least
    /// 3 s; `fallback` is the period of a run an earlier version claimed, which promised
    /// none). With `rerun`, the job's row keeps their dues to rerun (a triggered run's never).
    /// Returns them, oldest first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn abandon(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        term_id: &str,
        ended: &[String],
        fallback: std::time::Duration,
        rerun: bool,
        who: &Claimant<'_>,
    ) -> Result<Vec<Abandoned>, ScheduleError> {
        let epoch = who.epoch.map(|e| e as i64);
        let rows = client
            .query_typed(
                &self.abandon,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&term_id, Type::TEXT),
                    (&ended, Type::TEXT_ARRAY),
                    (&fallback.as_secs_f64(), Type::FLOAT8),
                    (&rerun, Type::BOOL),
                    (&who.identity, Type::TEXT),
                    (&epoch, Type::INT8),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let attempt: i32 = row.try_get(1)?;
                Ok(Abandoned {
                    due: row.try_get(0)?,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    kind: row.try_get(2)?,
                    claimed_by: row.try_get(3)?,
                    rerun: row.try_get(4)?,
                })
            })
            .collect()
    }

    /// Says that a run is still going; `false` when its record (its term's) is not `running`
    /// any more: another term called it abandoned, or the row is gone (a failover that lost
    /// the claim, even if another term has claimed the same due and attempt again since).
    pub(crate) async fn heartbeat(
        &self,
        client: &tokio_postgres::Client,
        run: RunRef<'_>,
    ) -> Result<bool, ScheduleError> {
        let attempt = run.attempt as i32;
        let params = [run.params(&attempt).as_slice(), &[(&run.term, Type::TEXT)]].concat();
        let beats = client.execute_typed(&self.heartbeat, &params).await?;
        Ok(beats > 0)
    }

    /// Waits until everything this connection committed before is on the synchronous
    /// standby, when one is configured ([`CONFIRM`](super::CONFIRM)).
    pub(crate) async fn confirm(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<(), ScheduleError> {
        client.execute_typed(super::CONFIRM, &[]).await?;
        Ok(())
    }

    /// Claims one run in `tx` (compare-and-set on the job's row) and returns its attempt
    /// number and the transaction's id; `None` when someone else claimed it first (or it is no
    /// longer due).
    pub(crate) async fn claim(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        namespace: &str,
        job: &str,
        due: Timestamp,
        kind: RunKind,
        who: &Claimant<'_>,
    ) -> Result<Option<Claimed>, ScheduleError> {
        let epoch = who.epoch.map(|e| e as i64);
        let statement = match kind {
            RunKind::Triggered => &self.claim_trigger,
            RunKind::Rerun => &self.claim_rerun,
            RunKind::Scheduled => &self.claim_due,
        };
        let claimed = tx
            .query_typed(
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
            .await?;
        if claimed.is_empty() {
            return Ok(None);
        }
        let rows = tx
            .query_typed(
                &self.insert_run,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&due, Type::TIMESTAMPTZ),
                    (&kind.label(), Type::TEXT),
                    (&who.identity, Type::TEXT),
                    (&who.term_id, Type::TEXT),
                    (&epoch, Type::INT8),
                    (&who.heartbeat.as_secs_f64(), Type::FLOAT8),
                ],
            )
            .await?;
        // One row, always (INSERT … SELECT without FROM); none would leave the claim to roll
        // back with the transaction.
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let attempt: i32 = row.try_get(0)?;
        Ok(Some(Claimed {
            attempt: u32::try_from(attempt).unwrap_or(1),
            xid: row.try_get(1)?,
        }))
    }

    /// Reads back a claim of this term whose COMMIT got no answer; `run.attempt` is the
    /// claim's.
    pub(crate) async fn claim_status(
        &self,
        client: &tokio_postgres::Client,
        run: RunRef<'_>,
        xid: &str,
    ) -> Result<ClaimStatus, ScheduleError> {
        let attempt = run.attempt as i32;
        let params = [
            run.params(&attempt).as_slice(),
            &[(&run.term, Type::TEXT), (&xid, Type::TEXT)],
        ]
        .concat();
        let row = client.query_typed(&self.claim_status, &params).await?;
        // One row, always (a SELECT without FROM).
        let Some(row) = row.first() else {
            return Ok(ClaimStatus::Unsettled);
        };
        let status: Option<String> = row.try_get(0)?;
        let there: bool = row.try_get(1)?;
        Ok(match (there, status.as_deref()) {
            (true, _) => ClaimStatus::Committed,
            // Aborted, or too old for the server to say (long gone, and not there).
            (false, Some("aborted") | None) => ClaimStatus::Aborted,
            (false, _) => ClaimStatus::Unsettled,
        })
    }

    /// Records how a run ended; `false` when another term had called it abandoned (its record
    /// stays so) or the record is gone (another term's claim of the same due and attempt is
    /// not this run's record).
    pub(crate) async fn finish(
        &self,
        client: &tokio_postgres::Client,
        run: RunRef<'_>,
        outcome: Outcome,
        error: Option<&str>,
    ) -> Result<bool, ScheduleError> {
        let attempt = run.attempt as i32;
        let outcome = outcome.as_str();
        let params = [
            run.params(&attempt).as_slice(),
            &[
                (&outcome, Type::TEXT),
                (&error, Type::TEXT),
                (&run.term, Type::TEXT),
            ],
        ]
        .concat();
        let row = client.query_typed(&self.finish, &params).await?;
        let (ended, before): (i64, Option<String>) = match row.first() {
            Some(row) => (row.try_get(0)?, row.try_get(1)?),
            None => (0, None),
        };
        // Not ended now, and not by an earlier try of this runner (which would read `failed`
        // or `succeeded`): abandoned by another term, now or before, or gone.
        Ok(ended > 0 || before.is_some_and(|b| b != "running" && b != Outcome::Abandoned.as_str()))
    }

    /// Counts the dues after `last` up to `through` as handled without running them, and
    /// records each stretch of `skipped` as a `skipped` row, in `tx`; `false` when the job's
    /// row no longer holds `last` (someone else moved it on: nothing recorded).
    pub(crate) async fn skip(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        namespace: &str,
        job: &str,
        (last, through): (Timestamp, Timestamp),
        skipped: &[Skipped],
        who: &Claimant<'_>,
    ) -> Result<bool, ScheduleError> {
        let n = self
            .write_skipped(
                tx,
                &self.skip,
                namespace,
                job,
                Some((through, last)),
                skipped,
                who,
            )
            .await?;
        Ok(n > 0)
    }

    /// Records `skipped` as `skipped` rows, without moving the job's row on.
    pub(crate) async fn record_skipped(
        &self,
        client: &tokio_postgres::Client,
        namespace: &str,
        job: &str,
        skipped: &[Skipped],
        who: &Claimant<'_>,
    ) -> Result<(), ScheduleError> {
        self.write_skipped(
            client,
            &self.record_skipped,
            namespace,
            job,
            None,
            skipped,
            who,
        )
        .await?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_skipped(
        &self,
        client: &impl tokio_postgres::GenericClient,
        statement: &str,
        namespace: &str,
        job: &str,
        through_and_last: Option<(Timestamp, Timestamp)>,
        skipped: &[Skipped],
        who: &Claimant<'_>,
    ) -> Result<u64, ScheduleError> {
        let epoch = who.epoch.map(|e| e as i64);
        let (through, last) = through_and_last.unzip();
        let dues: Vec<Timestamp> = skipped.iter().map(|s| s.latest).collect();
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        let counts: Vec<i64> = skipped
            .iter()
            .map(|s| i64::try_from(s.dues).unwrap_or(i64::MAX))
            .collect();
        Ok(client
            .execute_typed(
                statement,
                &[
                    (&namespace, Type::TEXT),
                    (&job, Type::TEXT),
                    (&through, Type::TIMESTAMPTZ),
                    (&last, Type::TIMESTAMPTZ),
                    (&who.identity, Type::TEXT),
                    (&who.term_id, Type::TEXT),
                    (&epoch, Type::INT8),
                    (&dues, Type::TIMESTAMPTZ_ARRAY),
                    (&reasons, Type::TEXT_ARRAY),
                    (&counts, Type::INT8_ARRAY),
                ],
            )
            .await?)
    }
}

impl RunRef<'_> {
    /// The run's parameters `$1`..`$4` (namespace, job, due, attempt); `attempt` is
    /// `self.attempt` as the column's type, which the caller keeps alive.
    fn params<'p>(&'p self, attempt: &'p i32) -> [(&'p (dyn ToSql + Sync), Type); 4] {
        [
            (&self.namespace, Type::TEXT),
            (&self.job, Type::TEXT),
            (&self.due, Type::TIMESTAMPTZ),
            (attempt, Type::INT4),
        ]
    }
}
