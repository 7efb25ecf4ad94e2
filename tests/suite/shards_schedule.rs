//! Shards (F6.6) and schedules (F5): a `Schedule` on each shard's elector
//! (`Shards::elector`) runs that shard's job on the member that owns the shard. Through a join
//! and a graceful leave, every due of every shard runs exactly once, none is lost across the
//! moves (`CatchUp::All`), and each runs on the member whose lock session holds the shard, as
//! the server's `pg_locks` says at the moment of the run.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use common::schedules::BoxedRun;
use common::shards::{Member, Monitor, balanced, joined, shares};
use common::{I, TestDb, query_i64, timing_db_with, wait_for, wait_for_async};
use deadpool_postgres::Pool;
use pg_elector::schedule::{CatchUp, Job, JobRun, Schedule, ScheduleError};
use pg_elector::shards::{ShardId, Shards};
use tokio::task::JoinHandle;

/// The group's name and size.
const GROUP: &str = "scheduled";
const COUNT: u32 = 4;

/// Each shard's job is due every I/2, the 100 ms the schedule tests use.
const PERIOD: Duration = Duration::from_millis(100);

/// One row per run: the shard, the due it ran for, the member that ran it, who held the
/// shard's lock as it ran (the `application_name` of the holding session, per `pg_locks`),
/// the run's fencing epoch, and when it ran.
const SHARD_RUNS: &str = "CREATE TABLE shard_runs (shard int4 NOT NULL, \
     due timestamptz NOT NULL, member text NOT NULL, holder text, epoch bigint, \
     ran_at timestamptz NOT NULL DEFAULT clock_timestamp())";

/// A run's row, its holder read by the same statement: $4 and $5 are the shard's key (the
/// two-int4 form of an advisory lock: `classid`, `objid`, `objsubid = 2`).
const LOG_RUN: &str = "INSERT INTO shard_runs (shard, due, member, holder, epoch) \
     SELECT $1::int4, $2::timestamptz, $3::text, (SELECT string_agg(a.application_name, ',') FROM pg_locks l \
       JOIN pg_stat_activity a ON a.pid = l.pid \
       WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
       AND l.classid = $4::oid AND l.objid = $5::oid AND l.objsubid = 2), $6::int8";

/// A job body that logs its run of `shard` on `member`.
fn logging(
    pool: Pool,
    shard: ShardId,
    member: &'static str,
) -> impl Fn(JobRun) -> BoxedRun + Send + Sync + 'static {
    move |run| {
        let pool = pool.clone();
        Box::pin(async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let epoch = run.epoch.map(|e| e as i64);
            let class = shard.key().class() as u32;
            client
                .execute(
                    LOG_RUN,
                    &[
                        &(shard.index() as i32),
                        &run.due,
                        &member,
                        &class,
                        &shard.index(),
                        &epoch,
                    ],
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    }
}

/// One replica: a member of the group (fenced, checking every I, draining up to 10·I) and,
/// for every shard, a schedule on the shard's elector, stopped by the member's shutdown.
struct Node {
    member: Member,
    schedules: Vec<JoinHandle<Result<(), ScheduleError>>>,
}

fn node(db: &TestDb, name: &'static str) -> Node {
    let member = Member::build(
        Shards::builder(db.pool(2), GROUP, COUNT)
            .check_interval(I)
            .identity(name)
            .fencing(true)
            .drain_timeout(10 * I),
    );
    let (pool, log) = (db.pool(4), db.pool(4));
    let schedules = member
        .shards
        .all()
        .map(|shard| {
            let elector = member.shards.elector(shard).expect("a shard of the group");
            tokio::spawn(
                Schedule::new(elector, pool.clone())
                    .job(
                        Job::every("tick", PERIOD).catch_up(CatchUp::All),
                        logging(log.clone(), shard, name),
                    )
                    .run(member.shutdown.clone()),
            )
        })
        .collect();
    Node { member, schedules }
}

impl Node {
    /// A graceful leave: the member's `run` returns (every shard drained and unlocked).
    async fn leave(&mut self) {
        self.member.shutdown.cancel();
        (&mut self.member.task)
            .await
            .expect("run does not panic")
            .expect("the member leaves cleanly");
    }

    /// Leaves, and waits for every schedule to return `Ok`.
    async fn stop(mut self) {
        self.leave().await;
        for schedule in self.schedules {
            schedule.await.unwrap().expect("the schedule stops cleanly");
        }
    }
}

/// One row of `shard_runs`.
#[derive(Clone, Debug)]
struct Ran {
    due: SystemTime,
    member: String,
    holder: Option<String>,
    epoch: Option<i64>,
    ran_at: SystemTime,
}

/// Every run, by shard, in due order.
async fn runs_by_shard(client: &tokio_postgres::Client) -> BTreeMap<u32, Vec<Ran>> {
    let mut by_shard: BTreeMap<u32, Vec<Ran>> = BTreeMap::new();
    let rows = client
        .query(
            "SELECT shard, due, member, holder, epoch, ran_at FROM shard_runs \
             ORDER BY shard, due, ran_at",
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        by_shard
            .entry(row.get::<_, i32>(0) as u32)
            .or_default()
            .push(Ran {
                due: row.get(1),
                member: row.get(2),
                holder: row.get(3),
                epoch: row.get(4),
                ran_at: row.get(5),
            });
    }
    by_shard
}

/// The due instants of a `period` grid in `[from, to]`.
fn grid(from: SystemTime, to: SystemTime, period: Duration) -> Vec<SystemTime> {
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let p = period.as_millis();
    (ms(from).div_ceil(p) * p..=ms(to))
        .step_by(p as usize)
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64))
        .collect()
}

