//! `Elector::resign(cooldown)`: a leader hands over gracefully (its term ends with `Resigned`,
//! a standby leads within one interval) and does not compete again before its cooldown ends;
//! a standby that resigns returns `false` and sits the cooldown out; no instant has two
//! leaders across a resign; and the local electors (manual, always-leader) resign too.
//!
//! The cooldown runs from the call of `resign`, so a test that takes `called` just before the
//! call knows the cooldown lasts at least until `called + cooldown`, and one that takes
//! `returned` just after it knows the cooldown is over by `returned + cooldown`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::handover::{a_leads_b_stands_by, write, writes, writes_table};
use common::*;
use pg_elector::{Elector, LockKey, TermEnd};
use tokio_util::sync::CancellationToken;

/// Another replica leads within one interval of the lock being freed: a standby tries every
/// I, and its try is one short query. The margin, 150 ms, is for that query's round trip (with
/// a new connection's setup when the pool has none idle, as for a replica whose lock session
/// just left its pool) and for waking two tasks on a loaded two-core machine. Measured at
/// I = 200 ms: on a quiet machine every takeover of 20 runs of this file within 211 ms; with
/// two busy loops holding both cores (12 runs of the four-resign test, 48 takeovers) within
/// 314 ms, where the I/4 margin this had before failed one run in ten (as it once did in CI).
const TAKEOVER: Duration = Duration::from_millis(I.as_millis() as u64 + 150);

