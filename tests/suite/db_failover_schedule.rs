//! Schedules across a database failover (F7.3). With a synchronous standby, the standby stops
//! confirming for a while (no job starts meanwhile: its claim's commit waits), then the primary
//! crashes mid-schedule and the standby is promoted: no due runs twice, and every due of the
//! window ran or is recorded (abandoned, when its run was cut off by the crash); with
//! `CatchUp::All` the dues of the leaderless gap run after it. With asynchronous replication
//! and the standby lagging, the dues claimed in the lag window run a second time, exactly
//! those, and the replica that claimed them says so at ERROR when it leads again.

use crate::common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::failover::{Cluster, Follow, cluster};
use common::*;
use pg_elector::schedule::{CatchUp, Job, JobRun, Schedule};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::server::ShutdownMode;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

/// The job's period.
const PERIOD: Duration = Duration::from_millis(300);

/// Every start of the job: which replica, which due, when.
type Starts = Arc<Mutex<Vec<(&'static str, SystemTime, Instant)>>>;

/// One replica: an elector and its schedule of one job, every `PERIOD`, catching up on all.
struct Scheduler {
    elector: Elector,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Scheduler {
    fn start(cluster: &Cluster, key: LockKey, name: &'static str, starts: &Starts) -> Self {
        Self::start_captured(cluster, key, name, starts, &Capture::default())
    }

    fn start_captured(
        cluster: &Cluster,
        key: LockKey,
        name: &'static str,
        starts: &Starts,
        capture: &Capture,
    ) -> Self {
        let starts = starts.clone();
        let job = Job::every("tick", PERIOD).catch_up(CatchUp::All);
        let body = move |run: JobRun| {
            starts.lock().unwrap().push((name, run.due, Instant::now()));
            async { Ok::<_, String>(()) }
        };
        Self::spawn(cluster, key, name, job, body, capture)
    }

    /// A replica whose schedule runs `job` with `body`.
    fn spawn<F, Fut>(
        cluster: &Cluster,
        key: LockKey,
        name: &'static str,
        job: Job,
        body: F,
        capture: &Capture,
    ) -> Self
    where
        F: Fn(JobRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let elector = Elector::builder(cluster.pool(2), key)
            .check_interval(I)
            .identity(name)
            .fencing(true)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let schedule = Schedule::new(&elector, cluster.pool(2))
            .poll_interval(I)
            .job(job, body);
        let tasks = vec![
            tokio::spawn({
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move {
                    let _ = elector.run(shutdown).await;
                }
                .with_subscriber(capture.dispatch())
            }),
            tokio::spawn({
                let shutdown = shutdown.clone();
                async move {
                    let _ = schedule.run(shutdown).await;
                }
                .with_subscriber(capture.dispatch())
            }),
        ];
        Self {
            elector,
            shutdown,
            tasks,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

/// How many times each due started.
fn counts(starts: &Starts) -> BTreeMap<SystemTime, usize> {
    let mut counts = BTreeMap::new();
    for &(_, due, _) in starts.lock().unwrap().iter() {
        *counts.entry(due).or_default() += 1;
    }
    counts
}

/// Waits (at most 20 s) until a due after `after` ran: the schedule has caught up.
async fn caught_up(starts: &Starts, after: SystemTime) {
    wait_for(Duration::from_secs(20), || {
        starts
            .lock()
            .unwrap()
            .iter()
            .any(|&(_, due, _)| due > after)
    })
    .await
    .expect("the job runs again after the promotion");
}

/// The dues the runs table on `config`'s server records as abandoned.
async fn abandoned(config: &tokio_postgres::Config) -> Vec<SystemTime> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .query(
            "SELECT due FROM pg_elector_job_runs WHERE job = 'tick' AND outcome = 'abandoned'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Two replicas over a primary with a synchronous standby, the database's sessions committing
/// with `synchronous_commit = <default>`: the standby stops confirming (no job starts), then
/// the primary crashes and the standby is promoted.
async fn no_due_runs_twice_with_a_synchronous_standby(default: &str) {
    let _timing = timing();
    let cluster = cluster(Follow::MultiHost, true).await;
    let key = LockKey::new(0x4637, 3);
    // The database's sessions do not wait for the standby by default: the claims must.
    let admin = cluster.db.connect().await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} SET synchronous_commit = {default}",
            cluster.db.name()
        ))
        .await
        .unwrap();
    let starts: Starts = Arc::default();
    let a = Scheduler::start(&cluster, key, "a", &starts);
    let b = Scheduler::start(&cluster, key, "b", &starts);
    wait_for(Duration::from_secs(10), || {
        starts.lock().unwrap().len() >= 6
    })
    .await
    .expect("the job runs");
    // The standby stops confirming: the claims' commits on the primary wait for it, and no job
    // starts on a claim the standby does not have.
    cluster.wal.blackhole();
    let cut = Instant::now();
    tokio::time::sleep(4 * PERIOD + PERIOD / 2).await;
    let crashed = Instant::now();
    let unconfirmed = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|&&(_, _, at)| at >= cut + Duration::from_millis(50) && at < crashed)
        .count();

    cluster.stop_primary(ShutdownMode::Immediate).await.unwrap();
    tokio::time::sleep(3 * I).await;
    cluster.promote().await.unwrap();
    caught_up(&starts, SystemTime::now() + 2 * PERIOD).await;
    let leaders = [&a, &b].iter().filter(|s| s.elector.is_leader()).count();
    a.stop().await;
    b.stop().await;

    let counts = counts(&starts);
    let twice: Vec<_> = counts.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "dues that ran twice: {twice:?}");
    let abandoned = abandoned(&cluster.on_standby()).await;
    let (first, last) = (
        *counts.keys().next().unwrap(),
        *counts.keys().next_back().unwrap(),
    );
    let mut due = first;
    let mut lost = Vec::new();
    while due <= last {
        if !counts.contains_key(&due) && !abandoned.contains(&due) {
            lost.push(due);
        }
        due += PERIOD;
    }
    eprintln!(
        "synchronous standby: {} dues ran once each, {} recorded abandoned, {} lost",
        counts.len(),
        abandoned.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "dues neither run nor recorded: {lost:?}");
    assert_eq!(
        unconfirmed, 0,
        "jobs started while the standby confirmed nothing"
    );
    assert_eq!(leaders, 1, "one leader at the end");
}

/// The slow job's period.
const SLOW_PERIOD: Duration = Duration::from_millis(700);

/// How long each run of the slow job takes: three intervals.
const LASTS: Duration = Duration::from_millis(3 * 200);

/// Every start of the slow job: its due and attempt.
type Attempts = Arc<Mutex<Vec<(SystemTime, u32)>>>;

/// `(due, attempt, kind, outcome, claimed_by)` of every run of `job` the server of `config`
/// stores, oldest first.
async fn stored(
    config: &tokio_postgres::Config,
    job: &str,
) -> Vec<(SystemTime, i32, String, String, String)> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    common::schedules::stored_runs(&client, job).await
}

