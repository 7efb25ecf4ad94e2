//! Shards (F6.6): the background plane per shard (a loop per owned shard, a per-shard ticker,
//! readiness per shard), the owned set as a subscription, and the group's metrics.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::shards::{Member, balanced, shares};
use common::{I, fresh_db, timing, wait_for};
use pg_elector::background::{LeaderTicker, Readiness};
use pg_elector::shards::{ShardLoops, Shards};

/// (member, shard, started, stopped) of every loop run.
type Runs = Arc<Mutex<Vec<(usize, u32, Instant, Option<Instant>)>>>;

/// Runs a `ShardLoops` for member `who`, recording each loop's start and stop in `runs`; the
/// loop on `failing` returns an error at once.
fn spawn_loops(
    who: usize,
    shards: &Shards,
    runs: &Runs,
    readiness: &Readiness,
    failing: Option<u32>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let loops = ShardLoops::new("sweep", shards).readiness(readiness);
    let (runs, shutdown) = (runs.clone(), shutdown.clone());
    tokio::spawn(async move {
        loops
            .run(shutdown, move |shard, term| {
                let runs = runs.clone();
                async move {
                    if Some(shard.index()) == failing {
                        return Err("the tenant table is gone".to_owned());
                    }
                    let at = {
                        let mut runs = runs.lock().unwrap();
                        runs.push((who, shard.index(), Instant::now(), None));
                        runs.len() - 1
                    };
                    term.cancelled().await;
                    // A little work after the end, which the move waits for.
                    tokio::time::sleep(I / 4).await;
                    runs.lock().unwrap()[at].3 = Some(Instant::now());
                    Ok(())
                }
            })
            .await
    })
}

mod f6_6 {
    use super::*;

