//! F8.1 and F8.2, the schedule part of Hardening III (issue 30): partial failures that broke a
//! promise. A connection whose statement did not answer in time is closed, never handed back
//! to the pool the application shares; a run whose heartbeats do not land ends before another
//! term may take it for dead, and one that another term called abandoned ends at its next beat
//! and stays recorded so; the tables' upgrade does not queue every claim behind a long query.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::schedules::{
    Body, OLD_DDL, first_start, leading_schedule, schedule, slow_commits, stored_runs,
};
use common::*;
use deadpool_postgres::Pool;
use pg_elector::schedule::{Job, JobRun};

/// Every connection of `pool` (up to `size`, borrowed at once within 3 s, new ones made as
/// needed) answers `SELECT 1` within 1 s; otherwise what did not.
async fn every_connection_answers(pool: &Pool, size: usize) -> Result<(), String> {
    let limit = Duration::from_secs(1);
    let mut held = Vec::new();
    for n in 0..size {
        let object = tokio::time::timeout(3 * limit, pool.get())
            .await
            .map_err(|_| format!("connection {n}: no connection from the pool within 3 s"))?
            .map_err(|e| format!("connection {n}: {e}"))?;
        held.push(object);
    }
    for (n, object) in held.iter().enumerate() {
        tokio::time::timeout(limit, object.simple_query("SELECT 1"))
            .await
            .map_err(|_| {
                format!("connection {n} of the pool: no answer to SELECT 1 within {limit:?}")
            })?
            .map_err(|e| format!("connection {n}: {e}"))?;
    }
    Ok(())
}

mod f8_1 {
    use super::*;

    /// Item 1: a claim whose COMMIT waits on the server (a synchronous standby that does not
    /// confirm, as the client sees it: here a deferred trigger that sleeps 15 s) past the
    /// claim's 2 s bound. Its connection went back to the pool the application shares, and
    /// after the schedule had stopped, a `SELECT 1` on it waited for the COMMIT. It is closed
    /// now, and every connection the pool hands out answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_timed_out_on_its_commit_leaves_no_connection_behind() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        slow_commits(&db, &admin, 15.0).await;
        let pool = db.pool(2);
        let (starts, capture, sched) = leading_schedule(
            pool.clone(),
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
        capture
            .logged("the claim's COMMIT got no answer", Duration::from_secs(5))
            .await
            .expect("a claim times out on its commit");
        let timed_out = Instant::now();
        sched.stop().await;
        eprintln!(
            "stopped {:?} after the claim timed out",
            timed_out.elapsed()
        );
        let answered = every_connection_answers(&pool, 2).await;
        assert_eq!(
            answered,
            Ok(()),
            "the application's pool after the schedule"
        );
    }

    /// Item 1, a heartbeat: another session holds the running run's row `FOR UPDATE`, so
    /// every beat waits on the row lock past its 1 s bound. Each beat's connection is closed:
    /// while the lock is still held, every connection of the pool answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_heartbeat_timed_out_on_a_row_lock_leaves_no_connection_behind() {
        let _timing = timing();
        let db = fresh_db().await;
        let pool = db.pool(3);
        let (starts, _capture, sched) = leading_schedule(
            pool.clone(),
            Job::every("long", Duration::from_secs(1)).rerun_abandoned(false),
            Duration::from_secs(5),
        );
        first_start(&starts, Duration::from_secs(5), "the job runs").await;
        let mut locker = db.connect().await.unwrap();
        let tx = locker.transaction().await.unwrap();
        tx.batch_execute(
            "SELECT 1 FROM pg_elector_job_runs WHERE job = 'long' AND outcome = 'running' \
             FOR UPDATE",
        )
        .await
        .unwrap();
        // Two beats time out on the lock (1 s each).
        tokio::time::sleep(Duration::from_millis(2300)).await;
        let answered = every_connection_answers(&pool, 3).await;
        tx.rollback().await.unwrap();
        sched.stop().await;
        assert_eq!(answered, Ok(()), "the pool while the row lock is held");
    }
}

