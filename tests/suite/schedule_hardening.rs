//! F5, Hardening II (issue 17), the schedule part: bounds on user durations, a handle bounded
//! through a partition, the heartbeat period a running replica promised, a rerun that survives
//! a failed claim or a new leader, a claim whose commit outlived the client's bound, a due
//! whose claim failed while the leader was alive, the dues that are not run counted, and a run
//! in flight at a graceful shutdown under a supervisor.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::roles::{drop_role, limited_role, pool_as};
use common::schedules::{
    Body, BoxedRun, ManualSchedule, OLD_DDL, Starts, first_start, leading_schedule, schedule,
    slow_commits, started_for, stored_runs, working,
};
use common::*;
use pg_elector::Elector;
use pg_elector::schedule::{Job, JobRun, RunKind, Schedule, ScheduleError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long run `n` works: the first for 30 s, well past the grace a term's end gives it, the
/// later ones for 10 ms.
fn first_outlasts_its_grace(n: usize) -> Duration {
    match n {
        0 => Duration::from_secs(30),
        _ => Duration::from_millis(10),
    }
}

/// A job body that counts its runs.
fn counting(runs: &Arc<AtomicUsize>) -> impl Fn(JobRun) -> BoxedRun + Send + Sync + 'static {
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
async fn h6_a_poll_interval_of_duration_max_is_bounded() {
    let _timing = timing();
    let db = fresh_db().await;
    let (elector, control) = Elector::manual();
    control.promote();
    let runs = Arc::new(AtomicUsize::new(0));
    let schedule = Schedule::new(&elector, db.pool(2))
        .poll_interval(Duration::MAX)
        .job(
            Job::every("tick", Duration::from_millis(200)).max_catch_up(usize::MAX),
            counting(&runs),
        );
    let sched = ManualSchedule::spawn(control, schedule);
    let ran = wait_for(Duration::from_secs(3), || runs.load(Ordering::SeqCst) >= 3).await;
    sched.shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), sched.task)
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

/// Runs `call`, a handle's call behind a partition, within ten times `wait` (or panics saying
/// `hangs`), and asserts that it said `Timeout(wait)` when the handle's wait of 1 s was over.
async fn times_out_after_the_wait(
    wait: Duration,
    call: impl Future<Output = Result<(), ScheduleError>>,
    hangs: &str,
    says: fn(&ScheduleError) -> bool,
) {
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(10 * wait, call).await.expect(hangs);
    let took = started.elapsed();
    assert!(outcome.as_ref().is_err_and(says), "{outcome:?}");
    assert!(
        took >= wait && took < wait + Duration::from_millis(1500),
        "bounded by the handle's wait of 1 s: {took:?}"
    );
}

/// Item 7: `ScheduleHandle::trigger` and `reschedule` bounded only the pool borrow, not the
/// query: behind a partition (a connection the pool already holds, then a blackhole) they hung.
/// Each call is now bounded as a whole by the handle's wait (the poll interval, at least 1 s):
/// the first says `Timeout` and closes the connection whose answer never came (given back, it
/// would have made every later call wait on it in vain); the next, finding no connection it can
/// open through the partition, says `PoolTimeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h7_handle_calls_in_a_partition_time_out_within_its_wait() {
    let _timing = timing();
    let db = fresh_db().await;
    let (elector, control) = Elector::manual();
    control.promote();
    let runs = Arc::new(AtomicUsize::new(0));
    let job = || Job::every("report", Duration::from_secs(3600));
    let schedule = Schedule::new(&elector, db.pool(2))
        .poll_interval(Duration::from_millis(50))
        .job(job(), counting(&runs));
    let sched = ManualSchedule::spawn(control, schedule);
    let admin = db.connect().await.unwrap();
    wait_for_async(Duration::from_secs(3), || async {
        finds_row(&admin, "SELECT 1 FROM pg_elector_jobs WHERE job = 'report'").await
    })
    .await
    .expect("the leader registers the job");

    // Another replica's handle, through a proxy, on a pool of one that holds its connection.
    let proxy = shared_server_proxy().await;
    let pool = db.pool_via(proxy.addr(), 1);
    let handle = Schedule::new(&Elector::manual().0, pool.clone())
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
    times_out_after_the_wait(
        wait,
        handle.trigger("report"),
        "trigger returns through a partition, rather than hanging",
        |e| matches!(e, ScheduleError::Timeout(w) if *w == Duration::from_secs(1)),
    )
    .await;
    assert_eq!(
        pool.status().size,
        0,
        "the connection whose answer never came is closed, not given back"
    );
    times_out_after_the_wait(
        wait,
        handle.reschedule("report", &Job::every("report", Duration::from_secs(60))),
        "reschedule returns through a partition, rather than hanging",
        |e| matches!(e, ScheduleError::PoolTimeout(w) if *w == Duration::from_secs(1)),
    )
    .await;

    proxy.pass();
    sched.stop().await;
}

mod h8 {
    use super::*;

