//! F9 preferred leaders: a live standby with a strictly higher preference gets the lead within
//! two intervals, through a graceful handover, and the lock goes to the most preferred live
//! standby rather than to whichever tries first; equal preferences never move the lead; a
//! replica without a preference counts as 0 (a mixed fleet); a preferred standby that is cut
//! off stops counting; a handover asked from outside goes to the named standby, or is refused
//! with a clear error and changes nothing. (A frozen preferred standby, which needs a real
//! process, is in `processes.rs`.)

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use pg_elector::{
    BuildError, Elector, Error, HandoverError, HandoverTo, LockKey, TermEnd, request_handover,
    request_handover_in,
};
use pg_elector_testkit::FaultProxy;
use tokio::task::JoinHandle;

/// Slack on every bound below, for a round trip with a new connection's setup and for waking
/// tasks on a loaded two-core machine (as `resign.rs`'s takeover margin).
const SLACK: Duration = Duration::from_millis(150);

/// How long a preferred standby may take to get the lead after it starts: its first try says
/// it is alive at once; the leader sees it at its next check (≤ I), hands over (nothing to
/// drain, one unlock); the standby's next try (≤ I after its first) takes the lock.
const PREFERRED_TAKES: Duration = Duration::from_millis(2 * I.as_millis() as u64 + 150);

/// A replica on a pool of its own, named `name`, with `preference` if any.
fn replica(db: &TestDb, key: LockKey, name: &str, preference: Option<u64>, fast: bool) -> Replica {
    let mut builder = Elector::builder(db.pool(3), key)
        .check_interval(I)
        .identity(name)
        .fast_takeover(fast);
    if let Some(p) = preference {
        builder = builder.preference(p);
    }
    Replica::run(builder.build().expect("a valid elector"))
}

/// Samples the replicas' `is_leader()` every millisecond until stopped: the most that led at
/// one sample, and each change of leader in order (the index, or `None` for no leader).
struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<(usize, Vec<Option<usize>>)>,
}

impl Sampler {
    /// The first sample is taken before this returns, so that a leader stopped right after
    /// is in the record.
    fn start(electors: Vec<Elector>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sample = move || -> Vec<usize> {
            (0..electors.len())
                .filter(|&i| electors[i].is_leader())
                .collect()
        };
        let first = sample();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut most = first.len();
                let mut last = first.first().copied();
                let mut changes = vec![last];
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let leading = sample();
                    most = most.max(leading.len());
                    let now = leading.first().copied();
                    if last != now {
                        changes.push(now);
                        last = now;
                    }
                }
                (most, changes)
            }
        });
        Self { stop, task }
    }

    /// The most that led at once, and the leaders in order (no-leader gaps left out).
    async fn finish(self) -> (usize, Vec<usize>) {
        self.stop.store(true, Ordering::Relaxed);
        let (most, changes) = self.task.await.unwrap();
        (most, changes.into_iter().flatten().collect())
    }
}

fn electors(replicas: &[&Replica]) -> Vec<Elector> {
    replicas.iter().map(|r| r.elector.clone()).collect()
}

async fn lead_within(replica: &Replica, limit: Duration, what: &str) -> Duration {
    wait_for(limit, || replica.elector.is_leader())
        .await
        .unwrap_or_else(|| panic!("{what} did not lead within {limit:?}"))
}

/// A leader without a preference (0) hands over to a standby of preference 1 within two
/// intervals of its start, gracefully (its term ends `HandedOver`), and no sample sees two
/// leaders; the lead then stays there. In both modes (with fast takeover the leader hands over
/// once the standby's session waits, and the waiting session takes the lock at the unlock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_more_preferred_standby_gets_the_lead_within_two_intervals() {
    let _timing = timing();
    let db = fresh_db().await;
    for fast in [false, true] {
        let key = LockKey::new(0xf9, 10 + i32::from(fast));
        let old = replica(&db, key, "old", None, fast);
        lead_within(&old, 3 * I, "the first replica").await;
        let term = old.elector.term();
        // Half an interval off the leader's checks, as a replica started at a random moment
        // is on average: started right after a check, the new replica's tries would fall in
        // step with the old leader's checks and, once it yields, with its tries, whose
        // question can refuse the new one's try in the same millisecond.
        tokio::time::sleep(I + I / 2).await;

        let new = replica(&db, key, "new", Some(1), fast);
        let sampler = Sampler::start(electors(&[&old, &new]));
        let took = lead_within(&new, PREFERRED_TAKES, "the preferred standby").await;
        assert_eq!(
            term.end(),
            Some(TermEnd::HandedOver),
            "fast {fast}: a graceful handover"
        );
        // No flapping back: the old leader, now a standby of a lower preference, stays one.
        tokio::time::sleep(4 * I).await;
        let (most, order) = sampler.finish().await;
        assert_eq!(most, 1, "fast {fast}: two leaders at one sample");
        assert_eq!(order, vec![0, 1], "fast {fast}: one move, old to new");
        assert!(new.elector.is_leader());
        eprintln!("fast {fast}: the preferred standby led {took:?} after it started");
        new.stop().await.unwrap();
        old.stop().await.unwrap();
    }
}

