//! E9, E10, E11 and E12: terms, do_work, is_leader and the gauge.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use pg_elector::{Elector, LockKey, TermEnd};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

mod e9 {
    use super::*;

    /// Terms on a standby are born ended, and on the leader live until leadership ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn terms_are_born_ended_on_a_standby_and_live_on_the_leader() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(9, 1);
        let a = leading_replica(&db, key).await;
        let b = Replica::start(db.pool(2), key, I);
        tokio::time::sleep(I).await;

        // Standby: ended at birth, whatever the parent.
        let standby = b.elector.term();
        assert!(!standby.is_leader());
        assert!(standby.token().is_cancelled());
        assert_eq!(standby.end(), Some(TermEnd::NotLeader));
        let standby = b.elector.term_with(&CancellationToken::new());
        assert_eq!(standby.end(), Some(TermEnd::NotLeader));
        tokio::time::timeout(Duration::from_millis(10), standby.cancelled())
            .await
            .expect("a standby's term is already cancelled");

        // Leader: live; term_with ends with its parent, and the term itself goes on.
        let term = a.elector.term();
        assert!(term.is_leader());
        assert_eq!(term.end(), None);
        let parent = CancellationToken::new();
        let child = a.elector.term_with(&parent);
        let survivor = a.elector.term_with(&CancellationToken::new());
        assert!(child.is_leader());
        parent.cancel();
        assert_eq!(child.end(), Some(TermEnd::ParentCancelled));
        assert!(!child.is_leader());
        assert_eq!(term.end(), None);

        // Leadership lost: the term and every term_with of it end with LeadershipLost.
        terminate_holder(&db, key).await;
        tokio::time::timeout(2 * I, term.cancelled())
            .await
            .expect("the term ends");
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(survivor.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(
            child.end(),
            Some(TermEnd::ParentCancelled),
            "the first cause stays"
        );

        // Whoever leads next does so in a fresh, live term.
        let replicas = [a, b];
        let next = one_leader(&replicas, 3 * I).await;
        let fresh = replicas[next].elector.term();
        assert!(fresh.is_leader());
        assert!(!term.is_leader(), "an ended term stays ended");
        for replica in replicas {
            replica.stop().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leaders_term_ends_with_shutdown_and_term_with_too() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = leading_replica(&db, LockKey::new(9, 2)).await;
        let term = a.elector.term();
        let linked = a.elector.term_with(&CancellationToken::new());
        a.stop().await.unwrap();
        assert_eq!(term.end(), Some(TermEnd::Shutdown));
        assert_eq!(linked.end(), Some(TermEnd::Shutdown));
    }

    /// A holder that cancels its term's token ends its own handle only.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_holder_cancelling_its_token_ends_its_own_handle_only() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = leading_replica(&db, LockKey::new(9, 3)).await;
        let mine = a.elector.term();
        let clone = mine.clone();
        mine.token().cancel();
        assert!(
            !mine.is_leader() && !clone.is_leader(),
            "the handle and its clones end"
        );
        assert_eq!(mine.end(), Some(TermEnd::ParentCancelled));

        let other = a.elector.term();
        assert!(other.is_leader(), "another holder's term goes on");
        assert!(a.elector.is_leader());
        let work: Result<Option<u8>, ()> = a.elector.do_work(|_| async { Ok(1) }).await;
        assert_eq!(work, Ok(Some(1)));

        a.stop().await.unwrap();
        assert_eq!(other.end(), Some(TermEnd::Shutdown));
        assert_eq!(
            mine.end(),
            Some(TermEnd::ParentCancelled),
            "the first cause stays"
        );
    }
}

