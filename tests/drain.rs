//! Drain: a graceful handover ends the term first, then waits for the work still running on
//! the old leader (up to the drain timeout) before it unlocks, so the next leader's work starts
//! after the old leader's has finished, as the server's clock shows; work still running at the
//! limit is named in a WARN line.

mod common;

use std::time::{Duration, SystemTime};

use common::capture::Capture;
use common::*;
use pg_elector::background::LeaderTicker;
use pg_elector::{Elector, LockKey};
use tokio_util::sync::CancellationToken;

async fn writes_table(db: &TestDb) {
    db.connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE writes (replica text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

async fn write(pool: &deadpool_postgres::Pool, replica: &str) {
    pool.get()
        .await
        .unwrap()
        .execute("INSERT INTO writes (replica) VALUES ($1)", &[&replica])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_a_tick_still_writing_300_ms_into_the_shutdown_lands_before_the_next_leaders_first_write()
 {
    let _serial = serial();
    let db = fresh_db().await;
    writes_table(&db).await;
    let key = LockKey::new(0xd7, 1);
    let pool = db.pool(4);
    let build = || {
        Elector::builder(db.pool(2), key)
            .check_interval(I)
            .drain_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let a = Replica::run(build());
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = Replica::run(build());

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

    let rows: Vec<(String, SystemTime)> = db
        .connect()
        .await
        .unwrap()
        .query("SELECT replica, at FROM writes ORDER BY at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_work_still_running_at_the_limit_is_named_and_the_lock_is_given_up() {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0xd7, 2);
    let capture = Capture::default();
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .drain_timeout(I)
        .build()
        .unwrap();
    let replica = Replica::run_captured(elector.clone(), &capture);
    wait_for(3 * I, || elector.is_leader())
        .await
        .expect("leads");
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