    /// Item 8: a live run taken for dead. The stale threshold was the reading replica's own poll
    /// interval: b, polling every 50 ms, called a's run dead after 3 s, while a, polling (and so
    /// beating) every 4 s, was still running it, and reran it beside it. The run's row now
    /// carries the period its runner promised, and a run is stale after three of those (at least
    /// 3 s). The two replicas lead at once (manual electors), as in the overlap window of a
    /// failover.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_poll_replicas_live_run_is_not_taken_for_dead() {
        let _timing = timing();
        let db = fresh_db().await;
        let starts: Starts = Arc::default();
        let (capture_a, capture_b) = (Capture::default(), Capture::default());
        let job = || Job::every("long", Duration::from_millis(200)).rerun_abandoned(true);
        // a's first run lasts 9 s: two of its 4 s beats, and silent for 4 s at a time.
        let first = Duration::from_secs(9);
        let a_body = working("a", &starts, move |n| match n {
            0 => first,
            _ => Duration::from_millis(10),
        });
        let a = schedule(
            db.pool(2),
            Duration::from_secs(4),
            job(),
            a_body,
            &capture_a,
        );
        a.control.promote();
        let (_, due, _, _, started) =
            first_start(&starts, Duration::from_secs(5), "a starts a run").await;
        let b_body = working("b", &starts, |_| Duration::from_millis(10));
        let b = schedule(
            db.pool(2),
            Duration::from_millis(50),
            job(),
            b_body,
            &capture_b,
        );
        b.control.promote();
        // Until a's run is over, and a little longer.
        tokio::time::sleep((first + Duration::from_millis(500)).saturating_sub(started.elapsed()))
            .await;
        b.stop().await;
        a.stop().await;

