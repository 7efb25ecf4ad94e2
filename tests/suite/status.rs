//! `status::read`: what a database shows of its elections. Each key once, with its leader (and
//! the epoch with fencing), the sessions waiting for it, the candidates with their preference
//! and liveness, and a pending handover; nothing in a database the crate never used.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
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
    let plain = db.connect().await.unwrap();
    plain
        .batch_execute("SET application_name = 'plain'")
        .await
        .unwrap();
    plain
        .execute(
            "SELECT pg_advisory_lock($1, $2)",
            &[&held.class(), &held.object()],
        )
        .await
        .unwrap();
    let asked = replica(&db, held, "asked", 2, false);
    // Both standbys have written their rows, and the fast one waits.
    tokio::time::sleep(3 * I).await;
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