mod f9_3 {
    use super::*;

    /// A schedule on the application's pool of one connection, which the application hands
    /// back inside a transaction (a `BEGIN` and an `INSERT` without their `COMMIT`, an
    /// application bug): the schedule's claim does not join that transaction (its `BEGIN`
    /// would have, and its `COMMIT` committed the application's `INSERT`); the connection is
    /// closed, which ends the transaction, and the job runs on a fresh one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_schedule_never_commits_a_transaction_the_application_left_open() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        admin
            .batch_execute("CREATE TABLE app_rows (n int)")
            .await
            .unwrap();
        let app = db.pool(1);
        let (starts, _capture, sched) = leading_schedule(
            app.clone(),
            Job::every("tick", Duration::from_millis(200)),
            Duration::ZERO,
        );
        wait_for(Duration::from_secs(5), || starts.lock().unwrap().len() >= 2)
            .await
            .expect("the job runs");
        // The tables exist and the job is registered: the next statements are claims.
        let (leaked, inserted) =
            leave_in_transaction(&app, "INSERT INTO app_rows VALUES (1)").await;
        inserted.unwrap();
        let ran = starts.lock().unwrap().len();
        wait_for(Duration::from_secs(5), || {
            starts.lock().unwrap().len() >= ran + 2
        })
        .await
        .expect("the job runs on");
        // A transaction left aborted by an error: the probe fails in it; closed all the same.
        let (aborted, failed) = leave_in_transaction(&app, "SELECT 1/0").await;
        assert!(failed.is_err());
        let ran = starts.lock().unwrap().len();
        wait_for(Duration::from_secs(5), || {
            starts.lock().unwrap().len() >= ran + 2
        })
        .await
        .expect("the job runs on after an aborted transaction");
        sched.stop().await;
        let rows = query_i64(&admin, "SELECT count(*) FROM app_rows").await;
        assert_eq!(
            rows, 0,
            "the application's open transaction was never committed"
        );
        let fresh = app.get().await.unwrap();
        let pid = query_i64(&fresh, "SELECT pg_backend_pid()::int8").await;
        assert_ne!(
            pid, leaked,
            "the connection left inside a transaction was closed"
        );
        assert_ne!(
            pid, aborted,
            "the connection left in an aborted transaction was closed"
        );
    }
}

/// Each run as its body saw it: the replica, the due, when it started and when it ended (its
/// future finished or was dropped).
type Lives = Arc<Mutex<Vec<(&'static str, SystemTime, Instant, Option<Instant>)>>>;

/// Records the end of one run, however its future ends.
struct Ends(Lives, usize);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].3 = Some(Instant::now());
    }
}

/// A job body whose runs last `lasts` and record their life in `lives`.
fn living(replica: &'static str, lives: &Lives, lasts: Duration) -> Body {
    let lives = lives.clone();
    Arc::new(move |run: JobRun| {
        let lives = lives.clone();
        Box::pin(async move {
            let n = {
                let mut lives = lives.lock().unwrap();
                lives.push((replica, run.due, Instant::now(), None));
                lives.len() - 1
            };
            let _ends = Ends(lives, n);
            tokio::time::sleep(lasts).await;
            Ok(())
        })
    })
}

/// What an asynchronous failover does to job `lost` here (every 10 s): its run's row is gone
/// and the job's row is as before the claim, as on a promoted standby that never received
/// them.
async fn lose_the_claim(admin: &tokio_postgres::Client) {
    admin
        .batch_execute(
            "DELETE FROM pg_elector_job_runs WHERE job = 'lost'; \
             UPDATE pg_elector_jobs SET last_due = last_due - interval '10 s', \
               claimed_by = NULL, claimed_term = NULL, claimed_epoch = NULL, \
               started_at = NULL, finished_at = NULL, outcome = NULL WHERE job = 'lost'",
        )
        .await
        .unwrap();
}