/// A replica whose schedule runs the slow job (every `SLOW_PERIOD`, `LASTS` long, catching up
/// on all, rerunning an abandoned run), its starts recorded in `attempts`.
fn slow_scheduler(
    cluster: &Cluster,
    key: LockKey,
    name: &'static str,
    attempts: &Attempts,
) -> Scheduler {
    let attempts = attempts.clone();
    let job = Job::every("slow", SLOW_PERIOD)
        .catch_up(CatchUp::All)
        .rerun_abandoned(true);
    let body = move |run: JobRun| {
        attempts.lock().unwrap().push((run.due, run.attempt));
        async {
            tokio::time::sleep(LASTS).await;
            Ok::<_, String>(())
        }
    };
    Scheduler::spawn(cluster, key, name, job, body, &Capture::default())
}

mod f7_3 {
    use super::*;

    /// A run in flight when the primary crashes, with a healthy synchronous standby that is
    /// promoted 8·I later (after the runner gave up recording the run's end): the run is
    /// recorded abandoned on the promoted server and rerun exactly once; no due starts twice as
    /// the same attempt, and every due from the first to the last ran (`CatchUp::All`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_in_flight_at_the_crash_is_rerun_exactly_once() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, true).await;
        let key = LockKey::new(0x4637, 6);
        let attempts: Attempts = Arc::default();
        let a = slow_scheduler(&cluster, key, "a", &attempts);
        let b = slow_scheduler(&cluster, key, "b", &attempts);
        // The third run is in flight: the primary crashes one interval into it.
        wait_for(Duration::from_secs(10), || {
            attempts.lock().unwrap().len() >= 3
        })
        .await
        .expect("the job runs");
        let (in_flight, _) = attempts.lock().unwrap()[2];
        tokio::time::sleep(I).await;
        cluster.stop_primary(ShutdownMode::Immediate).await.unwrap();
        // The run ends 2·I after the crash; its end is tried three times, I apart, and fails.
        tokio::time::sleep(8 * I).await;
        cluster.promote().await.unwrap();
        let promoted = cluster.on_standby();
        let settled = wait_for_async(Duration::from_secs(20), || async {
            stored(&promoted, "slow")
                .await
                .iter()
                .any(|r| r.0 == in_flight && r.1 == 2 && r.3 != "running")
        })
        .await;
        let now = SystemTime::now();
        let caught_up = wait_for(Duration::from_secs(20), || {
            attempts.lock().unwrap().iter().any(|&(due, _)| due > now)
        })
        .await;
        a.stop().await;
        b.stop().await;

