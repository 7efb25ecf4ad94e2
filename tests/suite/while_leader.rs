//! B2: the while-leader launcher. A self-paced loop handed one term at a time: started when a
//! term begins, stopped when it ends (or after its stop grace) and started again in the next;
//! a loop whose start panics, or that fails or returns early. Paused time with a manual
//! elector; a terminated leader on the real server.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::background::{P, Running};
use common::capture::Capture;
use common::*;
use pg_elector::background::{Probe, ProbeStatus, WhileLeader};
use pg_elector::{Elector, LockKey};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Lets every task that is ready run, on paused time, without moving the clock much.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A loop body for the B2 tests: counts starts, marks itself running, and runs until its term
/// ends (or returns at once when `returns_early`).
#[derive(Clone, Default)]
struct Body {
    starts: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
    saw_token: Arc<AtomicUsize>,
}

impl Body {
    async fn run(self, term: pg_elector::Term) -> Result<(), String> {
        assert!(term.is_leader(), "the loop is handed a live term");
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.running.store(true, Ordering::SeqCst);
        let _running = Running(self.running.clone());
        term.cancelled().await;
        self.saw_token.fetch_add(1, Ordering::SeqCst);
        // Dropped here at once unless given a grace.
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(())
    }
    fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }
    fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}

mod b2 {
    use super::*;

    /// The loop gets each term, is stopped at its end, and restarts in the next.
    #[tokio::test(start_paused = true)]
    async fn the_loop_gets_each_term_and_restarts_in_the_next() {
        let (elector, control) = Elector::manual();
        let shutdown = CancellationToken::new();
        let body = Body::default();
        let launcher = WhileLeader::new("archiver", &elector);
        let task = tokio::spawn({
            let (shutdown, body) = (shutdown.clone(), body.clone());
            async move {
                launcher
                    .run(shutdown, move |term| body.clone().run(term))
                    .await
            }
        });
        tokio::time::sleep(P).await;
        assert_eq!(body.starts(), 0, "not on a standby");

        let t0 = Instant::now();
        control.promote();
        settle().await;
        assert_eq!(body.starts(), 1, "started at once");
        assert_eq!(t0.elapsed(), Duration::ZERO, "woken, not polled");
        assert!(body.running());

        control.demote();
        settle().await;
        assert!(!body.running(), "stopped when the term ended");
        assert_eq!(
            body.saw_token.load(Ordering::SeqCst),
            1,
            "it saw the term's token"
        );
        tokio::time::sleep(P).await;
        assert_eq!(body.starts(), 1);

        control.promote();
        settle().await;
        assert_eq!(body.starts(), 2, "started again in the next term");
        assert!(body.running());

        shutdown.cancel();
        task.await.unwrap();
        assert!(!body.running(), "stopped at shutdown");
    }