/// Equal preferences never move the lead: neither a standby of the same preference nor one
/// built without a preference (0) beside a leader of preference 0, over six intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_preferences_never_move_the_lead() {
    let _timing = timing();
    let db = fresh_db().await;
    for (leader_pref, standby_pref) in [(Some(3), Some(3)), (None, Some(0)), (Some(0), None)] {
        let key = LockKey::new(0xf9, 2);
        let leader = replica(&db, key, "leader", leader_pref, false);
        lead_within(&leader, 3 * I, "the first replica").await;
        let term = leader.elector.term();
        let standby = replica(&db, key, "standby", standby_pref, false);
        tokio::time::sleep(6 * I).await;
        assert!(
            term.is_leader(),
            "{leader_pref:?} beside {standby_pref:?}: the term ended with {:?}",
            term.end()
        );
        assert!(!standby.elector.is_leader());
        standby.stop().await.unwrap();
        leader.stop().await.unwrap();
    }
}

/// At a graceful stop of the most preferred leader, the lock goes to the most preferred live
/// standby, not to whichever tries first, among standbys with a preference and one without
/// (a mixed fleet); and again at the next stop. In both modes; with fast takeover the waiting
/// sessions pass the lock along to the preferred one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_the_lock_to_the_most_preferred_live_standby() {
    let _timing = timing();
    let db = fresh_db().await;
    for fast in [false, true] {
        let key = LockKey::new(0xf9, 3 + u16::from(fast) as i32);
        let top = replica(&db, key, "top", Some(10), fast);
        lead_within(&top, 3 * I, "the first replica").await;
        let low = replica(&db, key, "low", Some(1), fast);
        let none = replica(&db, key, "none", None, fast);
        let mid = replica(&db, key, "mid", Some(5), fast);
        // Every standby has tried (and, with fast takeover, waits) by now.
        tokio::time::sleep(2 * I).await;
        assert!(top.elector.is_leader(), "the most preferred keeps the lead");
        let sampler = Sampler::start(electors(&[&top, &low, &none, &mid]));

        let stopped = Instant::now();
        top.stop().await.unwrap();
        let took = lead_within(&mid, I + SLACK, "the most preferred standby").await;
        let leaderless = stopped.elapsed();
        tokio::time::sleep(I).await;
        let stopped_mid = Instant::now();
        mid.stop().await.unwrap();
        lead_within(&low, I + SLACK, "the next most preferred standby").await;
        let leaderless_2 = stopped_mid.elapsed();
        tokio::time::sleep(2 * I).await;
        let (most, order) = sampler.finish().await;
        assert_eq!(most, 1, "fast {fast}: two leaders at one sample");
        assert_eq!(order, vec![0, 3, 1], "fast {fast}: top, mid, then low");
        eprintln!(
            "fast {fast}: mid led {took:?} after top's stop began, low {leaderless_2:?} after \
             mid's (leaderless at most {leaderless:?})"
        );
        low.stop().await.unwrap();
        none.stop().await.unwrap();
    }
}

/// A preferred standby cut off from the server (a blackholed proxy) stops counting within two
/// intervals of its last try: at the leader's graceful stop, a less preferred standby leaves
/// the lock to it only until then, and leads within three intervals; the cut-off standby
/// never leads while cut off, and gets the lead back once it hears the server again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_preferred_standby_stops_counting_within_two_intervals() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf9, 5);
    let proxy = FaultProxy::start(db.server_addr()).await.unwrap();
    let top = replica(&db, key, "top", Some(9), false);
    lead_within(&top, 3 * I, "the first replica").await;
    let cut = Replica::run(
        Elector::builder(db.pool_via(proxy.addr(), 3), key)
            .check_interval(I)
            .identity("cut")
            .preference(5)
            .build()
            .unwrap(),
    );
    let low = replica(&db, key, "low", Some(1), false);
    tokio::time::sleep(2 * I).await;
    let sampler = Sampler::start(electors(&[&top, &cut, &low]));

    proxy.blackhole();
    let cut_off = Instant::now();
    top.stop().await.unwrap();
    // The cut-off standby's row is live for at most 2·I after its last try (before `cut_off`);
    // the less preferred standby's next try after that (≤ I) takes the lock.
    let limit = (3 * I + SLACK).saturating_sub(cut_off.elapsed());
    lead_within(&low, limit, "the less preferred standby").await;
    let took = cut_off.elapsed();
    assert!(
        took >= I,
        "the less preferred standby led {took:?} after the cut: it did not leave the lock to the \
         preferred one while that one counted (at least I after its last try)"
    );
    assert!(!cut.elector.is_leader(), "the cut-off standby never leads");

    proxy.pass();
    let healed = Instant::now();
    // Its tries reach the server again (its pool replaces the broken connections within a try
    // or two), it is live again, and the leader hands over.
    lead_within(
        &cut,
        4 * I + PREFERRED_TAKES,
        "the healed preferred standby",
    )
    .await;
    let back = healed.elapsed();
    let (most, order) = sampler.finish().await;
    assert_eq!(most, 1, "two leaders at one sample");
    assert_eq!(order, vec![0, 2, 1], "top, low, then the healed one");
    eprintln!("low led {took:?} after the cut; the healed standby {back:?} after the heal");
    cut.stop().await.unwrap();
    low.stop().await.unwrap();
}

