//! F2: the leader notices its lock connection closing within 100 ms, not at its next check.
//!
//! The interval is 5 s and each fault comes right after the grant, so the next leader check
//! is about 5 s away and the local lease (3·I) 15 s: only the closed-connection watch can
//! demote within the bound. The watch polls the client's closed flag every 20 ms; the tests
//! allow 100 ms plus 50 ms of slack for a loaded machine, and print what they measured.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use pg_elector::{LockKey, Term, TermEnd};
use pg_elector_testkit::server::ShutdownMode;

/// Long enough that no leader check or lease expiry can come into it.
const LONG: Duration = Duration::from_secs(5);
/// F2's bound plus slack for a loaded 2-core machine.
const BOUND: Duration = Duration::from_millis(150);

/// A replica that leads, and its term. Its next leader check is one `LONG` away.
async fn leading(pool: deadpool_postgres::Pool, key: LockKey) -> (Replica, Term, Instant) {
    let replica = Replica::start(pool, key, LONG);
    wait_for(LONG, || replica.elector.is_leader())
        .await
        .expect("the only replica leads at its first try");
    let term = replica.elector.term();
    (replica, term, Instant::now())
}

/// Waits for the term to end; returns when it ended. Panics after `LONG / 2`, well before
/// a leader check could end it.
async fn demotion(term: &Term) -> Instant {
    tokio::time::timeout(LONG / 2, term.cancelled())
        .await
        .expect("the leader demotes without waiting for its next check");
    Instant::now()
}

/// Terminates the lock session of `key`'s holder over `admin`, as an operator would; returns
/// the terminated backend's pid and when the terminate was sent.
async fn terminate_lock_session(admin: &tokio_postgres::Client, key: LockKey) -> (i32, Instant) {
    let pid = holders(admin, key).await[0];
    let terminated = Instant::now();
    let ok: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(ok);
    (pid, terminated)
}

fn assert_fast(what: &str, took: Duration, replica: &Replica, term: &Term, granted: Instant) {
    eprintln!("F2 {what}: the leader demoted {took:?} after the connection closed");
    assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
    assert!(!replica.elector.is_leader());
    assert!(
        granted.elapsed() < LONG,
        "the test ran into the next leader check; it proves nothing"
    );
    assert!(
        took <= BOUND,
        "{what}: demoted {took:?} after the connection closed; F2 bound 100 ms (+50 ms slack)"
    );
}

mod f2 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_lock_session_demotes_the_leader_within_100_ms() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf2, 1);
        let (a, term, granted) = leading(db.pool(2), key).await;
        let admin = db.connect().await.unwrap();
        let (_, terminated) = terminate_lock_session(&admin, key).await;
        let took = demotion(&term).await - terminated;
        assert_fast("pg_terminate_backend", took, &a, &term, granted);
        a.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reset_lock_connection_demotes_the_leader_within_100_ms() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        let (a, term, granted) = leading(db.pool_via(proxy.addr(), 2), LockKey::new(0xf2, 2)).await;

        let reset = Instant::now();
        proxy.reset();
        let took = demotion(&term).await - reset;
        assert_fast("TCP RST", took, &a, &term, granted);
        a.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fast_server_restart_demotes_the_leader_within_100_ms() {
        let _timing = timing();
        let (server, db) = private_server().await;
        let (a, term, granted) = leading(db.pool(2), LockKey::new(0xf2, 3)).await;
        // An observer connection: its task ends the moment the server closes it.
        let (observer, connection) = db.config().connect(tokio_postgres::NoTls).await.unwrap();
        let closed = tokio::spawn(async move {
            let _ = connection.await;
            Instant::now()
        });

        let restart = tokio::task::spawn_blocking({
            let server = server.clone();
            move || server.restart(ShutdownMode::Fast)
        });
        let demoted = demotion(&term).await;
        let closed = closed.await.unwrap();
        let took = demoted.saturating_duration_since(closed);
        assert_fast("fast server restart", took, &a, &term, granted);
        restart.await.unwrap().unwrap();
        a.stop().await.unwrap();
        drop(observer);
        drop(db);
    }

    /// Found by the chaos soak: a lone fast-takeover leader whose lock session is terminated
    /// takes the lock again within milliseconds, since nobody else waits for it. That is a new
    /// term, not the old one going on: the old term ends first (its token cancelled, lost as a
    /// closed connection), the new one has a later epoch, the leadership watch counts a demotion
    /// and a promotion, and the old term's fenced writes are refused. A loop that only polls
    /// `is_leader()` can miss the gap between the two; the term and the watch cannot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_terminated_leader_leads_again_only_in_a_new_term() {
        use pg_elector::{Elector, LossCause};

        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf2, 4);
        let elector = Elector::builder(db.pool(2), key)
            .check_interval(LONG)
            .fast_takeover(true)
            .fencing(true)
            .build()
            .unwrap();
        let mut leadership = elector.subscribe();
        let replica = Replica::run(elector);
        let old = tokio::time::timeout(LONG, replica.elector.wait_for_leadership())
            .await
            .expect("the only replica leads at its first try");
        let granted = Instant::now();
        let old_epoch = old.epoch().expect("fencing gives each term an epoch");
        let admin = db.connect().await.unwrap();
        let (pid, terminated) = terminate_lock_session(&admin, key).await;
        let ended = demotion(&old).await;
        assert_eq!(old.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(old.loss_cause(), Some(LossCause::ConnectionClosed));
        let new = tokio::time::timeout(LONG / 2, replica.elector.wait_for_leadership())
            .await
            .expect("nobody else waits: it takes the lock again, before its next check");
        let again = Instant::now();
        eprintln!(
            "F2 lone leader: old term ended {:?} and a new one began {:?} after the terminate",
            ended - terminated,
            again - terminated
        );
        assert!(
            granted.elapsed() < LONG,
            "the test ran into the next leader check; it proves nothing"
        );
        assert!(
            ended - terminated <= BOUND,
            "demoted {:?}",
            ended - terminated
        );
        assert!(
            new.is_leader() && new.end().is_none(),
            "the new term is live"
        );
        let new_epoch = new.epoch().expect("an epoch");
        assert!(new_epoch > old_epoch, "epoch {new_epoch} after {old_epoch}");
        let now = leadership.borrow_and_update().clone();
        assert!(now.is_leader && now.epoch == Some(new_epoch), "{now:?}");
        assert_eq!(now.changes, 3, "promoted, demoted, promoted: {now:?}");
        // The new lock session is another backend.
        assert_ne!(holders(&admin, key).await, vec![pid]);

        // A write fenced with the old term is refused; one with the new term passes.
        let mut client = db.connect().await.unwrap();
        let tx = client.transaction().await.unwrap();
        old.fence(&tx).await.expect_err("the old term is over");
        drop(tx);
        let tx = client.transaction().await.unwrap();
        new.fence(&tx).await.expect("the new term's fence passes");
        tx.commit().await.unwrap();
        replica.stop().await.unwrap();
    }
}