        let runs = stored_runs(&db.connect().await.unwrap(), "long").await;
        let of_due: Vec<_> = runs.iter().filter(|r| r.0 == due).collect();
        let bodies = started_for(&starts, due);
        eprintln!("the due's runs: {of_due:?}; started: {bodies:?}");
        assert_eq!(
            bodies,
            [("a", 1, RunKind::Scheduled)],
            "the due ran once, on a, never rerun beside it"
        );
        assert_eq!(
            of_due
                .iter()
                .map(|r| (r.1, r.3.as_str(), r.4.as_str()))
                .collect::<Vec<_>>(),
            [(1, "succeeded", "local")],
            "one stored run, which succeeded"
        );
        let abandoned = capture_b.events("a run claimed by an earlier term never finished");
        assert!(
            abandoned.is_empty(),
            "b took a's live run for dead: {abandoned:?}"
        );
    }

    /// Heartbeats that keep failing were logged at DEBUG only, so an operator saw nothing
    /// before another replica took the live run for dead. Here the job itself holds the only
    /// connection of a pool of one for 1.4 s: a beat waits its 1 s bound in vain. Once the run
    /// has been silent for a third of the 3 s after which it is taken for dead, one WARN says
    /// so; when the job gives the connection back (before the 2 s at which the run would be
    /// cut off), one INFO says the beats land again, and the run goes on to succeed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_that_keep_failing_are_a_warning() {
        let _timing = timing();
        let db = fresh_db().await;
        let pool = db.pool(1);
        let capture = Capture::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let body: Body = {
            let (pool, runs) = (pool.clone(), runs.clone());
            Arc::new(move |_run: JobRun| {
                let (pool, first) = (pool.clone(), runs.fetch_add(1, Ordering::SeqCst) == 0);
                Box::pin(async move {
                    if first {
                        let hog = pool.get().await.map_err(|e| e.to_string())?;
                        tokio::time::sleep(Duration::from_millis(1400)).await;
                        drop(hog);
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    Ok(())
                })
            })
        };
        let job = Job::every("hog", Duration::from_millis(500));
        let sched = schedule(pool, Duration::from_millis(50), job, body, &capture);
        sched.control.promote();
        let warned = capture
            .logged(
                "heartbeats of the running run keep failing",
                Duration::from_secs(5),
            )
            .await;
        let landed = capture
            .logged(
                "heartbeats of the running run land again",
                Duration::from_secs(5),
            )
            .await;
        wait_for(Duration::from_secs(5), || runs.load(Ordering::SeqCst) >= 1).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sched.stop().await;

        let warnings = capture.events("heartbeats of the running run keep failing");
        eprintln!("warned after {warned:?}, landed after {landed:?}: {warnings:?}");
        assert_eq!(warnings.len(), 1, "one WARN for the streak: {warnings:?}");
        assert_eq!(warnings[0].level, tracing::Level::WARN);
        assert_eq!(warnings[0].field("job"), "hog");
        assert!(landed.is_some(), "an INFO line when the beats land again");
        let runs = stored_runs(&db.connect().await.unwrap(), "hog").await;
        assert_eq!(
            runs[0].3, "succeeded",
            "the first run was not given up: {runs:?}"
        );
    }

    /// The columns of `table`, in order.
    async fn columns(client: &tokio_postgres::Client, table: &str) -> Vec<String> {
        client
            .query(
                "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
                &[&table],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Item 8, older tables: tables an earlier version made (no heartbeat period) get the column
    /// at the next term, when the role may add it (here the owner), and the jobs run on them; a
    /// run such a version left running (it promised no period) is judged by the reader's poll.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn older_tables_get_the_new_columns_and_the_jobs_run() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        admin.batch_execute(OLD_DDL).await.unwrap();
        let before = columns(&admin, "pg_elector_job_runs").await;
        assert!(
            !before.contains(&"heartbeat_period".to_owned()),
            "{before:?}"
        );
        // A run the earlier version left running, silent for 10 s.
        admin
            .batch_execute(
                "INSERT INTO pg_elector_job_runs (namespace, job, due, attempt, kind, claimed_by, \
             claimed_term, started_at, heartbeat_at, outcome) VALUES ('local', 'count', \
             '2026-01-01T00:00:00Z', 1, 'scheduled', 'old', 'old/1/0/0', \
             now() - interval '20 s', now() - interval '10 s', 'running')",
            )
            .await
            .unwrap();
        let (starts, capture, sched) = leading_schedule(
            db.pool(2),
            Job::every("count", Duration::from_millis(100)),
            Duration::ZERO,
        );
        wait_for(Duration::from_secs(3), || starts.lock().unwrap().len() >= 3)
            .await
            .expect("the jobs run on the upgraded tables");
        sched.stop().await;
        let after = columns(&admin, "pg_elector_job_runs").await;
        assert!(after.contains(&"heartbeat_period".to_owned()), "{after:?}");
        let promised: Vec<f64> = first_column(
            &admin,
            "SELECT extract(epoch FROM heartbeat_period)::float8 FROM pg_elector_job_runs \
             WHERE job = 'count' AND outcome = 'succeeded'",
        )
        .await;
        assert!(promised.len() >= 3, "{promised:?}");
        assert!(
            promised.iter().all(|p| (*p - 0.05).abs() < 1e-9),
            "each run promised the runner's poll, 50 ms: {promised:?}"
        );
        let problems: Vec<_> = capture
            .events("")
            .into_iter()
            .filter(|e| e.level <= tracing::Level::WARN)
            .collect();
        let old: String = admin
            .query_one(
                "SELECT outcome FROM pg_elector_job_runs WHERE claimed_term = 'old/1/0/0'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            old, "abandoned",
            "judged by the reader's poll (3 s at least)"
        );
        let warned: Vec<_> = problems
            .iter()
            .filter(|e| {
                e.message()
                    .starts_with("a run claimed by an earlier term never finished")
            })
            .collect();
        assert_eq!(warned.len(), 1, "{problems:?}");
        assert_eq!(
            problems.len(),
            1,
            "nothing else to complain about: {problems:?}"
        );
    }

    /// Item 8, older tables and a role that may not alter them: a clear ERROR naming the
    /// statement to run, and the jobs wait until an administrator ran it (`ddl()` has it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_role_that_may_not_add_the_columns_is_told_the_statement() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let role = limited_role(&db, &admin, "hb").await;
        admin
            .batch_execute(&format!(
                "{OLD_DDL}; GRANT SELECT, INSERT, UPDATE ON pg_elector_jobs, pg_elector_job_runs \
             TO \"{role}\""
            ))
            .await
            .unwrap();
        let pool = pool_as(&db, &role, 2);
        let (starts, capture, sched) = leading_schedule(
            pool.clone(),
            Job::every("count", Duration::from_millis(100)),
            Duration::ZERO,
        );
        let said = capture
            .logged("the job tables are not ready", Duration::from_secs(3))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(said.is_some(), "the refusal is logged");
        assert!(starts.lock().unwrap().is_empty(), "no job runs meanwhile");
        let said = capture.events("the job tables are not ready");
        assert_eq!(said[0].level, tracing::Level::ERROR);
        let error = said[0].field("error");
        assert!(
        error.contains(
            "ALTER TABLE \"pg_elector_job_runs\" ADD COLUMN IF NOT EXISTS heartbeat_period interval"
        ) && error.contains("must be owner of table"),
        "the statement to run and the server's refusal: {error}"
    );
        let ddl = Schedule::new(&Elector::manual().0, pool.clone())
            .ddl()
            .unwrap();
        assert!(
            ddl.contains("ADD COLUMN IF NOT EXISTS heartbeat_period interval"),
            "{ddl}"
        );
        admin.batch_execute(&ddl).await.unwrap();
        wait_for(Duration::from_secs(3), || starts.lock().unwrap().len() >= 3)
            .await
            .expect("the jobs run once the administrator ran the statements");
        sched.stop().await;
        drop(pool);
        drop_role(&admin, &role).await;
    }
}