mod f8_2 {
    use super::*;

    /// Item 2: a leader cut off by a partition 1 s into an 8 s run; the next leader called the
    /// run abandoned once it had been silent for the stale threshold (3 s) and reran it, while
    /// the old run went on: two runs of one due at once. The runner now ends its run once its
    /// beats have not landed for two thirds of the threshold, before anyone may call it
    /// abandoned. The two replicas lead at once (manual electors): the old one never learns
    /// that it was deposed, the worst case.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitioned_runner_ends_its_run_before_the_rerun() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        let lives: Lives = Arc::default();
        let poll = Duration::from_millis(100);
        let job = || Job::every("long", Duration::from_secs(1)).rerun_abandoned(true);
        let (capture_a, capture_b) = (Capture::default(), Capture::default());
        let a = schedule(
            db.pool_via(proxy.addr(), 2),
            poll,
            job(),
            living("a", &lives, Duration::from_secs(8)),
            &capture_a,
        );
        a.control.promote();
        let (_, due, started, _) = first_start(&lives, Duration::from_secs(5), "a runs").await;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
        proxy.blackhole();
        let partitioned = Instant::now();
        let b = schedule(
            db.pool(2),
            poll,
            job(),
            living("b", &lives, Duration::from_millis(10)),
            &capture_b,
        );
        b.control.promote();
        let rerun = wait_for(Duration::from_secs(8), || {
            lives
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.0 == "b" && l.1 == due)
        })
        .await;
        b.stop().await;
        proxy.pass();
        a.stop().await;

        let lives = lives.lock().unwrap().clone();
        eprintln!("partitioned at {partitioned:?}; runs: {lives:?}");
        let of_due: Vec<_> = lives.iter().filter(|l| l.1 == due).collect();
        let (a_run, b_run) = (of_due[0], of_due.last().unwrap());
        assert!(rerun.is_some(), "b reran the abandoned due: {of_due:?}");
        assert_eq!(
            (a_run.0, b_run.0, of_due.len()),
            ("a", "b", 2),
            "{of_due:?}"
        );
        let a_ended = a_run.3.expect("a's run ended");
        assert!(
            a_ended <= b_run.2,
            "a's run went on {:?} past the start of b's rerun",
            a_ended - b_run.2
        );
        // Cut off two thirds of the 3 s threshold after its last beat (sent at most a poll
        // before the partition), with slack for a loaded machine.
        let cut_after = a_ended - partitioned;
        assert!(
            cut_after <= Duration::from_millis(2000 + 700),
            "cut off {cut_after:?} after the partition"
        );
        assert_eq!(
            capture_a
                .events("the run was cut off: its heartbeats did not land")
                .len(),
            1,
            "a says why it ended its run"
        );
    }

    /// An asynchronous database failover can lose a run's claim while the run goes on; the
    /// next term then claims the same due and attempt again. The old runner's beats named only
    /// the due and the attempt, so they landed on the new claim's row, and the old run went on
    /// to its end beside the new one (the chaos soak with failovers, seed 33005: 2.4 s of
    /// overlap). Now a beat names its term: the old runner's next beat finds no row of its own
    /// and ends its run. The loss is made by hand here: a's run row is deleted and the job's
    /// row set back to before the claim, as on a promoted standby that never received them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runner_whose_claim_was_lost_stops_at_its_next_beat_beside_the_new_claim() {
        let _timing = timing();
        let db = fresh_db().await;
        let lives: Lives = Arc::default();
        let period = Duration::from_secs(10);
        let job = || Job::every("lost", period);
        let (capture_a, capture_b) = (Capture::default(), Capture::default());
        // a beats every second (its cut-off would come 2 s after the loss); b polls fast, so
        // that it claims again well before a's next beat.
        let a = schedule(
            db.pool(2),
            Duration::from_secs(1),
            job(),
            living("a", &lives, Duration::from_secs(8)),
            &capture_a,
        );
        a.control.promote();
        let (_, due, _, _) = first_start(&lives, period + Duration::from_secs(5), "a runs").await;
        let admin = db.connect().await.unwrap();
        lose_the_claim(&admin).await;
        let lost = Instant::now();
        let b = schedule(
            db.pool(2),
            Duration::from_millis(100),
            job(),
            living("b", &lives, Duration::from_secs(3)),
            &capture_b,
        );
        b.control.promote();
        let b_started = wait_for(Duration::from_secs(5), || {
            lives.lock().unwrap().iter().any(|l| l.0 == "b")
        })
        .await;
        let a_ended = wait_for(Duration::from_secs(9), || {
            lives.lock().unwrap()[0].3.is_some()
        })
        .await;
        let lives_seen = lives.lock().unwrap().clone();
        let runs = stored_runs(&admin, "lost").await;
        b.stop().await;
        a.stop().await;
        eprintln!("lost at {lost:?}; runs: {lives_seen:?}; stored: {runs:?}");
        assert!(b_started.is_some(), "b claimed again: {lives_seen:?}");
        let b_run = lives_seen.iter().find(|l| l.0 == "b").unwrap();
        assert_eq!(b_run.1, due, "b claimed the same due as a: {lives_seen:?}");
        assert!(a_ended.is_some(), "a's run ended: {lives_seen:?}");
        let a_end = lives_seen[0].3.unwrap();
        // b's claim was there when a stopped: a's beat met the new row, not an empty table.
        assert!(
            b_run.2 < a_end,
            "b's run began {:?} after a's ended: the test did not reach the case",
            b_run.2 - a_end
        );
        // Its next beat comes within a second of the loss (a poll), with slack.
        assert!(
            a_end <= lost + Duration::from_millis(1_000 + 700),
            "a's run went on {:?} after its claim was lost (b's run began {:?} after)",
            a_end - lost,
            b_run.2 - lost
        );
        assert_eq!(
            capture_a
                .events("the run was cut off: its record is no longer running")
                .len(),
            1,
            "a says why it ended its run"
        );
        let rows: Vec<_> = runs.iter().map(|r| (r.0, r.1, r.3.as_str())).collect();
        assert_eq!(
            rows,
            vec![(due, 1, "running")],
            "one row, b's claim of the same due and attempt, still running: {runs:?}"
        );
    }

    /// The same loss, with the old run ending by itself after the new claim and before its
    /// next beat: its end named only the due and the attempt, so it marked the new claim's row
    /// finished, and the new runner's next beat found its record ended and cut its run off.
    /// Now the end names its term, and the new run goes on to its end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_ending_after_its_claim_was_lost_does_not_end_the_new_claim() {
        let _timing = timing();
        let db = fresh_db().await;
        let lives: Lives = Arc::default();
        let period = Duration::from_secs(10);
        let job = || Job::every("lost", period);
        let (capture_a, capture_b) = (Capture::default(), Capture::default());
        // a beats 1 s after its claim and 1 s later; its run ends 1.6 s in, between the two.
        let a = schedule(
            db.pool(2),
            Duration::from_secs(1),
            job(),
            living("a", &lives, Duration::from_millis(1_600)),
            &capture_a,
        );
        a.control.promote();
        let (_, due, started, _) =
            first_start(&lives, period + Duration::from_secs(5), "a runs").await;
        tokio::time::sleep(Duration::from_millis(1_150).saturating_sub(started.elapsed())).await;
        let admin = db.connect().await.unwrap();
        lose_the_claim(&admin).await;
        let b = schedule(
            db.pool(2),
            Duration::from_millis(100),
            job(),
            living("b", &lives, Duration::from_millis(1_500)),
            &capture_b,
        );
        b.control.promote();
        let b_ended = wait_for(Duration::from_secs(6), || {
            lives
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.0 == "b" && l.3.is_some())
        })
        .await;
        let lives_seen = lives.lock().unwrap().clone();
        // b records its end just after its body returns.
        let mut runs = stored_runs(&admin, "lost").await;
        let recorded = Instant::now() + Duration::from_secs(2);
        while runs.iter().any(|r| r.3 == "running") && Instant::now() < recorded {
            tokio::time::sleep(Duration::from_millis(20)).await;
            runs = stored_runs(&admin, "lost").await;
        }
        b.stop().await;
        a.stop().await;
        eprintln!("runs: {lives_seen:?}; stored: {runs:?}");
        assert!(b_ended.is_some(), "b's run ended: {lives_seen:?}");
        let (a_run, b_run) = (
            &lives_seen[0],
            lives_seen.iter().find(|l| l.0 == "b").unwrap(),
        );
        assert_eq!(
            (a_run.0, b_run.1),
            ("a", due),
            "b ran a's due again: {lives_seen:?}"
        );
        assert!(
            b_run.2 < a_run.3.expect("a's run ended"),
            "b claimed before a's run ended: {lives_seen:?}"
        );
        let b_lasted = b_run.3.unwrap() - b_run.2;
        assert!(
            b_lasted >= Duration::from_millis(1_500),
            "b's run was cut off after {b_lasted:?}"
        );
        assert!(
            capture_b.events("the run was cut off").is_empty(),
            "b was not cut off"
        );
        let rows: Vec<_> = runs.iter().map(|r| (r.0, r.1, r.3.as_str())).collect();
        assert_eq!(rows, vec![(due, 1, "succeeded")], "b's own end: {runs:?}");
    }

    /// A run cut off because its beats failed did not run in full: with
    /// `rerun_abandoned(true)` it must run again. A 2.6 s partition of the leader's pool (past
    /// the 2 s cut-off, short of the 3 s at which another term would call it abandoned, and
    /// nobody else leads): the leader itself records the cut-off run as abandoned once its
    /// pool answers again, and reruns its due.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_cut_off_is_rerun_when_the_job_asks() {
        let _timing = timing();
        let db = fresh_db().await;
        let proxy = shared_server_proxy().await;
        let lives: Lives = Arc::default();
        let capture = Capture::default();
        let sched = schedule(
            db.pool_via(proxy.addr(), 2),
            Duration::from_millis(100),
            Job::every("long", Duration::from_secs(1)).rerun_abandoned(true),
            living("a", &lives, Duration::from_secs(4)),
            &capture,
        );
        sched.control.promote();
        let (_, due, _, _) = first_start(&lives, Duration::from_secs(5), "the job runs").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.blackhole();
        tokio::time::sleep(Duration::from_millis(2600)).await;
        proxy.pass();
        let rerun = wait_for(Duration::from_secs(5), || {
            lives.lock().unwrap().iter().filter(|l| l.1 == due).count() >= 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        sched.stop().await;
        let runs = stored_runs(&db.connect().await.unwrap(), "long").await;
        let of_due: Vec<_> = runs
            .iter()
            .filter(|r| r.0 == due)
            .map(|r| (r.1, r.3.clone()))
            .collect();
        eprintln!("runs of the due: {of_due:?}");
        assert!(
            rerun.is_some(),
            "the cut-off run's due ran again: {of_due:?}"
        );
        assert_eq!(of_due[0], (1, "abandoned".to_owned()), "{of_due:?}");
        let lives = lives.lock().unwrap().clone();
        let of_due: Vec<_> = lives.iter().filter(|l| l.1 == due).collect();
        assert!(
            of_due[0].3.is_some_and(|ended| ended <= of_due[1].2),
            "never two runs at once: {of_due:?}"
        );
    }

    /// Item 9: a run that another term called abandoned went on to its end, and its end
    /// overwrote the `abandoned` record (a due reported run that was skipped or rerun). The
    /// next beat finds the record settled and ends the run; the record stays `abandoned`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_called_abandoned_ends_at_its_next_beat_and_stays_so() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let lives: Lives = Arc::default();
        let capture = Capture::default();
        let poll = Duration::from_millis(100);
        let sched = schedule(
            db.pool(2),
            poll,
            Job::every("long", Duration::from_secs(1)),
            living("a", &lives, Duration::from_secs(5)),
            &capture,
        );
        sched.control.promote();
        let (_, due, _, _) = first_start(&lives, Duration::from_secs(5), "the job runs").await;
        admin
            .batch_execute(
                "UPDATE pg_elector_job_runs SET outcome = 'abandoned', \
                 finished_at = clock_timestamp() WHERE job = 'long' AND outcome = 'running'",
            )
            .await
            .unwrap();
        let abandoned = Instant::now();
        let ended = wait_for(Duration::from_secs(3), || {
            lives.lock().unwrap()[0].3.is_some()
        })
        .await;
        // Its end recorded (or not) before the schedule stops.
        tokio::time::sleep(Duration::from_millis(500)).await;
        sched.stop().await;
        let ended_after = lives.lock().unwrap()[0].3.map(|at| at - abandoned);
        assert!(ended.is_some(), "the run ended at its next beat");
        assert!(
            ended_after.unwrap() <= poll * 2 + Duration::from_millis(500),
            "within a beat and its answer: {ended_after:?}"
        );
        let runs = stored_runs(&admin, "long").await;
        let of_due: Vec<_> = runs.iter().filter(|r| r.0 == due).collect();
        assert_eq!(of_due.len(), 1, "{runs:?}");
        assert_eq!(of_due[0].3, "abandoned", "the record stays: {runs:?}");
    }
}

