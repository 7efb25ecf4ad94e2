//! `status::read`: what a database shows of its elections. Each key once, with its leader (and
//! the epoch with fencing), the sessions waiting for it, the candidates with their preference
//! and liveness, and a pending handover; nothing in a database the crate never used.
//! `status::jobs`: each stored job's last run, outcome and next due.

use crate::common;

use std::time::{Duration, SystemTime};

use common::schedules::ManualSchedule;
use common::*;
use pg_elector::schedule::{Job, Schedule};
use pg_elector::status::{self, KeyStatus};
use pg_elector::{Elector, HandoverTo, LockKey, request_handover};

/// A replica at interval `I` named `identity`, with `preference`, fast takeover and fencing
/// as asked.
fn replica(db: &TestDb, key: LockKey, identity: &str, preference: u64, fast: bool) -> Replica {
    let elector = Elector::builder(db.pool(3), key)
        .check_interval(I)
        .identity(identity)
        .preference(preference)
        .fast_takeover(fast)
        .fencing(true)
        .build()
        .expect("a valid elector");
    Replica::run(elector)
}

/// A session of the application's, named `plain`, holding `key` with a plain advisory lock.
async fn plain_holder(db: &TestDb, key: LockKey) -> tokio_postgres::Client {
    let plain = db.connect().await.unwrap();
    plain
        .batch_execute("SET application_name = 'plain'")
        .await
        .unwrap();
    plain
        .execute(
            "SELECT pg_advisory_lock($1, $2)",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
    plain
}

/// The status of `key`, which must be listed once.
fn of(keys: &[KeyStatus], key: LockKey) -> &KeyStatus {
    let found: Vec<_> = keys.iter().filter(|k| k.key == key).collect();
    assert_eq!(found.len(), 1, "{key:?} listed once: {keys:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_the_crate_never_used_shows_no_key() {
    let db = fresh_db().await;
    let client = db.connect().await.unwrap();
    assert_eq!(status::read(&client).await.unwrap(), Vec::new());
}

/// A fenced leader with a waiting (fast takeover) standby and a polling one; beside it a key
/// held by a plain session of the application's, with a live candidate and a handover asked
/// of it that the plain holder never carries out. Then the leader stops: the next one shows
/// with its later epoch, and the stopped one's session is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_shows_its_leader_waiting_standbys_candidates_and_request() {
    let _timing = timing();
    let db = fresh_db().await;
    let client = db.connect().await.unwrap();
    let started = SystemTime::now() - Duration::from_secs(1);
    let (elected, held) = (LockKey::from_name("status/sweep"), LockKey::new(-7, 3));

    let top = replica(&db, elected, "top", 9, false);
    wait_for(3 * I, || top.elector.is_leader())
        .await
        .expect("the first replica leads");
    let waits = replica(&db, elected, "waits", 5, true);
    let polls = replica(&db, elected, "polls", 1, false);
    let _plain = plain_holder(&db, held).await;
    let asked = replica(&db, held, "asked", 2, false);
    // Every standby has written its row, and the fast one waits.
    let written = async {
        loop {
            let keys = status::read(&client).await.unwrap();
            let rows = |key| {
                keys.iter()
                    .find(|k| k.key == key)
                    .map_or(0, |k| k.candidates.len())
            };
            let waiting = keys.iter().map(|k| k.waiting.len()).sum::<usize>();
            if rows(elected) == 2 && rows(held) == 1 && waiting == 1 {
                return;
            }
            tokio::time::sleep(I / 10).await;
        }
    };
    tokio::time::timeout(10 * I, written)
        .await
        .expect("the standbys' rows and the waiting session within 10·I");
    let to = request_handover(
        &db.pool(1),
        held,
        HandoverTo::Identity("asked".into()),
        10 * I,
        ASK,
    )
    .await
    .unwrap();
    assert_eq!(to, "asked");

    let keys = status::read(&client).await.unwrap();
    assert_eq!(keys.len(), 2, "{keys:#?}");
    let sweep = of(&keys, elected);
    let leader = sweep.leader.as_ref().expect("someone leads");
    assert_eq!(leader.identity, "top");
    assert_eq!(holders(&client, elected).await, vec![leader.pid]);
    assert_eq!(leader.epoch, top.elector.term().epoch());
    let since = leader.since.expect("since, with fencing");
    assert!(since >= started && since <= SystemTime::now(), "{since:?}");
    let waiting: Vec<_> = sweep.waiting.iter().map(|s| s.identity.as_str()).collect();
    assert_eq!(waiting, ["waits"], "only the most preferred standby waits");
    let rows: Vec<_> = sweep
        .candidates
        .iter()
        .map(|c| (c.identity.as_str(), c.preference, c.live, c.waits))
        .collect();
    assert_eq!(
        rows,
        [("waits", 5, true, true), ("polls", 1, true, false)],
        "most preferred first; the leader has no row"
    );
    assert_eq!(sweep.handover, None);

    let other = of(&keys, held);
    assert_eq!(
        other.leader.as_ref().map(|l| l.identity.as_str()),
        Some("plain")
    );
    assert_eq!(
        other.leader.as_ref().and_then(|l| l.epoch),
        None,
        "no epoch row"
    );
    let request = other.handover.as_ref().expect("the request is pending");
    assert_eq!(request.to, "asked");
    assert_eq!(request.stay_away, 10 * I);
    assert!(request.until > SystemTime::now(), "{request:?}");
    assert!(
        other
            .candidates
            .iter()
            .any(|c| c.identity == "asked" && c.live)
    );

    let epoch = top.elector.term().epoch().expect("a fenced term");
    top.stop().await.unwrap();
    wait_for(3 * I, || waits.elector.is_leader())
        .await
        .expect("the waiting standby leads");
    let keys = status::read(&client).await.unwrap();
    let sweep = of(&keys, elected);
    let leader = sweep.leader.as_ref().expect("the standby leads");
    assert_eq!(leader.identity, "waits");
    assert_eq!(leader.epoch, waits.elector.term().epoch());
    assert!(leader.epoch > Some(epoch), "a later epoch: {leader:?}");
    assert!(sweep.waiting.is_empty(), "{sweep:#?}");
    drop((polls, asked));
}

/// A request the leader would not act on is not shown as pending: one whose target stopped
/// (its row is no longer live), and one naming the leader itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_leader_would_ignore_is_not_pending() {
    let _timing = timing();
    let db = fresh_db().await;
    let client = db.connect().await.unwrap();
    let key = LockKey::new(-7, 4);
    let _plain = plain_holder(&db, key).await;
    let target = replica(&db, key, "target", 2, false);
    let _other = replica(&db, key, "other", 1, false);
    tokio::time::sleep(2 * I).await;
    let asker = db.pool(1);
    let to = HandoverTo::Identity("target".into());
    request_handover(&asker, key, to, 10 * I, ASK)
        .await
        .unwrap();
    let pending = |keys: &[KeyStatus]| of(keys, key).handover.clone();
    let keys = status::read(&client).await.unwrap();
    assert_eq!(pending(&keys).map(|h| h.to), Some("target".into()));

    // The target's task is aborted (as a crashed process would): its row stays, dead two
    // intervals after its last try.
    target.task.abort();
    tokio::time::sleep(3 * I).await;
    let keys = status::read(&client).await.unwrap();
    let live: Vec<_> = of(&keys, key)
        .candidates
        .iter()
        .filter(|c| c.live)
        .map(|c| c.identity.as_str())
        .collect();
    assert_eq!(live, ["other"], "{keys:#?}");
    assert!(
        of(&keys, key)
            .candidates
            .iter()
            .any(|c| c.identity == "target"),
        "the dead row is listed: {keys:#?}"
    );
    assert_eq!(
        pending(&keys),
        None,
        "a dead target's request waits for nothing"
    );

    // A live row of the leader's own identity, asked for: the leader never hands over to
    // itself.
    client
        .execute(
            "INSERT INTO pg_elector_candidates (class, object, identity, preference, live_until, \
             live_since, waits, requested_until, stay_away_ms, heard_at) VALUES ($1, $2, 'plain', \
             0, now() + interval '1 minute', now(), false, now() + interval '2 minutes', 1000, \
             now() - interval '1 second')",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
    let keys = status::read(&client).await.unwrap();
    assert!(
        of(&keys, key)
            .candidates
            .iter()
            .any(|c| c.identity == "plain" && c.live),
        "{keys:#?}"
    );
    assert_eq!(pending(&keys), None, "a request naming the leader");
}

/// `status::jobs`: nothing before a schedule made its tables; then each job with its stored
/// schedule, its last run claimed and that run's outcome and error, and its next due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_job_shows_its_last_run_outcome_and_next_due() {
    let db = fresh_db().await;
    let client = db.connect().await.unwrap();
    assert_eq!(status::jobs(&client).await.unwrap(), Vec::new());
    let (elector, control) = Elector::manual();
    control.promote();
    let period = Duration::from_millis(200);
    let schedule = Schedule::new(&elector, db.pool(2))
        .namespace("status")
        .poll_interval(Duration::from_millis(50))
        .job(Job::every("failing", period), |_run| async {
            Err::<(), _>("disk full".to_owned())
        });
    let running = ManualSchedule::spawn(control, schedule);
    let failed = async {
        loop {
            let jobs = status::jobs(&client).await.unwrap();
            let done = jobs
                .first()
                .and_then(|j| j.last_run.as_ref())
                .is_some_and(|run| {
                    run.outcome.as_deref() == Some("failed") && run.finished_at.is_some()
                });
            if done {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let jobs = tokio::time::timeout(Duration::from_secs(10), failed)
        .await
        .expect("a failed run recorded within 10 s");
    running.stop().await;
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let job = &jobs[0];
    assert_eq!(
        (job.namespace.as_str(), job.job.as_str()),
        ("status", "failing")
    );
    assert_eq!(job.schedule, "every 200ms");
    let run = job.last_run.as_ref().unwrap();
    assert_eq!(run.error.as_deref(), Some("disk full"));
    let due = run.due.expect("the due it ran for");
    assert_eq!(job.next_due, Some(due + period), "the next due on the grid");
    assert_eq!((job.skipped, job.reruns_owed), (0, 0));
}

/// `status::groups`: a group of shards with two live members shows once, by its class, with
/// its count, each member's session and the shards it owns (every shard once), none unowned;
/// a plain shared lock of another class is no group. The shards' keys show in `read` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_shards_shows_its_members_and_their_shards() {
    use common::shards::Member;
    use pg_elector::shards::Shards;
    let _timing = timing();
    let db = fresh_db().await;
    let count = 8;
    let member = |identity: &str| {
        Member::build(
            Shards::builder(db.pool(2), "status/tenants", count)
                .check_interval(I)
                .identity(identity),
        )
    };
    let (a, b) = (member("a"), member("b"));
    let other = db.connect().await.unwrap();
    other
        .execute("SELECT pg_advisory_lock_shared(5, -3)", &[])
        .await
        .unwrap();
    let client = db.connect().await.unwrap();
    // The handles say a shard is owned once its term began, after its lock's grant.
    let balanced = wait_for_async(Duration::from_secs(10), || async {
        let groups = status::groups(&client).await.unwrap();
        a.shards.owned().len() == 4
            && b.shards.owned().len() == 4
            && groups.len() == 1
            && groups[0].members.len() == 2
            && groups[0].members.iter().all(|m| m.owned.len() == 4)
    })
    .await;
    let groups = status::groups(&client).await.unwrap();
    let keys = status::read(&client).await.unwrap();
    let (a_owns, b_owns) = (a.shards.owned(), b.shards.owned());
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    balanced.unwrap_or_else(|| panic!("two members with four shards each: {groups:?}"));

    let group = &groups[0];
    assert_eq!(group.class, status::group_class("status/tenants"));
    assert_eq!((group.count, group.unowned.clone()), (count, vec![]));
    let mut members: Vec<_> = group
        .members
        .iter()
        .map(|m| (m.session.identity.as_str(), m.count, m.owned.clone()))
        .collect();
    members.sort();
    let indexes = |owned: Vec<pg_elector::shards::ShardId>| {
        let mut indexes: Vec<u32> = owned.iter().map(|s| s.index()).collect();
        indexes.sort_unstable();
        indexes
    };
    assert_eq!(
        members,
        [
            ("a", Some(count), indexes(a_owns)),
            ("b", Some(count), indexes(b_owns))
        ],
        "each member's shards, as its own handle says"
    );
    let shard_keys = keys
        .iter()
        .filter(|k| k.key.class() == group.class && k.key.object() >= 0)
        .count();
    assert_eq!(shard_keys, count as usize, "the shards' keys in read");
}