        let runs = stored(&promoted, "slow").await;
        let of_in_flight: Vec<_> = runs.iter().filter(|r| r.0 == in_flight).collect();
        let attempts = attempts.lock().unwrap().clone();
        let mut starts: BTreeMap<(SystemTime, u32), usize> = BTreeMap::new();
        for &(due, attempt) in &attempts {
            *starts.entry((due, attempt)).or_default() += 1;
        }
        let twice: Vec<_> = starts.iter().filter(|&(_, &n)| n > 1).collect();
        let (first, last) = (attempts[0].0, attempts.iter().map(|a| a.0).max().unwrap());
        let mut lost = Vec::new();
        let mut due = first;
        while due <= last {
            if !starts.contains_key(&(due, 1)) {
                lost.push(due);
            }
            due += SLOW_PERIOD;
        }
        eprintln!(
            "a run in flight at the crash: stored as {:?}; {} dues started, none twice, {} lost",
            of_in_flight
                .iter()
                .map(|r| (r.1, r.2.as_str(), r.3.as_str(), r.4.as_str()))
                .collect::<Vec<_>>(),
            starts.len(),
            lost.len()
        );
        settled.expect("the run in flight is rerun within 20 s of the promotion");
        caught_up.expect("the schedule catches up within 20 s");
        assert!(
            twice.is_empty(),
            "dues started twice as one attempt: {twice:?}"
        );
        assert_eq!(
            of_in_flight
                .iter()
                .map(|r| (r.1, r.2.as_str(), r.3.as_str()))
                .collect::<Vec<_>>(),
            [(1, "scheduled", "abandoned"), (2, "rerun", "succeeded")],
            "the run in flight is recorded abandoned and rerun once"
        );
        assert_eq!(
            (starts.get(&(in_flight, 1)), starts.get(&(in_flight, 2))),
            (Some(&1), Some(&1)),
            "the due in flight started once, and once more as the rerun"
        );
        assert!(
            lost.is_empty(),
            "dues that never ran (CatchUp::All): {lost:?}"
        );
    }

    /// With a synchronous standby that stops confirming for a while, then a crash and a
    /// promotion: no due runs twice and none is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn synchronous_standby_no_due_runs_twice_none_is_lost() {
        super::no_due_runs_twice_with_a_synchronous_standby("off").await;
    }

    /// The same with `local`, a default often set per role: it commits without waiting for the
    /// standby either. (Before, claims were made durable only under `off`: with `local` a job
    /// started on a claim the standby did not have.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_commit_default_still_waits_for_the_standby() {
        super::no_due_runs_twice_with_a_synchronous_standby("local").await;
    }

    /// With a lagging asynchronous standby, the dues claimed in the lag window run again after the
    /// promotion (those and no others), and the replica that claimed them reports it at ERROR.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_async_standby_reruns_the_lag_window_and_says_so() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, false).await;
        let key = LockKey::new(0x4637, 4);
        let starts: Starts = Arc::default();
        let capture = Capture::default();
        let a = Scheduler::start_captured(&cluster, key, "a", &starts, &capture);
        wait_for(Duration::from_secs(10), || {
            starts.lock().unwrap().len() >= 3
        })
        .await
        .expect("the job runs");
        // Let the standby catch up, then cut it off: the claims from here on are the primary's
        // alone.
        tokio::time::sleep(PERIOD).await;
        cluster.wal.blackhole();
        let cut = Instant::now();
        tokio::time::sleep(4 * PERIOD + PERIOD / 2).await;
        let crashed = Instant::now();
        cluster.stop_primary(ShutdownMode::Immediate).await.unwrap();
        cluster.promote().await.unwrap();
        let behind = capture
            .logged(
                "the job's row is behind what this process wrote to it",
                Duration::from_secs(20),
            )
            .await;
        caught_up(&starts, SystemTime::now()).await;
        a.stop().await;

        let starts = starts.lock().unwrap().clone();
        let mut first_start: BTreeMap<SystemTime, Instant> = BTreeMap::new();
        let mut runs: BTreeMap<SystemTime, usize> = BTreeMap::new();
        for &(_, due, at) in &starts {
            first_start.entry(due).or_insert(at);
            *runs.entry(due).or_default() += 1;
        }
        let repeated: Vec<SystemTime> = runs
            .iter()
            .filter(|&(_, &n)| n > 1)
            .map(|(&due, _)| due)
            .collect();
        // Claims made just before the cut may not have been streamed yet: 50 ms of slack.
        let slack = Duration::from_millis(50);
        let in_window = |due: &SystemTime| {
            let at = first_start[due];
            at + slack >= cut && at < crashed
        };
        let surely_lost: Vec<SystemTime> = first_start
            .iter()
            .filter(|&(_, &at)| at >= cut + slack && at < crashed)
            .map(|(&due, _)| due)
            .collect();
        eprintln!(
            "asynchronous standby cut off {:?} before the crash: {} dues claimed in that window, \
             {} ran twice ({} dues in all); reported after {behind:?}",
            crashed - cut,
            surely_lost.len(),
            repeated.len(),
            runs.len()
        );
        assert!(
            repeated.iter().all(in_window),
            "a due claimed outside the lag window ran twice: {repeated:?}"
        );
        assert!(
            surely_lost.iter().all(|due| repeated.contains(due)),
            "a due claimed in the lag window did not run again: {surely_lost:?} vs {repeated:?}"
        );
        assert!(
            surely_lost.len() >= 3,
            "the lag window held {} claims",
            surely_lost.len()
        );
        assert!(
            behind.is_some(),
            "the replica did not report its row going back"
        );
        assert_eq!(
            capture
                .events("the job's row is behind what this process wrote to it")
                .len(),
            1,
            "reported once"
        );
    }
}