mod tables {
    use super::*;

    /// Item 10: the upgrade's `ALTER TABLE … ADD COLUMN` queued its exclusive lock behind a
    /// long query on the job tables, and every other statement on them queued behind it. It
    /// gives up after a short lock wait now (and tries again every poll): a reader of the
    /// tables answers within 1 s all along, and the jobs run once the long query ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_upgrade_does_not_queue_other_statements_behind_a_long_query() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        admin.batch_execute(OLD_DDL).await.unwrap();
        let mut report = db.connect().await.unwrap();
        let long_query = report.transaction().await.unwrap();
        long_query
            .batch_execute("SELECT count(*) FROM pg_elector_jobs")
            .await
            .unwrap();
        let (starts, capture, sched) = leading_schedule(
            db.pool(2),
            Job::every("count", Duration::from_millis(100)),
            Duration::ZERO,
        );
        capture
            .logged(
                "the job tables' upgrade waits for a lock",
                Duration::from_secs(5),
            )
            .await
            .expect("the upgrade meets the long query");
        let reader = db.connect().await.unwrap();
        let mut slowest = Duration::ZERO;
        let watching = Instant::now();
        while watching.elapsed() < Duration::from_secs(2) {
            let asked = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(1),
                reader.simple_query("SELECT count(*) FROM pg_elector_job_runs"),
            )
            .await;
            assert!(
                matches!(answer, Ok(Ok(_))),
                "a reader of the tables waited past 1 s: {answer:?}"
            );
            slowest = slowest.max(asked.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            starts.lock().unwrap().is_empty(),
            "no job runs on old tables"
        );
        long_query.commit().await.unwrap();
        let ran = wait_for(Duration::from_secs(3), || {
            !starts.lock().unwrap().is_empty()
        })
        .await;
        sched.stop().await;
        eprintln!("the slowest read while the upgrade waited: {slowest:?}");
        assert!(ran.is_some(), "the jobs run once the long query ended");
    }
}

