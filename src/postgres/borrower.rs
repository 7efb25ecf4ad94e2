//! A standby's way to the pool: one borrow at a time, kept across tries while it is under way,
//! and started again when it has been under way for longer than any live connect takes, each
//! time given twice as long as the one before.

use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio::time::{Instant, timeout};
use tokio_util::task::AbortOnDropHandle;

use super::prepared::Prepared;
use super::session_error::SessionError;

/// How long a borrow may be under way before it is taken for stuck, at the least: longer than
/// PostgreSQL's default `authentication_timeout` (60 s), after which a live server ends any
/// connection that has not finished its start-up. A connect still under way past it is held
/// by a server that accepts TCP but never answers (a stopped process behind a live kernel).
const STUCK_FLOOR: Duration = Duration::from_secs(75);

/// How long a standby's first borrow may be under way before it is taken for stuck, for a
/// standby trying every `interval`: ten intervals, at least [`STUCK_FLOOR`].
pub(super) fn stuck_after(interval: Duration) -> Duration {
    interval.saturating_mul(10).max(STUCK_FLOOR)
}

/// How many times longer than the first a borrow may be under way, at the most, once borrows
/// have been started again in a row: 16, so that with the first limit at 75 s a connect that
/// must first wait out the SYN timeout of up to nine hosts that drop SYNs (Linux's is about
/// 127 s each) still gets through, while a server that accepts TCP and never answers holds a
/// standby at most 20 minutes after its address has moved on.
const MAX_GROWTH: u32 = 16;

/// A standby's way to the pool. A borrow that is still under way when the standby stops
/// waiting (a slow connect, a full pool) goes on in the background and is picked up by the
/// next try, so a connect slower than I is finished rather than abandoned and started again
/// every I. A borrow under way for longer than its limit ([`stuck_after`] at first) is
/// dropped and started again, with a WARN: tokio-postgres's `connect_timeout` bounds only the
/// TCP connect, so a connect to a server that accepts it and never answers would otherwise
/// hold every later try, even once the address has moved to a live server.
///
/// Each borrow started again gets twice the limit of the one before (at most [`MAX_GROWTH`]
/// times the first), back to the first once a borrow gets a connection. A restart alone would
/// never get past a first host that drops SYNs in a multi-host URL without `connect_timeout`:
/// the connect waits out the kernel's SYN timeout there (about 127 s on Linux) before it tries
/// the next host, and a limit shorter than that starts it again at the first host, forever.
/// With the limit doubling, when the connect past the dead hosts takes `C` (no more than the
/// largest limit), a borrow gets its connection within `C` when `C` is under the first limit,
/// and within `3·C` otherwise: the limits before the first one long enough add up to less than
/// it, which is less than `2·C`. A borrow is taken for stuck only at a try, up to I late, and
/// at most four are in a row: hence the `3·C + 6·I` the docs state for a leader.
///
/// When no next try comes soon (the standby leads, or cools down after a resign),
/// [`let_go`](Self::let_go) gives that connection back. Dropping the borrower cancels a borrow
/// still under way.
pub(crate) struct Borrower {
    pool: Pool,
    /// The first limit, and the one after a borrow that got a connection.
    first_limit: Duration,
    /// How long the borrow under way (or the next one) may be under way.
    limit: Duration,
    pending: Option<Pending>,
    /// Whether the try (and the check of a lock session it is granted) goes as a statement
    /// prepared once per connection (see [`Prepared`]).
    pub(super) prepared: Prepared,
}

/// A borrow under way, and when it began.
struct Pending {
    since: Instant,
    borrow: AbortOnDropHandle<Result<Object, PoolError>>,
}

impl Borrower {
    /// A borrower for a standby trying every `interval`.
    pub(crate) fn new(pool: Pool, interval: Duration) -> Self {
        Self::stuck_after(pool, stuck_after(interval))
    }

    /// A borrower that starts a borrow again once it has been under way for `stuck_after`
    /// (twice that for the next one, and so on).
    pub(super) fn stuck_after(pool: Pool, stuck_after: Duration) -> Self {
        Self {
            pool,
            first_limit: stuck_after,
            limit: stuck_after,
            pending: None,
            prepared: Prepared::new(Some(false)),
        }
    }

    /// How long `pending` has been under way, when that is its limit or more and it has not
    /// finished.
    fn stuck(&self, pending: &Pending) -> Option<Duration> {
        let under_way = pending.since.elapsed();
        (under_way >= self.limit && !pending.borrow.is_finished()).then_some(under_way)
    }