/// A handover asked from another process's connection goes to the named live standby within
/// two intervals, even a less preferred one, which then keeps the lead against preferences;
/// the old leader stays away for the time asked. A request for a replica that is not a live
/// standby, or with no leader, is refused with its own error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_on_request_goes_to_the_named_standby() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf9, 6);
    let client = db.connect().await.unwrap();
    let asker = db.pool(1);
    let none = request_handover(&asker, key, HandoverTo::MostPreferred, I, ASK).await;
    assert!(matches!(none, Err(HandoverError::NoLeader)), "{none:?}");

    let top = replica(&db, key, "top", Some(9), false);
    lead_within(&top, 3 * I, "the first replica").await;
    let term = top.elector.term();
    let low = replica(&db, key, "low", Some(1), false);
    let mid = replica(&db, key, "mid", Some(5), false);
    let unnamed = replica(&db, key, "unnamed", None, false);
    tokio::time::sleep(2 * I).await;

    for missing in ["nobody", "unnamed", "top"] {
        let refused = request_handover(
            &asker,
            key,
            HandoverTo::Identity(missing.into()),
            10 * I,
            ASK,
        )
        .await;
        match refused {
            Err(HandoverError::NoSuchStandby { identity }) => {
                assert_eq!(identity.as_deref(), Some(missing))
            }
            other => panic!("a request to {missing:?}: {other:?}"),
        }
    }
    let asked: i64 = query_i64(
        &client,
        "SELECT count(*) FROM pg_elector_candidates WHERE requested_until IS NOT NULL",
    )
    .await;
    assert_eq!(asked, 0, "a refused request changes nothing");
    tokio::time::sleep(2 * I).await;
    assert!(term.is_leader(), "a refused request moves nothing");

    let sampler = Sampler::start(electors(&[&top, &low, &mid, &unnamed]));
    let stay_away = 10 * I;
    let asked_at = Instant::now();
    let to = request_handover(
        &asker,
        key,
        HandoverTo::Identity("low".into()),
        stay_away,
        ASK,
    )
    .await
    .unwrap();
    assert_eq!(to, "low");
    let took = lead_within(&low, PREFERRED_TAKES, "the named standby").await;
    assert_eq!(term.end(), Some(TermEnd::HandedOver));
    // The less preferred target keeps the lead beside a more preferred standby, and the old
    // leader stays away, for the rest of the stay-away.
    let away_until = asked_at + stay_away;
    tokio::time::sleep_until(away_until.into()).await;
    assert!(low.elector.is_leader(), "the target kept the lead");
    let (most, order) = sampler.finish().await;
    assert_eq!(most, 1, "two leaders at one sample");
    assert_eq!(order, vec![0, 1], "one move, to the named standby");

    // To the most preferred live standby: `top` is back from its stay-away and tries again.
    tokio::time::sleep(2 * I).await;
    let to = request_handover(&asker, key, HandoverTo::MostPreferred, I, ASK)
        .await
        .unwrap();
    assert_eq!(to, "top", "the most preferred live standby");
    lead_within(&top, PREFERRED_TAKES, "the most preferred standby").await;
    eprintln!("the named standby led {took:?} after the request");
    for r in [top, low, mid, unnamed] {
        r.stop().await.unwrap();
    }
}

