//! F1: fast takeover. A standby keeps a session waiting for the lock, so that it leads within
//! milliseconds of the leader letting go, at any interval; and each hazard of a waiting
//! session: a wait granted to a standby that is gone, a wait the standby gave up, a waiting
//! session that ends, a pool whose timeouts would cut the wait short.
//!
//! The interval here is long (2 s) so that a standby that only tried every interval would
//! take hundreds of milliseconds on average; every test first waits until the standby's
//! session is seen waiting in `pg_locks`, which no standby without fast takeover ever shows.

use crate::common;

use std::time::{Duration, Instant};

use common::capture::Capture;
use common::*;
use pg_elector::{Elector, LockKey, current_leader};

/// A long interval: fast takeover is measured against it.
const LONG: Duration = Duration::from_secs(2);

/// The bound a fast takeover is held to in these tests: far below one interval, with slack
/// for a loaded 2-core machine (the benchmark measures the real figure).
const FAST: Duration = Duration::from_millis(250);

fn fast(pool: deadpool_postgres::Pool, key: LockKey, interval: Duration, name: &str) -> Elector {
    Elector::builder(pool, key)
        .check_interval(interval)
        .identity(name)
        .fast_takeover(true)
        .build()
        .expect("a valid elector")
}

/// A leader on `LONG`, and a fast standby whose session waits; returns both and the admin
/// connection.
async fn leader_and_waiting_standby(
    db: &TestDb,
    key: LockKey,
    capture: &Capture,
) -> (Replica, Replica, tokio_postgres::Client) {
    leader_in_mode_and_waiting_standby(db, key, capture, true).await
}

/// As [`leader_and_waiting_standby`], with a leader that runs fast takeover or not.
async fn leader_in_mode_and_waiting_standby(
    db: &TestDb,
    key: LockKey,
    capture: &Capture,
    leader_fast: bool,
) -> (Replica, Replica, tokio_postgres::Client) {
    let admin = db.connect().await.unwrap();
    let leader = Elector::builder(db.pool(2), key)
        .check_interval(LONG)
        .identity("leader")
        .fast_takeover(leader_fast)
        .build()
        .expect("a valid elector");
    let leader = Replica::run(leader);
    wait_for(3 * LONG, || leader.elector.is_leader())
        .await
        .expect("the first replica leads");
    let standby = Replica::run_captured(fast(db.pool(2), key, LONG, "standby"), capture);
    session_waiting(&admin, key, "standby", 2 * LONG).await;
    (leader, standby, admin)
}

/// How the standby's grant came: (through its waiting session, from a graceful unlock).
fn grant_kind(capture: &Capture) -> (String, String) {
    let grants = capture.events("lock granted; the server's bounds");
    let grant = grants.last().expect("the grant is logged");
    (
        grant.field("waited").to_owned(),
        grant.field("handed_over").to_owned(),
    )
}

/// Whether the server has `client_connection_check_interval` (PostgreSQL 14 and later), with
/// which it drops a waiting session whose client has closed the connection.
async fn client_check_on(admin: &tokio_postgres::Client) -> bool {
    let version: String = admin
        .query_one("SHOW server_version_num", &[])
        .await
        .unwrap()
        .get(0);
    version.parse::<i32>().unwrap() >= 140_000
}

/// Reads both electors every 50 µs for `span`; returns how long both said they led.
fn both_leading(a: &Elector, b: &Elector, span: Duration) -> std::thread::JoinHandle<Duration> {
    let (a, b) = (a.clone(), b.clone());
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut both = Duration::ZERO;
        let mut last = Instant::now();
        while start.elapsed() < span {
            let now = Instant::now();
            if a.is_leader() && b.is_leader() {
                both += now - last;
            }
            last = now;
            std::thread::sleep(Duration::from_micros(50));
        }
        both
    })
}

/// How long after `from` the standby leads; panics past `limit`.
async fn takeover(standby: &Replica, from: Instant, limit: Duration) -> Duration {
    wait_for(limit, || standby.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("the standby did not lead within {limit:?}"));
    from.elapsed()
}

