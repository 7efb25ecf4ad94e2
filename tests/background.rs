//! B1–B5: the background plane. Pure state and cadence on paused time with a manual elector;
//! leadership moves on the real server.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::capture::Capture;
use common::*;
use pg_elector::background::{
    Gate, LeaderTicker, Probe, ProbeStatus, Readiness, RestartPolicy, Supervisor, TickOutcome,
    WhileLeader,
};
use pg_elector::{Elector, LockKey, TermEnd};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const P: Duration = Duration::from_millis(100);

/// Lets every task that is ready run, on paused time, without moving the clock much.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

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

// ---------------------------------------------------------------------------------------------
// B1: the leader ticker.

#[tokio::test(start_paused = true)]
async fn b1_ticks_once_per_period_on_the_leader_only() {
    let (elector, control) = Elector::manual();
    let shutdown = CancellationToken::new();
    let ticks = Mutex::new(Vec::new());
    let t0 = Instant::now();
    let ticker = LeaderTicker::new("sweep", &elector, P);
    let driver = async {
        // Standby for 3.5 periods: nothing runs.
        tokio::time::sleep(P * 7 / 2).await;
        assert!(ticks.lock().unwrap().is_empty());
        control.promote();
        tokio::time::sleep(P * 3).await;
        control.demote();
        tokio::time::sleep(P * 3).await;
        shutdown.cancel();
    };
    let run = ticker.run(shutdown.clone(), |term| {
        assert!(term.is_leader());
        // The tick borrows from the test: no 'static bound.
        ticks.lock().unwrap().push(t0.elapsed());
        async { Ok::<_, String>(()) }
    });
    tokio::join!(run, driver);
    assert_eq!(*ticks.lock().unwrap(), [P * 4, P * 5, P * 6]);
}

#[tokio::test(start_paused = true)]
async fn b1_missed_ticks_do_not_burst() {
    let elector = Elector::always_leader();
    let shutdown = CancellationToken::new();
    let starts = Mutex::new(Vec::new());
    let t0 = Instant::now();
    let ticker = LeaderTicker::new("slow", &elector, P);
    let stop = async {
        tokio::time::sleep(P * 10).await;
        shutdown.cancel();
    };
    let run = ticker.run(shutdown.clone(), |_term| {
        starts.lock().unwrap().push(t0.elapsed());
        async {
            // Overruns two and a half periods.
            tokio::time::sleep(P * 5 / 2).await;
            Ok::<_, String>(())
        }
    });
    tokio::join!(run, stop);
    let starts = starts.lock().unwrap().clone();
    assert_eq!(
        starts,
        [Duration::ZERO, P * 3, P * 6, P * 9],
        "skipped, never bunched"
    );
    assert!(starts.windows(2).all(|w| w[1] - w[0] >= P));
}

#[tokio::test(start_paused = true)]
async fn b1_tick_at_start_false_waits_one_period() {
    let elector = Elector::always_leader();
    let shutdown = CancellationToken::new();
    let t0 = Instant::now();
    let first = Mutex::new(None);
    let ticker = LeaderTicker::new("late", &elector, P).tick_at_start(false);
    ticker
        .run(shutdown.clone(), |_| {
            first.lock().unwrap().get_or_insert(t0.elapsed());
            shutdown.cancel();
            async { Ok::<_, String>(()) }
        })
        .await;
    assert_eq!(*first.lock().unwrap(), Some(P));
}

#[tokio::test(start_paused = true)]
async fn b1_a_failed_tick_logs_warn_with_the_loop_name_and_the_ticker_goes_on() {
    let capture = Capture::default();
    let _log = capture.install();
    let elector = Elector::always_leader();
    let shutdown = CancellationToken::new();
    let probe = Probe::new("sweep");
    let n = AtomicUsize::new(0);
    let ticker = LeaderTicker::new("sweep", &elector, P).probe(&probe);
    ticker
        .run(shutdown.clone(), |_| {
            let i = n.fetch_add(1, Ordering::SeqCst);
            if i == 3 {
                shutdown.cancel();
            }
            async move {
                if i == 1 {
                    Err("relation \"jobs\" does not exist")
                } else {
                    Ok(())
                }
            }
        })
        .await;
    assert_eq!(
        n.load(Ordering::SeqCst),
        4,
        "the ticker went on after the failure"
    );
    let warned = capture.events("tick failed");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].level, tracing::Level::WARN);
    assert_eq!(warned[0].field("loop_name"), "sweep");
    assert_eq!(warned[0].field("error"), "relation \"jobs\" does not exist");
}

