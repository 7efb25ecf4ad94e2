//! Schedules across a database failover (F7.3). With a synchronous standby, the standby stops
//! confirming for a while (no job starts meanwhile: its claim's commit waits), then the primary
//! crashes mid-schedule and the standby is promoted: no due runs twice, and every due of the
//! window ran or is recorded (abandoned, when its run was cut off by the crash); with
//! `CatchUp::All` the dues of the leaderless gap run after it. With asynchronous replication and the standby
//! lagging, the dues claimed in the lag window run a second time, exactly those, and the
//! replica that claimed them says so at ERROR when it leads again.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::capture::Capture;
use common::failover::{Cluster, Follow, cluster};
use common::*;
use pg_elector::schedule::{CatchUp, Job, JobRun, Schedule};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::ShutdownMode;
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
        let elector = Elector::builder(cluster.pool(2), key)
            .check_interval(I)
            .identity(name)
            .fencing(true)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let starts = starts.clone();
        let schedule = Schedule::new(&elector, cluster.pool(2))
            .poll_interval(I)
            .job(
                Job::every("tick", PERIOD).catch_up(CatchUp::All),
                move |run: JobRun| {
                    starts.lock().unwrap().push((name, run.due, Instant::now()));
                    async { Ok::<_, String>(()) }
                },
            );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f7_3_with_a_synchronous_standby_no_due_runs_twice_and_none_is_lost() {
    no_due_runs_twice_with_a_synchronous_standby("off").await;
}

/// The same with `local`, a default often set per role: it commits without waiting for the
/// standby either. (Before, claims were made durable only under `off`: with `local` a job
/// started on a claim the standby did not have.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f7_3_a_local_synchronous_commit_default_still_waits_for_the_standby() {
    no_due_runs_twice_with_a_synchronous_standby("local").await;
}

/// Two replicas over a primary with a synchronous standby, the database's sessions committing
/// with `synchronous_commit = <default>`: the standby stops confirming (no job starts), then
/// the primary crashes and the standby is promoted.
async fn no_due_runs_twice_with_a_synchronous_standby(default: &str) {
    let _serial = serial();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f7_3_with_a_lagging_asynchronous_standby_the_dues_of_the_lag_window_run_again_and_are_reported()
 {
    let _serial = serial();
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
    // Let the standby catch up, then cut it off: the claims from here on are the primary's alone.
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
