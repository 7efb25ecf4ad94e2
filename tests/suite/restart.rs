//! A server restart (fast or immediate) with three replicas: every replica demotes, exactly one
//! leads within one I of the server accepting connections again, and no instant has two
//! leaders. Each test runs its own private server, since it restarts it.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use pg_elector::{LockKey, TermEnd};
use pg_elector_testkit::server::ShutdownMode;

/// How often the replicas are sampled.
const SAMPLE: Duration = Duration::from_millis(2);

async fn restart_with_three_replicas(mode: ShutdownMode, fast: bool) {
    let (server, db) = private_server().await;
    let key = LockKey::new(0x5253, 1);
    let replicas = replicas_on((0..3).map(|_| db.pool(2)).collect(), key, fast);
    let old = one_leader(&replicas, Duration::from_secs(10)).await;
    let old_term = replicas[old].elector.term();
    // Every standby is past its first try.
    tokio::time::sleep(I).await;
    assert_eq!(leaders(&replicas), vec![old]);

    // An observer connection, whose task ends when the server closes it, and a prober that
    // then connects every 5 ms until the server answers again.
    let (observer, connection) = db.config().connect(tokio_postgres::NoTls).await.unwrap();
    let config = db.config();
    let mut back = tokio::spawn(async move {
        let _ = connection.await;
        let closed = Instant::now();
        loop {
            if let Ok((client, connection)) = config.connect(tokio_postgres::NoTls).await {
                tokio::spawn(connection);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return (closed, Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });

    let demoted = tokio::spawn({
        let term = old_term.clone();
        async move {
            term.cancelled().await;
            Instant::now()
        }
    });
    let started = Instant::now();
    let restart = tokio::task::spawn_blocking({
        let server = server.clone();
        move || server.restart(mode)
    });
    // Sample until the server is back and a new term leads; then for 2·I more.
    let mut samples: Vec<(Instant, usize)> = Vec::new();
    let mut times = None;
    let mut new_leader = None;
    let mut settled_until = None;
    loop {
        let now = Instant::now();
        let leading = leaders(&replicas);
        samples.push((now, leading.len()));
        if times.is_none() && back.is_finished() {
            times = Some((&mut back).await.unwrap());
        }
        if times.is_some() && new_leader.is_none() && leading.len() == 1 && old_term.end().is_some()
        {
            new_leader = Some((leading[0], now));
            settled_until = Some(now + 2 * I);
        }
        if settled_until.is_some_and(|until| now > until) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no new leader within 60 s of the restart; leaders {leading:?}\n{}",
            server.log_tail(30)
        );
        tokio::time::sleep(SAMPLE).await;
    }
    restart.await.unwrap().unwrap();
    let (closed, accepting) = times.unwrap();
    let (new, led) = new_leader.unwrap();
    let demoted = demoted.await.unwrap();
    let most = samples.iter().map(|&(_, n)| n).max().unwrap_or(0);
    let none_led = samples.iter().any(|&(at, n)| n == 0 && at > closed);
    let took = led.saturating_duration_since(accepting);
    eprintln!(
        "restart {}: connections closed {:?} after pg_ctl restart began, server back {:?} later; \
         old leader {old} demoted {:?} after the close; replica {new} leads {took:?} after the \
         server accepts again",
        mode.as_str(),
        closed - started,
        accepting - closed,
        demoted.saturating_duration_since(closed),
    );
    assert_eq!(old_term.end(), Some(TermEnd::LeadershipLost));
    assert!(
        demoted < accepting,
        "the old leader demoted only after the server was back"
    );
    assert!(
        none_led,
        "no sample without a leader after the server closed the connections"
    );
    assert_eq!(most, 1, "an instant with two leaders");
    assert!(
        took <= I + I / 2,
        "new leader {took:?} after the server accepts again; bound 1·I + I/2 = {:?}",
        I + I / 2
    );
    assert_eq!(leaders(&replicas), vec![new], "the new leader leads on");
    if fast {
        // The waiting sessions ended with the server; the standbys tried every I meanwhile
        // (the takeover above), and wait again after their next refused try.
        let admin = db.connect().await.unwrap();
        for n in (0..3).filter(|&n| n != new) {
            session_waiting(&admin, key, &format!("replica-{n}"), 2 * I + I / 2).await;
        }
    }
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    drop(observer);
    drop(db);
}

/// A fast restart demotes every replica, and one leads within one interval of the server's return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_fast_restart_one_leads_within_one_interval() {
    let _timing = timing();
    restart_with_three_replicas(ShutdownMode::Fast, false).await;
}

/// An immediate restart demotes every replica, and one leads within one interval of the server's
/// return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_immediate_restart_one_leads_within_one_interval() {
    let _timing = timing();
    restart_with_three_replicas(ShutdownMode::Immediate, false).await;
}

/// With fast takeover the waiting sessions die with the server: the standbys fall back to
/// trying every I, one leads within one I of the server's return as without fast takeover,
/// and the others wait again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_after_a_fast_restart_standbys_try_then_wait_again() {
    let _timing = timing();
    restart_with_three_replicas(ShutdownMode::Fast, true).await;
}