#[tokio::test(start_paused = true)]
async fn b1_a_panicking_tick_is_caught_logged_with_backtrace_and_counts_as_failed() {
    let capture = Capture::default();
    let _log = capture.install();
    let elector = Elector::always_leader();
    let shutdown = CancellationToken::new();
    let probe = Probe::new("expire");
    let n = AtomicUsize::new(0);
    let seen_after_panic = Mutex::new(None);
    let ticker = LeaderTicker::new("expire", &elector, P).probe(&probe);
    ticker
        .run(shutdown.clone(), |_| {
            let i = n.fetch_add(1, Ordering::SeqCst);
            if i == 1 {
                *seen_after_panic.lock().unwrap() = Some(probe.status());
            }
            if i == 2 {
                shutdown.cancel();
            }
            async move {
                if i == 0 {
                    tokio::task::yield_now().await;
                    panic!("index out of range: {i}");
                }
                Ok::<_, String>(())
            }
        })
        .await;
    assert_eq!(n.load(Ordering::SeqCst), 3, "the ticker kept ticking");
    assert_eq!(
        seen_after_panic.lock().unwrap().clone(),
        Some(ProbeStatus::Fail(
            "background loop \"expire\": tick panicked: index out of range: 0".into()
        )),
        "a panic counts as a failed tick"
    );
    assert!(probe.status().is_pass(), "cleared by the next success");
    let errors = capture.events("tick panicked");
    assert_eq!(errors.len(), 1);
    let e = &errors[0];
    assert_eq!(e.level, tracing::Level::ERROR);
    assert_eq!(e.field("loop_name"), "expire");
    assert_eq!(e.field("panic"), "index out of range: 0");
    assert!(e.field("location").contains("background.rs"), "{e:?}");
    assert!(
        e.field("backtrace").contains("b1_a_panicking_tick"),
        "the backtrace shows the panic site: {}",
        e.field("backtrace")
    );
}