/// Issue "Hardening IV" item 3: what a running run's heartbeats wait for. A beat is seen on
/// the primary at once; its confirmation waits for the synchronous standby, and the runner
/// cuts its run off two thirds of the stale threshold (3 s here: a 50 ms poll) after its last
/// confirmed beat.
mod heartbeats {
    use super::*;
    use common::schedules::{first_start, leading_schedule, stored_runs};

    /// The first of `runs` that ran (a due the schedule skipped, on a loaded machine, has a
    /// row too).
    fn first_run(runs: &[Run]) -> Option<&Run> {
        runs.iter().find(|run| run.3 != "skipped")
    }

    type Run = (SystemTime, i32, String, String, String);

    /// The stored runs of `job` on the cluster's primary.
    async fn runs_of(
        cluster: &Cluster,
        job: &str,
    ) -> Vec<(SystemTime, i32, String, String, String)> {
        let (client, connection) = cluster
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        stored_runs(&client, job).await
    }

    /// Whether the first run of `long` ended (is no longer `running`) within 10 s.
    async fn first_run_ends(cluster: &Cluster) -> bool {
        wait_for_async(Duration::from_secs(10), || async {
            first_run(&runs_of(cluster, "long").await).is_some_and(|run| run.3 != "running")
        })
        .await
        .is_some()
    }