/// Which replica reruns the cut-off run in [`a_rerun_whose_abandon_lost_its_answer`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rerunner {
    /// The same leader, at a later pass.
    SameLeader,
    /// Another replica, leading after the term that abandoned it ended.
    NextLeader,
}

/// Item 2: the decision to rerun an abandoned run lived in memory, between the abandon and the
/// rerun's claim. Here the abandon's answer is lost: a's first run (of due `d`) is cut off at
/// the end of its term; an operator's transaction holds that run's row `FOR UPDATE` when a's
/// next term begins, so a's abandon waits and times out; once a has said so, the lock goes, and
/// the server carries out the abandon a had given up on. Nobody reran it: a's later passes find
/// no run `running`, nor does the next leader. The rerun is now a state in the table, cleared
/// only by the rerun's claim: the rerun happens, exactly once, on `by`.
async fn a_rerun_whose_abandon_lost_its_answer(by: Rerunner) {
    let db = fresh_db().await;
    let admin = db.connect().await.unwrap();
    let starts: Starts = Arc::default();
    let (capture_a, capture_b) = (Capture::default(), Capture::default());
    let poll = Duration::from_millis(50);
    let job = || Job::every("rerun", Duration::from_millis(300)).rerun_abandoned(true);
    let a_body = working("a", &starts, first_outlasts_its_grace);
    let a = schedule(db.pool(2), poll, job(), a_body, &capture_a);
    let due = a
        .cut_off_first_run(
            &starts,
            &capture_a,
            Duration::from_secs(3),
            "a's first run starts",
            "the run is cut off after its grace",
        )
        .await
        .1;

    let mut locker = db.connect().await.unwrap();
    let lock = locker.transaction().await.unwrap();
    let held = lock
        .query(
            "SELECT 1 FROM pg_elector_job_runs WHERE job = 'rerun' AND outcome = 'running' \
             FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "the cut-off run's row, locked");
    a.control.promote();
    capture_a
        .logged("cannot look for abandoned runs", Duration::from_secs(5))
        .await
        .expect("a's abandon times out behind the lock");
    let b = match by {
        Rerunner::SameLeader => None,
        Rerunner::NextLeader => {
            a.control.demote();
            let b_body = working("b", &starts, |_| Duration::from_millis(10));
            Some(schedule(db.pool(2), poll, job(), b_body, &capture_b))
        }
    };
    lock.rollback().await.unwrap();
    wait_for_async(Duration::from_secs(3), || async {
        stored_runs(&admin, "rerun")
            .await
            .iter()
            .any(|r| r.0 == due && r.1 == 1 && r.3 == "abandoned")
    })
    .await
    .expect("the abandon a gave up on is carried out once the lock goes");
    if let Some(b) = &b {
        b.control.promote();
    }
    // Time for the rerun: a few polls, with slack for a loaded machine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(b) = b {
        b.stop().await;
    }
    a.stop().await;

    let runs = stored_runs(&admin, "rerun").await;
    let of_due: Vec<_> = runs
        .iter()
        .filter(|r| r.0 == due)
        .map(|r| (r.1, r.2.as_str(), r.3.as_str()))
        .collect();
    let started = started_for(&starts, due);
    eprintln!("{by:?}: the due's runs {of_due:?}, started {started:?}");
    assert_eq!(
        of_due,
        [(1, "scheduled", "abandoned"), (2, "rerun", "succeeded")],
        "the cut-off run, and one rerun that succeeded"
    );
    let rerunner = match by {
        Rerunner::SameLeader => "a",
        Rerunner::NextLeader => "b",
    };
    assert_eq!(
        started,
        [("a", 1, RunKind::Scheduled), (rerunner, 2, RunKind::Rerun)],
        "rerun once, by {rerunner}"
    );
    let reruns = runs.iter().filter(|r| r.2 == "rerun").count();
    assert_eq!(reruns, 1, "one rerun in all: {runs:?}");
}

mod h2 {
    use super::*;

    /// A rerun whose abandon lost its answer is still run once, at a later pass.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_abandon_answer_still_reruns_once_at_a_later_pass() {
        let _timing = timing();
        a_rerun_whose_abandon_lost_its_answer(Rerunner::SameLeader).await;
    }

    /// A rerun whose abandon lost its answer is run once, by the next leader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_abandon_answer_reruns_once_on_the_next_leader() {
        let _timing = timing();
        a_rerun_whose_abandon_lost_its_answer(Rerunner::NextLeader).await;
    }
}

/// How the client loses the answer to the slow COMMIT in [`a_claim_whose_commit_is_slow`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LostCommit {
    /// The claim's bound (2 s) passes first.
    Timeout,
    /// The connection is reset while the server is still committing.
    Reset,
}