#[tokio::test(start_paused = true)]
async fn b1_shutdown_stops_the_ticker_even_mid_tick() {
    let elector = Elector::always_leader();
    let shutdown = CancellationToken::new();
    let finished = AtomicBool::new(false);
    let ticker = LeaderTicker::new("long", &elector, P);
    let t0 = Instant::now();
    let stop = async {
        tokio::time::sleep(P / 2).await;
        shutdown.cancel();
    };
    let run = ticker.run(shutdown.clone(), |_| async {
        tokio::time::sleep(P * 100).await;
        finished.store(true, Ordering::SeqCst);
        Ok::<_, String>(())
    });
    tokio::join!(run, stop);
    assert_eq!(t0.elapsed(), P / 2, "the ticker returned at shutdown");
    assert!(!finished.load(Ordering::SeqCst), "the tick was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b1_ticks_follow_leadership_on_the_real_server() {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0xb1, 1);
    let replicas = [
        Replica::start(db.pool(2), key, I),
        Replica::start(db.pool(2), key, I),
    ];
    let counts: [Arc<AtomicUsize>; 2] = Default::default();
    let shutdown = CancellationToken::new();
    let mut tickers = Vec::new();
    for (replica, count) in replicas.iter().zip(&counts) {
        let ticker = LeaderTicker::new("sweep", &replica.elector, Duration::from_millis(20));
        let (count, shutdown) = (count.clone(), shutdown.clone());
        tickers.push(tokio::spawn(async move {
            ticker
                .run(shutdown, |term| {
                    assert!(term.is_leader());
                    count.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, String>(()) }
                })
                .await
        }));
    }
    let first = one_leader(&replicas, 10 * I).await;
    wait_for(10 * I, || counts[first].load(Ordering::SeqCst) >= 3)
        .await
        .expect("the leader ticks");
    assert_eq!(
        counts[1 - first].load(Ordering::SeqCst),
        0,
        "a standby never ticks"
    );

    terminate_holder(&db, key).await;
    wait_for(3 * I, || !replicas[first].elector.is_leader())
        .await
        .expect("the old leader is demoted within 2·I and a half");
    // Either replica may win the free lock; the ticks follow whichever does.
    let next = one_leader(&replicas, 10 * I).await;
    let at_takeover = counts[next].load(Ordering::SeqCst);
    wait_for(10 * I, || {
        counts[next].load(Ordering::SeqCst) >= at_takeover + 3
    })
    .await
    .expect("the new leader ticks");
    let standby_count = counts[1 - next].load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await; // ten periods
    if leaders(&replicas) == [next] {
        assert_eq!(
            counts[1 - next].load(Ordering::SeqCst),
            standby_count,
            "the standby does not tick"
        );
    }
    shutdown.cancel();
    for ticker in tickers {
        ticker.await.unwrap();
    }
    for replica in replicas {
        replica.stop().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// B2: the while-leader loop.

/// A loop body for the B2 tests: counts starts, marks itself running, and runs until its term
/// ends (or returns at once when `returns_early`).
#[derive(Clone, Default)]
struct Body {
    starts: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
    saw_token: Arc<AtomicUsize>,
}

struct Running(Arc<AtomicBool>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
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

#[tokio::test(start_paused = true)]
async fn b2_the_loop_gets_each_term_is_stopped_at_its_end_and_restarts_in_the_next() {
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

#[tokio::test(start_paused = true)]
async fn b2_a_loop_whose_start_panics_is_caught_fails_the_probe_and_starts_again_next_term() {
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
async fn b2_a_loop_that_returns_early_restarts_only_in_a_later_term() {
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
async fn b2_stop_grace_lets_the_loop_finish_after_its_term_ends() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b2_the_loop_stops_with_a_terminated_leader_and_restarts_on_the_new_one() {
    let _serial = serial();
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

// ---------------------------------------------------------------------------------------------
// B3: probes and readiness.

#[tokio::test(start_paused = true)]
async fn b3_a_tickers_probe_follows_the_state_table_through_a_demotion() {
    let (elector, control) = Elector::manual();
    let shutdown = CancellationToken::new();
    let readiness = Readiness::new();
    let probe = readiness.probe("sweep");
    probe.set_boot(Err("boot sweep pending"));
    assert_eq!(readiness.check().status_code(), 503, "the boot state");

    let fail = Arc::new(AtomicBool::new(false));
    let ticker = LeaderTicker::new("sweep", &elector, P)
        .probe(&probe)
        .tick_at_start(false);
    let task = tokio::spawn({
        let (shutdown, fail) = (shutdown.clone(), fail.clone());
        async move {
            ticker
                .run(shutdown, move |_| {
                    let fail = fail.load(Ordering::SeqCst);
                    async move { if fail { Err("disk full") } else { Ok(()) } }
                })
                .await
        }
    });
    // Before the first tick: boot state.
    tokio::time::sleep(P / 2).await;
    assert_eq!(
        probe.status(),
        ProbeStatus::Fail("boot sweep pending".into())
    );
    // Standby tick: pass.
    tokio::time::sleep(P).await;
    assert_eq!(probe.status(), ProbeStatus::Pass);

    control.promote();
    fail.store(true, Ordering::SeqCst);
    tokio::time::sleep(P).await;
    assert_eq!(
        probe.status(),
        ProbeStatus::Fail("disk full".into()),
        "leader, failed"
    );
    let report = readiness.check();
    assert_eq!(report.status_code(), 503);
    assert_eq!(report.body(), "not ready\nsweep: disk full\n");
    tokio::time::sleep(P).await;
    assert!(!probe.status().is_pass(), "until a later success");
    fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(P).await;
    assert_eq!(probe.status(), ProbeStatus::Pass, "leader, succeeded");

    fail.store(true, Ordering::SeqCst);
    tokio::time::sleep(P).await;
    assert!(!probe.status().is_pass());
    control.demote();
    tokio::time::sleep(P).await;
    assert_eq!(
        probe.status(),
        ProbeStatus::Pass,
        "cleared on the first standby tick"
    );
    assert_eq!(readiness.check().status_code(), 200);
    shutdown.cancel();
    task.await.unwrap();
}

#[test]
fn b3_readiness_renders_a_status_and_names_the_failing_loops() {
    let readiness = Readiness::new();
    let a = readiness.probe("invitations-expire");
    let b = readiness.probe("approvals-expire");
    readiness.add(&Probe::new("actions-timeout"));
    let report = readiness.check();
    assert!(report.is_ready());
    assert_eq!(
        (report.status_code(), report.body().as_str()),
        (200, "ok\n")
    );
    assert_eq!(report.probe_count(), 3);

    a.record(TickOutcome::Failed("timeout\nexpired".into()));
    b.record(TickOutcome::Failed("deadlock detected".into()));
    let report = readiness.check();
    assert_eq!(report.status_code(), 503);
    assert_eq!(
        report.body(),
        "not ready\ninvitations-expire: timeout expired\napprovals-expire: deadlock detected\n"
    );
    let names: Vec<_> = report.failing().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["invitations-expire", "approvals-expire"]);
    a.record(TickOutcome::Standby);
    b.record(TickOutcome::Succeeded);
    assert!(readiness.check().is_ready());
}

// ---------------------------------------------------------------------------------------------
// B4: gates.

#[tokio::test(start_paused = true)]
async fn b4_a_gate_without_an_elector_stays_open_and_runs_what_it_gates() {
    let gate = Gate::new(None);
    assert!(gate.is_open());
    assert!(gate.elector().is_none());
    assert_eq!(gate.term().end(), None);
    assert_eq!(
        gate.do_work(|_| async { Ok::<_, ()>(7) }).await,
        Ok(Some(7))
    );

    let shutdown = CancellationToken::new();
    let n = AtomicUsize::new(0);
    LeaderTicker::new("single-replica", Gate::open(), P)
        .run(shutdown.clone(), |_| {
            if n.fetch_add(1, Ordering::SeqCst) == 2 {
                shutdown.cancel();
            }
            async { Ok::<_, String>(()) }
        })
        .await;
    assert_eq!(n.load(Ordering::SeqCst), 3);
    assert!(gate.is_open(), "still open, long after");
}

#[tokio::test]
async fn b4_a_gate_on_an_elector_is_open_only_on_the_leader() {
    let (elector, control) = Elector::manual();
    let gate = Gate::from(&elector);
    assert!(!gate.is_open());
    assert_eq!(gate.term().end(), Some(TermEnd::NotLeader));
    assert_eq!(gate.do_work(|_| async { Ok::<_, ()>(1) }).await, Ok(None));
    let term = control.promote();
    assert!(gate.is_open());
    assert_eq!(
        gate.do_work(|_| async { Ok::<_, ()>(1) }).await,
        Ok(Some(1))
    );
    let parent = CancellationToken::new();
    let linked = gate.term_with(&parent);
    control.demote();
    assert!(!gate.is_open());
    assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
    assert_eq!(linked.end(), Some(TermEnd::LeadershipLost));
}

// ---------------------------------------------------------------------------------------------
// B5: the supervisor.

fn fast_policy() -> RestartPolicy {
    RestartPolicy::new()
        .backoff(Duration::from_millis(100), Duration::from_millis(1000))
        .budget(4, Duration::from_secs(60))
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
                let (ticker, ticks) = (ticker.clone(), ticks.clone());
                async move {
                    ticker
                        .run(token, move |_| {
                            ticks.fetch_add(1, Ordering::SeqCst);
                            async { Ok::<_, String>(()) }
                        })
                        .await
                }
            }
        })
}

#[tokio::test(start_paused = true)]
async fn b5_a_failed_worker_restarts_with_exponential_backoff() {
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
async fn b5_a_worker_past_its_budget_stops_and_the_probe_names_it() {
    let capture = Capture::default();
    let _log = capture.install();
    let readiness = Readiness::new();
    let attempts = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(false));
    let supervisor = Supervisor::new()
        .restart_policy(fast_policy())
        .worker("doomed", {
            let attempts = attempts.clone();
            move |_token| {
                attempts.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>("schema mismatch") }
            }
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
    readiness.add(&supervisor.probe());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        5,
        "the first run and 4 restarts"
    );
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
    shutdown.cancel();
    task.await.unwrap();
    assert!(!healthy.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn b5_a_panicking_worker_is_logged_and_restarted() {
    let capture = Capture::default();
    let _log = capture.install();
    let attempts = Arc::new(AtomicUsize::new(0));
    let supervisor = Supervisor::new()
        .restart_policy(fast_policy())
        .worker("crashy", {
            let attempts = attempts.clone();
            move |token: CancellationToken| {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        panic!("unwrap on None");
                    }
                    token.cancelled().await;
                }
            }
        });
    let probe = supervisor.probe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "restarted after the panic"
    );
    assert!(probe.status().is_pass());
    let panicked = capture.events("worker panicked");
    assert_eq!(panicked.len(), 1);
    assert_eq!(panicked[0].level, tracing::Level::ERROR);
    assert_eq!(panicked[0].field("worker"), "crashy");
    assert_eq!(panicked[0].field("panic"), "unwrap on None");
    assert!(!panicked[0].field("backtrace").is_empty());
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn b5_a_worker_whose_start_panics_is_restarted_within_its_budget_then_given_up() {
    let capture = Capture::default();
    let _log = capture.install();
    let attempts = Arc::new(AtomicUsize::new(0));
    let supervisor = Supervisor::new()
        .restart_policy(fast_policy())
        .worker("misconfigured", {
            let attempts = attempts.clone();
            move |token: CancellationToken| {
                // The synchronous part of the start, before any future exists.
                attempts.fetch_add(1, Ordering::SeqCst);
                let batch: u32 = "ten".parse().expect("SWEEP_BATCH is not a number");
                async move {
                    for _ in 0..batch {
                        token.cancelled().await;
                    }
                }
            }
        });
    let probe = supervisor.probe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        5,
        "the first start and 4 restarts"
    );
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
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn b5_a_probe_taken_before_probe_name_is_renamed_and_still_reports() {
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
async fn b5_shutdown_cancels_every_worker_and_waits_for_them() {
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
async fn b5_a_worker_stuck_at_shutdown_is_aborted_after_the_timeout() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b5_the_supervisor_runs_the_election_and_releases_the_lock_at_shutdown() {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0xb5, 1);
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .build()
        .unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = LeaderTicker::new("sweep", &elector, Duration::from_millis(20));
    let supervisor = supervise_election_and_sweep(&elector, ticker, &ticks);
    let probe = supervisor.probe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
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

// ---------------------------------------------------------------------------------------------
// B6: the launchers run unchanged on a local elector.

#[tokio::test(start_paused = true)]
async fn b6_the_launchers_and_the_supervisor_run_on_an_always_leader_elector() {
    let elector = Elector::always_leader();
    let term = elector.term();
    let ticks = Arc::new(AtomicUsize::new(0));
    let loops = Arc::new(AtomicUsize::new(0));
    let ticker = LeaderTicker::new("sweep", &elector, P);
    let launcher = WhileLeader::new("outbox", &elector);
    let supervisor = supervise_election_and_sweep(&elector, ticker, &ticks).worker("outbox", {
        let loops = loops.clone();
        move |token| {
            let (launcher, loops) = (launcher.clone(), loops.clone());
            async move {
                launcher
                    .run(token, move |term| {
                        loops.fetch_add(1, Ordering::SeqCst);
                        async move {
                            term.cancelled().await;
                            Ok::<_, String>(())
                        }
                    })
                    .await
            }
        }
    });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    tokio::time::sleep(P * 5 / 2).await;
    assert_eq!(ticks.load(Ordering::SeqCst), 3);
    assert_eq!(loops.load(Ordering::SeqCst), 1);
    shutdown.cancel();
    task.await.unwrap();
    assert_eq!(
        term.end(),
        Some(TermEnd::Shutdown),
        "the supervised run shut down"
    );
}
