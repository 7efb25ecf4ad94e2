//! E6, E7 and E8: shutdown, a dropped or panicking `run`, and one run at a time.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use deadpool_postgres::{Hook, HookError};
use pg_elector::{Elector, Error, LockKey, TermEnd};
use tokio_util::sync::CancellationToken;

mod e6 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_returns_ok_and_a_standby_leads_within_one_interval() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(6, 1);
        let (a, registry) = replica_with_gauge(db.pool(2), key);
        wait_a_leads(&a).await;
        let b = Replica::start(db.pool(2), key, I);
        tokio::time::sleep(I).await;
        assert!(!b.elector.is_leader());
        let term = a.elector.term();
        let elector = a.elector.clone();

        a.stop().await.expect("shutdown returns Ok");
        let released = Instant::now();
        assert_eq!(term.end(), Some(TermEnd::Shutdown));
        assert!(!elector.is_leader());
        assert_eq!(gauge(&registry, "pg_elector_leader"), Some(0));
        let took = wait_for(I + I / 2, || b.elector.is_leader())
            .await
            .expect("the standby leads within one I");
        eprintln!("graceful handover: new leader {took:?} after the release");
        assert!(released.elapsed() < 2 * I);
        b.stop().await.unwrap();
    }

    /// Shutdown against a silent server returns within the two-second bound of the unlock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_against_a_silent_server_returns_within_2_s() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        // A long interval, so that no leader check demotes before the shutdown.
        let a = Replica::start(
            db.pool_via(proxy.addr(), 2),
            LockKey::new(6, 2),
            Duration::from_secs(10),
        );
        wait_for(Duration::from_secs(3), || a.elector.is_leader())
            .await
            .expect("a leads");
        let term = a.elector.term();
        proxy.blackhole();

        let start = Instant::now();
        a.stop()
            .await
            .expect("shutdown returns Ok even when the unlock gets no answer");
        let took = start.elapsed();
        assert_eq!(term.end(), Some(TermEnd::Shutdown));
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_millis(2600),
            "shutdown took {took:?}; the unlock is bounded by 2 s"
        );
    }
}

mod e7 {
    use super::*;

    /// Aborting the run task ends the term, and the server frees the lock within a second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn aborting_the_run_ends_the_term_and_frees_the_lock_in_1_s() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(7, 1);
        let (a, registry) = replica_with_gauge(db.pool(2), key);
        wait_a_leads(&a).await;
        let term = a.elector.term();
        let admin = db.connect().await.unwrap();
        assert_eq!(holders(&admin, key).await.len(), 1);

        a.task.abort();
        let joined = a.task.await;
        assert!(joined.unwrap_err().is_cancelled());
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        assert!(!a.elector.is_leader());
        assert_eq!(gauge(&registry, "pg_elector_leader"), Some(0));
        let freed = wait_for_async(Duration::from_secs(1), || async {
            holders(&admin, key).await.is_empty()
        })
        .await
        .expect("the server frees the lock within a second");
        eprintln!("abort: lock free after {freed:?}");

        // And run may be called again.
        let again = Replica::run(a.elector.clone());
        wait_for(3 * I, || again.elector.is_leader())
            .await
            .expect("leads again");
        again.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_dropped_by_a_lost_select_ends_the_term() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(7, 2);
        let elector = Elector::builder(db.pool(2), key)
            .check_interval(I)
            .build()
            .unwrap();
        let observer = elector.clone();
        let watched = tokio::spawn(async move {
            wait_for(3 * I, || observer.is_leader())
                .await
                .expect("leads");
            observer.term()
        });
        let term = tokio::select! {
            _ = elector.run(CancellationToken::new()) => unreachable!("run returns only on shutdown"),
            term = watched => term.unwrap(),
        };
        // The select dropped `run` when the watcher finished.
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        assert!(!elector.is_leader());
        let admin = db.connect().await.unwrap();
        wait_for_async(Duration::from_secs(1), || async {
            holders(&admin, key).await.is_empty()
        })
        .await
        .expect("the server frees the lock within a second");
    }
}

mod e8 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_concurrent_run_is_already_running_at_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = Replica::start(db.pool(2), LockKey::new(8, 1), I);
        tokio::time::sleep(I / 2).await;
        let clone = a.elector.clone();
        let start = Instant::now();
        let second = clone.run(CancellationToken::new()).await;
        assert!(matches!(second, Err(Error::AlreadyRunning)), "{second:?}");
        assert!(start.elapsed() < Duration::from_millis(50), "at once");
        assert!(!a.task.is_finished(), "the first run goes on");

        // Once the first returned, run may be called again.
        let elector = a.elector.clone();
        a.stop().await.unwrap();
        let again = Replica::run(elector);
        wait_for(3 * I, || again.elector.is_leader())
            .await
            .expect("a new run leads");
        again.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_may_be_called_again_after_a_panic_unwound_through_it() {
        let _timing = timing();
        let db = fresh_db().await;
        // A pool whose first connection makes `pool.get()` panic inside `run`.
        let panicked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
            db.config(),
            tokio_postgres::NoTls,
        ))
        .max_size(2)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .post_create(Hook::sync_fn({
            let panicked = panicked.clone();
            move |_, _| -> Result<(), HookError> {
                if !panicked.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    panic!("injected panic in a pool hook");
                }
                Ok(())
            }
        }))
        .build()
        .unwrap();
        let elector = Elector::builder(pool, LockKey::new(8, 2))
            .check_interval(I)
            .build()
            .unwrap();
        let first = Replica::run(elector.clone());
        let joined = first.task.await;
        assert!(
            joined.unwrap_err().is_panic(),
            "the panic unwound through run"
        );
        assert!(!elector.is_leader());

        let again = Replica::run(elector);
        wait_for(3 * I, || again.elector.is_leader())
            .await
            .expect("run works again after a panic");
        again.stop().await.unwrap();
    }
}
