//! E5 and E13: the leader check, and the bound on an orphaned lock session.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use pg_elector::{LockKey, TermEnd};

mod e5 {
    use super::*;

    /// A terminated lock session demotes the leader within two intervals, and another leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_session_demotes_within_two_intervals() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(5, 1);
        let (a, a_metrics) = replica_with_gauge(db.pool(2), key);
        wait_a_leads(&a).await;
        let (b, _) = replica_with_gauge(db.pool(2), key);
        let term = a.elector.term();
        assert_eq!(gauge(&a_metrics, "pg_elector_leader"), Some(1));

        let admin = db.connect().await.unwrap();
        let pid = holders(&admin, key).await[0];
        let killed = Instant::now();
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();

        let demoted = wait_for(2 * I + I / 2, || !a.elector.is_leader())
            .await
            .expect("demoted within 2·I");
        assert_eq!(term_end(&term).await, Some(TermEnd::LeadershipLost));
        assert!(term.token().is_cancelled());
        assert_eq!(gauge(&a_metrics, "pg_elector_leader"), Some(0));
        wait_for(2 * I, || a.elector.is_leader() || b.elector.is_leader())
            .await
            .expect("another term starts within one I of the demotion, plus slack");
        eprintln!(
            "terminate: demoted after {demoted:?}, new leader {:?} after the kill",
            killed.elapsed()
        );
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }

    /// A blackholed leader demotes within two intervals, and another leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blackholed_leader_demotes_within_two_intervals() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(5, 2);
        let proxy = shared_server_proxy().await;
        let (a, a_metrics) = replica_with_gauge(db.pool_via(proxy.addr(), 2), key);
        wait_a_leads(&a).await;
        let (b, _) = replica_with_gauge(db.pool(2), key);
        let term = a.elector.term();

        let cut = Instant::now();
        proxy.blackhole();
        let demoted = wait_for(2 * I + I / 2, || !a.elector.is_leader())
            .await
            .expect("demoted within 2·I: the check is bounded by I");
        assert_eq!(term_end(&term).await, Some(TermEnd::LeadershipLost));
        assert_eq!(gauge(&a_metrics, "pg_elector_leader"), Some(0));
        if !has_idle_session_timeout(&db).await {
            tokio::time::sleep(6 * I).await;
            assert!(!b.elector.is_leader() && !a.elector.is_leader());
            return;
        }
        // The server frees the lock once the session has been silent for 4·I (E13).
        wait_for(5 * I + I / 2, || b.elector.is_leader())
            .await
            .expect("the standby leads within 5·I of the partition");
        eprintln!(
            "blackhole: demoted after {demoted:?}, new leader after {:?}",
            cut.elapsed()
        );
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }
}

/// The server ends a silent lock session after four intervals, and never do two replicas lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e13_a_silent_session_ends_after_four_intervals() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(13, 1);
    let proxy = shared_server_proxy().await;
    let a = Replica::start(db.pool_via(proxy.addr(), 2), key, I);
    wait_a_leads(&a).await;
    let b = Replica::start(db.pool(2), key, I);
    let admin = db.connect().await.unwrap();
    assert_eq!(holders(&admin, key).await.len(), 1);
    tokio::time::sleep(I + I / 2).await; // at least one leader check has run

    let cut = Instant::now();
    proxy.blackhole();
    if !has_idle_session_timeout(&db).await {
        wait_for(2 * I + I / 2, || !a.elector.is_leader())
            .await
            .expect("demoted within 2·I");
        tokio::time::sleep(6 * I).await;
        assert_eq!(
            holders(&admin, key).await.len(),
            1,
            "the silent session keeps the lock"
        );
        assert!(!b.elector.is_leader() && !a.elector.is_leader());
        return;
    }
    // Sample both replicas every 2 ms until the standby leads: never both at once.
    let mut both = 0;
    let mut freed = None;
    while !b.elector.is_leader() {
        if a.elector.is_leader() && b.elector.is_leader() {
            both += 1;
        }
        if freed.is_none() && holders(&admin, key).await.is_empty() {
            freed = Some(cut.elapsed());
        }
        assert!(cut.elapsed() < 6 * I, "no takeover within 6·I");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took_over = cut.elapsed();
    assert_eq!(both, 0, "an instant with two leaders");
    assert!(!a.elector.is_leader());
    // The lock came free from the server's idle_session_timeout (4·I after the last check
    // that reached it, which ran at most one I before the cut), not from a closed socket.
    let freed = freed.unwrap_or(took_over);
    assert!(
        freed > 3 * I && freed <= 4 * I + I / 2,
        "the lock came free {freed:?} after the cut; idle_session_timeout is 4·I = {:?}",
        4 * I
    );
    eprintln!("orphaned session: lock free after {freed:?}, new leader after {took_over:?}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
