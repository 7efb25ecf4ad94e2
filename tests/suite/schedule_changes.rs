//! F5: changes to a job. A trigger or a reschedule asked on a standby reaches the leader within
//! one poll; a deploy that registers another schedule keeps the job's history and follows the
//! new grid from then on, without catching up on the new grid's past.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use pg_elector::schedule::{Job, RunKind, Schedule, ScheduleError};
use pg_elector::{Elector, LockKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Each run's replica, kind and due, and when it started.
type Runs = Arc<Mutex<Vec<(&'static str, RunKind, SystemTime, Instant)>>>;

struct Replica {
    elector: Elector,
    handle: pg_elector::schedule::ScheduleHandle,
    shutdown: CancellationToken,
    election: JoinHandle<Result<(), pg_elector::Error>>,
    schedule: JoinHandle<Result<(), ScheduleError>>,
}

fn replica(
    db: &TestDb,
    key: LockKey,
    name: &'static str,
    poll: Duration,
    job: Job,
    runs: &Runs,
) -> Replica {
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .identity(name)
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let election = elector.spawn(shutdown.clone());
    let schedule = Schedule::new(&elector, db.pool(2))
        .poll_interval(poll)
        .job(job, {
            let runs = runs.clone();
            move |run| {
                runs.lock()
                    .unwrap()
                    .push((name, run.kind, run.due, Instant::now()));
                async { Ok::<_, String>(()) }
            }
        });
    let handle = schedule.handle();
    let schedule = tokio::spawn(schedule.run(shutdown.clone()));
    Replica {
        elector,
        handle,
        shutdown,
        election,
        schedule,
    }
}

impl Replica {
    async fn stop(self) {
        self.shutdown.cancel();
        self.election.await.unwrap().unwrap();
        self.schedule.await.unwrap().unwrap();
    }
}

fn ms(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

mod f5 {
    use super::*;

    /// A trigger and a reschedule asked on a standby reach the leader within one poll.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standbys_requests_reach_the_leader_within_one_poll() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf5, 0xc1);
        let poll = Duration::from_millis(200);
        let runs: Runs = Arc::default();
        // Due at midnight on 29 February only: no scheduled run gets in the way.
        let job = || Job::cron("report", "0 0 29 2 *").unwrap();
        let a = replica(&db, key, "a", poll, job(), &runs);
        wait_for(3 * I, || a.elector.is_leader())
            .await
            .expect("a leads");
        let b = replica(&db, key, "b", poll, job(), &runs);
        // The leader has registered the job, and b is a standby.
        wait_for_async(Duration::from_secs(2), || async {
            b.handle.trigger("report").await.is_ok()
        })
        .await
        .expect("the job is registered, and a standby may trigger it");
        let asked = Instant::now();
        assert!(!b.elector.is_leader());
        let triggered = wait_for(3 * poll, || {
            runs.lock()
                .unwrap()
                .iter()
                .any(|r| r.1 == RunKind::Triggered)
        })
        .await
        .expect("the triggered run starts");
        let all = runs.lock().unwrap().clone();
        assert_eq!(all.len(), 1, "one run: {all:?}");
        let run = all[0];
        assert_eq!((run.0, run.1), ("a", RunKind::Triggered), "on the leader");
        let took = run.3 - asked;
        eprintln!(
            "triggered on the standby: run on the leader {took:?} later ({triggered:?} seen)"
        );
        assert!(
            took <= 2 * poll,
            "within one poll ({poll:?}) and the claim: {took:?}"
        );

        // A new schedule from the standby: every 300 ms.
        let period = Duration::from_millis(300);
        // The change is committed before the call returns, and the leader may read it at once:
        // its dues count from the request, not from the answer.
        let changed = SystemTime::now();
        b.handle
            .reschedule("report", &Job::every("report", period))
            .await
            .expect("a standby may reschedule");
        let changed_at = Instant::now();
        tokio::time::sleep(poll + 4 * period).await;
        b.stop().await;
        a.stop().await;
        let scheduled: Vec<_> = runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.1 == RunKind::Scheduled)
            .copied()
            .collect();
        assert!(scheduled.len() >= 3, "runs on the new grid: {scheduled:?}");
        for run in &scheduled {
            assert_eq!(run.0, "a");
            assert_eq!(ms(run.2) % 300, 0, "on the 300 ms grid: {run:?}");
            assert!(run.2 > changed, "from the next due on: {run:?}");
        }
        let first = scheduled[0].3 - changed_at;
        assert!(
            first <= poll + period + poll,
            "the leader followed the new schedule within a poll of its first due: {first:?}"
        );
    }

    /// A deploy with another schedule keeps the history and follows the new grid.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deploy_with_another_schedule_follows_the_new_grid() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf5, 0xc2);
        let poll = Duration::from_millis(50);
        let runs: Runs = Arc::default();
        let old = replica(
            &db,
            key,
            "v1",
            poll,
            Job::every("report", Duration::from_millis(1000)),
            &runs,
        );
        wait_for(Duration::from_secs(5), || runs.lock().unwrap().len() >= 2)
            .await
            .expect("two runs of the first deploy");
        old.stop().await;
        let before: Vec<(SystemTime, String)> = stored(&db).await;

        // The next deploy: the same job, every 300 ms.
        let deployed = SystemTime::now();
        let new = replica(
            &db,
            key,
            "v2",
            poll,
            Job::every("report", Duration::from_millis(300)),
            &runs,
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        new.stop().await;
        let after = stored(&db).await;
        for run in &before {
            assert!(after.contains(run), "history kept: {run:?} in {after:?}");
        }
        let new_runs: Vec<_> = runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.0 == "v2")
            .copied()
            .collect();
        assert!(new_runs.len() >= 3, "{new_runs:?}");
        for run in &new_runs {
            assert_eq!(ms(run.2) % 300, 0, "on the new grid: {run:?}");
            assert!(
                run.2 > deployed,
                "none of the new grid's past is caught up on: {run:?}"
            );
        }
        let schedule: String = db
            .connect()
            .await
            .unwrap()
            .query_one(
                "SELECT schedule FROM pg_elector_jobs WHERE job = 'report'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(schedule, "every 300ms");
    }
}

/// `(due, outcome)` of every stored run of `report`.
async fn stored(db: &TestDb) -> Vec<(SystemTime, String)> {
    db.connect()
        .await
        .unwrap()
        .query(
            "SELECT due, outcome FROM pg_elector_job_runs WHERE job = 'report' ORDER BY due",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}
