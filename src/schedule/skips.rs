//! Dues that do not run: recorded as `skipped` rows in a fenced transaction, and counted.

use std::sync::Arc;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use super::context::{Context, count_skipped};
use super::due::Taken;
use super::{Registered, ScheduleError, SkipReason, plan};

/// Records `skipped` (dues of a pass that do not run) as `skipped` rows, and the job's row as
/// handled up to `through`, in a fenced transaction on the leader, and counts them; `NotOurs`
/// when another replica (or this one, earlier) moved the job's row on since `last` was read.
pub(super) async fn skip_dues(
    ctx: &Context,
    registered: &Registered,
    last: Timestamp,
    through: Timestamp,
    skipped: &[plan::Skipped],
    term_id: &str,
) -> Taken {
    let name = registered.job.name.as_str();
    let label: Arc<str> = name.into();
    let work = ctx.elector.do_work_named(&label, |term| async move {
        let who = ctx.claimant(&term, term_id);
        ctx.query(async |client| {
            let tx = client.transaction().await?;
            if term.epoch().is_some() {
                term.fence(&tx).await.map_err(ScheduleError::Fence)?;
            }
            let recorded = ctx
                .store
                .skip(&tx, &ctx.namespace, name, (last, through), skipped, &who)
                .await?;
            tx.commit().await?;
            Ok(recorded)
        })
        .await
    });
    match work.await {
        Ok(Some(true)) => {
            ctx.moved_row(name, through);
            for stretch in skipped {
                tracing::info!(
                    job = name,
                    reason = %stretch.reason,
                    dues = stretch.dues,
                    latest = %stretch.latest,
                    "skipping missed dues"
                );
                count_skipped(ctx, registered, stretch.reason, stretch.dues);
            }
            Taken::Ran
        }
        Ok(Some(false) | None) => Taken::NotOurs,
        Err(ScheduleError::Fence(fenced)) if !fenced.is_query_error() => Taken::NotOurs,
        Err(e) => {
            tracing::warn!(job = name, error = %e, "cannot skip the missed dues");
            Taken::Failed
        }
    }
}

/// A job halted in this process: while this replica leads, every poll, the dues that passed
/// (and will not run) are recorded as `skipped` rows and counted, until the term ends.
pub(super) async fn count_halted(
    ctx: &Context,
    registered: &Registered,
    term_id: &str,
    stop: &CancellationToken,
) {
    let name = registered.job.name.as_str();
    let label: Arc<str> = name.into();
    let mut counted_until = Timestamp::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(ctx.poll) => {}
        }
        let now = Timestamp::now();
        let spec = &registered.job.spec;
        let dues = spec.count_between(counted_until, now);
        let Some(latest) = spec.previous(now, true).filter(|_| dues > 0) else {
            continue;
        };
        let stretch = plan::Skipped {
            reason: SkipReason::Halted,
            latest,
            dues,
        };
        let work = ctx.elector.do_work_named(&label, |term| async move {
            let who = ctx.claimant(&term, term_id);
            ctx.query(async |client| {
                ctx.store
                    .record_skipped(client, &ctx.namespace, name, &[stretch], &who)
                    .await
            })
            .await
        });
        match work.await {
            Ok(Some(())) => {
                count_skipped(ctx, registered, SkipReason::Halted, dues);
                counted_until = latest;
            }
            // Not leading: no due of it was this replica's to run.
            Ok(None) => counted_until = latest,
            Err(e) => {
                tracing::debug!(job = name, error = %e, "cannot record the halted job's dues; retrying")
            }
        }
    }
}