/// Item 3: a claim whose COMMIT outlived the client's bound was committed but never run: the
/// leader logged the timeout and moved on, and the due's run stayed `running` until the next
/// term called it abandoned. A claim whose outcome is unknown is now read back (the
/// transaction's status, and the run's row) and run when it was committed.
async fn a_claim_whose_commit_is_slow(lost: LostCommit) {
    let db = fresh_db().await;
    let admin = db.connect().await.unwrap();
    slow_commits(&db, &admin, 3.0).await;
    let proxy = shared_server_proxy().await;
    let (starts, capture, sched) = leading_schedule(
        db.pool_via(proxy.addr(), 2),
        Job::every("slow", Duration::from_millis(500)),
        Duration::ZERO,
    );
    wait_for(Duration::from_secs(3), || starts.lock().unwrap().len() >= 2)
        .await
        .expect("the job runs");
    admin
        .batch_execute("UPDATE slow_commit SET armed = true")
        .await
        .unwrap();
    if lost == LostCommit::Reset {
        // While the claim's transaction sleeps in its commit.
        wait_for_async(Duration::from_secs(3), || async {
            query_i64(
                &admin,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' \
                     AND datname = current_database()",
            )
            .await
                == 1
        })
        .await
        .expect("a claim commits slowly");
        proxy.reset();
    }
    let slowed = || async {
        admin
            .query_one("SELECT due FROM slow_commit", &[])
            .await
            .unwrap()
            .get::<_, Option<SystemTime>>(0)
    };
    wait_for_async(Duration::from_secs(5), || async {
        slowed().await.is_some()
    })
    .await
    .expect("the slow commit is over");
    let due = slowed().await.unwrap();
    let ran_due = || starts.lock().unwrap().iter().any(|s| s.1 == due);
    let ran = wait_for(Duration::from_secs(3), ran_due).await;
    let later = wait_for(Duration::from_secs(3), || {
        starts.lock().unwrap().iter().any(|s| s.1 > due)
    })
    .await;
    sched.stop().await;

    let runs = stored_runs(&admin, "slow").await;
    let of_due: Vec<_> = runs
        .iter()
        .filter(|r| r.0 == due)
        .map(|r| (r.1, r.3.as_str()))
        .collect();
    let started: Vec<_> = started_for(&starts, due)
        .into_iter()
        .map(|(_, attempt, kind)| (attempt, kind))
        .collect();
    eprintln!(
        "{lost:?}: the slowed due's runs {of_due:?}, started {started:?}; warnings {:?}",
        capture.events("cannot claim or record the run")
    );
    assert!(ran.is_some(), "the committed claim's due ran");
    assert_eq!(started, [(1, RunKind::Scheduled)], "once");
    assert_eq!(of_due, [(1, "succeeded")], "and its run is recorded");
    assert!(later.is_some(), "the job runs on after it");
}

mod h3 {
    use super::*;

    /// A claim whose commit outlives the bound is read back and run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_whose_commit_outlives_its_bound_is_read_back() {
        let _timing = timing();
        a_claim_whose_commit_is_slow(LostCommit::Timeout).await;
    }

    /// A claim whose commit answer is lost with its connection is read back and run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_whose_commit_answer_is_lost_is_read_back() {
        let _timing = timing();
        a_claim_whose_commit_is_slow(LostCommit::Reset).await;
    }
}

/// The next instant of a `period` grid that is at least `ahead` from now.
fn next_grid_point(period: Duration, ahead: Duration) -> SystemTime {
    let p = period.as_millis();
    let from = (SystemTime::now() + ahead)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    SystemTime::UNIX_EPOCH + Duration::from_millis((from.div_ceil(p) * p) as u64)
}

/// Sleeps until `at` on the wall clock (at once if it has passed).
async fn sleep_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

/// Item 4: `CatchUp::Skip` dropped a due whose claim failed while the leader was alive. Another
/// connection holds the job's row `FOR UPDATE` for 3 s around a due (from 0.5 s before it);
/// the claim waits, and times out after 2 s. The leader then took the due (and the next one,
/// 2 s later, which passed during the wait) for missed and skipped them. Skip is only for dues
/// missed while nobody led: both run once the lock goes, and the one after on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h4_with_skip_a_claim_that_waited_on_a_row_lock_still_runs() {
    claim_waits_on_a_row_lock(pg_elector::schedule::CatchUp::Skip).await;
}

/// The same with `CatchUp::Latest`, which read the two dues the same way (as missed, and ran
/// only the later one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h4_with_latest_a_claim_that_waited_on_a_row_lock_runs() {
    claim_waits_on_a_row_lock(pg_elector::schedule::CatchUp::Latest).await;
}