mod f1 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_standby_leads_within_ms_of_a_graceful_release() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 1);
        let capture = Capture::default();
        let (leader, standby, _admin) = leader_and_waiting_standby(&db, key, &capture).await;
        let released = Instant::now();
        // In the background: a graceful stop returns after the handover marker's linger.
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&standby, released, LONG).await;
        stopping.await.unwrap().unwrap();
        eprintln!("graceful release: the standby led {took:?} after the shutdown began");
        assert!(
            took < FAST,
            "took {took:?}, not within milliseconds (bound {FAST:?}); interval {LONG:?}"
        );
        // Handed over: the old leader had stepped down, so the term started without a wait.
        assert_eq!(grant_kind(&capture), ("true".into(), "true".into()));
        standby.stop().await.unwrap();
    }

    /// A leader without fast takeover hands over to a waiting standby just as a fast one does:
    /// its unlock marks the session it grants the lock to, so the term starts at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poll_leader_hands_over_to_a_waiting_standby_at_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 12);
        let capture = Capture::default();
        let (leader, standby, _admin) =
            leader_in_mode_and_waiting_standby(&db, key, &capture, false).await;
        let released = Instant::now();
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&standby, released, LONG).await;
        stopping.await.unwrap().unwrap();
        eprintln!(
            "graceful release by a poll leader: the standby led {took:?} after the shutdown began"
        );
        assert!(
            took < FAST,
            "took {took:?}, not within milliseconds (bound {FAST:?}); interval {LONG:?}"
        );
        assert_eq!(
            grant_kind(&capture),
            ("true".into(), "true".into()),
            "granted to the waiting session by the graceful unlock: handed over, no wait"
        );
        standby.stop().await.unwrap();
    }

    /// A waiting standby leads within milliseconds of the leader's run being aborted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_standby_leads_within_ms_of_an_aborted_run() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 2);
        let capture = Capture::default();
        let (leader, standby, _admin) = leader_and_waiting_standby(&db, key, &capture).await;
        // An aborted run closes its lock connection without an unlock, as a killed process's
        // kernel does.
        let aborted = Instant::now();
        leader.task.abort();
        let took = takeover(&standby, aborted, LONG).await;
        eprintln!("aborted leader: the standby led {took:?} after the abort");
        assert!(
            took < FAST,
            "took {took:?}, not within milliseconds (bound {FAST:?}); interval {LONG:?}"
        );
        // The session ended without an unlock: the term waited for a leader to step down.
        assert_eq!(grant_kind(&capture), ("true".into(), "false".into()));
        standby.stop().await.unwrap();
    }

    /// A waiting standby leads within milliseconds of the lock session being terminated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_standby_leads_within_ms_of_a_terminated_session() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 3);
        let capture = Capture::default();
        let (leader, standby, _admin) = leader_and_waiting_standby(&db, key, &capture).await;
        // Both replicas read every 50 µs on a thread of their own: any instant with two leaders.
        let overlap = both_leading(&leader.elector, &standby.elector, LONG);
        let terminated = Instant::now();
        terminate_holder(&db, key).await;
        let took = takeover(&standby, terminated, LONG).await;
        eprintln!("terminated lock session: the standby led {took:?} after the terminate");
        assert!(
            took < FAST,
            "took {took:?}, not within milliseconds (bound {FAST:?}); interval {LONG:?}"
        );
        // The old leader notices its closed connection on its own (F2), before the new one leads.
        wait_for(LONG, || !leader.elector.is_leader())
            .await
            .expect("the old leader demotes");
        assert_eq!(grant_kind(&capture), ("true".into(), "false".into()));
        let both = overlap.join().unwrap();
        assert_eq!(
            both,
            Duration::ZERO,
            "two replicas led at once for {both:?}"
        );
        leader.stop().await.unwrap();
        standby.stop().await.unwrap();
    }

    /// A term won by waiting has its identity, bounds and epoch in place when it starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_term_won_by_waiting_starts_with_identity_bounds_and_epoch() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 4);
        let admin = db.connect().await.unwrap();
        let fenced = |name: &str| {
            Elector::builder(db.pool(2), key)
                .check_interval(LONG)
                .identity(name)
                .fencing(true)
                .fast_takeover(true)
                .build()
                .unwrap()
        };
        let leader = Replica::run(fenced("first"));
        let first = leader.elector.wait_for_leadership().await;
        let capture = Capture::default();
        let standby = Replica::run_captured(fenced("second"), &capture);
        session_waiting(&admin, key, "second", 2 * LONG).await;
        let mut changes = standby.elector.subscribe();
        leader.stop().await.unwrap();
        // The first moment the term exists, everything it stands on is in place.
        let term = loop {
            changes.changed().await.unwrap();
            let term = standby.elector.term();
            if term.is_leader() {
                break term;
            }
        };
        assert!(
            term.epoch().unwrap() > first.epoch().unwrap(),
            "a later epoch"
        );
        let who = current_leader(&admin, key)
            .await
            .unwrap()
            .expect("a leader");
        assert_eq!(who.identity, "second");
        let grants = capture.events("lock granted; the server's bounds");
        let grant = grants.last().expect("the grant is logged with its bounds");
        // 4·I = 8 s, as the server shows it.
        if has_idle_session_timeout(&db).await {
            assert_eq!(grant.field("idle_session_timeout"), "8s", "{grant:?}");
        }
        assert_eq!(grant.field("tcp_user_timeout"), "8000", "{grant:?}");
        assert_eq!(grant.field("tcp_keepalives_idle"), "8", "{grant:?}");
        standby.stop().await.unwrap();
    }

    /// The pool's own session timeouts (here a `statement_timeout` and a `lock_timeout` shorter
    /// than the wait) must not end the waiting session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pools_timeouts_do_not_cut_the_wait_short() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 5);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, LONG, "leader"));
        leader.elector.wait_for_leadership().await;
        let mut config = db.config();
        config.options("-c statement_timeout=300 -c lock_timeout=300");
        let pool = pg_elector_testkit::server::config::pool_from_config(config, 2);
        let standby = Replica::run(fast(pool, key, LONG, "standby"));
        let pid = session_waiting(&admin, key, "standby", 2 * LONG).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            session_waiting(&admin, key, "standby", Duration::ZERO).await,
            pid,
            "the same session still waits after three statement timeouts"
        );
        let released = Instant::now();
        // In the background: a graceful stop returns after the handover marker's linger.
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&standby, released, LONG).await;
        stopping.await.unwrap().unwrap();
        assert!(took < FAST, "took {took:?}");
        standby.stop().await.unwrap();
    }

    /// A waiting session that the server ends (an operator's terminate) leaves the standby trying
    /// every interval, and the next refused try starts another waiting session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_waiting_session_is_replaced_at_the_next_try() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 6);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, I, "leader"));
        leader.elector.wait_for_leadership().await;
        let capture = Capture::default();
        let standby = Replica::run_captured(fast(db.pool(2), key, I, "standby"), &capture);
        let first = session_waiting(&admin, key, "standby", 3 * I).await;
        let terminated = Instant::now();
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&first])
            .await
            .unwrap();
        let second = loop {
            let pid = session_waiting(&admin, key, "standby", 3 * I).await;
            if pid != first {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let back = terminated.elapsed();
        eprintln!(
            "a new waiting session ({second}) {back:?} after the first ({first}) was terminated"
        );
        assert!(back <= 2 * I + I / 2, "back after {back:?}; interval {I:?}");
        assert!(
            !capture.events("the waiting session ended").is_empty(),
            "the end of the waiting session is logged"
        );
        // And it works: the new one takes over at once.
        let released = Instant::now();
        // In the background: a graceful stop returns after the handover marker's linger.
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&standby, released, 3 * I).await;
        stopping.await.unwrap().unwrap();
        assert!(took < I / 2, "took {took:?}; interval {I:?}");
        standby.stop().await.unwrap();
    }

    /// A standby that stops while its session waits closes that session: the lock is never granted
    /// to a connection that anyone could use, and no pool gets it back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_stopping_while_waiting_leaves_no_session() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 7);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, LONG, "leader"));
        leader.elector.wait_for_leadership().await;
        let stopped_pool = db.pool(1);
        let stopped = Replica::run(fast(stopped_pool.clone(), key, LONG, "stopped"));
        let aborted = Replica::run(fast(db.pool(1), key, LONG, "aborted"));
        let gone = session_waiting(&admin, key, "stopped", 2 * LONG).await;
        let torn = session_waiting(&admin, key, "aborted", 2 * LONG).await;
        stopped.stop().await.unwrap();
        aborted.task.abort();
        // The server sees the closed connections while they wait (client_connection_check_interval
        // on 14 and later) or at the latest when it grants them the lock; either way they end.
        let third = Replica::run(fast(db.pool(2), key, LONG, "third"));
        session_waiting(&admin, key, "third", 2 * LONG).await;
        let released = Instant::now();
        // In the background: a graceful stop returns after the handover marker's linger.
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&third, released, LONG).await;
        stopping.await.unwrap().unwrap();
        eprintln!("the third replica led {took:?} after the release");
        assert!(took < FAST, "took {took:?}");
        let alive: Vec<i32> = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)",
                &[&vec![gone, torn]],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            alive.is_empty(),
            "given-up waiting sessions still exist: {alive:?}"
        );
        // Nothing the stopped replica's pool hands out holds the lock.
        let client = stopped_pool.get().await.unwrap();
        let held = pg_elector_testkit::server::sql::own_advisory_locks(&client)
            .await
            .unwrap();
        assert_eq!(held, 0);
        third.stop().await.unwrap();
    }

    /// A wait granted to a standby that is gone without the server knowing (its network cut, then
    /// the process gone): the server ends the granted session within 4·I, its usual bound on a
    /// silent lock session, because the session carried its bounds before it waited; then another
    /// waiting standby leads at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vanished_standbys_grant_is_freed_within_four_intervals() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 8);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, I, "leader"));
        leader.elector.wait_for_leadership().await;
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let vanished = Replica::run(fast(db.pool_via(proxy.addr(), 2), key, I, "vanished"));
        let orphan = session_waiting(&admin, key, "vanished", 3 * I).await;
        // Queued behind the vanished one.
        let next = Replica::run(fast(db.pool(2), key, I, "next"));
        session_waiting(&admin, key, "next", 3 * I).await;
        proxy.blackhole();
        vanished.task.abort();
        let released = Instant::now();
        leader.stop().await.unwrap();
        // The lock went to the first in the queue, which can no longer hear of it.
        wait_for_async(I, || async { holders(&admin, key).await == vec![orphan] })
            .await
            .expect("the vanished standby's session is granted the lock");
        if !has_idle_session_timeout(&db).await {
            tokio::time::sleep(6 * I).await;
            assert_eq!(holders(&admin, key).await, vec![orphan]);
            assert!(!next.elector.is_leader());
            next.stop().await.unwrap();
            return;
        }
        let took = takeover(&next, released, 8 * I).await;
        eprintln!(
            "the next standby led {took:?} after the release; the server's bound is 4·I = {:?}",
            4 * I
        );
        assert!(
            took >= 4 * I - I / 4,
            "led after {took:?}, before the server's bound"
        );
        assert!(took <= 4 * I + 2 * I, "led after {took:?}; interval {I:?}");
        next.stop().await.unwrap();
    }

    /// A standby that resigns gives up its waiting session at once, not at its next try: the
    /// server drops it from the queue within its client check (1 s here), long before the
    /// standby's next try (its interval is 30 s); and the lock goes to the other waiting standby.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resigning_standby_stops_waiting_at_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 9);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, LONG, "leader"));
        leader.elector.wait_for_leadership().await;
        // Its first try is at once; its next one 30 s later.
        let resigned = Replica::run(fast(db.pool(2), key, Duration::from_secs(30), "resigned"));
        session_waiting(&admin, key, "resigned", 2 * LONG).await;
        let other = Replica::run(fast(db.pool(2), key, LONG, "other"));
        session_waiting(&admin, key, "other", 2 * LONG).await;
        assert!(
            !resigned.elector.resign(Duration::from_secs(60)).await,
            "a standby resigns at once"
        );
        let in_queue = || async {
            waiting(&admin, key)
                .await
                .iter()
                .any(|(_, name)| name == "resigned")
        };
        if client_check_on(&admin).await {
            let gone = wait_for_async(Duration::from_millis(1500), || async { !in_queue().await })
            .await
            .expect(
                "the resigned standby's session leaves the queue within the server's client check",
            );
            eprintln!("the resigned standby's waiting session left the queue after {gone:?}");
        } else {
            // PostgreSQL 13 has no client_connection_check_interval: the closed session stays in
            // the queue until the server hands it the lock, finds its client gone and ends it,
            // which passes the lock on at once (the takeover below).
            eprintln!("PostgreSQL 13: a closed waiting session stays queued until it is granted");
            assert!(in_queue().await);
        }
        let released = Instant::now();
        // In the background: a graceful stop returns after the handover marker's linger.
        let stopping = tokio::spawn(leader.stop());
        let took = takeover(&other, released, LONG).await;
        stopping.await.unwrap().unwrap();
        assert!(took < FAST, "took {took:?}");
        tokio::time::sleep(LONG).await;
        assert!(!resigned.elector.is_leader());
        assert_eq!(holders(&admin, key).await.len(), 1);
        resigned.stop().await.unwrap();
        other.stop().await.unwrap();
    }

    /// A leader that loses its session waits again at once: a second failover soon after the
    /// first (here 150 ms, against an interval of 2 s) still finds it waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_demoted_leader_waits_again_at_once() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 10);
        let capture = Capture::default();
        let (first, second, admin) = leader_and_waiting_standby(&db, key, &capture).await;
        terminate_holder(&db, key).await;
        takeover(&second, Instant::now(), LONG).await;
        wait_for(LONG, || !first.elector.is_leader())
            .await
            .expect("the first leader demotes");
        let back = wait_for_async(LONG, || async {
            waiting(&admin, key)
                .await
                .iter()
                .any(|(_, n)| n == "leader")
        })
        .await
        .expect("the old leader waits again");
        eprintln!("the demoted leader waited again {back:?} after it saw its session end");
        assert!(
            back < Duration::from_millis(150),
            "waited again after {back:?}, not at once (bound 150 ms)"
        );
        tokio::time::sleep(Duration::from_millis(150) - back).await;
        let terminated = Instant::now();
        terminate_holder(&db, key).await;
        let took = takeover(&first, terminated, LONG).await;
        eprintln!("second failover: the first replica led again {took:?} after the terminate");
        assert!(
            took < FAST,
            "took {took:?}, not within milliseconds (bound {FAST:?}); interval {LONG:?}"
        );
        first.stop().await.unwrap();
        second.stop().await.unwrap();
    }

    /// At most three standbys wait for a key, whatever the size of the fleet: the server's queue
    /// for the key stays short (a long one makes PostgreSQL's deadlock checks stall the server).
    /// The others only try; a slot freed by a takeover is taken by one of them at its next try.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_most_three_standbys_wait_and_a_freed_slot_is_taken_again() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf1, 11);
        let admin = db.connect().await.unwrap();
        let leader = Replica::run(fast(db.pool(2), key, I, "leader"));
        leader.elector.wait_for_leadership().await;
        let standbys: Vec<Replica> = (0..6)
            .map(|n| Replica::run(fast(db.pool(2), key, I, &format!("standby-{n}"))))
            .collect();
        tokio::time::sleep(3 * I).await;
        assert_eq!(
            waiting(&admin, key).await.len(),
            3,
            "three wait, the others try"
        );
        let released = Instant::now();
        let stopping = tokio::spawn(leader.stop());
        wait_for(I, || leaders(&standbys).len() == 1)
            .await
            .expect("a waiting standby takes over");
        let took = released.elapsed();
        stopping.await.unwrap().unwrap();
        assert!(took < I / 2, "took {took:?}; interval {I:?}");
        // The new leader gave its slot back; one of the trying standbys takes it.
        tokio::time::sleep(3 * I).await;
        assert_eq!(waiting(&admin, key).await.len(), 3);
        assert_eq!(leaders(&standbys).len(), 1);
        for standby in standbys {
            standby.stop().await.unwrap();
        }
    }
}