/// Samples `elector.is_leader()` every 2 ms until `until`; returns how long after `from` the
/// first sample that saw it leading was taken, if any.
async fn first_lead_before(elector: &Elector, from: Instant, until: Instant) -> Option<Duration> {
    while Instant::now() < until {
        if elector.is_leader() {
            return Some(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// Two replicas on pools of two at interval I, once one of them leads; returns
/// `(leader, standby)`.
async fn two_replicas(db: &TestDb, key: LockKey) -> (Replica, Replica) {
    let mut replicas = vec![
        Replica::start(db.pool(2), key, I),
        Replica::start(db.pool(2), key, I),
    ];
    let leader = one_leader(&replicas, 3 * I).await;
    // One more interval: the standby has had a try refused, and neither is mid-grant.
    tokio::time::sleep(I).await;
    assert_eq!(leaders(&replicas), vec![leader], "the leader is stable");
    let leader = replicas.remove(leader);
    let standby = replicas.remove(0);
    (leader, standby)
}

/// A resigning leader hands over within one interval, and competes again only after its cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_leader_hands_over_within_one_interval() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x2e, 1);
    let (resigner, other) = two_replicas(&db, key).await;
    let term = resigner.elector.term();
    let cooldown = 5 * I;

    let called = Instant::now();
    let gave_up = resigner.elector.resign(cooldown).await;
    let returned = Instant::now();
    assert!(gave_up, "resign on the leader returns true");
    assert_eq!(term.end(), Some(TermEnd::Resigned));
    assert!(!resigner.elector.is_leader());
    // The handover: the term ends, nothing is in flight to drain, one unlock query. Its bound
    // is the drain timeout (I) + the unlock (2 s); with nothing to drain it is one round trip.
    let resign_took = returned - called;
    assert!(resign_took < I, "resign took {resign_took:?}");

    // Resign returns after the unlock, so the standby leads at its next try: within I of the
    // resign, plus the margin (which also covers the resign's own unlock round trip).
    let took = wait_for(TAKEOVER, || other.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("the standby did not lead within {TAKEOVER:?} of the resign"));
    let since_called = called.elapsed();
    assert!(
        since_called <= TAKEOVER,
        "the standby led {since_called:?} after resign was called; bound one interval plus \
         margin, {TAKEOVER:?}"
    );
    assert!(!resigner.elector.is_leader(), "never two leaders");

    // Free the lock for the rest of the cooldown: only the cooldown keeps the resigner out now.
    other.stop().await.unwrap();
    let freed = Instant::now();
    let cooldown_end = called + cooldown;
    // The new leader took at most I + 150 ms, so the lock is free for at least the last 3·I of
    // the cooldown: the resigner, trying every I, skips at least two tries because of it.
    assert!(
        cooldown_end.saturating_duration_since(freed) >= 2 * I,
        "the lock was freed only {:?} before the cooldown ended",
        cooldown_end.saturating_duration_since(freed)
    );
    if let Some(at) = first_lead_before(&resigner.elector, called, cooldown_end).await {
        panic!("the resigner led again {at:?} after resign({cooldown:?}) was called");
    }

    // The cooldown ends at the latest at `returned + cooldown`; the resigner's next try comes
    // within I of that, and the lock is free.
    let deadline = returned + cooldown + TAKEOVER;
    let again = wait_for(deadline.saturating_duration_since(Instant::now()), || {
        resigner.elector.is_leader()
    })
    .await
    .unwrap_or_else(|| {
        panic!("the resigner did not lead again within {TAKEOVER:?} of its cooldown's end")
    });
    let after_cooldown = Instant::now().saturating_duration_since(called + cooldown);
    assert!(resigner.elector.term().is_leader(), "a new term");
    assert_eq!(
        term.end(),
        Some(TermEnd::Resigned),
        "the old term stays ended"
    );
    eprintln!(
        "resign took {resign_took:?}; the standby led {took:?} after it returned; the resigner \
         led again {after_cooldown:?} after its cooldown ended (waited {again:?})"
    );
    resigner.stop().await.unwrap();
}

/// A resign is a graceful handover: a `do_work` call still running when it is asked drains
/// before the unlock, so `resign` returns after it, and its write lands before the next
/// leader's first (by the server's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_waits_for_do_work_in_flight_before_it_unlocks() {
    let _timing = timing();
    let db = fresh_db().await;
    writes_table(&db).await;
    let key = LockKey::new(0x2e, 7);
    let pool = db.pool(4);
    let (a, b) = a_leads_b_stands_by(&db, key).await;
    let term = a.elector.term();

    // The tick writes 2·I after it started; without the drain, b would lead within I of the
    // resign and write first.
    let started = tokio::sync::Notify::new();
    let finished = AtomicBool::new(false);
    let tick = a.elector.do_work(|_term| async {
        started.notify_one();
        tokio::time::sleep(2 * I).await;
        write(&pool, "a").await;
        finished.store(true, Ordering::SeqCst);
        Ok::<_, String>(())
    });
    let resign = async {
        started.notified().await;
        let gave_up = a.elector.resign(10 * I).await;
        (gave_up, finished.load(Ordering::SeqCst))
    };
    let b_writes = async {
        b.elector.wait_for_leadership().await;
        write(&pool, "b").await;
    };
    let (outcome, (gave_up, drained), ()) = tokio::join!(tick, resign, b_writes);
    assert!(gave_up, "resign on the leader returns true");
    assert!(drained, "resign returned only after the tick had finished");
    assert_eq!(outcome, Ok(None), "the tick's term ended while it ran");
    assert_eq!(term.end(), Some(TermEnd::Resigned));

    let rows = writes(&db).await;
    let order: Vec<&str> = rows.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(order, ["a", "b"], "the drained tick's write, then b's");
    assert!(rows[0].1 < rows[1].1);
    eprintln!(
        "b wrote {:?} after the drained tick",
        rows[1].1.duration_since(rows[0].1).unwrap()
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// `resign` on a standby returns false, and keeps it standby until its cooldown ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_on_a_standby_keeps_it_standby_for_the_cooldown() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x2e, 2);
    let (leader, standby) = two_replicas(&db, key).await;
    let cooldown = 4 * I;

    let called = Instant::now();
    let gave_up = standby.elector.resign(cooldown).await;
    let returned = Instant::now();
    assert!(!gave_up, "resign on a standby returns false");
    assert!(leader.elector.is_leader(), "the leader is not affected");

    // A graceful stop frees the lock at once: only the cooldown keeps the standby out now.
    leader.stop().await.unwrap();
    let freed = Instant::now();
    let cooldown_end = called + cooldown;
    // The stop is one unlock; the lock is free for most of the cooldown, over at least two of
    // the standby's tries.
    assert!(cooldown_end.saturating_duration_since(freed) >= 2 * I);
    // The lock stays free while the cooldown lasts: looked at one interval before its end, as
    // a try may come the moment it ends.
    let client = db.connect().await.unwrap();
    let inside = cooldown_end - I;
    if let Some(at) = first_lead_before(&standby.elector, called, inside).await {
        panic!("the standby led {at:?} after resign({cooldown:?}) was called");
    }
    assert_eq!(
        holders(&client, key).await,
        Vec::<i32>::new(),
        "nobody holds the lock {I:?} before the cooldown ends"
    );
    if let Some(at) = first_lead_before(&standby.elector, called, cooldown_end).await {
        panic!("the standby led {at:?} after resign({cooldown:?}) was called");
    }

    // It competes again at its first try after the cooldown, within I of its end.
    let deadline = returned + cooldown + TAKEOVER;
    wait_for(deadline.saturating_duration_since(Instant::now()), || {
        standby.elector.is_leader()
    })
    .await
    .unwrap_or_else(|| {
        panic!("the standby did not lead within {TAKEOVER:?} of its cooldown's end")
    });
    eprintln!(
        "standby resign: led {:?} after its cooldown ended",
        Instant::now().saturating_duration_since(called + cooldown)
    );
    standby.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sample_sees_two_leaders_across_four_resigns() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x2e, 3);
    let (first, second) = two_replicas(&db, key).await;
    let (a, b) = (first.elector.clone(), second.elector.clone());

    // A thread of its own samples both replicas every millisecond, so that the sampling does
    // not wait for the runtime's two workers. Two loads are not one instant, so a sample reads
    // a, b, a, b: a replica that reads leading before and after the other's read led all along
    // in between (a replica's two terms here are at least its cooldown, I, apart, far longer
    // than a sample), so "a, b, a" (or "b, a, b") all leading is a real instant with two
    // leaders, and a thread preempted between two loads cannot fake one.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let (a, b, done) = (a.clone(), b.clone(), done.clone());
        move || {
            let (mut samples, mut both) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let (a1, b1, a2, b2) = (a.is_leader(), b.is_leader(), a.is_leader(), b.is_leader());
                samples += 1;
                if b1 && a2 && (a1 || b2) {
                    both += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (samples, both)
        }
    });

    // Four handovers back and forth, each resign with a cooldown of I: the resigner's cooldown
    // has ended by the time the next handover comes back to it (the other replica first needs
    // to take over, which is its next try, up to I later).
    let mut handovers = Vec::new();
    let (mut leader, mut standby) = (&a, &b);
    for round in 0..4 {
        assert!(leader.is_leader(), "round {round}");
        let returned = {
            assert!(
                leader.resign(I).await,
                "round {round}: resign on the leader"
            );
            Instant::now()
        };
        let took = wait_for(TAKEOVER, || standby.is_leader())
            .await
            .unwrap_or_else(|| panic!("round {round}: no takeover within {TAKEOVER:?}"));
        handovers.push(took);
        // Until the resigner's cooldown is over, so that it may lead in the next round.
        tokio::time::sleep(I.saturating_sub(returned.elapsed())).await;
        std::mem::swap(&mut leader, &mut standby);
    }
    // One more check interval of sampling after the last handover.
    tokio::time::sleep(I).await;
    done.store(true, Ordering::Relaxed);
    let (samples, both) = sampler.join().unwrap();
    eprintln!("two leaders: {both} of {samples} samples; takeovers after resign: {handovers:?}");
    // At least one sample per 5 ms over the ≥ 5·I the test ran, even on a loaded machine.
    assert!(
        samples >= (5 * I).as_millis() as u64 / 5,
        "only {samples} samples"
    );
    assert_eq!(both, 0, "samples that saw two leaders");
    first.stop().await.unwrap();
    second.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_elector_resigns_with_resigned_and_stays_standby() {
    let _timing = timing();
    let (elector, control) = Elector::manual();
    let term = control.promote();
    assert!(elector.is_leader());

    assert!(elector.resign(Duration::ZERO).await, "it led, so true");
    assert_eq!(term.end(), Some(TermEnd::Resigned));
    assert!(!elector.is_leader());
    // A manual elector leads only when promoted by hand, cooldown or not.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!elector.is_leader());
    assert!(!elector.resign(Duration::ZERO).await, "a standby: false");
    assert!(control.promote().is_leader(), "promoted by hand again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_always_leader_leads_again_after_the_cooldown() {
    let _timing = timing();
    let elector = Elector::always_leader();
    // Resign only once `run` is going: it is what leads again after the cooldown. To see when
    // it is going, it starts on a standby with no cooldown left: a resign with a zero cooldown
    // (no `run` yet) demotes, and `run` promotes again as soon as it has subscribed to
    // resigns.
    let first = elector.term();
    assert!(elector.resign(Duration::ZERO).await, "it led, so true");
    assert_eq!(first.end(), Some(TermEnd::Resigned));
    assert!(!elector.is_leader());
    let shutdown = CancellationToken::new();
    let run = elector.spawn(shutdown.clone());
    // A spawned task starts within microseconds on an idle worker; 1 s is room for a loaded
    // machine.
    let term = tokio::time::timeout(Duration::from_secs(1), elector.wait_for_leadership())
        .await
        .expect("run leads at once when no cooldown is left");

    let cooldown = Duration::from_millis(50);
    let called = Instant::now();
    assert!(elector.resign(cooldown).await, "it led, so true");
    assert_eq!(term.end(), Some(TermEnd::Resigned));
    if let Some(at) = first_lead_before(&elector, called, called + cooldown).await {
        panic!("led again {at:?} after resign({cooldown:?})");
    }
    // `run` sleeps until the cooldown's end and promotes: within a timer tick (1 ms) and a
    // wake-up; 1 s is room for a loaded machine.
    wait_for(Duration::from_secs(1), || elector.is_leader())
        .await
        .expect("leads again after the cooldown");
    eprintln!(
        "always-leader: led again {:?} after the cooldown ended",
        called.elapsed().saturating_sub(cooldown)
    );
    let next = elector.term();
    assert!(next.is_leader(), "a new term");
    assert_eq!(
        term.end(),
        Some(TermEnd::Resigned),
        "the old one stays ended"
    );
    assert_ne!(next.epoch(), term.epoch());
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(next.end(), Some(TermEnd::Shutdown));
}

/// `resign` promises a standby "for at least `cooldown`". An always-leader elector whose `run`
/// starts during the cooldown (here: resigned, then `run` spawned; the same happens when
/// `resign` is called right after `spawn`, before the spawned task first runs) must wait for
/// the cooldown's end like the PostgreSQL election does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_leader_run_in_a_cooldown_waits_for_its_end() {
    let _timing = timing();
    let elector = Elector::always_leader();
    let cooldown = Duration::from_millis(500);
    let called = Instant::now();
    assert!(elector.resign(cooldown).await, "it led, so true");
    assert!(!elector.is_leader());
    let shutdown = CancellationToken::new();
    let run = elector.spawn(shutdown.clone());
    if let Some(at) = first_lead_before(&elector, called, called + cooldown).await {
        panic!(
            "led again {at:?} after resign({cooldown:?}): run, started during the cooldown, \
             promoted at once"
        );
    }
    wait_for(Duration::from_secs(1), || elector.is_leader())
        .await
        .expect("leads after the cooldown");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// A standby that resigns while its try is on the wire must not start a term during the
/// cooldown: `resign` returned `false` and promised a standby for `cooldown`. The answers to
/// the standby come through a proxy 150 ms late (less than I, so the grant needs no second
/// check and the leader's checks pass), which holds its first try on the wire while it
/// resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_resigning_mid_try_does_not_lead_in_the_cooldown() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x2e, 6);
    let proxy = shared_server_proxy().await;
    let pool = db.pool_via(proxy.addr(), 2);
    // An open connection in the pool, so that the try is sent at once, without a connect.
    drop(pool.get().await.unwrap());
    proxy.delay(Duration::from_millis(150));
    let replica = Replica::start(pool, key, I);
    // The first tick is at once: the try goes out within a few milliseconds and its answer
    // comes back 150 ms later. Resign in between.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!replica.elector.is_leader());
    let cooldown = 5 * I;
    let called = Instant::now();
    assert!(!replica.elector.resign(cooldown).await, "a standby: false");
    if let Some(at) = first_lead_before(&replica.elector, called, called + cooldown).await {
        panic!(
            "the standby led {at:?} after resign({cooldown:?}) returned false: the try in \
             flight at the resign was granted and its term started during the cooldown"
        );
    }
    proxy.delay(Duration::ZERO);
    wait_for(I + TAKEOVER, || replica.elector.is_leader())
        .await
        .expect("leads after the cooldown");
    replica.stop().await.unwrap();
}

/// A drain timeout and a cooldown of `Duration::MAX` ("wait for the work however long", "never
/// lead again") are bounds, not overflows: the resign drains the work in flight, unlocks, and
/// the replica never competes again while a standby takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_without_end_drains_unlocks_and_stays_away() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x4e, 0x99);
    let a = Replica::run(
        Elector::builder(db.pool(2), key)
            .check_interval(I)
            .drain_timeout(Duration::MAX)
            .build()
            .unwrap(),
    );
    wait_a_leads(&a).await;
    let b = Replica::start(db.pool(2), key, I);
    let started = Arc::new(tokio::sync::Notify::new());
    let work = tokio::spawn({
        let (elector, started) = (a.elector.clone(), started.clone());
        async move {
            elector
                .do_work(|_term| async move {
                    started.notify_one();
                    tokio::time::sleep(2 * I).await;
                    Ok::<_, String>(())
                })
                .await
        }
    });
    started.notified().await;
    let called = Instant::now();
    assert!(a.elector.resign(Duration::MAX).await, "a led and resigned");
    assert!(
        called.elapsed() >= 2 * I - I / 4,
        "the resign drained the work"
    );
    assert_eq!(work.await.unwrap(), Ok(None));
    wait_for(TAKEOVER, || b.elector.is_leader())
        .await
        .expect("b takes over");
    b.stop().await.unwrap();
    tokio::time::sleep(3 * I).await;
    assert!(!a.elector.is_leader(), "a never competes again");
    a.stop().await.unwrap();
}