    /// No run was cut off, and the first run of `long` ended (`finished`) as it would have:
    /// recorded `succeeded`.
    async fn assert_ran_to_its_end(cluster: &Cluster, capture: &Capture, finished: bool) {
        let cut = capture.events("the run was cut off");
        assert!(cut.is_empty(), "no run was cut off: {}", cut.len());
        assert!(finished, "the first run finished");
        let runs = runs_of(cluster, "long").await;
        assert_eq!(
            first_run(&runs).map(|run| run.3.as_str()),
            Some("succeeded"),
            "the first run ran to its end: {runs:?}"
        );
    }

    /// A slow but healthy synchronous standby (its WAL 1.3 s late for 4 s, through the WAL
    /// proxy, two thirds of the 2 s cut-off) cuts no run off: the beats land every poll, their
    /// confirmations come 1.3 s late and several at once, and the 5 s run ends as it would
    /// have, recorded `succeeded`. (At 1.5 s the runner sees 1.76 s of silence: too close to
    /// the cut-off for a loaded machine.)
    /// (Before, every beat waited for the standby past its 1 s bound with the run's row locked,
    /// and the run was cut off at 2 s and recorded abandoned.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_synchronous_standby_cuts_no_run_off() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, true).await;
        let (starts, capture, sched) = leading_schedule(
            cluster.pool(10),
            Job::every("long", Duration::from_secs(1)).rerun_abandoned(false),
            Duration::from_secs(5),
        );
        first_start(&starts, Duration::from_secs(5), "the job runs").await;
        cluster.wal.delay(Duration::from_millis(1300));
        tokio::time::sleep(Duration::from_secs(4)).await;
        cluster.wal.delay(Duration::ZERO);
        let finished = first_run_ends(&cluster).await;
        sched.stop().await;
        assert_ran_to_its_end(&cluster, &capture, finished).await;
    }

    /// A synchronous standby already slow when the run is claimed (its WAL 1.2 s late, more
    /// than half the 2 s cut-off, within the claim's 2 s bound): the claim waits for it, then
    /// the first beats go out at once and the job starts on the first confirmation; the 2 s
    /// run ends as it would have, recorded `succeeded`, and no run is cut off. (With the first
    /// beat counted from the claim's send, the claim's wait and the first confirmation's, 2.4
    /// s, cut it off before it started.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_slow_from_the_claim_on_cuts_no_run_off() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, true).await;
        cluster.wal.delay(Duration::from_millis(1200));
        let (starts, capture, sched) = leading_schedule(
            cluster.pool(10),
            Job::every("long", Duration::from_secs(1)).rerun_abandoned(false),
            Duration::from_secs(2),
        );
        first_start(&starts, Duration::from_secs(10), "the job runs").await;
        let finished = first_run_ends(&cluster).await;
        sched.stop().await;
        cluster.wal.delay(Duration::ZERO);
        assert_ran_to_its_end(&cluster, &capture, finished).await;
    }

    /// A dead synchronous standby (its link blackholed) confirms no beat: the running run is
    /// cut off two thirds of the 3 s stale threshold after its last confirmed beat, so before
    /// a term on a standby promoted meanwhile, or on this primary, could take it for dead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_synchronous_standby_cuts_the_run_off_before_it_is_stale() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, true).await;
        let (starts, capture, sched) = leading_schedule(
            cluster.pool(10),
            Job::every("long", Duration::from_secs(1)).rerun_abandoned(false),
            Duration::from_secs(8),
        );
        first_start(&starts, Duration::from_secs(5), "the job runs").await;
        // Beats confirmed for a while, then none.
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.wal.blackhole();
        let dead = Instant::now();
        let cut = wait_for(Duration::from_secs(6), || {
            !capture.events("the run was cut off").is_empty()
        })
        .await;
        let after = dead.elapsed();
        cluster.wal.pass();
        sched.stop().await;
        assert!(cut.is_some(), "the run was cut off");
        // The last confirmed beat was sent at most a poll (50 ms) and a round trip before the
        // standby died: the cut-off comes 2 s after it, before the 3 s threshold.
        assert!(
            after >= Duration::from_millis(1800) && after < Duration::from_millis(2600),
            "cut off {after:?} after the standby died (2 s after the last confirmed beat)"
        );
        assert!(
            !capture.events("the run was cut off")[0]
                .field("silent")
                .is_empty(),
            "cut off for silence"
        );
    }
}
