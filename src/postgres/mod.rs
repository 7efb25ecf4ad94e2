//! Everything PostgreSQL-specific. The election loop behind [`Elector::run`](crate::Elector::run)
//! is here, short: a standby waits for a grant ([`standby`]), a term is started on it
//! ([`begin`]), led ([`lead`]) and given back ([`give_back`]). The SQL of the lock session is
//! in [`session`], fast takeover's waiting session in [`waiter`], the graceful unlock's marker
//! in [`handover`], the epoch table in [`fence`].

use std::time::Duration;

use tokio::time::{MissedTickBehavior, interval};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::Error;
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};
use begin::{Start, start_term};
use borrower::Borrower;
use repeats::Repeats;
use session::{LockSession, SessionBounds};
use settings::PgSettings;
use standby::Standby;

mod begin;
mod borrower;
pub(crate) mod fence;
mod give_back;
mod handover;
pub(crate) mod ident;
mod lead;
mod leader;
mod lock_table;
mod loss;
mod repeats;
mod session;
mod session_error;
pub(crate) mod settings;
pub(crate) mod shards;
mod standby;
mod waiter;

pub(crate) use leader::leader_via;
pub use leader::{LeaderInfo, current_leader};

pub(crate) use fence::{DEFAULT_TABLE as DEFAULT_FENCING_TABLE, FenceTable};

/// The election on PostgreSQL, until `shutdown`: standby, start a term, lead, give back.
pub(crate) async fn run(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let _slot = shared.claim_run()?;
    let mut ticks = interval(pg.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut resigns = shared.resign.subscribe();
    resigns.borrow_and_update();
    let mut standby = Standby {
        shared,
        pg,
        bounds: SessionBounds::for_interval(pg.interval),
        shutdown: &shutdown,
        borrower: Borrower::new(pg.pool.clone(), pg.interval),
    };
    let mut repeats = Repeats::default();
    let mut held = Held {
        shared,
        pg,
        session: None,
    };
    loop {
        let Some(grant) = standby.wait_for_grant(&mut ticks, &mut resigns).await else {
            return Ok(());
        };
        let epoch = match start_term(shared, pg, &shutdown, grant, &mut held, &mut repeats).await {
            Start::Leading(epoch) => epoch,
            Start::GaveUp => continue,
            Start::Stopped => return Ok(()),
        };
        // One span per term, inside the election's: every line of the term carries its epoch.
        let term_span = tracing::info_span!("term", epoch);
        let led = lead::lead_term(
            shared,
            pg,
            &shutdown,
            &mut ticks,
            &mut resigns,
            &mut held,
            epoch,
        );
        match led.instrument(term_span).await {
            None => continue,
            Some(TermEnd::Shutdown) => return Ok(()),
            Some(_) => shared.resign_handled(),
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The local lease: the server cannot free the lock within 4·I of the last check's
/// send time; one I of that is kept as a margin.
fn lease_length(interval: Duration) -> Duration {
    3 * interval
}

/// The lock session of a running election. If `run` is dropped or unwinds while leading, the
/// session is closed without an unlock, since it may be mid-query.
struct Held<'a> {
    shared: &'a Shared,
    pg: &'a PgSettings,
    session: Option<Box<LockSession>>,
}

impl Held<'_> {
    /// Gives the lock back before a term began on it: unlocked, then closed.
    async fn give_back(&mut self) {
        if let Some(session) = self.session.take() {
            give_back::unlock(self.pg, session, false).await;
        }
    }

    /// Closes the session without an unlock (the server frees the lock with it).
    fn close(&mut self) {
        drop(self.session.take());
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared
                .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
            drop(session);
            tracing::warn!(key = %self.pg.key, "lock abandoned: run was dropped or panicked while leading; closing its session frees the lock");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::now_ms;
    use crate::{Elector, LockKey};
    use pg_elector_testkit::{FaultProxy, PgServer, serial};
    use tokio::time::Instant;

    /// A machine suspend moves the lease's clock (`CLOCK_BOOTTIME`) but not tokio's timers, so
    /// a check in flight across it would not time out for up to I. The test makes the lease
    /// run out while a check hangs in a partition, and wants the term over within the watch's
    /// poll, not at the check's timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_running_out_mid_check_ends_the_term_at_once() {
        let _serial = serial();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let interval = Duration::from_secs(1);
        let elector = Elector::builder(db.pool_via(proxy.addr(), 2), LockKey::new(10, 10))
            .check_interval(interval)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        // Promoted at t; the first check goes out at t + I and, in the partition, hangs until
        // its bound at t + 2·I.
        let term = elector.wait_for_leadership().await;
        tokio::time::sleep(interval / 2).await;
        proxy.blackhole();
        tokio::time::sleep(interval).await;
        assert!(term.is_leader(), "the check is still in flight");
        let expired = Instant::now();
        elector.shared.lease().hold_until(now_ms());
        tokio::time::timeout(interval / 4, term.cancelled())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the token was still live {:?} after the lease ran out",
                    interval / 4
                )
            });
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        eprintln!(
            "token cancelled {:?} after the lease ran out mid-check",
            expired.elapsed()
        );
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }
}