/// A row lock held around a due for 3 s, with the job's `catch_up`: the due, the one that passed
/// during the wait and the one after each run once.
async fn claim_waits_on_a_row_lock(catch_up: pg_elector::schedule::CatchUp) {
    let _timing = timing();
    let db = fresh_db().await;
    let period = Duration::from_secs(2);
    let (starts, capture, sched) = leading_schedule(
        db.pool(2),
        Job::every("locked", period).catch_up(catch_up),
        Duration::from_millis(10),
    );
    first_start(&starts, Duration::from_secs(4), "the job runs").await;
    let due = next_grid_point(period, Duration::from_millis(700));
    sleep_until(due - Duration::from_millis(500)).await;
    let mut locker = db.connect().await.unwrap();
    let lock = locker.transaction().await.unwrap();
    let held = lock
        .query(
            "SELECT 1 FROM pg_elector_jobs WHERE job = 'locked' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    sleep_until(due + Duration::from_millis(2500)).await;
    lock.rollback().await.unwrap();
    let after = due + 2 * period;
    sleep_until(after + Duration::from_secs(1)).await;
    sched.stop().await;

    let started: Vec<SystemTime> = starts.lock().unwrap().iter().map(|s| s.1).collect();
    let count = |d: SystemTime| started.iter().filter(|s| **s == d).count();
    eprintln!(
        "runs of the locked due {}, the next {}, the one after {}; warnings {:?}",
        count(due),
        count(due + period),
        count(after),
        capture.events("cannot claim or record the run")
    );
    assert!(
        !capture.events("cannot claim or record the run").is_empty(),
        "the claim did wait and fail on the lock"
    );
    assert_eq!(count(due), 1, "the due whose claim failed ran, once");
    assert_eq!(
        count(due + period),
        1,
        "the due that passed during the wait ran, once"
    );
    assert_eq!(count(after), 1, "and the one after, on time");
}

/// The value of `pg_elector_job_skipped_total{job, reason}` in `registry` (0 without a series).
fn skipped_total(registry: &prometheus::Registry, job: &str, reason: &str) -> u64 {
    registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "pg_elector_job_skipped_total")
        .and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| {
                    let label = |name: &str| {
                        m.get_label()
                            .iter()
                            .find(|l| l.name() == name)
                            .map(|l| l.value().to_owned())
                    };
                    label("job").as_deref() == Some(job)
                        && label("reason").as_deref() == Some(reason)
                })
                .map(|m| m.get_counter().value() as u64)
        })
        .unwrap_or(0)
}

