//! Drain: a graceful handover ends the term first, then waits for the work still running on
//! the old leader (up to the drain timeout) before it unlocks, so the next leader's work starts
//! after the old leader's has finished, as the server's clock shows; work still running at the
//! limit is named in a WARN line.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::handover::{a_leads_b_stands_by, write, writes, writes_table};
use common::*;
use pg_elector::background::{LeaderTicker, Supervisor, WhileLeader};
use pg_elector::{Elector, LockKey};
use tokio_util::sync::CancellationToken;

/// A tick still writing 300 ms into the shutdown lands before the next leader's first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_writing_300_ms_into_the_shutdown_lands_first() {
    let _timing = timing();
    let db = fresh_db().await;
    writes_table(&db).await;
    let key = LockKey::new(0xd7, 1);
    let pool = db.pool(4);
    let (a, b) = a_leads_b_stands_by(&db, key).await;

    // a's tick is running when the shutdown begins, and writes 300 ms later (more than one
    // interval, in which b would otherwise have taken over).
    let started = tokio::sync::Notify::new();
    let tick = a.elector.do_work(|_term| async {
        started.notify_one();
        // The term ends at the shutdown; this tick does not look, and writes anyway.
        tokio::time::sleep(Duration::from_millis(300)).await;
        write(&pool, "a").await;
        Ok::<_, String>(())
    });
    let shutdown = async {
        started.notified().await;
        a.shutdown.cancel();
    };
    // b writes as soon as it leads.
    let b_writes = async {
        let term = b.elector.wait_for_leadership().await;
        assert!(term.is_leader());
        write(&pool, "b").await;
    };
    let (outcome, (), ()) = tokio::join!(tick, shutdown, b_writes);
    assert_eq!(outcome, Ok(None), "the tick's term ended while it ran");
    a.task.await.unwrap().unwrap();

    let rows = writes(&db).await;
    let order: Vec<&str> = rows.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        order,
        ["a", "b"],
        "the old leader's write, then the new leader's"
    );
    eprintln!(
        "a wrote {:?} before b",
        rows[1].1.duration_since(rows[0].1).unwrap()
    );
    b.stop().await.unwrap();
}

/// A while-leader loop finishing in its stop grace holds the unlock, and writes before the next
/// leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_finishing_in_its_stop_grace_holds_the_unlock() {
    let _timing = timing();
    let db = fresh_db().await;
    writes_table(&db).await;
    let key = LockKey::new(0xd7, 3);
    let pool = db.pool(4);
    let (a, b) = a_leads_b_stands_by(&db, key).await;

    // A loop that, when its term ends, finishes up: one last write 2·I later, within its
    // grace. Without the drain, b would lead within I of the shutdown and write first.
    let started = Arc::new(tokio::sync::Notify::new());
    let launcher = CancellationToken::new();
    let looping = tokio::spawn({
        let flusher = WhileLeader::new("flusher", &a.elector).stop_grace(Duration::from_secs(1));
        let (launcher, pool, started) = (launcher.clone(), pool.clone(), started.clone());
        async move {
            flusher
                .run(launcher, move |term| {
                    let (pool, started) = (pool.clone(), started.clone());
                    async move {
                        started.notify_one();
                        term.cancelled().await;
                        tokio::time::sleep(2 * I).await;
                        write(&pool, "a").await;
                        Ok::<_, String>(())
                    }
                })
                .await
        }
    });
    started.notified().await;
    let began = Instant::now();
    a.shutdown.cancel();
    let b_writes = async {
        let term = b.elector.wait_for_leadership().await;
        assert!(term.is_leader());
        write(&pool, "b").await;
        began.elapsed()
    };
    let (run, b_wrote) = tokio::join!(a.task, b_writes);
    run.unwrap().unwrap();
    let rows = writes(&db).await;
    let order: Vec<&str> = rows.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        order,
        ["a", "b"],
        "the loop's last write, then the new leader's first"
    );
    assert!(
        rows[0].1 < rows[1].1,
        "by the server's clock: {:?} then {:?}",
        rows[0].1,
        rows[1].1
    );
    assert!(
        b_wrote >= 2 * I,
        "b wrote {b_wrote:?} after the shutdown began, before the loop could have finished"
    );
    eprintln!(
        "b wrote {b_wrote:?} after the shutdown began, {:?} after the loop's last write",
        rows[1].1.duration_since(rows[0].1).unwrap()
    );
    launcher.cancel();
    looping.await.unwrap();
    b.stop().await.unwrap();
}

