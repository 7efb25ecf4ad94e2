//! B1: the leader ticker. A named tick every period on the leader only: its cadence, missed
//! ticks that do not burst, failed and panicking ticks, and shutdown mid-tick, on paused time
//! with a manual or always-leader elector; and ticks that follow leadership on the real server.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::background::P;
use common::capture::Capture;
use common::*;
use pg_elector::background::{LeaderTicker, Probe, ProbeStatus};
use pg_elector::{Elector, LockKey};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod b1 {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_once_per_period_on_the_leader_only() {
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
    async fn missed_ticks_do_not_burst() {
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
    async fn tick_at_start_false_waits_one_period() {
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
        assert_eq!(
            *first.lock().unwrap(),
            Some(P),
            "the first tick waits one period"
        );
    }

    /// A failed tick logs WARN with the loop name, and the ticker goes on.
    #[tokio::test(start_paused = true)]
    async fn a_failed_tick_logs_warn_with_its_loop_name_and_goes_on() {
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

    /// A panicking tick is caught, logged with its backtrace, and counts as a failed tick.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_tick_is_caught_logged_and_counted_as_failed() {
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
        assert!(
            e.field("location").contains("tests/suite/ticker.rs"),
            "{e:?}"
        );
        assert!(
            e.field("backtrace").contains("b1::a_panicking_tick"),
            "the backtrace shows the panic site: {}",
            e.field("backtrace")
        );
    }

    /// At shutdown no new tick starts, and the tick in flight runs on to its end (here, a local
    /// elector's drain timeout is 5 s): a tick that ends within it is not cut off.
    #[tokio::test(start_paused = true)]
    async fn at_shutdown_the_tick_in_flight_finishes_and_no_other_starts() {
        let elector = Elector::always_leader();
        let shutdown = CancellationToken::new();
        let ticks = AtomicUsize::new(0);
        let finished = AtomicBool::new(false);
        let ticker = LeaderTicker::new("short", &elector, P);
        let t0 = Instant::now();
        let stop = async {
            tokio::time::sleep(P / 2).await;
            shutdown.cancel();
        };
        let run = ticker.run(shutdown.clone(), |_| async {
            ticks.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(3 * P).await;
            finished.store(true, Ordering::SeqCst);
            Ok::<_, String>(())
        });
        tokio::join!(run, stop);
        assert_eq!(
            t0.elapsed(),
            3 * P,
            "the ticker returned when its tick ended"
        );
        assert!(finished.load(Ordering::SeqCst), "the tick ran to its end");
        assert_eq!(
            ticks.load(Ordering::SeqCst),
            1,
            "no tick after the shutdown"
        );
    }

    /// A tick that outlives the drain timeout after the shutdown is dropped then.
    /// A tick still running past the drain timeout after shutdown is dropped.
    #[tokio::test(start_paused = true)]
    async fn a_tick_past_the_drain_timeout_after_shutdown_is_dropped() {
        let elector = Elector::always_leader();
        let drain = elector.drain_timeout();
        assert_eq!(
            drain,
            pg_elector::DEFAULT_CHECK_INTERVAL,
            "a local elector's"
        );
        let shutdown = CancellationToken::new();
        let finished = AtomicBool::new(false);
        let ticker = LeaderTicker::new("long", &elector, P);
        let t0 = Instant::now();
        let stop = async {
            tokio::time::sleep(P / 2).await;
            shutdown.cancel();
        };
        let run = ticker.run(shutdown.clone(), |_| async {
            tokio::time::sleep(drain * 10).await;
            finished.store(true, Ordering::SeqCst);
            Ok::<_, String>(())
        });
        tokio::join!(run, stop);
        assert_eq!(
            t0.elapsed(),
            P / 2 + drain,
            "the ticker returned at the drain timeout"
        );
        assert!(!finished.load(Ordering::SeqCst), "the tick was dropped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ticks_follow_leadership_on_the_real_server() {
        let _timing = timing();
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
}
