//! B5: the supervisor. Named workers restarted with exponential backoff within a budget,
//! panicking workers and starts, a renamed probe, and a bounded shutdown, on paused time; the
//! election as a supervised worker on the real server. Also B6, the launchers and the
//! supervisor unchanged on an always-leader elector, and that the public types are `Send`,
//! `Sync` and `Clone`, as the supervisor's workers need them.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::background::{P, Running};
use common::capture::Capture;
use common::*;
use pg_elector::background::{
    Gate, LeaderTicker, Probe, ProbeStatus, Readiness, RestartPolicy, Supervisor, WhileLeader,
};
use pg_elector::{Elector, LockKey, Term, TermEnd};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn fast_policy() -> RestartPolicy {
    RestartPolicy::new()
        .backoff(Duration::from_millis(100), Duration::from_millis(1000))
        .budget(4, Duration::from_secs(60))
}

/// Runs `supervisor` in a spawned task until the returned token is cancelled.
fn spawn_run(supervisor: Supervisor) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    (shutdown, task)
}

/// Cancels a [`spawn_run`]'s token and waits for the supervisor to return.
async fn stop_run(shutdown: CancellationToken, task: tokio::task::JoinHandle<()>) {
    shutdown.cancel();
    task.await.unwrap();
}

/// A supervisor on [`fast_policy`] with the worker `name`: each start adds one to `attempts`
/// and calls `start` with the count before it (0 at the first start) and the worker's token.
fn counted_worker<Fut>(
    name: &str,
    attempts: &Arc<AtomicUsize>,
    mut start: impl FnMut(usize, CancellationToken) -> Fut + Send + 'static,
) -> Supervisor
where
    Fut: std::future::Future + Send + 'static,
    Fut::Output: pg_elector::background::WorkerResult,
{
    let attempts = attempts.clone();
    Supervisor::new()
        .restart_policy(fast_policy())
        .worker(name, move |token| {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            start(n, token)
        })
}

/// Runs `supervisor` ([`spawn_run`]) for `wait` of paused time, its restarts going on
/// meanwhile; returns the run and how many starts `attempts` counted by then.
async fn run_for(
    wait: Duration,
    supervisor: Supervisor,
    attempts: &AtomicUsize,
) -> (CancellationToken, tokio::task::JoinHandle<()>, usize) {
    let (shutdown, task) = spawn_run(supervisor);
    tokio::time::sleep(wait).await;
    (shutdown, task, attempts.load(Ordering::SeqCst))
}

/// A timing slot, a fresh database, and an elector of `key` on it (a pool of two, checking
/// every I), not running yet.
async fn elector_on_a_fresh_db(
    key: LockKey,
) -> (pg_elector_testkit::replicas::SerialGuard, TestDb, Elector) {
    let timing = timing();
    let db = fresh_db().await;
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .build()
        .unwrap();
    (timing, db, elector)
}

/// A tick that counts itself in `ticks` and succeeds at once.
fn counting_tick(
    ticks: Arc<AtomicUsize>,
) -> impl Fn(Term) -> std::future::Ready<Result<(), String>> + Send + Sync + 'static {
    move |_term| {
        ticks.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(()))
    }
}

/// A loop that counts its starts in `loops` and runs until its term ends.
fn counting_loop(
    loops: Arc<AtomicUsize>,
) -> impl Fn(Term) -> common::schedules::BoxedRun + Send + Sync + 'static {
    move |term| {
        loops.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            term.cancelled().await;
            Ok(())
        })
    }
}

/// Runs `supervisor` for 2.5·P of paused time, then shuts it down: by then its ticker (period P,
/// counted in `ticks`) ticked three times and its loop (counted in `loops`) started once, and
/// the shutdown ended `term`.
async fn three_ticks_and_one_loop_then_shutdown(
    supervisor: Supervisor,
    ticks: &AtomicUsize,
    loops: &AtomicUsize,
    term: &Term,
) {
    let (shutdown, task) = spawn_run(supervisor);
    tokio::time::sleep(P * 5 / 2).await;
    assert_eq!(ticks.load(Ordering::SeqCst), 3);
    assert_eq!(loops.load(Ordering::SeqCst), 1);
    stop_run(shutdown, task).await;
    assert_eq!(
        term.end(),
        Some(TermEnd::Shutdown),
        "the supervised election shut down"
    );
}