/// A replica at `I` whose events go to the returned capture, with `drain` as its drain timeout
/// (the default when `None`), once it leads (within 3·I).
async fn captured_leader(db: &TestDb, key: LockKey, drain: Option<Duration>) -> (Replica, Capture) {
    let capture = Capture::default();
    let mut builder = Elector::builder(db.pool(2), key).check_interval(I);
    if let Some(drain) = drain {
        builder = builder.drain_timeout(drain);
    }
    let elector = builder.build().unwrap();
    let replica = Replica::run_captured(elector.clone(), &capture);
    wait_for(3 * I, || elector.is_leader())
        .await
        .expect("leads");
    (replica, capture)
}

/// Work still running at the limit is named, and the lock is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_running_at_the_limit_is_named_and_the_lock_given_up() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xd7, 2);
    let (replica, capture) = captured_leader(&db, key, Some(I)).await;
    let elector = replica.elector.clone();
    // A ticker whose tick outlives any drain.
    let ticker = LeaderTicker::new("slow-archive", &elector, Duration::from_secs(60));
    let ticking = tokio::spawn({
        let ticker = ticker.clone();
        async move {
            ticker
                .run(CancellationToken::new(), |_term| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<_, String>(())
                })
                .await
        }
    });
    tokio::time::sleep(I / 4).await;
    let began = std::time::Instant::now();
    replica.shutdown.cancel();
    tokio::time::timeout(I + I / 2 + Duration::from_secs(2), replica.task)
        .await
        .expect("run returns after the drain timeout and the unlock")
        .unwrap()
        .unwrap();
    let took = began.elapsed();
    assert!(took >= I, "it waited for the drain timeout: {took:?}");
    let warned = capture.events("work still running at the drain timeout");
    assert_eq!(warned.len(), 1);
    assert!(
        warned[0].field("running").contains("slow-archive"),
        "names the loop: {:?}",
        warned[0]
    );
    let admin = db.connect().await.unwrap();
    assert!(holders(&admin, key).await.is_empty(), "unlocked");
    ticking.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_defaults_to_one_check_interval() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xd7, 4);
    let (replica, capture) = captured_leader(&db, key, None).await;
    let elector = replica.elector.clone();
    // A tick that outlives any drain of a few intervals.
    let started = Arc::new(tokio::sync::Notify::new());
    let tick = tokio::spawn({
        let (elector, started) = (elector.clone(), started.clone());
        async move {
            elector
                .do_work(|_term| async move {
                    started.notify_one();
                    tokio::time::sleep(10 * I).await;
                    Ok::<_, String>(())
                })
                .await
        }
    });
    started.notified().await;
    let began = Instant::now();
    replica.shutdown.cancel();
    replica.task.await.unwrap().unwrap();
    let took = began.elapsed();
    let warned = capture.events("work still running at the drain timeout");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].field("drain_timeout"), format!("{I:?}"));
    assert!(warned[0].field("running").contains("do_work"), "{warned:?}");
    // The drain (I), then one unlock round trip: a whole interval is ample for that query.
    assert!(
        took >= I && took < 2 * I,
        "run returned {took:?} after the shutdown began; the default drain is one interval, {I:?}"
    );
    let admin = db.connect().await.unwrap();
    assert!(holders(&admin, key).await.is_empty(), "unlocked");
    assert_eq!(tick.await.unwrap(), Ok(None), "the tick's term ended");
    eprintln!("default drain: run returned {took:?} after the shutdown began");
}