    /// One loop per owned shard: a's loops of the shards that move to b have returned before
    /// b's loops of them start, and each member runs exactly the loops of what it owns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loop_runs_per_owned_shard_and_stops_before_it_moves() {
        let _timing = timing();
        let db = fresh_db().await;
        let count = 8;
        let runs: Runs = Arc::default();
        let readiness = Readiness::new();
        let a = Member::start(db.pool(2), "loops", count, I);
        let loops_a = spawn_loops(0, &a.shards, &runs, &readiness, None, &a.shutdown);
        let running = |who: usize| {
            let runs = runs.lock().unwrap();
            let mut s: Vec<u32> = runs
                .iter()
                .filter(|r| r.0 == who && r.3.is_none())
                .map(|r| r.1)
                .collect();
            s.sort();
            s
        };
        wait_for(10 * I, || running(0).len() == count as usize)
            .await
            .expect("a runs a loop on each of its 8 shards");
        let b = Member::start(db.pool(2), "loops", count, I);
        let loops_b = spawn_loops(1, &b.shards, &runs, &readiness, None, &b.shutdown);
        let two = [&a.shards, &b.shards];
        wait_for(10 * I, || {
            balanced(&two, count) && running(1).len() == b.shards.owned().len()
        })
        .await
        .unwrap_or_else(|| panic!("balanced with b's loops running: {:?}", shares(&two)));
        let owned = |s: &Shards| s.owned().iter().map(|id| id.index()).collect::<Vec<_>>();
        wait_for(I, || running(0) == owned(&a.shards))
            .await
            .expect("a runs exactly the loops of what it owns");
        assert_eq!(running(1), owned(&b.shards));
        let runs_now = runs.lock().unwrap().clone();
        for &(_, shard, started, _) in runs_now.iter().filter(|r| r.0 == 1) {
            let a_run = runs_now
                .iter()
                .find(|r| r.0 == 0 && r.1 == shard)
                .expect("a ran the shard before");
            let stopped = a_run.3.expect("a's loop of a moved shard returned");
            assert!(
                stopped <= started,
                "shard {shard}: b's loop started before a's returned"
            );
        }
        b.stop().await.unwrap();
        a.stop().await.unwrap();
        loops_a.await.unwrap();
        loops_b.await.unwrap();
        assert!(
            runs.lock().unwrap().iter().all(|r| r.3.is_some()),
            "every loop returned"
        );
        assert!(readiness.check().is_ready());
    }

    /// A shard whose loop fails fails `/readyz` on the member that owns it only; the others
    /// stay ready.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_shard_fails_only_its_owners_readiness() {
        let _timing = timing();
        let db = fresh_db().await;
        let count = 4;
        let runs: Runs = Arc::default();
        let (ready_a, ready_b) = (Readiness::new(), Readiness::new());
        let a = Member::start(db.pool(2), "ready", count, I);
        let loops_a = spawn_loops(0, &a.shards, &runs, &ready_a, Some(2), &a.shutdown);
        wait_for(10 * I, || !ready_a.check().is_ready())
            .await
            .unwrap_or_else(|| panic!("a's shard 2 fails its probe: {}", ready_a.check().body()));
        let failing = ready_a.check();
        assert_eq!(failing.failing().len(), 1, "{}", failing.body());
        assert_eq!(failing.failing()[0].name, "sweep/2");
        assert_eq!(failing.probe_count(), count as usize);
        let b = Member::start(db.pool(2), "ready", count, I);
        let loops_b = spawn_loops(1, &b.shards, &runs, &ready_b, Some(2), &b.shutdown);
        let two = [&a.shards, &b.shards];
        wait_for(10 * I, || balanced(&two, count))
            .await
            .expect("balanced");
        let shard2 = a.shards.shard(2).unwrap();
        let (owner, other) = if a.shards.is_owner(shard2) {
            (&ready_a, &ready_b)
        } else {
            (&ready_b, &ready_a)
        };
        wait_for(2 * I, || {
            !owner.check().is_ready() && other.check().is_ready()
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "only shard 2's owner is not ready: owner {}, other {}",
                owner.check().body(),
                other.check().body()
            )
        });
        b.stop().await.unwrap();
        a.stop().await.unwrap();
        loops_a.await.unwrap();
        loops_b.await.unwrap();
    }

    /// A leader ticker on a shard's elector ticks only while this member owns the shard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ticker_on_a_shard_ticks_while_it_is_owned() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = Member::start(db.pool(2), "ticker", 2, I);
        let ticks: Arc<Mutex<Vec<(u32, bool)>>> = Arc::default();
        let tickers: Vec<_> = a
            .shards
            .all()
            .map(|shard| {
                let ticker = LeaderTicker::new(
                    format!("tick/{shard}"),
                    a.shards.elector(shard).unwrap(),
                    Duration::from_millis(20),
                );
                let (ticks, shards, shutdown) =
                    (ticks.clone(), a.shards.clone(), a.shutdown.clone());
                tokio::spawn(async move {
                    ticker
                        .run(shutdown, move |_term| {
                            let ticks = ticks.clone();
                            let owned = shards.is_owner(shard);
                            async move {
                                ticks.lock().unwrap().push((shard.index(), owned));
                                Ok::<_, String>(())
                            }
                        })
                        .await
                })
            })
            .collect();
        wait_for(10 * I, || a.shards.owned().len() == 2)
            .await
            .expect("a owns both");
        tokio::time::sleep(I).await;
        let b = Member::start(db.pool(2), "ticker", 2, I);
        wait_for(10 * I, || b.shards.owned().len() == 1)
            .await
            .expect("one shard moves");
        let moved = b.shards.owned()[0].index();
        ticks.lock().unwrap().clear();
        tokio::time::sleep(I).await;
        let seen = ticks.lock().unwrap().clone();
        assert!(
            seen.iter().all(|&(_, owned)| owned),
            "every tick ran on an owned shard"
        );
        assert!(
            seen.iter().all(|&(s, _)| s != moved),
            "no tick of the moved shard on a: {seen:?}"
        );
        // 10 periods of 20 ms in I; half of them, for a loaded machine.
        assert!(
            seen.len() >= 5,
            "the kept shard keeps ticking every 20 ms: {} ticks in {I:?}",
            seen.len()
        );
        b.stop().await.unwrap();
        a.stop().await.unwrap();
        for t in tickers {
            t.await.unwrap();
        }
    }

    /// The moves counter adds up: a member that leaves while a moved shard still drains
    /// counts that shard as released, so gained = moved + released once it is gone. (Before,
    /// a shard draining at the leave, or at a lost session, was counted nowhere.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shard_draining_at_the_leave_is_counted_released() {
        let _timing = timing();
        let db = fresh_db().await;
        let registry = prometheus::Registry::new();
        let a = Member::build(
            Shards::builder(db.pool(2), "counted", 2)
                .check_interval(I)
                .drain_timeout(10 * I)
                .registry(&registry),
        );
        wait_for(10 * I, || a.shards.owned().len() == 2)
            .await
            .expect("a owns both");
        let works: Vec<_> = a
            .shards
            .all()
            .map(|shard| {
                let shards = a.shards.clone();
                tokio::spawn(async move {
                    shards
                        .do_work(shard, |_term| async move {
                            tokio::time::sleep(4 * I).await;
                            Ok::<_, ()>(())
                        })
                        .await
                })
            })
            .collect();
        let b = Member::start(db.pool(2), "counted", 2, I);
        wait_for(5 * I, || a.shards.owned().len() == 1)
            .await
            .expect("one shard drains, to move to b");
        a.stop().await.unwrap();
        for w in works {
            let _ = w.await;
        }
        let count = |cause: &str| -> f64 {
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == "pg_elector_shard_moves_total")
                .flat_map(|f| f.get_metric().to_vec())
                .filter(|m| m.get_label().iter().any(|p| p.value() == cause))
                .map(|m| m.get_counter().value())
                .sum()
        };
        let (gained, moved, released) = (count("gained"), count("moved"), count("released"));
        assert_eq!(
            gained,
            moved + released,
            "gained {gained} = moved {moved} + released {released}"
        );
        assert_eq!(gained, 2.0);
        b.stop().await.unwrap();
    }

    /// The owned set, on every change, with the member count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscribers_see_the_owned_set_change() {
        let _timing = timing();
        let db = fresh_db().await;
        let registry = prometheus::Registry::new();
        let a = Member::build(
            Shards::builder(db.pool(2), "watched", 6)
                .check_interval(I)
                .registry(&registry),
        );
        let mut owned = a.shards.subscribe();
        tokio::time::timeout(
            10 * I,
            owned.wait_for(|o| o.owned.len() == 6 && o.members == 1),
        )
        .await
        .expect("a owns all six")
        .unwrap();
        let b = Member::start(db.pool(2), "watched", 6, I);
        tokio::time::timeout(
            10 * I,
            owned.wait_for(|o| o.owned.len() == 3 && o.members == 2),
        )
        .await
        .expect("a is told it owns three of two members' six")
        .unwrap();
        let metric = |name: &str, label: Option<&str>| -> f64 {
            registry
                .gather()
                .iter()
                .filter(|f| f.name() == name)
                .flat_map(|f| f.get_metric().to_vec())
                .filter(|m| label.is_none_or(|l| m.get_label().iter().any(|p| p.value() == l)))
                .map(|m| {
                    if m.get_gauge().value() != 0.0 {
                        m.get_gauge().value()
                    } else {
                        m.get_counter().value()
                    }
                })
                .sum()
        };
        wait_for(2 * I, || b.shards.owned().len() == 3)
            .await
            .expect("b owns the three a gave up");
        wait_for(I, || metric("pg_elector_shards_owned", None) == 3.0)
            .await
            .expect("the gauge says 3");
        assert_eq!(metric("pg_elector_shard_moves_total", Some("gained")), 6.0);
        assert_eq!(metric("pg_elector_shard_moves_total", Some("moved")), 3.0);
        let handle = a.shards.clone();
        b.stop().await.unwrap();
        a.stop().await.unwrap();
        assert_eq!(handle.subscribe().borrow().owned.len(), 0);
    }
}