/// The indices of `shards` this member owns now.
fn owned(shards: &Shards) -> BTreeSet<u32> {
    shards.owned().iter().map(ShardId::index).collect()
}

mod f6_6 {
    use super::*;

    /// Schedules on each shard's elector, on two members: a joins alone, b joins (half the
    /// shards move to b), both run, then a leaves gracefully (its half moves to b). Every due
    /// of the window ran exactly once, on the member whose session held the shard's lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shards_schedule_runs_each_due_once_on_its_owner() {
        let (_timing, db) = timing_db_with(SHARD_RUNS).await;
        let client = db.connect().await.unwrap();
        let monitor = Monitor::start(COUNT);

        // a alone: it owns every shard, and every shard's job is registered and running.
        let mut a = node(&db, "member-a");
        monitor.watch(&a.member.shards);
        joined(&[&a.member.shards], I).await;
        wait_for(10 * I, || a.member.shards.owned().len() == COUNT as usize)
            .await
            .expect("a owns every shard");
        let c = &client;
        wait_for_async(10 * I, || async move {
            query_i64(c, "SELECT count(DISTINCT shard) FROM shard_runs").await == COUNT as i64
        })
        .await
        .expect("a runs every shard's job (its tables made by the schedules)");
        // From here every shard's job row exists: no due of the window is a new job's past.
        let from = SystemTime::now();

        // b joins: half the shards move to it.
        let b = node(&db, "member-b");
        monitor.watch(&b.member.shards);
        let two = [&a.member.shards, &b.member.shards];
        joined(&two, I).await;
        wait_for(10 * I, || balanced(&two, COUNT))
            .await
            .unwrap_or_else(|| panic!("balanced: {:?}", shares(&two)));
        let (a_share, b_share) = (owned(&a.member.shards), owned(&b.member.shards));
        let both_from = SystemTime::now();
        assert!(a_share.is_disjoint(&b_share), "{a_share:?} {b_share:?}");
        assert_eq!(a_share.len() + b_share.len(), COUNT as usize);

        // Both run.
        tokio::time::sleep(8 * I).await;
        assert_eq!(
            (owned(&a.member.shards), owned(&b.member.shards)),
            (a_share.clone(), b_share.clone()),
            "the shares stay put while both members run"
        );