/// An elector of the supervised handovers: fast takeover at `I`, a drain timeout of 2 s.
fn fast_pair_elector(db: &TestDb, key: LockKey, name: &str) -> Elector {
    Elector::builder(db.pool(2), key)
        .check_interval(I)
        .identity(name)
        .fast_takeover(true)
        .drain_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The statement the old leader's work has in flight at the shutdown: its row is stamped by the
/// server's clock after 300 ms, when it commits.
const SLOW_WRITE: &str =
    "INSERT INTO writes (replica, at) SELECT 'a', clock_timestamp() FROM pg_sleep(0.3)";

/// How many slow writes the old leader's work has started: the test cancels 50 ms after a start
/// it saw happen, never on a start counted before it looked.
type Starts = Arc<tokio::sync::watch::Sender<u32>>;

/// One step of the old leader's work, on `client`: counts a start (in `started`), then runs the
/// [`SLOW_WRITE`].
async fn slow_write(client: &tokio_postgres::Client, started: &Starts) -> Result<(), String> {
    started.send_modify(|n| *n += 1);
    client
        .execute(SLOW_WRITE, &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The quick start's wiring with fast takeover: the election and the leader's work as workers
/// of one supervisor (`base`), whose shutdown cancels both at once. Starts `a`'s supervisor
/// (built by `with_work` on top of its election), waits until `a` leads and `b` (fast takeover,
/// under a supervisor of its own) waits for the lock, then for the next start of `a`'s slow
/// write, cancels `a`'s supervisor 50 ms into it, and lets `b` write as soon as it leads.
/// Asserts that `a`'s write in flight at the cancel committed, and before `b`'s first write by
/// the server's clock.
async fn supervised_handover(
    key: LockKey,
    base: Supervisor,
    with_work: impl FnOnce(Supervisor, &Elector, deadpool_postgres::Pool, Starts) -> Supervisor,
) {
    let _timing = timing();
    let db = fresh_db().await;
    writes_table(&db).await;
    let admin = db.connect().await.unwrap();
    // Each replica writes through a pool of its own, as two processes would.
    let (a_pool, b_pool) = (db.pool(4), db.pool(2));
    let a = fast_pair_elector(&db, key, "a");
    let started: Starts = Arc::new(tokio::sync::watch::Sender::new(0));
    let a_shutdown = CancellationToken::new();
    let a_supervisor = with_work(base.election(&a), &a, a_pool, started.clone());
    let a_run = tokio::spawn(a_supervisor.run(a_shutdown.clone()));
    wait_for(10 * I, || a.is_leader()).await.expect("a leads");
    let b = fast_pair_elector(&db, key, "b");
    let b_shutdown = CancellationToken::new();
    let b_run = tokio::spawn(Supervisor::new().election(&b).run(b_shutdown.clone()));
    session_waiting(&admin, key, "b", 10 * I).await;

    let mut starts = started.subscribe();
    starts.borrow_and_update();
    tokio::time::timeout(10 * I, starts.changed())
        .await
        .expect("a's work starts a slow write within 10·I")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = Instant::now();
    let cancelled_at = SystemTime::now();
    a_shutdown.cancel();
    let term = b.wait_for_leadership().await;
    assert!(term.is_leader());
    write(&b_pool, "b").await;
    let b_led = began.elapsed();
    a_run.await.unwrap();
    let rows = writes(&db).await;
    let order: Vec<&str> = rows.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        order.last(),
        Some(&"b"),
        "every write of a's term, then b's first: {rows:?}"
    );
    let a_last = rows.iter().rev().find(|(r, _)| r == "a").map(|(_, at)| *at);
    assert!(
        a_last.is_some_and(|at| at > cancelled_at),
        "a's write in flight at the cancel (started 50 ms before it) committed after it: \
         {rows:?}, cancelled at {cancelled_at:?}"
    );
    eprintln!(
        "b led {b_led:?} after a's supervisor was cancelled, {:?} after a's last write",
        rows[rows.len() - 1]
            .1
            .duration_since(rows[rows.len() - 2].1)
            .unwrap()
    );
    b_shutdown.cancel();
    b_run.await.unwrap();
}

/// A supervised tick in flight at shutdown lands before the next leader's first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervised_tick_in_flight_at_shutdown_lands_first() {
    supervised_handover(LockKey::new(0xd7, 10), Supervisor::new(), ticking_writer).await;
}

/// A supervisor's shutdown timeout shorter than the elector's drain does not cut the drain: the
/// tick in flight still lands before the next leader's first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_shutdown_timeout_still_drains_the_tick() {
    let hasty = Supervisor::new().shutdown_timeout(Duration::from_millis(10));
    supervised_handover(LockKey::new(0xd7, 12), hasty, ticking_writer).await;
}

/// A ticker on `a` whose every tick is one slow write.
fn ticking_writer(
    supervisor: Supervisor,
    a: &Elector,
    pool: deadpool_postgres::Pool,
    started: Starts,
) -> Supervisor {
    let sweep = LeaderTicker::new("sweep", a, I);
    supervisor.ticker(sweep, move |_term| {
        let (pool, started) = (pool.clone(), started.clone());
        async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            slow_write(&client, &started).await?;
            Ok::<_, String>(())
        }
    })
}

/// A supervised while-leader loop mid-statement at shutdown lands before the next leader's first
/// write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervised_loop_mid_statement_at_shutdown_lands_first() {
    let key = LockKey::new(0xd7, 11);
    supervised_handover(key, Supervisor::new(), |supervisor, a, pool, started| {
        let writer = WhileLeader::new("writer", a);
        supervisor.while_leader(writer, move |term| {
            let (pool, started) = (pool.clone(), started.clone());
            async move {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                // One slow write after another until the term ends.
                while term.is_leader() {
                    slow_write(&client, &started).await?;
                }
                Ok::<_, String>(())
            }
        })
    })
    .await;
}