/// `(due, reason, skipped_dues)` of every `skipped` row of `job`, oldest first.
async fn skipped_rows(
    client: &tokio_postgres::Client,
    job: &str,
) -> Vec<(SystemTime, String, i64)> {
    client
        .query(
            "SELECT due, reason, skipped_dues FROM pg_elector_job_runs \
             WHERE job = $1 AND outcome = 'skipped' ORDER BY due",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

mod h10 {
    use super::*;

    /// Item 10, the catch-up policies: a due that is not run was visible only as an INFO line.
    /// After a leaderless gap of about ten dues, `Skip` and `Latest` record the dues they drop
    /// (reason `catch_up`), and `All` with `max_catch_up(3)` the ones past its limit
    /// (`catch_up_limit`): each as a `skipped` row saying how many dues it stands for (the latest
    /// of them its due), and on `pg_elector_job_skipped_total`. Every due of the window either ran
    /// or is counted as skipped, exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dues_dropped_by_catch_up_are_counted_in_table_and_metric() {
        use pg_elector::schedule::CatchUp;
        let _timing = timing();
        let db = fresh_db().await;
        let registry = prometheus::Registry::new();
        let starts: Starts = Arc::default();
        let period = Duration::from_millis(100);
        let (elector, control) = Elector::manual();
        let mut schedule = Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::from_millis(50))
            .registry(&registry);
        for (name, job) in [
            ("skip", Job::every("skip", period).catch_up(CatchUp::Skip)),
            (
                "latest",
                Job::every("latest", period).catch_up(CatchUp::Latest),
            ),
            (
                "all3",
                Job::every("all3", period)
                    .catch_up(CatchUp::All)
                    .max_catch_up(3),
            ),
        ] {
            let body = working(name, &starts, |_| Duration::ZERO);
            schedule = schedule.job(job, move |run| body(run));
        }
        let sched = ManualSchedule::spawn(control, schedule);
        sched.control.promote();
        tokio::time::sleep(Duration::from_millis(500)).await;
        sched.control.demote();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        sched.control.promote();
        tokio::time::sleep(Duration::from_millis(600)).await;
        sched.stop().await;

        let admin = db.connect().await.unwrap();
        for (job, reason) in [
            ("skip", "catch_up"),
            ("latest", "catch_up"),
            ("all3", "catch_up_limit"),
        ] {
            let counted = skipped_total(&registry, job, reason);
            let rows = skipped_rows(&admin, job).await;
            let ran: Vec<SystemTime> = starts
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.0 == job)
                .map(|s| s.1)
                .collect();
            eprintln!("{job}: {} runs, skipped {counted} ({rows:?})", ran.len());
            assert!(
                counted >= 7,
                "{job}: about ten dues of the gap were not run: {counted}"
            );
            assert!(
                rows.iter().all(|r| r.1 == reason),
                "{job}: every skipped row says {reason}: {rows:?}"
            );
            let in_rows: i64 = rows.iter().map(|r| r.2).sum();
            assert_eq!(
                in_rows as u64, counted,
                "{job}: the table and the metric agree"
            );
            let expected = match job {
                "all3" => counted + 3,
                "latest" => counted + 1,
                _ => counted,
            };
            assert!(
                (9..=13).contains(&expected),
                "{job}: {counted} skipped for a gap of about 11 dues"
            );
            // Each row stands for the `n` dues of the grid that end at its due.
            let mut covered = Vec::new();
            for (latest, _, n) in &rows {
                for k in 0..*n {
                    covered.push(*latest - period * (k as u32));
                }
            }
            let (first, last) = (ran[0], *ran.last().unwrap());
            let mut due = first;
            while due <= last {
                let times = ran.iter().filter(|d| **d == due).count()
                    + covered.iter().filter(|d| **d == due).count();
                assert_eq!(times, 1, "{job}: {due:?} ran or was skipped, once");
                due += period;
            }
        }
    }

    /// Item 10, an abandoned run that is not rerun (the default): its due did not run. It is
    /// recorded as a `skipped` row (reason `abandoned`, the attempt after the abandoned one) and
    /// counted, by the statement that calls the run abandoned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_run_that_is_not_rerun_is_counted_as_skipped() {
        let _timing = timing();
        let db = fresh_db().await;
        let registry = prometheus::Registry::new();
        let starts: Starts = Arc::default();
        let capture = Capture::default();
        let (elector, control) = Elector::manual();
        let body = working("m", &starts, first_outlasts_its_grace);
        let schedule = Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::from_millis(50))
            .registry(&registry)
            .job(Job::every("cut", Duration::from_millis(300)), move |run| {
                body(run)
            });
        let sched = ManualSchedule::spawn_captured(control, schedule, &capture);
        let due = sched
            .cut_off_first_run_then_promote(&starts, &capture, Duration::from_secs(3))
            .await
            .1;
        let admin = db.connect().await.unwrap();
        wait_for_async(Duration::from_secs(3), || async {
            stored_runs(&admin, "cut")
                .await
                .iter()
                .any(|r| r.0 == due && r.3 == "abandoned")
        })
        .await
        .expect("the cut-off run is called abandoned");
        tokio::time::sleep(Duration::from_millis(300)).await;
        sched.stop().await;

        assert_eq!(skipped_total(&registry, "cut", "abandoned"), 1);
        let of_due: Vec<_> = stored_runs(&admin, "cut")
            .await
            .into_iter()
            .filter(|r| r.0 == due)
            .map(|r| (r.1, r.3))
            .collect();
        assert_eq!(
            of_due,
            [(1, "abandoned".to_owned()), (2, "skipped".to_owned())],
            "the abandoned run, and its due recorded as skipped"
        );
        // Besides it, only the dues missed while nobody led, dropped by `Latest`.
        let rows = skipped_rows(&admin, "cut").await;
        let (abandoned, others): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.1 == "abandoned");
        assert_eq!(abandoned, [&(due, "abandoned".to_owned(), 1)], "{rows:?}");
        assert!(others.iter().all(|r| r.1 == "catch_up"), "{rows:?}");
    }

    /// Item 10, a job halted by `LostState::Halt`: the dues that pass while this process leads and
    /// will not run them are counted (reason `halted`), in the metric and in `skipped` rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dues_of_a_halted_job_are_counted_as_skipped() {
        let _timing = timing();
        let db = fresh_db().await;
        let registry = prometheus::Registry::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let (elector, control) = Elector::manual();
        control.promote();
        let period = Duration::from_millis(100);
        let schedule = Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::from_millis(50))
            .registry(&registry)
            .on_lost_state(pg_elector::schedule::LostState::Halt)
            .job(Job::every("halt", period), counting(&runs));
        let sched = ManualSchedule::spawn(control, schedule);
        wait_for(Duration::from_secs(3), || runs.load(Ordering::SeqCst) >= 3)
            .await
            .expect("runs");
        let admin = db.connect().await.unwrap();
        admin
            .batch_execute("DELETE FROM pg_elector_jobs")
            .await
            .unwrap();
        let lost = SystemTime::now();
        wait_for(Duration::from_secs(3), || {
            skipped_total(&registry, "halt", "halted") >= 5
        })
        .await
        .expect("the halted job's dues are counted");
        let ran = runs.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        sched.stop().await;
        let stopped = SystemTime::now();

        assert_eq!(runs.load(Ordering::SeqCst), ran, "halted: no more runs");
        let counted = skipped_total(&registry, "halt", "halted");
        let rows = skipped_rows(&admin, "halt").await;
        assert!(rows.iter().all(|r| r.1 == "halted"), "{rows:?}");
        let in_rows: i64 = rows.iter().map(|r| r.2).sum();
        assert_eq!(
            in_rows as u64, counted,
            "the table and the metric agree: {rows:?}"
        );
        let window = stopped.duration_since(lost).unwrap().as_millis() / period.as_millis() + 1;
        assert!(
            (counted as u128) <= window,
            "only dues since the loss are counted: {counted} of at most {window}"
        );
    }
}