/// Counts the scheduled claims (the statement that moves the job's `last_due`) in a sequence,
/// which no rollback undoes, and holds the second one (at most 5 s) until the run in the way
/// has ended. The held claim read the tables before (its snapshot is taken before the trigger
/// fires): the claims after it see the run ended.
const COUNT_CLAIMS: &str = "CREATE SEQUENCE claims_tried; \
     CREATE FUNCTION count_claims() RETURNS trigger LANGUAGE plpgsql AS $$ \
     BEGIN \
       IF current_query() LIKE '%SET last_due = $3, claimed_by%' \
          AND nextval('claims_tried') = 2 THEN \
         FOR i IN 1..500 LOOP \
           EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_elector_job_runs \
             WHERE claimed_term = 'elsewhere/1/0/0' AND outcome = 'running'); \
           PERFORM pg_sleep(0.01); \
         END LOOP; \
       END IF; \
       RETURN NULL; \
     END $$; \
     CREATE TRIGGER count_claims BEFORE UPDATE ON pg_elector_jobs \
       FOR EACH STATEMENT EXECUTE FUNCTION count_claims()";

mod f5 {
    use super::*;

    /// No due is lost (F5, with `CatchUp::All`) when another term's run that held the job back
    /// ends while a pass is claiming the missed dues. The pass found the run in the way at the
    /// first claims and went on to the next dues; the run ended, a later due's claim went
    /// through, and the job's row moved past the dues before it: they never ran. (Seen once
    /// after a database failover, where the run in the way was the crashed primary's.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_in_the_way_ending_mid_pass_loses_no_due() {
        let _timing = timing();
        let period = Duration::from_millis(100);
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let job = || Job::every("tick", period).catch_up(pg_elector::schedule::CatchUp::All);
        let (starts, _, sched) = leading_schedule(db.pool(2), job(), Duration::ZERO);
        wait_for(Duration::from_secs(5), || starts.lock().unwrap().len() >= 2)
            .await
            .expect("the job runs");
        sched.stop().await;
        let last: SystemTime = admin
            .query_one(
                "SELECT last_due FROM pg_elector_jobs WHERE job = 'tick'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        // Another term's run, alive (it promised a beat an hour), holds the job back.
        admin
            .batch_execute(
                "INSERT INTO pg_elector_job_runs (namespace, job, due, attempt, kind, \
                 claimed_by, claimed_term, started_at, heartbeat_at, heartbeat_period, outcome) \
                 VALUES ('local', 'tick', '2000-01-01', 1, 'scheduled', 'elsewhere', \
                 'elsewhere/1/0/0', clock_timestamp(), clock_timestamp(), '1 hour', 'running')",
            )
            .await
            .unwrap();
        tokio::time::sleep(10 * period).await;
        admin.batch_execute(COUNT_CLAIMS).await.unwrap();
        let (starts, _, sched) = leading_schedule(db.pool(2), job(), Duration::ZERO);
        // The second claim is held: the run in the way ends meanwhile, and the claims after
        // it see it ended.
        let tried = wait_for_async(Duration::from_secs(5), || async {
            let row = admin
                .query_one(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM claims_tried",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) >= 2
        })
        .await;
        let ran_in_the_way = starts.lock().unwrap().len();
        admin
            .batch_execute(
                "UPDATE pg_elector_job_runs SET outcome = 'succeeded', \
                 finished_at = clock_timestamp() WHERE claimed_term = 'elsewhere/1/0/0'",
            )
            .await
            .unwrap();
        let ended = SystemTime::now();
        let caught_up = wait_for(Duration::from_secs(10), || {
            starts
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.1 > ended + 3 * period)
        })
        .await;
        sched.stop().await;
        tried.expect("the pass tried to claim two dues while the run was in the way");
        assert_eq!(ran_in_the_way, 0, "no due ran beside the run in the way");
        caught_up.expect("the job runs once the run in the way ended");
        let ran: Vec<SystemTime> = starts.lock().unwrap().iter().map(|s| s.1).collect();
        let mut lost = Vec::new();
        let mut due = last + period;
        while due <= *ran.iter().max().unwrap() {
            if !ran.contains(&due) {
                lost.push(due);
            }
            due += period;
        }
        assert!(
            lost.is_empty(),
            "dues that never ran: {lost:?} (ran: {ran:?})"
        );
        let mut sorted = ran.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ran, "each due ran once, in order");
    }
}

