//! F5: runs cut off by a failover, and claims made by a leader that was deposed without
//! noticing. A run whose leader crashed is reported abandoned exactly once (and rerun once when
//! the job asks), even when the job is due more often than a run takes to be called dead; a run
//! this process cut off itself at the end of its previous term is called abandoned at once by
//! its next term; a deposed leader's claims are refused by the epoch row, and each due runs
//! once, by the real leader.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::schedules::{Body, ManualSchedule};
use common::*;
use pg_elector::schedule::{CatchUp, Job, JobRun, Schedule, ScheduleError};
use pg_elector::{Elector, LockKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

/// Which replica started a run of which due, and when.
type Starts = Arc<Mutex<Vec<(&'static str, SystemTime, Instant)>>>;

/// The table the test jobs write to when a run ends: one row per finished run.
const JOB_LOG: &str = "CREATE TABLE job_log (job text NOT NULL, due timestamptz NOT NULL, \
             replica text NOT NULL, kind text NOT NULL, attempt int4 NOT NULL)";

/// A job body that says when it starts, works for `lasts`, then logs its run.
fn slow(
    pool: deadpool_postgres::Pool,
    replica: &'static str,
    lasts: Duration,
    starts: Starts,
) -> Body {
    Arc::new(move |run: JobRun| {
        let (pool, starts) = (pool.clone(), starts.clone());
        Box::pin(async move {
            starts
                .lock()
                .unwrap()
                .push((replica, run.due, Instant::now()));
            tokio::time::sleep(lasts).await;
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client
                .execute(
                    "INSERT INTO job_log (job, due, replica, kind, attempt) \
                     VALUES ($1, $2, $3, $4, $5)",
                    &[
                        &run.job,
                        &run.due,
                        &replica,
                        &format!("{:?}", run.kind),
                        &(run.attempt as i32),
                    ],
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    })
}

/// One replica: a fenced elector and a schedule of one job, each its own task, logging into
/// `capture` if given. (A replica that is to crash logs to the global subscriber: spans of a
/// captured task that is aborted would be closed, at the drop, by a subscriber that never saw
/// them, which panics in tracing-subscriber.)
struct Node {
    name: &'static str,
    elector: Elector,
    shutdown: CancellationToken,
    election: JoinHandle<Result<(), pg_elector::Error>>,
    schedule: JoinHandle<Result<(), ScheduleError>>,
}

fn node(
    db: &TestDb,
    key: LockKey,
    name: &'static str,
    job: Job,
    body: Body,
    capture: Option<&Capture>,
) -> Node {
    let dispatch = capture.map_or_else(
        || tracing::dispatcher::get_default(Clone::clone),
        Capture::dispatch,
    );
    let elector = fenced_elector(db.pool(2), key, name, I);
    let schedule = Schedule::new(&elector, db.pool(2))
        .poll_interval(I)
        .job(job, move |run| body(run));
    spawn_node(name, elector, schedule, dispatch)
}

/// Replica `name`: `elector`'s election and `schedule` (made on `elector`), each its own task,
/// logging into `dispatch`.
fn spawn_node(
    name: &'static str,
    elector: Elector,
    schedule: Schedule,
    dispatch: tracing::Dispatch,
) -> Node {
    let shutdown = CancellationToken::new();
    let election = tokio::spawn(
        {
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        }
        .with_subscriber(dispatch.clone()),
    );
    let schedule = tokio::spawn(schedule.run(shutdown.clone()).with_subscriber(dispatch));
    Node {
        name,
        elector,
        shutdown,
        election,
        schedule,
    }
}

impl Node {
    /// A crash, in process: the schedule and the election are dropped where they stand. The
    /// run in progress stops at its `.await`, records nothing and beats no more; the lock
    /// connection is dropped without an unlock, and the server frees the lock.
    fn crash(self) {
        self.schedule.abort();
        self.election.abort();
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.election.await.unwrap().unwrap();
        self.schedule.await.unwrap().unwrap();
    }
}

/// `(due, outcome, kind, attempt, claimed_by)` of every stored run of `job`, oldest first.
async fn stored_runs(db: &TestDb, job: &str) -> Vec<(SystemTime, String, String, i32, String)> {
    let runs = common::schedules::stored_runs(&db.connect().await.unwrap(), job).await;
    runs.into_iter()
        .map(|(due, attempt, kind, outcome, by)| (due, outcome, kind, attempt, by))
        .collect()
}

/// Two replicas, a job due every 200 ms whose runs take 1 s. The leader crashes 300 ms into a
/// run; the other one takes over within about I, long before that run could be called dead
/// (it heart-beats until the crash, and is dead only after 3 s of silence). Returns the crashed
/// run's due and the stored runs once the survivor has stopped.
async fn crash_mid_run(
    rerun: bool,
) -> (
    SystemTime,
    &'static str,
    Vec<(SystemTime, String, String, i32, String)>,
    Capture,
) {
    let db = fresh_db_with(JOB_LOG).await;
    let key = LockKey::new(0xf5, if rerun { 0xab2 } else { 0xab1 });
    let starts: Starts = Arc::default();
    let capture = Capture::default();
    let job = || Job::every("slow", Duration::from_millis(200)).rerun_abandoned(rerun);
    let body = |name| slow(db.pool(2), name, Duration::from_secs(1), starts.clone());
    let a = node(&db, key, "a", job(), body("a"), None);
    wait_for(5 * I, || a.elector.is_leader())
        .await
        .expect("a leads first");
    let survivor = node(&db, key, "b", job(), body("b"), Some(&capture));

    // a's second run: the schedule is well under way.
    let (leader, due) = wait_for(Duration::from_secs(10), || {
        starts.lock().unwrap().len() >= 2
    })
    .await
    .map(|_| {
        let starts = starts.lock().unwrap();
        (starts[1].0, starts[1].1)
    })
    .expect("two runs within 10 s");
    assert_eq!(leader, a.name);
    assert!(a.elector.is_leader());
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.crash();
    let crashed_at = Instant::now();
    wait_for(5 * I, || survivor.elector.is_leader())
        .await
        .expect("the survivor leads within 5·I of the crash");
    // Long enough for the crashed run to be called dead (3 s of silence, looked at every
    // poll), rerun if asked (1 s), and for the survivor to run its own dues, with 2 s to spare.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(crashed_at.elapsed())).await;
    survivor.stop().await;
    let runs = stored_runs(&db, "slow").await;
    (due, leader, runs, capture)
}

mod f5 {
    use super::*;

    /// A run cut off by a crash is reported abandoned once, though the job is due every 200 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_run_is_abandoned_once_though_due_every_200_ms() {
        let _timing = timing();
        let (due, crashed, runs, capture) = crash_mid_run(false).await;
        let abandoned: Vec<_> = runs.iter().filter(|r| r.1 == "abandoned").collect();
        let running: Vec<_> = runs.iter().filter(|r| r.1 == "running").collect();
        eprintln!("{} runs stored: {runs:?}", runs.len());
        assert!(running.is_empty(), "no run left running: {running:?}");
        assert_eq!(
            abandoned.len(),
            1,
            "exactly the crashed run is abandoned: {abandoned:?}"
        );
        assert_eq!(
            (abandoned[0].0, abandoned[0].4.as_str()),
            (due, crashed),
            "the crashed leader's run"
        );
        let reported = capture.events("a run claimed by an earlier term never finished");
        assert_eq!(reported.len(), 1, "reported once: {reported:?}");
        assert_eq!(reported[0].level, tracing::Level::WARN);
        assert!(
            runs.iter().all(|r| r.2 != "rerun"),
            "not rerun by default: {runs:?}"
        );
        assert!(
            runs.iter().any(|r| r.0 > due && r.1 == "succeeded"),
            "the survivor ran later dues: {runs:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_cut_off_by_a_crash_is_rerun_once_when_the_job_asks() {
        let _timing = timing();
        let (due, crashed, runs, _capture) = crash_mid_run(true).await;
        eprintln!("{} runs stored: {runs:?}", runs.len());
        let of_due: Vec<_> = runs.iter().filter(|r| r.0 == due).collect();
        assert_eq!(of_due.len(), 2, "the crashed run and one rerun: {of_due:?}");
        assert_eq!(
            (of_due[0].1.as_str(), of_due[0].3, of_due[0].4.as_str()),
            ("abandoned", 1, crashed)
        );
        assert_eq!(
            (of_due[1].1.as_str(), of_due[1].2.as_str(), of_due[1].3),
            ("succeeded", "rerun", 2),
            "rerun once, by the survivor"
        );
        assert_ne!(of_due[1].4, crashed);
        let reruns = runs.iter().filter(|r| r.2 == "rerun").count();
        assert_eq!(reruns, 1, "one rerun in all: {runs:?}");
        assert!(
            runs.iter().all(|r| r.1 != "running"),
            "no run left running: {runs:?}"
        );
    }

    /// The same process's previous term: a run still going when the term ended is given a grace,
    /// then aborted. The process knows that run is over, so its next term calls it abandoned at
    /// once, rather than after the silence a run of another process is given.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_cut_off_at_its_terms_end_is_abandoned_at_once() {
        let (_timing, db) = timing_db_with(JOB_LOG).await;
        let capture = Capture::default();
        let (elector, control) = Elector::manual();
        let starts: Starts = Arc::default();
        // The first run outlasts the grace; the later ones are short.
        let first = slow(db.pool(2), "m", Duration::from_secs(30), starts.clone());
        let later = slow(db.pool(2), "m", Duration::from_millis(10), starts.clone());
        let body = {
            let starts = starts.clone();
            move |run: JobRun| match starts.lock().unwrap().is_empty() {
                true => first(run),
                false => later(run),
            }
        };
        let schedule = Schedule::new(&elector, db.pool(2))
            .poll_interval(Duration::from_millis(50))
            .job(Job::every("long", Duration::from_millis(200)), body);
        let sched = ManualSchedule::spawn_captured(control, schedule, &capture);
        let due = sched
            .cut_off_first_run_then_promote(&starts, &capture, Duration::from_secs(2))
            .await
            .1;
        let abandoned = || async {
            stored_runs(&db, "long")
                .await
                .iter()
                .any(|r| r.0 == due && r.1 == "abandoned")
        };
        let took = wait_for_async(Duration::from_secs(5), abandoned)
            .await
            .expect("the cut-off run is called abandoned");
        // The next term goes on with the job: a later due runs within five periods (waited
        // for, not raced: the stop must not come between the abandon and that run's claim).
        let ran_on = || async {
            stored_runs(&db, "long")
                .await
                .iter()
                .any(|r| r.0 > due && r.1 == "succeeded")
        };
        let _ = wait_for_async(Duration::from_secs(1), ran_on).await;
        sched.stop().await;
        let runs = stored_runs(&db, "long").await;
        eprintln!("abandoned {took:?} after the next term began; runs: {runs:?}");
        assert!(
            took < Duration::from_secs(1),
            "at once ({took:?}), not after the 3 s of silence a run of another process is given"
        );
        let abandoned: Vec<_> = runs.iter().filter(|r| r.1 == "abandoned").collect();
        assert_eq!(abandoned.len(), 1, "{runs:?}");
        assert!(runs.iter().all(|r| r.1 != "running"), "{runs:?}");
        assert!(
            runs.iter().any(|r| r.0 > due && r.1 == "succeeded"),
            "the next term runs the job on, within 1 s (5 periods) of the abandon: {runs:?}"
        );
        let reported = capture.events("a run claimed by an earlier term never finished");
        assert_eq!(reported.len(), 1, "{reported:?}");
    }

    /// The case only the claim's fence catches: a leader deposed without noticing. a's lock
    /// connection goes through a proxy that is then blackholed, and the server ends a's lock
    /// session; b takes over and bumps the epoch. a checks every 20·I, so it goes on believing it
    /// leads for at least that long (its first check after the partition times out 20·I after it
    /// is sent), and its schedule (on a healthy pool) goes on claiming dues: each claim is refused
    /// by the epoch row. Every due runs once, and those after the bump on b.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_leaders_claims_are_refused_by_the_epoch() {
        let (_timing, db) = timing_db_with(JOB_LOG).await;
        let key = LockKey::new(0xf5, 0xfe);
        let period = Duration::from_millis(100);
        let proxy = shared_server_proxy().await;
        let starts: Starts = Arc::default();
        let (capture_a, capture_b) = (Capture::default(), Capture::default());
        let replica = |name: &'static str, pool, interval, capture: &Capture| {
            let elector = fenced_elector(pool, key, name, interval);
            let body = slow(db.pool(2), name, Duration::from_millis(5), starts.clone());
            let schedule = Schedule::new(&elector, db.pool(2))
                .poll_interval(Duration::from_millis(50))
                .job(
                    Job::every("fenced", period).catch_up(CatchUp::All),
                    move |run| body(run),
                );
            spawn_node(name, elector, schedule, capture.dispatch())
        };
        let a = replica("a", db.pool_via(proxy.addr(), 2), 20 * I, &capture_a);
        wait_for(3 * I, || a.elector.is_leader())
            .await
            .expect("a leads at its first try");
        let b = replica("b", db.pool(2), I, &capture_b);
        wait_for(Duration::from_secs(2), || starts.lock().unwrap().len() >= 3)
            .await
            .expect("a runs the job");
        let from = SystemTime::now();

        proxy.blackhole();
        terminate_holder(&db, key).await;
        wait_for(5 * I, || b.elector.is_leader())
            .await
            .expect("b takes over within a few I");
        let admin = db.connect().await.unwrap();
        let bumped = epoch_since(&admin, key).await;
        // Ten dues with two replicas that both believe they lead.
        tokio::time::sleep(10 * period).await;
        let overlap = a.elector.is_leader() && b.elector.is_leader();
        let to = SystemTime::now() - period;
        proxy.pass();
        b.stop().await;
        a.stop().await;

        assert!(
            overlap,
            "a still believed it led at the end of the window (its check every 20·I has not \
         timed out yet), so its claims passed its own look at its term"
        );
        let ran: Vec<(SystemTime, String)> = admin
            .query("SELECT due, replica FROM job_log ORDER BY due", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let by_a_after: Vec<_> = ran
            .iter()
            .filter(|(due, who)| who == "a" && *due > bumped)
            .collect();
        assert!(
            by_a_after.is_empty(),
            "no due after b's epoch began ran on a: {by_a_after:?}"
        );
        let mut per_due = std::collections::BTreeMap::<SystemTime, Vec<&str>>::new();
        for (due, who) in &ran {
            per_due.entry(*due).or_default().push(who);
        }
        let twice: Vec<_> = per_due.iter().filter(|(_, w)| w.len() > 1).collect();
        assert!(twice.is_empty(), "dues run twice: {twice:?}");
        let window: Vec<SystemTime> = per_due
            .keys()
            .copied()
            .filter(|d| *d >= from && *d <= to)
            .collect();
        let p = period.as_millis();
        let first = from
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            .div_ceil(p)
            * p;
        let last = to
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let expected: Vec<SystemTime> = (first..=last)
            .step_by(p as usize)
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64))
            .collect();
        let fenced = capture_a.events("the due's claim was fenced");
        assert!(
            !fenced.is_empty(),
            "a tried to claim dues while deposed, and the epoch row refused them"
        );
        assert!(
            fenced[0].field("error").contains("is not the current one"),
            "refused as superseded: {:?}",
            fenced[0]
        );
        eprintln!(
            "{} claims of a refused; {} dues in the window, each run once, {} after the bump on b",
            fenced.len(),
            expected.len(),
            ran.iter().filter(|(due, _)| *due > bumped).count()
        );
        assert_eq!(
            window, expected,
            "every due of the window ran (once, as checked above)"
        );
    }
}