/// A replica as the README wires it: a supervisor running the election and the schedule, with
/// fast takeover and a drain timeout of `drain`. Its job, due every second, runs `run_sql` on a
/// pool of its own and says when it starts.
struct Supervised {
    elector: Elector,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

fn supervised(
    db: &TestDb,
    key: pg_elector::LockKey,
    name: &'static str,
    drain: Duration,
    run_sql: Option<String>,
    started: &Arc<Mutex<Vec<Instant>>>,
) -> Supervised {
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .identity(name)
        .drain_timeout(drain)
        .fast_takeover(true)
        .build()
        .unwrap();
    let (schedule_pool, job_pool) = (db.pool(2), db.pool(2));
    let started = started.clone();
    let schedule_elector = elector.clone();
    let supervisor = pg_elector::background::Supervisor::new()
        .election(&elector)
        .worker("schedule", move |token| {
            let (job_pool, run_sql, started) = (job_pool.clone(), run_sql.clone(), started.clone());
            Schedule::new(&schedule_elector, schedule_pool.clone())
                .poll_interval(I)
                .job(Job::every("drain", Duration::from_secs(1)), move |_run| {
                    let (job_pool, run_sql, started) =
                        (job_pool.clone(), run_sql.clone(), started.clone());
                    async move {
                        let Some(sql) = run_sql else {
                            return Ok(());
                        };
                        started.lock().unwrap().push(Instant::now());
                        let client = job_pool.get().await.map_err(|e| e.to_string())?;
                        client.batch_execute(&sql).await.map_err(|e| e.to_string())
                    }
                })
                .run(token)
        });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(supervisor.run(shutdown.clone()));
    Supervised {
        elector,
        shutdown,
        task,
    }
}

/// Item 1: a run in flight at a graceful shutdown under a supervisor is drained before the
/// lock is given up. a's job writes after `secs` of work (`pg_sleep`); a's supervisor is
/// cancelled 50 ms into the run; b (fast takeover) writes as soon as it leads. a's write must
/// come first by the server's clock, and b lead only once a's run is over: at least `secs` after
/// it started.
async fn a_run_in_flight_at_shutdown_is_drained(
    key: pg_elector::LockKey,
    secs: f64,
    drain: Duration,
) {
    use common::handover::{write, writes, writes_table};
    let db = fresh_db().await;
    writes_table(&db).await;
    let started: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let sql = format!("INSERT INTO writes SELECT 'a', clock_timestamp() FROM pg_sleep({secs})");
    let a = supervised(&db, key, "a", drain, Some(sql), &started);
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = supervised(&db, key, "b", drain, None, &started);
    wait_for(Duration::from_secs(3), || {
        !started.lock().unwrap().is_empty()
    })
    .await
    .expect("a's job starts");
    let run_started = started.lock().unwrap()[0];
    tokio::time::sleep(Duration::from_millis(50).saturating_sub(run_started.elapsed())).await;
    a.shutdown.cancel();
    let cancelled = Instant::now();
    wait_for(drain + Duration::from_secs(5), || b.elector.is_leader())
        .await
        .expect("b leads after a's graceful shutdown");
    let took = cancelled.elapsed();
    let after_start = run_started.elapsed();
    let b_pool = db.pool(1);
    write(&b_pool, "b").await;
    a.task.await.unwrap();
    b.shutdown.cancel();
    b.task.await.unwrap();

    let rows = writes(&db).await;
    eprintln!(
        "b led {took:?} after the cancel, {after_start:?} after a's run started; writes {rows:?}"
    );
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["a", "b"],
        "a's run in flight wrote before b led and wrote: {rows:?}"
    );
    assert!(
        after_start >= Duration::from_secs_f64(secs),
        "b led only once a's {secs} s run was over: {after_start:?} after it started"
    );
}

mod h1 {
    use super::*;

    /// The README's wiring, a short run well within the drain timeout (a regression test: it
    /// passed before this change too).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_in_flight_at_a_supervised_shutdown_is_drained() {
        let _timing = timing();
        a_run_in_flight_at_shutdown_is_drained(
            pg_elector::LockKey::new(0x17, 1),
            0.3,
            Duration::from_secs(2),
        )
        .await;
    }

    /// A run longer than the schedule's own grace after the term ends (two polls, at least 2 s)
    /// but within the elector's drain timeout (6 s): the schedule cut it off at 2 s, the drain saw
    /// no work left and gave the lock up, and b led and wrote while a's statement was still
    /// running on the server. The grace is now at least the elector's drain timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_grace_does_not_cut_a_run_off_before_the_drain_timeout() {
        let _timing = timing();
        a_run_in_flight_at_shutdown_is_drained(
            pg_elector::LockKey::new(0x17, 2),
            3.0,
            Duration::from_secs(6),
        )
        .await;
    }
}