        // a leaves gracefully: its shards move to b.
        let leave_at = SystemTime::now();
        a.leave().await;
        let took = wait_for(3 * I, || b.member.shards.owned().len() == COUNT as usize)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "b owns a's shards within 3·I of a's unlock (1·I, + 2·I for a loaded \
                     machine): it owns {:?}",
                    owned(&b.member.shards)
                )
            });
        for schedule in std::mem::take(&mut a.schedules) {
            schedule.await.unwrap().expect("a's schedules stop cleanly");
        }

        // b alone, then the window closes once every shard has run a due past its end (a
        // shard's dues run in order, so every due before it has been handled).
        tokio::time::sleep(8 * I).await;
        let to = SystemTime::now();
        wait_for_async(5 * I, || async move {
            c.query_one(
                "SELECT count(DISTINCT shard) FROM shard_runs WHERE due >= $1",
                &[&to],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
                == COUNT as i64
        })
        .await
        .expect("every shard runs past the window's end");
        let seen = monitor.finish().await;
        let group = b.member.shards.clone();
        b.stop().await;

        let runs = runs_by_shard(&client).await;
        assert_eq!(runs.len(), COUNT as usize, "every shard ran: {runs:?}");
        let dues = grid(from, to, PERIOD);
        let mut latest = Duration::ZERO;
        let mut caught_up = 0;
        for (&shard, ran) in &runs {
            // Exactly once: no due twice (in or out of the window), none of the window missing.
            let twice: Vec<_> = ran
                .windows(2)
                .filter(|w| w[0].due == w[1].due)
                .map(|w| (w[0].due, &w[0].member, &w[1].member))
                .collect();
            assert!(twice.is_empty(), "shard {shard}: dues run twice: {twice:?}");
            let by_due: BTreeMap<SystemTime, &Ran> = ran.iter().map(|r| (r.due, r)).collect();
            let missing: Vec<_> = dues.iter().filter(|d| !by_due.contains_key(d)).collect();
            assert!(
                missing.is_empty(),
                "shard {shard}: dues of the window never run (CatchUp::All loses none): \
                 {missing:?} of {}",
                dues.len()
            );
            // On the owner: the member whose session held the shard's lock as the run wrote.
            let elsewhere: Vec<_> = ran
                .iter()
                .filter(|r| r.holder.as_deref() != Some(r.member.as_str()))
                .collect();
            assert!(
                elsewhere.is_empty(),
                "shard {shard}: runs on a member that did not hold the shard: {elsewhere:?}"
            );
            // The owners in due order: a, then b, once; never back.
            let members: Vec<&str> = ran.iter().map(|r| r.member.as_str()).collect();
            let changes = members.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(
                members.first() == Some(&"member-a")
                    && members.last() == Some(&"member-b")
                    && changes == 1,
                "shard {shard}: owners change once, from a to b ({changes} changes)"
            );
            // ... at the move the shares say: b's shard left a before b's share was seen;
            // a's shard reached b only after a left.
            if b_share.contains(&shard) {
                let late_a: Vec<_> = ran
                    .iter()
                    .filter(|r| r.member == "member-a" && r.ran_at > both_from)
                    .collect();
                assert!(
                    late_a.is_empty(),
                    "shard {shard} (b's): a ran it after b owned it: {late_a:?}"
                );
            } else {
                let early_b: Vec<_> = ran
                    .iter()
                    .filter(|r| r.member == "member-b" && r.ran_at < leave_at)
                    .collect();
                assert!(
                    early_b.is_empty(),
                    "shard {shard} (a's): b ran it before a left: {early_b:?}"
                );
            }
            // One fencing epoch per ownership: never shared by two members, never going back.
            let epochs: Vec<(i64, &str)> = ran
                .iter()
                .map(|r| {
                    (
                        r.epoch.expect("a fenced shard's run has an epoch"),
                        &*r.member,
                    )
                })
                .collect();
            assert!(
                epochs.windows(2).all(|w| w[0].0 < w[1].0 || w[0] == w[1]),
                "shard {shard}: epochs go up with each new owner: {epochs:?}"
            );
            for &due in &dues {
                let r = by_due[&due];
                let late = r.ran_at.duration_since(due).unwrap_or_default();
                latest = latest.max(late);
                caught_up += usize::from(late > PERIOD);
            }
        }
        eprintln!(
            "{} dues × {COUNT} shards in the window, each run once; {caught_up} caught up after \
             a move; latest {latest:?}; b owned a's shards {took:?} after a left; longest \
             unowned {:?}",
            dues.len(),
            seen.longest_unowned
        );
        assert!(
            seen.two_owners.is_empty(),
            "two owners: {:?}",
            seen.two_owners
        );
        // A shard changes hands within 2·I (the two members may see a join at different
        // checks); + I for a loaded machine.
        assert!(
            seen.longest_unowned <= 3 * I,
            "no shard unowned past 3·I: {:?}",
            seen.longest_unowned
        );
        // A due waits at most for its shard's move (3·I, above) and the new owner's schedule
        // to start and catch up (a few statements per due): 5·I.
        assert!(
            latest <= 5 * I,
            "every due of the window ran within 5·I of its instant: {latest:?}"
        );

        // The schedule's own record agrees: one succeeded run per due, claimed by the member
        // that ran it, in the term (epoch) it ran in.
        let namespaces: BTreeMap<String, u32> = group
            .all()
            .map(|s| (s.key().to_string(), s.index()))
            .collect();
        let mut recorded: Vec<(u32, SystemTime, String, Option<i64>, String)> = client
            .query(
                "SELECT namespace, due, claimed_by, epoch, outcome FROM pg_elector_job_runs",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let namespace: String = row.get(0);
                let shard = *namespaces
                    .get(&namespace)
                    .unwrap_or_else(|| panic!("a run in another namespace: {namespace}"));
                (shard, row.get(1), row.get(2), row.get(3), row.get(4))
            })
            .collect();
        recorded.sort();
        let mut logged: Vec<_> = runs
            .iter()
            .flat_map(|(&shard, ran)| {
                ran.iter().map(move |r| {
                    (
                        shard,
                        r.due,
                        r.member.clone(),
                        r.epoch,
                        "succeeded".to_owned(),
                    )
                })
            })
            .collect();
        logged.sort();
        assert_eq!(recorded, logged, "the job tables record the runs logged");
    }
}
