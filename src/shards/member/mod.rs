//! The loop behind `Shards::run`: join the group with the same
//! try as a single elector's standby (its shared lock instead of the exclusive one, with the
//! same bounds, identity, read-replica and pooler checks), then serve as a member
//! ([`member`]) until the session is lost or shutdown comes.

use tokio::time::{MissedTickBehavior, interval};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::postgres::borrower::Borrower;
use crate::postgres::repeats::Repeats;
use crate::postgres::session::{Attempt, LockMode, SessionBounds, TryFor, try_acquire};
use crate::postgres::standby::report_try;
use crate::shards::group::Inner;

mod drains;
mod follow;
mod ledger;
mod marks;
mod serve;
mod sql;

use serve::{Member, Served};

/// The group's membership on PostgreSQL, until `shutdown`.
pub(crate) async fn run(inner: &Inner, shutdown: CancellationToken) -> Result<(), Error> {
    let Some(pg) = inner.member.pg() else {
        return Ok(());
    };
    let _slot = inner.member.shared.claim_run()?;
    let mut ticks = interval(pg.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let bounds = SessionBounds::for_interval(pg.interval);
    let mut borrower = Borrower::new(pg.pool.clone(), pg.interval);
    let mut repeats = Repeats::default();
    let mut complaints = Repeats::default();
    loop {
        let attempt = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            attempt = async {
                ticks.tick().await;
                let asked = TryFor {
                    key: pg.key,
                    mode: LockMode::Shared,
                    identity: &pg.identity,
                    bounds: &bounds,
                    interval: pg.interval,
                    defer_as: None,
                    candidates: &pg.candidates,
                };
                try_acquire(&mut borrower, &asked).await.attempt
            } => attempt,
        };
        let Ok(Attempt::Granted {
            session,
            sent_at,
            unbounded,
            ..
        }) = attempt
        else {
            report_try(pg.key, attempt, &mut repeats);
            continue;
        };
        repeats.clear();
        // A member tries again only after its session is lost: no borrow may hold a pool
        // connection meanwhile.
        borrower.let_go();
        if unbounded {
            inner.member.shared.warn_no_idle_session_timeout(pg.key);
        }
        let mut member = Member::join(inner, pg, session, sent_at, &mut complaints);
        match member.serve(&shutdown, &mut ticks).await {
            Served::Shutdown => return Ok(()),
            Served::Lost => continue,
        }
    }
}