    /// The limit of the borrow started after one under way for `limit` was taken for stuck.
    fn next_limit(&self) -> Duration {
        self.limit
            .saturating_mul(2)
            .min(self.first_limit.saturating_mul(MAX_GROWTH))
    }

    /// Drops a borrow still under way, or finished and not yet picked up, so that its
    /// connection goes back to the pool: called when this standby stops trying for a while (it
    /// leads, or a resign's cooldown holds), which must not keep a connection of the pool.
    pub(crate) fn let_go(&mut self) {
        self.pending = None;
    }

    /// A pool connection, waiting at most `wait`.
    ///
    /// Cancel safe: a borrow under way when the future is dropped is kept for the next call.
    pub(super) async fn get(&mut self, wait: Duration) -> Result<Object, SessionError> {
        if let Some(under_way) = self.pending.as_ref().and_then(|p| self.stuck(p)) {
            let next = self.next_limit();
            let grows = if next > self.limit {
                "which may take twice as long"
            } else {
                "with the same limit (the longest a borrow may run)"
            };
            self.limit = next;
            tracing::warn!(
                ?under_way,
                next_limit = ?self.limit,
                "a pool connection has been under way for longer than any live server takes to \
                 accept one (a server that accepts TCP connections but does not answer, such as \
                 a stopped PostgreSQL process, or a first host of the URL that drops SYNs and no \
                 connect_timeout): starting a new one, {grows}"
            );
            self.pending = None;
        }
        let pending = self.pending.get_or_insert_with(|| {
            let pool = self.pool.clone();
            Pending {
                since: Instant::now(),
                borrow: AbortOnDropHandle::new(tokio::spawn(async move { pool.get().await })),
            }
        });
        let joined = timeout(wait, &mut pending.borrow)
            .await
            .map_err(|_| SessionError::PoolTimeout(wait))?;
        self.pending = None;
        match joined {
            Ok(Ok(object)) => {
                self.limit = self.first_limit;
                Ok(object)
            }
            Ok(Err(e)) => Err(SessionError::Pool(e)),
            // A panic in the pool (a hook of the application's) unwinds through `run`, as it
            // would have had the borrow run in place.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(SessionError::BorrowCancelled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_elector_testkit::replicas::timing;
    use pg_elector_testkit::{FaultProxy, PgServer};
    use tokio::net::TcpListener;

    #[test]
    fn a_borrow_is_taken_for_stuck_only_past_the_servers_start_up_bound() {
        assert_eq!(stuck_after(Duration::from_millis(200)), STUCK_FLOOR);
        assert_eq!(stuck_after(Duration::from_secs(5)), STUCK_FLOOR);
        assert_eq!(
            stuck_after(Duration::from_secs(60)),
            Duration::from_secs(600)
        );
        assert_eq!(stuck_after(Duration::MAX), Duration::MAX);
    }

    /// An address that accepts TCP connections and never answers (a stopped PostgreSQL
    /// process: its kernel still completes the handshake), re-pointed after a while at a live
    /// server, as a virtual IP is after a failover. The borrow under way to the silent address
    /// held every later try for good, even once the address had moved. Now it is kept across
    /// tries until it has been under way for `stuck_after`, then started again, and that one
    /// reaches the live server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_borrow_stuck_on_a_silent_server_is_started_again() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap();
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        let proxy = FaultProxy::start(silent_addr).await.unwrap();
        let stuck = Duration::from_secs(1);
        let mut borrower = Borrower::stuck_after(db.pool_via(proxy.addr(), 1), stuck);
        let wait = Duration::from_millis(200);

        let started = Instant::now();
        while started.elapsed() < stuck / 2 {
            let got = borrower.get(wait).await;
            assert!(matches!(got, Err(SessionError::PoolTimeout(_))), "{got:?}");
        }
        proxy.retarget(server.addr());
        assert_eq!(
            proxy.accepted(),
            1,
            "one borrow under way, kept across tries"
        );
        let got = loop {
            match borrower.get(wait).await {
                Err(SessionError::PoolTimeout(_)) if started.elapsed() < 4 * stuck => continue,
                other => break other,
            }
        };
        let took = started.elapsed();
        let client = got.unwrap_or_else(|e| panic!("no connection after {took:?}: {e}"));
        client.simple_query("SELECT 1").await.unwrap();
        assert!(
            took >= stuck,
            "started again after {took:?}, before {stuck:?}"
        );
        assert_eq!(proxy.accepted(), 2, "started again once");
    }
}