mod e10 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn do_work_on_a_standby_does_not_call_f() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(10, 1);
        let a = leading_replica(&db, key).await;
        let b = Replica::start(db.pool(2), key, I);
        tokio::time::sleep(I).await;

        let called = AtomicBool::new(false);
        let got: Result<Option<u32>, &str> = b
            .elector
            .do_work(|_| async {
                called.store(true, Ordering::SeqCst);
                Ok(1)
            })
            .await;
        assert_eq!(got, Ok(None));
        assert!(
            !called.load(Ordering::SeqCst),
            "f is not called on a standby"
        );
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn do_work_on_the_leader_returns_fs_result() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = leading_replica(&db, LockKey::new(10, 2)).await;

        // f may borrow from its caller: no 'static bound.
        let mut swept = Vec::new();
        let got: Result<Option<usize>, String> = a
            .elector
            .do_work(|term| {
                let swept = &mut swept;
                async move {
                    assert!(term.is_leader(), "f gets the live term");
                    swept.push(1);
                    Ok(swept.len())
                }
            })
            .await;
        assert_eq!(got, Ok(Some(1)));
        assert_eq!(swept, vec![1]);

        let got: Result<Option<()>, String> = a
            .elector
            .do_work(|_| async { Err("tick failed".to_owned()) })
            .await;
        assert_eq!(got, Err("tick failed".to_owned()));
        a.stop().await.unwrap();
    }

    /// A tick that cancels its own token still gets its result while the replica leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tick_cancelling_its_own_token_still_gets_its_result() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = leading_replica(&db, LockKey::new(10, 4)).await;
        for fails in [false, true] {
            let got: Result<Option<&str>, &str> = a
                .elector
                .do_work(|term| async move {
                    // A tick stops the tasks it spawned by cancelling its token.
                    term.token().cancel();
                    if fails {
                        Err("tick failed")
                    } else {
                        Ok("done")
                    }
                })
                .await;
            let want = if fails {
                Err("tick failed")
            } else {
                Ok(Some("done"))
            };
            assert_eq!(
                got, want,
                "the replica still leads, so the tick's own answer counts"
            );
            assert!(a.elector.is_leader());
            assert!(a.elector.term().is_leader(), "the term goes on");
        }
        a.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leadership_lost_while_f_runs_is_ok_none_whatever_f_returned() {
        let _timing = timing();
        for f_fails in [false, true] {
            let db = fresh_db().await;
            let key = LockKey::new(10, 3);
            let a = leading_replica(&db, key).await;

            let capture = capture::Capture::default();
            let got: Result<Option<&str>, &str> = a
                .elector
                .do_work(|term| {
                    let db = &db;
                    async move {
                        terminate_holder(db, key).await;
                        // Finish only once the term has ended.
                        term.cancelled().await;
                        if f_fails { Err("failed") } else { Ok("done") }
                    }
                })
                .with_subscriber(capture.dispatch())
                .await;
            assert_eq!(got, Ok(None), "f_fails = {f_fails}");
            // The dropped outcome is logged, saying which key and which replica.
            let logged = capture.events("leadership ended while work ran");
            assert_eq!(logged.len(), 1, "{logged:?}");
            assert_eq!(logged[0].field("key"), key.to_string(), "{logged:?}");
            assert_eq!(
                logged[0].field("identity"),
                a.elector.identity().unwrap(),
                "{logged:?}"
            );
            assert_eq!(logged[0].field("failed"), f_fails.to_string(), "{logged:?}");
            a.stop().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e11_is_leader_is_callable_from_any_thread() {
    let _timing = timing();
    let db = fresh_db().await;
    let a = leading_replica(&db, LockKey::new(11, 1)).await;
    let elector = a.elector.clone();
    let seen = std::thread::spawn(move || (0..1000).all(|_| elector.is_leader()))
        .join()
        .unwrap();
    assert!(seen, "a plain thread, outside the runtime, sees the leader");
    a.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e12_the_gauge_is_one_on_the_leader_and_zero_after_shutdown() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(12, 1);
    let registry = Registry::new();
    let build = || {
        Elector::builder(db.pool(2), key)
            .check_interval(I)
            .registry(&registry)
            .build()
            .unwrap()
    };
    let a = Replica::run(build());
    wait_a_leads(&a).await;
    assert_eq!(gauge(&registry, "pg_elector_leader"), Some(1));

    // A second elector on the same registry: one series, still 1.
    let b = Replica::run(build());
    tokio::time::sleep(I).await;
    let families = registry.gather();
    let leader = families
        .iter()
        .find(|f| f.name() == "pg_elector_leader")
        .expect("the gauge");
    assert_eq!(leader.get_metric().len(), 1, "one series");
    assert_eq!(
        leader.get_metric()[0].get_label()[0].value(),
        "12:1",
        "labelled by key"
    );
    assert_eq!(gauge(&registry, "pg_elector_leader"), Some(1));
    let checked = || {
        registry
            .gather()
            .iter()
            .find(|f| f.name() == pg_elector::CHECK_DURATION_NAME)
            .is_some_and(|f| f.get_metric()[0].get_histogram().get_sample_count() >= 1)
    };
    wait_for(2 * I, checked)
        .await
        .expect("the leader's first check is timed within 2·I");

    a.stop().await.unwrap();
    wait_for(2 * I, || b.elector.is_leader())
        .await
        .expect("b leads");
    assert_eq!(
        gauge(&registry, "pg_elector_leader"),
        Some(1),
        "b took over"
    );
    b.stop().await.unwrap();
    assert_eq!(gauge(&registry, "pg_elector_leader"), Some(0));

    // Both promotions and both releases are counted by cause, and the checks are timed.
    let families = registry.gather();
    let changes = families
        .iter()
        .find(|f| f.name() == pg_elector::CHANGES_NAME)
        .expect("the changes counter");
    let count = |cause: &str| {
        changes
            .get_metric()
            .iter()
            .find(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "cause" && l.value() == cause)
            })
            .map_or(0.0, |m| m.get_counter().value())
    };
    assert_eq!((count("acquired"), count("released")), (2.0, 2.0));
}
