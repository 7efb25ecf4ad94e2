//! F5, Hardening II (issue 17), the schedule part: bounds on user durations, a handle bounded
//! through a partition, the heartbeat period a running replica promised, a rerun that survives
//! a failed claim or a new leader, a claim whose commit outlived the client's bound, a due
//! whose claim failed while the leader was alive, the dues that are not run counted, and a run
//! in flight at a graceful shutdown under a supervisor.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use pg_elector::Elector;
use pg_elector::schedule::{Job, Schedule};
use tokio_util::sync::CancellationToken;

/// A job body that counts its runs.
fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl Fn(
    pg_elector::schedule::JobRun,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    move |_run| {
        runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// Item 6: `poll_interval(Duration::MAX)` overflowed `2 * poll` (the query bound) at the
/// first query of the term, panicking the schedule's task. Now it is bounded (at most an hour)
/// and dues still run on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h6_a_poll_interval_of_duration_max_is_bounded_and_dues_still_run_on_time() {
    let _serial = serial();
    let db = fresh_db().await;
    let (elector, control) = Elector::manual();
    control.promote();
    let runs = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(
        Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::MAX)
            .job(
                Job::every("tick", Duration::from_millis(200)).max_catch_up(usize::MAX),
                counting(&runs),
            )
            .run(shutdown.clone()),
    );
    let ran = wait_for(Duration::from_secs(3), || runs.load(Ordering::SeqCst) >= 3).await;
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the schedule stops within 5 s of its shutdown");
    assert!(
        stopped.as_ref().is_ok_and(Result::is_ok),
        "the schedule ran without a panic and returned Ok: {stopped:?}"
    );
    assert!(
        ran.is_some(),
        "three dues of a 200 ms job ran within 3 s: {}",
        runs.load(Ordering::SeqCst)
    );
}

/// Item 7: `ScheduleHandle::trigger` and `reschedule` bounded only the pool borrow, not the
/// query: behind a partition (a connection the pool already holds, then a blackhole) they hung.
/// Each call is now bounded as a whole by the handle's wait (the poll interval, at least 1 s)
/// and says `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h7_trigger_and_reschedule_behind_a_partition_return_timeout_within_the_handles_wait() {
    let _serial = serial();
    let db = fresh_db().await;
    let (elector, control) = Elector::manual();
    control.promote();
    let runs = Arc::new(AtomicUsize::new(0));
    let job = || Job::every("report", Duration::from_secs(3600));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(
        Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::from_millis(50))
            .job(job(), counting(&runs))
            .run(shutdown.clone()),
    );
    let admin = db.connect().await.unwrap();
    wait_for_async(Duration::from_secs(3), || async {
        admin
            .query_opt("SELECT 1 FROM pg_elector_jobs WHERE job = 'report'", &[])
            .await
            .is_ok_and(|row| row.is_some())
    })
    .await
    .expect("the leader registers the job");

    // Another replica's handle, through a proxy, on a pool of one that holds its connection.
    let proxy = FaultProxy::start(PgServer::shared().unwrap().addr())
        .await
        .unwrap();
    let handle = Schedule::new(&Elector::manual().0, db.pool_via(proxy.addr(), 1))
        .poll_interval(Duration::from_millis(50))
        .handle();
    handle
        .trigger("report")
        .await
        .expect("a trigger while healthy");
    wait_for(Duration::from_secs(3), || runs.load(Ordering::SeqCst) == 1)
        .await
        .expect("the triggered run");

    proxy.blackhole();
    let wait = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let triggered = tokio::time::timeout(10 * wait, handle.trigger("report"))
        .await
        .expect("trigger returns through a partition, rather than hanging");
    let took = started.elapsed();
    assert!(
        matches!(triggered, Err(pg_elector::schedule::ScheduleError::Timeout(w)) if w == wait),
        "{triggered:?}"
    );
    assert!(
        took >= wait && took < wait + Duration::from_millis(1500),
        "bounded by the handle's wait of 1 s: {took:?}"
    );
    let started = std::time::Instant::now();
    let rescheduled = tokio::time::timeout(
        10 * wait,
        handle.reschedule("report", &Job::every("report", Duration::from_secs(60))),
    )
    .await
    .expect("reschedule returns through a partition, rather than hanging");
    let took = started.elapsed();
    assert!(
        matches!(rescheduled, Err(pg_elector::schedule::ScheduleError::Timeout(w)) if w == wait),
        "{rescheduled:?}"
    );
    assert!(
        took >= wait && took < wait + Duration::from_millis(1500),
        "bounded by the handle's wait of 1 s: {took:?}"
    );

    proxy.pass();
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