    /// A loop whose start panics is caught, fails the probe, and starts again in the next term.
    #[tokio::test(start_paused = true)]
    async fn a_loop_whose_start_panics_starts_again_next_term() {
        let capture = Capture::default();
        let _log = capture.install();
        let (elector, control) = Elector::manual();
        let probe = Probe::new("archiver");
        let launcher = WhileLeader::new("archiver", &elector).probe(&probe);
        let calls = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (shutdown, calls) = (shutdown.clone(), calls.clone());
            async move {
                launcher
                    .run(shutdown, move |term: pg_elector::Term| {
                        // The synchronous part of the loop's start: a bad setting found there.
                        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                            panic!("archive bucket is not configured");
                        }
                        async move {
                            term.cancelled().await;
                            Ok::<_, String>(())
                        }
                    })
                    .await
            }
        });
        control.promote();
        settle().await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(!task.is_finished(), "the launcher survives the panic");
        assert!(
            matches!(probe.status(), ProbeStatus::Fail(e) if e.contains("archive bucket is not configured")),
            "{probe:?}"
        );
        let panicked = capture.events("loop panicked; it starts again in the next term");
        assert_eq!(panicked.len(), 1);
        assert_eq!(panicked[0].field("loop_name"), "archiver");

        control.demote();
        settle().await;
        control.promote();
        settle().await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "started again in the next term"
        );
        assert!(probe.status().is_pass());
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_returns_early_restarts_only_in_a_later_term() {
        let capture = Capture::default();
        let _log = capture.install();
        let (elector, control) = Elector::manual();
        let shutdown = CancellationToken::new();
        let probe = Probe::new("outbox");
        let starts = Arc::new(AtomicUsize::new(0));
        let launcher = WhileLeader::new("outbox", &elector).probe(&probe);
        let task = tokio::spawn({
            let (shutdown, starts) = (shutdown.clone(), starts.clone());
            async move {
                launcher
                    .run(shutdown, move |_term| {
                        let n = starts.fetch_add(1, Ordering::SeqCst);
                        async move {
                            match n {
                                0 => Ok(()),
                                1 => Err("broker unreachable".to_owned()),
                                _ => panic!("bad row"),
                            }
                        }
                    })
                    .await
            }
        });
        control.promote();
        tokio::time::sleep(P * 10).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            1,
            "returned Ok: not spun in the same term"
        );
        assert!(probe.status().is_pass());
        assert_eq!(capture.events("loop returned while leading").len(), 1);

        control.demote();
        control.promote();
        tokio::time::sleep(P * 10).await;
        assert_eq!(starts.load(Ordering::SeqCst), 2, "failed: not spun either");
        assert_eq!(
            probe.status(),
            ProbeStatus::Fail("broker unreachable".into())
        );
        let warned = capture.events("loop failed");
        assert_eq!(warned.len(), 1);
        assert_eq!(warned[0].field("loop_name"), "outbox");
        assert_eq!(warned[0].level, tracing::Level::WARN);

        control.demote();
        tokio::time::sleep(P).await;
        assert!(probe.status().is_pass(), "cleared on standby");
        control.promote();
        tokio::time::sleep(P * 10).await;
        assert_eq!(starts.load(Ordering::SeqCst), 3, "panicked: not spun");
        assert_eq!(
            probe.status(),
            ProbeStatus::Fail("background loop \"outbox\": loop panicked: bad row".into())
        );
        let panicked = capture.events("loop panicked");
        assert_eq!(panicked.len(), 1);
        assert_eq!(panicked[0].level, tracing::Level::ERROR);
        assert_eq!(panicked[0].field("panic"), "bad row");

        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn stop_grace_lets_the_loop_finish_after_its_term_ends() {
        let (elector, control) = Elector::manual();
        let shutdown = CancellationToken::new();
        let finished = Arc::new(AtomicBool::new(false));
        let launcher = WhileLeader::new("drain", &elector).stop_grace(P);
        let task = tokio::spawn({
            let (shutdown, finished) = (shutdown.clone(), finished.clone());
            async move {
                launcher
                    .run(shutdown, move |term| {
                        let finished = finished.clone();
                        async move {
                            term.cancelled().await;
                            tokio::time::sleep(P / 2).await; // commit the last batch
                            finished.store(true, Ordering::SeqCst);
                            Ok::<_, String>(())
                        }
                    })
                    .await
            }
        });
        control.promote();
        tokio::time::sleep(P).await;
        control.demote();
        tokio::time::sleep(P).await;
        assert!(finished.load(Ordering::SeqCst), "finished within the grace");
        shutdown.cancel();
        task.await.unwrap();
    }

    /// The loop stops with a terminated leader and restarts on the new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_loop_follows_a_terminated_leader_to_the_new_one() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xb2, 1);
        let replicas = [
            Replica::start(db.pool(2), key, I),
            Replica::start(db.pool(2), key, I),
        ];
        let bodies: [Body; 2] = Default::default();
        let shutdown = CancellationToken::new();
        let mut launchers = Vec::new();
        for (replica, body) in replicas.iter().zip(&bodies) {
            let launcher = WhileLeader::new("archiver", &replica.elector);
            let (body, shutdown) = (body.clone(), shutdown.clone());
            launchers.push(tokio::spawn(async move {
                launcher
                    .run(shutdown, move |term| body.clone().run(term))
                    .await
            }));
        }
        let first = one_leader(&replicas, 10 * I).await;
        wait_for(10 * I, || bodies[first].running())
            .await
            .expect("the loop runs on the leader");
        assert_eq!(bodies[1 - first].starts(), 0, "not on the standby");

        terminate_holder(&db, key).await;
        wait_for(3 * I, || {
            bodies[first].saw_token.load(Ordering::SeqCst) == 1
        })
        .await
        .expect("the old leader's loop sees its term end within 2·I and a half");
        // Either replica may win the free lock; the loop starts again on whichever does.
        wait_for(10 * I, || bodies[0].starts() + bodies[1].starts() == 2)
            .await
            .expect("the loop starts again in the next term");
        let next = one_leader(&replicas, 10 * I).await;
        wait_for(10 * I, || bodies[next].running())
            .await
            .expect("it runs on the new leader");
        assert!(!bodies[1 - next].running(), "and only there");
        assert_eq!(
            bodies[0].starts() + bodies[1].starts(),
            2,
            "started once per term"
        );

        shutdown.cancel();
        for launcher in launchers {
            launcher.await.unwrap();
        }
        assert!(!bodies[0].running() && !bodies[1].running());
        for replica in replicas {
            replica.stop().await.unwrap();
        }
    }
}