/// Once made, the first scheduled claim fails after 350 ms (an error: the dues that came
/// meanwhile stay on time, for the next pass), and the second is held (at most 5 s) until the
/// job's `last_due` has moved, as another term's claim moves it; counted in `claims_held`.
const HOLD_CLAIM: &str = "CREATE SEQUENCE claims_held; \
     CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$ \
     DECLARE before timestamptz; n bigint; \
     BEGIN \
       IF current_query() NOT LIKE '%SET last_due = $3, claimed_by%' THEN RETURN NULL; END IF; \
       n := nextval('claims_held'); \
       IF n = 1 THEN \
         PERFORM pg_sleep(0.35); \
         RAISE EXCEPTION 'a claim that failed'; \
       ELSIF n = 2 THEN \
         SELECT last_due INTO before FROM pg_elector_jobs WHERE job = 'tick'; \
         FOR i IN 1..500 LOOP \
           EXIT WHEN (SELECT last_due FROM pg_elector_jobs WHERE job = 'tick') > before; \
           PERFORM pg_sleep(0.01); \
         END LOOP; \
       END IF; \
       RETURN NULL; \
     END $$; \
     CREATE TRIGGER hold_claim BEFORE UPDATE ON pg_elector_jobs \
       FOR EACH STATEMENT EXECUTE FUNCTION hold_claim()";