/// A preferred replica that cannot keep the lead it is handed (here its fencing table is in a
/// schema that does not exist, so every grant is given back) does not take the lead from a
/// healthy leader every couple of intervals: after each failure it stays quiet, for four
/// intervals and then twice as long each time, so over fourteen intervals the healthy leader
/// yields at most three times (without the quiet time, about once every two intervals).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_replica_that_cannot_keep_the_lead_backs_off() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf9, 7);
    let healthy = replica(&db, key, "healthy", Some(1), false);
    lead_within(&healthy, 3 * I, "the healthy replica").await;
    let broken = Replica::run(
        Elector::builder(db.pool(3), key)
            .check_interval(I)
            .identity("broken")
            .preference(5)
            .fencing(true)
            .fencing_table(Some("no_such_schema"), "epochs")
            .build()
            .unwrap(),
    );
    // Each yield is a demotion and a promotion of the healthy replica.
    let changes = || healthy.elector.subscribe().borrow().changes;
    let before = changes();
    tokio::time::sleep(14 * I).await;
    let yields = (changes() - before) / 2;
    assert!(!broken.elector.is_leader(), "its grants are given back");
    assert!(
        (1..=3).contains(&yields),
        "the healthy leader yielded {yields} times in 14·I"
    );
    lead_within(&healthy, 3 * I, "the healthy replica, in the end").await;
    eprintln!("the healthy leader yielded {yields} times in 14·I");
    broken.stop().await.unwrap();
    healthy.stop().await.unwrap();
}

/// Issue "Hardening IV": the candidates table may be named (schema and table, taken as
/// written) like the fencing and job tables. Replicas on `"Ops"."Candidates"` create it there
/// and leave the default table alone; the lead moves to the more preferred of them within
/// two intervals; a request through `request_handover_in` on that table moves it to the named
/// one, and the same request on the default table finds no such standby. Names PostgreSQL
/// would cut or refuse are an error at `build()` and at the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_candidates_table_carries_preferences_and_requests() {
    let _timing = timing();
    let db = fresh_db().await;
    let client = db.connect().await.unwrap();
    client.batch_execute("CREATE SCHEMA \"Ops\"").await.unwrap();
    let key = LockKey::new(0xf9, 40);
    let named = |name: &str, preference: u64| {
        let elector = Elector::builder(db.pool(3), key)
            .check_interval(I)
            .identity(name)
            .preference(preference)
            .candidates_table(Some("Ops"), "Candidates")
            .build()
            .expect("a valid elector");
        assert!(
            elector
                .candidates_ddl()
                .unwrap()
                .starts_with("CREATE TABLE IF NOT EXISTS \"Ops\".\"Candidates\" (")
        );
        Replica::run(elector)
    };
    let low = named("low", 1);
    lead_within(&low, 3 * I, "the first replica").await;
    let high = named("high", 2);
    lead_within(&high, PREFERRED_TAKES, "the more preferred replica").await;
    let rows = query_i64(&client, "SELECT count(*) FROM \"Ops\".\"Candidates\"").await;
    assert!(rows >= 1, "the standby's row is in the named table");
    let default = query_i64(
        &client,
        "SELECT (pg_catalog.to_regclass('pg_elector_candidates') IS NOT NULL)::int4::int8",
    )
    .await;
    assert_eq!(default, 0, "the default table was never made");

    // The old leader says it is alive again (in the named table) at its next try as a standby.
    wait_for_async(3 * I, || async {
        query_i64(
            &client,
            "SELECT count(*) FROM \"Ops\".\"Candidates\" \
             WHERE identity = 'low' AND live_until > statement_timestamp()",
        )
        .await
            == 1
    })
    .await
    .expect("the old leader stands by, live in the named table");
    let asker = db.pool(1);
    let to = |name: &str| HandoverTo::Identity(name.into());
    let elsewhere = request_handover(&asker, key, to("low"), 10 * I, ASK).await;
    assert!(
        matches!(elsewhere, Err(HandoverError::NoSuchStandby { .. })),
        "{elsewhere:?}"
    );
    let asked = request_handover_in(
        &asker,
        Some("Ops"),
        "Candidates",
        key,
        to("low"),
        10 * I,
        ASK,
    )
    .await;
    assert_eq!(asked.unwrap(), "low");
    lead_within(&low, 3 * I + SLACK, "the standby asked for").await;

    let bad = request_handover_in(&asker, Some(""), "Candidates", key, to("low"), I, ASK).await;
    assert!(
        matches!(bad, Err(HandoverError::InvalidTable { ref name }) if name.is_empty()),
        "{bad:?}"
    );
    let long = "x".repeat(64);
    let refused = Elector::builder(db.pool(1), key)
        .candidates_table(None, &long)
        .build();
    assert!(
        matches!(refused, Err(Error::Build(BuildError::InvalidCandidatesTable { ref name })) if *name == long),
        "{refused:?}"
    );
    high.stop().await.unwrap();
    low.stop().await.unwrap();
}