/// A supervisor with two workers: `pg-elector` runs the election, `sweep` runs `ticker` and
/// counts its ticks in `ticks`.
fn supervise_election_and_sweep(
    elector: &Elector,
    ticker: LeaderTicker,
    ticks: &Arc<AtomicUsize>,
) -> Supervisor {
    Supervisor::new()
        .worker("pg-elector", {
            let elector = elector.clone();
            move |token| {
                let elector = elector.clone();
                async move { elector.run(token).await }
            }
        })
        .worker("sweep", {
            let ticks = ticks.clone();
            move |token| {
                let (ticker, tick) = (ticker.clone(), counting_tick(ticks.clone()));
                async move { ticker.run(token, tick).await }
            }
        })
}

mod b5 {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_failed_worker_restarts_with_exponential_backoff() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let supervisor = Supervisor::new()
            .restart_policy(fast_policy())
            .worker("flaky", {
                let starts = starts.clone();
                move |token: CancellationToken| {
                    starts.lock().unwrap().push(t0.elapsed());
                    let n = starts.lock().unwrap().len();
                    async move {
                        if n < 4 {
                            Err("connection reset")
                        } else {
                            token.cancelled().await;
                            Ok(())
                        }
                    }
                }
            });
        let shutdown = CancellationToken::new();
        let stop = {
            let shutdown = shutdown.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                shutdown.cancel();
            }
        };
        tokio::join!(supervisor.run(shutdown), stop);
        let ms: Vec<_> = starts
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, [0, 100, 300, 700], "waits of 100, 200, 400 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_past_its_budget_stops_and_the_probe_names_it() {
        let capture = Capture::default();
        let _log = capture.install();
        let attempts = Arc::new(AtomicUsize::new(0));
        let healthy = Arc::new(AtomicBool::new(false));
        let supervisor = counted_worker("doomed", &attempts, |_, _token| async {
            Err::<(), _>("schema mismatch")
        })
        .worker("healthy", {
            let healthy = healthy.clone();
            move |token: CancellationToken| {
                let healthy = healthy.clone();
                async move {
                    healthy.store(true, Ordering::SeqCst);
                    token.cancelled().await;
                    healthy.store(false, Ordering::SeqCst);
                }
            }
        });
        let readiness = Readiness::new();
        readiness.add(&supervisor.probe());
        let (shutdown, task, starts) =
            run_for(Duration::from_secs(10), supervisor, &attempts).await;
        assert_eq!(starts, 5, "the first run and 4 restarts");
        let report = readiness.check();
        assert_eq!(report.status_code(), 503);
        assert_eq!(report.failing()[0].name, "workers");
        assert!(
            report.failing()[0]
                .error
                .contains("worker \"doomed\" stopped")
                && report.failing()[0].error.contains("schema mismatch"),
            "{report}"
        );
        assert!(healthy.load(Ordering::SeqCst), "the other worker runs on");
        let gave_up = capture.events("worker stopped: restart budget spent");
        assert_eq!(gave_up.len(), 1);
        assert_eq!(gave_up[0].field("worker"), "doomed");
        assert_eq!(capture.events("worker failed").len(), 4);
        stop_run(shutdown, task).await;
        assert!(!healthy.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_logged_and_restarted() {
        let capture = Capture::default();
        let _log = capture.install();
        let attempts = Arc::new(AtomicUsize::new(0));
        let supervisor = counted_worker(
            "crashy",
            &attempts,
            |n, token: CancellationToken| async move {
                if n == 0 {
                    panic!("unwrap on None");
                }
                token.cancelled().await;
            },
        );
        let probe = supervisor.probe();
        let (shutdown, task, starts) = run_for(Duration::from_secs(1), supervisor, &attempts).await;
        assert_eq!(starts, 2, "restarted after the panic");
        assert!(probe.status().is_pass());
        let panicked = capture.events("worker panicked");
        assert_eq!(panicked.len(), 1);
        assert_eq!(panicked[0].level, tracing::Level::ERROR);
        assert_eq!(panicked[0].field("worker"), "crashy");
        assert_eq!(panicked[0].field("panic"), "unwrap on None");
        assert!(!panicked[0].field("backtrace").is_empty());
        stop_run(shutdown, task).await;
    }

    /// A worker whose start panics is restarted within its budget, then given up.
    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_start_panics_is_restarted_then_given_up() {
        let capture = Capture::default();
        let _log = capture.install();
        let attempts = Arc::new(AtomicUsize::new(0));
        let supervisor =
            counted_worker("misconfigured", &attempts, |_, token: CancellationToken| {
                // The synchronous part of the start, before any future exists (the count too).
                let batch: u32 = "ten".parse().expect("SWEEP_BATCH is not a number");
                async move {
                    for _ in 0..batch {
                        token.cancelled().await;
                    }
                }
            });
        let probe = supervisor.probe();
        let (shutdown, task, starts) =
            run_for(Duration::from_secs(10), supervisor, &attempts).await;
        assert_eq!(starts, 5, "the first start and 4 restarts");
        let panicked = capture.events("worker panicked");
        assert_eq!(panicked.len(), 5);
        assert!(
            panicked[0]
                .field("panic")
                .starts_with("SWEEP_BATCH is not a number")
        );
        assert_eq!(
            capture.events("worker stopped: restart budget spent").len(),
            1
        );
        assert!(
            matches!(probe.status(), ProbeStatus::Fail(e) if e.contains("misconfigured") && e.contains("SWEEP_BATCH")),
            "{probe:?}"
        );
        stop_run(shutdown, task).await;
    }

    /// A probe taken before `probe_name` is renamed and still reports.
    #[tokio::test(start_paused = true)]
    async fn a_probe_taken_before_probe_name_is_renamed_and_reports() {
        let early = Supervisor::new();
        let probe = early.probe();
        let supervisor = early
            .probe_name("jobs")
            .restart_policy(RestartPolicy::new().budget(0, Duration::from_secs(60)))
            .worker("doomed", |_token| async { Err::<(), _>("schema mismatch") });
        assert_eq!(probe.name(), "jobs", "the probe taken earlier is renamed");
        assert_eq!(supervisor.probe().name(), "jobs");
        let readiness = Readiness::new();
        readiness.add(&probe);
        supervisor.run(CancellationToken::new()).await;
        let report = readiness.check();
        assert_eq!(report.status_code(), 503, "{report}");
        assert_eq!(report.failing()[0].name, "jobs");
        assert!(report.failing()[0].error.contains("doomed"), "{report}");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_cancels_every_worker_and_waits_for_them() {
        let cleaned = Arc::new(AtomicUsize::new(0));
        let mut supervisor = Supervisor::new();
        for name in ["a", "b", "c"] {
            let cleaned = cleaned.clone();
            supervisor = supervisor.worker(name, move |token: CancellationToken| {
                let cleaned = cleaned.clone();
                async move {
                    token.cancelled().await;
                    tokio::time::sleep(P).await; // flush on the way out
                    cleaned.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(())
                }
            });
        }
        let shutdown = CancellationToken::new();
        let t0 = Instant::now();
        let stop = {
            let shutdown = shutdown.clone();
            async move {
                tokio::time::sleep(P).await;
                shutdown.cancel();
            }
        };
        tokio::join!(supervisor.run(shutdown), stop);
        assert_eq!(
            cleaned.load(Ordering::SeqCst),
            3,
            "run waited for every worker"
        );
        assert_eq!(t0.elapsed(), P * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_stuck_at_shutdown_is_aborted_after_the_timeout() {
        let capture = Capture::default();
        let _log = capture.install();
        let dropped = Arc::new(AtomicBool::new(false));
        let supervisor = Supervisor::new().shutdown_timeout(P).worker("stuck", {
            let dropped = dropped.clone();
            move |_token| {
                let guard = Running(dropped.clone());
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                }
            }
        });
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let t0 = Instant::now();
        // `Running` sets false on drop: start true to see it.
        dropped.store(true, Ordering::SeqCst);
        supervisor.run(shutdown).await;
        assert_eq!(t0.elapsed(), P);
        assert!(
            !dropped.load(Ordering::SeqCst),
            "the stuck worker was dropped"
        );
        let warned = capture.events("workers did not stop");
        assert_eq!(warned.len(), 1);
        assert!(warned[0].field("workers").contains("stuck"));
    }

    /// The supervisor runs the election and releases the lock at shutdown.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_supervisor_runs_the_election_and_unlocks_at_shutdown() {
        let key = LockKey::new(0xb5, 1);
        let (_timing, db, elector) = elector_on_a_fresh_db(key).await;
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = LeaderTicker::new("sweep", &elector, Duration::from_millis(20));
        let supervisor = supervise_election_and_sweep(&elector, ticker, &ticks);
        let probe = supervisor.probe();
        let (shutdown, task) = spawn_run(supervisor);
        wait_for(3 * I, || elector.is_leader())
            .await
            .expect("the supervised election leads");
        wait_for(3 * I, || ticks.load(Ordering::SeqCst) >= 3)
            .await
            .expect("the supervised ticker ticks");
        let admin = db.connect().await.unwrap();
        assert_eq!(holders(&admin, key).await.len(), 1);
        assert!(probe.status().is_pass());

        shutdown.cancel();
        tokio::time::timeout(5 * I, task)
            .await
            .expect("shutdown waits for the workers, boundedly")
            .unwrap();
        assert!(!elector.is_leader());
        assert!(
            holders(&admin, key).await.is_empty(),
            "run unlocked at shutdown"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// B6: the launchers run unchanged on a local elector.

/// The launchers and the supervisor run on an always-leader elector.
#[tokio::test(start_paused = true)]
async fn b6_launchers_and_supervisor_run_on_an_always_leader() {
    let elector = Elector::always_leader();
    let term = elector.term();
    let ticks = Arc::new(AtomicUsize::new(0));
    let loops = Arc::new(AtomicUsize::new(0));
    let ticker = LeaderTicker::new("sweep", &elector, P);
    let launcher = WhileLeader::new("outbox", &elector);
    let supervisor = supervise_election_and_sweep(&elector, ticker, &ticks).worker("outbox", {
        let loops = loops.clone();
        move |token| {
            let (launcher, run_loop) = (launcher.clone(), counting_loop(loops.clone()));
            async move { launcher.run(token, run_loop).await }
        }
    });
    three_ticks_and_one_loop_then_shutdown(supervisor, &ticks, &loops, &term).await;
}

/// The short path runs the election, a ticker and a loop as named workers.
#[tokio::test(start_paused = true)]
async fn the_short_path_runs_election_ticker_and_loop_as_workers() {
    let capture = Capture::default();
    let _log = capture.install();
    let elector = Elector::always_leader();
    let ticks = Arc::new(AtomicUsize::new(0));
    let loops = Arc::new(AtomicUsize::new(0));
    let supervisor = Supervisor::new()
        .election(&elector)
        .ticker(
            LeaderTicker::new("sweep", &elector, P),
            counting_tick(ticks.clone()),
        )
        .while_leader(WhileLeader::new("outbox", &elector), {
            let loops = loops.clone();
            move |term| {
                loops.fetch_add(1, Ordering::SeqCst);
                async move {
                    term.cancelled().await;
                    Err::<(), _>("stopped")
                }
            }
        });
    assert_eq!(
        format!("{supervisor:?}").matches("pg-elector").count()
            + format!("{supervisor:?}").matches("sweep").count()
            + format!("{supervisor:?}").matches("outbox").count(),
        3,
        "one worker each, named after the election, the ticker and the loop: {supervisor:?}"
    );
    let term = elector.term();
    three_ticks_and_one_loop_then_shutdown(supervisor, &ticks, &loops, &term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_runs_the_election_until_shutdown() {
    let key = LockKey::new(0xb5, 2);
    let (_timing, db, elector) = elector_on_a_fresh_db(key).await;
    let shutdown = CancellationToken::new();
    let election = elector.spawn(shutdown.clone());
    wait_for(3 * I, || elector.is_leader())
        .await
        .expect("the spawned election leads");
    shutdown.cancel();
    election.await.unwrap().unwrap();
    assert!(!elector.is_leader());
    let admin = db.connect().await.unwrap();
    assert!(
        holders(&admin, key).await.is_empty(),
        "unlocked at shutdown"
    );
}

// ---------------------------------------------------------------------------------------------
// The public types go into the supervisor's workers.

#[test]
fn the_public_types_are_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Gate>();
    check::<LeaderTicker>();
    check::<WhileLeader>();
    check::<Probe>();
    check::<Readiness>();
    check::<RestartPolicy>();
    fn send<T: Send + 'static>() {}
    send::<Supervisor>();
}