mod f5_overlap {
    use super::*;

    /// A claim refused because another term had claimed that due already (two leaders at
    /// once, unfenced) loses nothing, and the dues after it came on time (a failed claim held
    /// the pass back while they came): they run in the same pass, even with `CatchUp::Skip`,
    /// rather than counting as missed at the next one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_due_another_term_claimed_first_does_not_make_the_next_ones_late() {
        let _timing = timing();
        let period = Duration::from_millis(100);
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let job = Job::every("tick", period).catch_up(pg_elector::schedule::CatchUp::Skip);
        let (starts, _, sched) = leading_schedule(db.pool(2), job, Duration::ZERO);
        wait_for(Duration::from_secs(5), || starts.lock().unwrap().len() >= 3)
            .await
            .expect("the job runs");
        admin.batch_execute(HOLD_CLAIM).await.unwrap();
        let held = wait_for_async(Duration::from_secs(5), || async {
            let row = admin
                .query_one(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM claims_held",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) >= 2
        })
        .await;
        // Three more dues came while the first claim failed: the next pass plans four, on
        // time. "Another term" claims the first of them while its claim is held: the row
        // moves to it.
        let taken: SystemTime = admin
            .query_one(
                "UPDATE pg_elector_jobs SET last_due = last_due + interval '100 milliseconds' \
                 WHERE job = 'tick' RETURNING last_due",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let later = wait_for(Duration::from_secs(5), || {
            starts
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.1 > taken + 6 * period)
        })
        .await;
        sched.stop().await;
        held.expect("a claim failed and the next was held");
        later.expect("the job runs on");
        let ran: Vec<SystemTime> = starts.lock().unwrap().iter().map(|s| s.1).collect();
        assert!(!ran.contains(&taken), "the due claimed elsewhere ran here");
        // The three that came while the first claim failed were planned on time with it.
        let missing: Vec<SystemTime> = (1..=3)
            .map(|n| taken + n * period)
            .filter(|due| !ran.contains(due))
            .collect();
        assert!(
            missing.is_empty(),
            "dues planned on time after the one claimed elsewhere did not run: {missing:?}"
        );
    }
}
