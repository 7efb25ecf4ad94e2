//! F9.1–F9.3 preferred leaders under partial failures: after a fault heals, the most preferred
//! live replica leads again within a bound the README states, and a handover asked from
//! outside never strands the key. Each test here failed before the fix it guards.

use crate::common;

use std::time::Duration;

use common::*;
use pg_elector::{Elector, HandoverTo, LockKey, TermEnd, request_handover};
use pg_elector_testkit::FaultProxy;
use pg_elector_testkit::server::ShutdownMode;
use tokio::task::block_in_place;

/// How soon, after a fault heals, the most preferred live replica leads again: the README's
/// bound. Its first good try after the heal is quiet (it failed before); the next says it is
/// alive (≤ 2·I); the leader sees it at its next check and, with fast takeover, once its
/// session waits (≤ 1·I more), drains (nothing here) and unlocks; the waiting session takes
/// the lock at once, a polling one at its next try (≤ 1·I). Two intervals of slack for a new
/// connection's setup through the healed link and for a loaded machine.
const AFTER_HEAL: Duration = Duration::from_millis(6 * I.as_millis() as u64);

/// A replica on a pool of `pool`, named `name`, of `preference`, with fast takeover.
fn preferring(pool: deadpool_postgres::Pool, key: LockKey, name: &str, preference: u64) -> Replica {
    Replica::run(
        Elector::builder(pool, key)
            .check_interval(I)
            .identity(name)
            .preference(preference)
            .fast_takeover(true)
            .build()
            .expect("a valid elector"),
    )
}

/// A preferred standby cut off from the server for fifteen intervals (every try fails: no
/// connection, no answer) says it is alive again right after the link heals and leads within
/// [`AFTER_HEAL`]. Before, each failed try doubled a quiet time meant for a lead it could not
/// keep, up to 256·I, and it stayed silent for minutes while its tries were answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_standby_cut_off_for_a_while_leads_soon_after_the_heal() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf91, 1);
    let leader = preferring(db.pool(3), key, "leader", 1);
    wait_for(3 * I, || leader.elector.is_leader())
        .await
        .expect("the first replica leads");
    let proxy = FaultProxy::start(db.server_addr()).await.unwrap();
    proxy.blackhole();
    let preferred = preferring(db.pool_via(proxy.addr(), 3), key, "preferred", 5);
    tokio::time::sleep(15 * I).await;
    assert!(
        leader.elector.is_leader(),
        "the cut-off standby cannot take the lead"
    );
    proxy.pass();
    let took = wait_for(AFTER_HEAL, || preferred.elector.is_leader())
        .await
        .unwrap_or_else(|| {
            panic!("the preferred standby did not lead within {AFTER_HEAL:?} of the heal")
        });
    assert!(!leader.elector.is_leader(), "never two leaders");
    eprintln!("the preferred standby led {took:?} after the link healed");
    preferred.stop().await.unwrap();
    leader.stop().await.unwrap();
}

/// Three replicas of preferences 1, 2 and 3; the server stops for fifteen intervals and starts
/// again. Every try fails meanwhile; the most preferred reaches the server only three intervals
/// after its return (its link still cut), so that another leads first, and it leads within
/// [`AFTER_HEAL`] of reaching it. Before, every replica's failed tries had made it quiet for up
/// to 256·I: the most preferred had not led 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_the_most_preferred_leads_again() {
    let _timing = timing();
    let (server, db) = private_server().await;
    let key = LockKey::new(0xf91, 2);
    let proxy = FaultProxy::start(db.server_addr()).await.unwrap();
    let replicas: Vec<Replica> = vec![
        preferring(db.pool(3), key, "one", 1),
        preferring(db.pool(3), key, "two", 2),
        preferring(db.pool_via(proxy.addr(), 3), key, "three", 3),
    ];
    wait_for(6 * I, || replicas[2].elector.is_leader())
        .await
        .expect("the most preferred leads at first");
    block_in_place(|| server.stop(ShutdownMode::Fast)).unwrap();
    proxy.blackhole();
    tokio::time::sleep(15 * I).await;
    block_in_place(|| server.start_again()).unwrap();
    wait_for(3 * I, || !leaders(&replicas).is_empty())
        .await
        .expect("a replica that reaches the server leads");
    assert_ne!(
        leaders(&replicas),
        vec![2],
        "the cut-off one cannot lead yet"
    );
    proxy.pass();
    let took = wait_for(AFTER_HEAL, || replicas[2].elector.is_leader())
        .await
        .unwrap_or_else(|| {
            panic!(
                "the most preferred did not lead within {AFTER_HEAL:?} of reaching the server \
                 again; leaders: {:?}",
                leaders(&replicas)
            )
        });
    assert_eq!(
        leaders(&replicas),
        vec![2],
        "one leader, the most preferred"
    );
    eprintln!("the most preferred led {took:?} after it reached the restarted server");
    for replica in replicas {
        replica.stop().await.unwrap();
    }
    drop(db);
}

/// How long a key may go without a leader when the target of a handover asked from outside
/// dies before it leads: its row stays live for up to 2·I after its last try, the old leader
/// looks at it once an interval (≤ 1·I) and, standing by again, tries at once; an interval of
/// slack for a new connection and a loaded machine.
const TARGET_GONE: Duration = Duration::from_millis(4 * I.as_millis() as u64);

/// A leader asked to hand over to `b` and stay away for a minute; `b` (killed: its task is
/// aborted, which closes its connections) dies as the handover begins, before it leads. The
/// old leader leads again within [`TARGET_GONE`] of the kill, not after the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_target_dies_before_it_leads_strands_nobody() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf92, 1);
    let a = preferring(db.pool(3), key, "a", 5);
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let term = a.elector.term();
    let b = preferring(db.pool(3), key, "b", 1);
    tokio::time::sleep(2 * I).await;
    let asker = db.pool(1);
    let to = request_handover(&asker, key, HandoverTo::Identity("b".into()), 300 * I, ASK)
        .await
        .unwrap();
    assert_eq!(to, "b");
    // The term's end, not `is_leader()`: on a loaded machine a late check lets the lease
    // lapse for a moment (is_leader false, the term not over yet) before the handover ends it.
    wait_for(2 * I, || term.end().is_some())
        .await
        .expect("the leader hands over to the live-looking target");
    assert_eq!(term.end(), Some(TermEnd::HandedOver));
    // b dies as the handover begins: the term ends before the drain and the unlock, so b
    // cannot have led. (Killed right after the request instead, b's row could be dead by
    // the time a late check of a loaded machine read the request: no handover at all, a
    // PG 13 run in CI.)
    assert!(!b.elector.is_leader(), "b has not led");
    b.task.abort();
    let killed = std::time::Instant::now();
    let took = wait_for(TARGET_GONE, || a.elector.is_leader())
        .await
        .unwrap_or_else(|| {
            panic!("the old leader did not lead again within {TARGET_GONE:?} of the target's death")
        });
    eprintln!(
        "the old leader led again {:?} after the target died ({took:?} after its term ended)",
        killed.elapsed()
    );
    a.stop().await.unwrap();
}

/// The same when the target dies a few intervals into the term it took: the old leader, which
/// saw it lead, stands by again once it no longer does, and leads within [`TARGET_GONE`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_target_dies_in_its_term_strands_nobody() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf92, 2);
    let a = preferring(db.pool(3), key, "a", 5);
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = preferring(db.pool(3), key, "b", 1);
    tokio::time::sleep(2 * I).await;
    let asker = db.pool(1);
    request_handover(&asker, key, HandoverTo::Identity("b".into()), 300 * I, ASK)
        .await
        .unwrap();
    wait_for(4 * I, || b.elector.is_leader())
        .await
        .expect("the target leads");
    tokio::time::sleep(3 * I).await;
    assert!(b.elector.is_leader(), "the target keeps the lead");
    assert!(!a.elector.is_leader(), "the old leader stays away");
    b.task.abort();
    let took = wait_for(TARGET_GONE, || a.elector.is_leader())
        .await
        .unwrap_or_else(|| {
            panic!("the old leader did not lead again within {TARGET_GONE:?} of the target's death")
        });
    eprintln!("the old leader led again {took:?} after the target died in its term");
    a.stop().await.unwrap();
}

/// A live standby of preference 100 that never takes the lock, written by hand: every try of
/// another standby then finds the key's lock free and leaves it to this one.
async fn a_ghost_more_preferred(client: &tokio_postgres::Client, key: LockKey) {
    client
        .execute(
            "INSERT INTO pg_elector_candidates \
               (class, object, identity, preference, live_until, live_since, waits, heard_at) \
             VALUES ($1, $2, 'ghost', 100, now() + interval '1 hour', now(), false, now())",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
}

/// A try that finds the lock free and leaves it to a more preferred live standby gives its
/// pool connection back: ten such tries cost one backend, not ten (before, each closed its
/// connection, and a thousand deferring standbys logged in again thousands of times in every
/// handover window). On a connection the application left inside a transaction, where the
/// question's hold lasts until that transaction ends, the connection is still closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_leaves_the_lock_to_a_preferred_standby_keeps_its_connection() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf94, 1);
    let admin = db.connect().await.unwrap();
    // The table, made by a preferred replica's first try; then the ghost.
    let maker = preferring(db.pool(1), key, "maker", 1);
    wait_for(3 * I, || maker.elector.is_leader())
        .await
        .expect("the maker leads");
    maker.stop().await.unwrap();
    a_ghost_more_preferred(&admin, key).await;

    let proxy = FaultProxy::start(db.server_addr()).await.unwrap();
    let pool = db.pool_via(proxy.addr(), 1);
    let deferring = Replica::run(
        Elector::builder(pool.clone(), key)
            .check_interval(I)
            .identity("deferring")
            .preference(2)
            .build()
            .unwrap(),
    );
    tokio::time::sleep(12 * I).await;
    assert!(
        !deferring.elector.is_leader(),
        "the lock is left to the ghost"
    );
    let logins = proxy.accepted();
    assert!(
        logins <= 2,
        "{logins} connections for ten tries that left the lock to a preferred standby"
    );

    // A standby without a preference (it writes nothing before its try) on a pool of one
    // connection, which the application leaves inside a transaction: its question's hold
    // outlasts the question there, and the try that leaves the lock to the ghost closes it.
    let app = db.pool(1);
    let plain = Replica::run(
        Elector::builder(app.clone(), key)
            .check_interval(I)
            .identity("plain")
            .build()
            .unwrap(),
    );
    tokio::time::sleep(2 * I).await;
    let (leaked, _) = leave_in_transaction(&app, "").await;
    let gone = wait_for_async(4 * I, || async {
        query_i64(
            &admin,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {leaked}"),
        )
        .await
            == 0
    })
    .await;
    assert!(
        gone.is_some(),
        "the connection left inside a transaction is closed by the next try that defers"
    );
    assert!(!plain.elector.is_leader(), "the lock is left to the ghost");
    plain.stop().await.unwrap();
    deferring.stop().await.unwrap();
}

/// A leader (preference 9) on a pool of its own, and a standby named `standby` (preference 1)
/// on the application's pool of one connection, which a test then hands back inside a
/// transaction; `admin`, a direct connection to read the server.
struct OnAppPool {
    _db: TestDb,
    leader: Replica,
    app: deadpool_postgres::Pool,
    standby: Replica,
    admin: tokio_postgres::Client,
}

async fn standby_on_app_pool(key: LockKey) -> OnAppPool {
    let db = fresh_db().await;
    let leader = preferring(db.pool(3), key, "leader", 9);
    wait_for(3 * I, || leader.elector.is_leader())
        .await
        .expect("the leader leads");
    let app = db.pool(1);
    let standby = preferring(app.clone(), key, "standby", 1);
    let admin = db.connect().await.unwrap();
    OnAppPool {
        _db: db,
        leader,
        app,
        standby,
        admin,
    }
}

/// A preferred standby on the application's pool of one connection, which the application
/// hands back inside a transaction (a `BEGIN` without its `COMMIT`, an application bug): the
/// standby's "I am alive" write does not land in that transaction (before, it set
/// `synchronous_commit` for the application's transaction and left its row uncommitted there,
/// try after try); the connection is closed instead, which ends the transaction, and the
/// standby says it is alive again on a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_never_writes_inside_a_transaction_the_application_left_open() {
    let _timing = timing();
    let OnAppPool {
        _db,
        leader,
        app,
        standby,
        admin,
    } = standby_on_app_pool(LockKey::new(0xf95, 1)).await;
    let live = || async {
        query_i64(
            &admin,
            "SELECT count(*) FROM pg_elector_candidates \
             WHERE identity = 'standby' AND live_until > statement_timestamp()",
        )
        .await
            == 1
    };
    wait_for_async(3 * I, live)
        .await
        .expect("the standby says it is alive");

    let (leaked, _) = leave_in_transaction(&app, "").await;
    let gone = || async {
        query_i64(
            &admin,
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {leaked}"),
        )
        .await
            == 0
    };
    wait_for_async(3 * I, gone)
        .await
        .expect("the connection left inside a transaction is closed at the standby's next try");
    // Alive again, written and committed on a fresh connection.
    tokio::time::sleep(2 * I).await;
    assert!(live().await, "the standby says it is alive again");
    let fresh = app.get().await.unwrap();
    let pid = query_i64(&fresh, "SELECT pg_backend_pid()::int8").await;
    assert_ne!(pid, leaked, "the pool's connection is a fresh one");
    drop(fresh);
    standby.stop().await.unwrap();
    leader.stop().await.unwrap();
}

/// A preferred standby that stops while the application has just handed its pool's only
/// connection back inside a transaction: its withdrawal closes that connection (ending the
/// transaction) and drops its row on a fresh one, so the row is gone when `stop` returns
/// (before, the withdrawal gave up after the first connection and the row counted for two
/// more intervals, the free lock left to a replica that had stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_withdraws_past_a_connection_left_inside_a_transaction() {
    let _timing = timing();
    let OnAppPool {
        _db,
        leader,
        app,
        standby,
        admin,
    } = standby_on_app_pool(LockKey::new(0xf95, 2)).await;
    let rows = || async {
        query_i64(
            &admin,
            "SELECT count(*) FROM pg_elector_candidates WHERE identity = 'standby'",
        )
        .await
    };
    wait_for_async(3 * I, || async { rows().await == 1 })
        .await
        .expect("the standby says it is alive");
    // Right after a try, so that the next one does not close the connection first.
    tokio::time::sleep(I / 4).await;
    let (leaked, _) = leave_in_transaction(&app, "").await;
    standby.stop().await.unwrap();
    assert_eq!(rows().await, 0, "the row is gone when stop returns");
    let leaked = format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {leaked}");
    let closed = wait_for_async(I, || async { query_i64(&admin, &leaked).await == 0 }).await;
    leader.stop().await.unwrap();
    assert!(
        closed.is_some(),
        "the connection left inside a transaction was closed"
    );
}

/// A handover asked on the application's pool of one connection, which the application handed
/// back inside a transaction: the request is not written inside that transaction (where it
/// would never commit, and the call would say it was asked); that connection is closed, which
/// ends the transaction, and a fresh one asks. The target leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_request_never_writes_inside_a_transaction_the_application_left_open() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf99, 1);
    let a = preferring(db.pool(3), key, "a", 1);
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = preferring(db.pool(3), key, "b", 1);
    tokio::time::sleep(2 * I).await;
    let app = db.pool(1);
    let (leaked, _) = leave_in_transaction(&app, "").await;
    let to = request_handover(&app, key, HandoverTo::Identity("b".into()), 300 * I, ASK)
        .await
        .expect("the request is made on a fresh connection");
    assert_eq!(to, "b");
    wait_for(2 * I + I / 2, || b.elector.is_leader())
        .await
        .expect("the target leads: the request was committed");
    let fresh = app.get().await.unwrap();
    let pid = query_i64(&fresh, "SELECT pg_backend_pid()::int8").await;
    assert_ne!(
        pid, leaked,
        "the connection left inside a transaction was closed"
    );
    drop(fresh);
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

/// A handover asked through a link that answers nothing returns its own error within its
/// bound (before, the call had no bound and waited as long as the link did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_request_through_a_dead_link_ends_at_its_bound() {
    let db = fresh_db().await;
    let proxy = FaultProxy::start(db.server_addr()).await.unwrap();
    let pool = db.pool_via(proxy.addr(), 1);
    // A connection made while the link works, then the link goes silent.
    drop(pool.get().await.unwrap());
    proxy.blackhole();
    let key = LockKey::new(0xf99, 2);
    let started = std::time::Instant::now();
    let asked = request_handover(&pool, key, HandoverTo::MostPreferred, I, 2 * I).await;
    let took = started.elapsed();
    assert!(
        matches!(asked, Err(pg_elector::HandoverError::Timeout(bound)) if bound == 2 * I),
        "{asked:?}"
    );
    assert!(took < 2 * I + I, "ends at its bound: {took:?}");
}

/// Two live replicas of one key named alike (`.identity("svc")` on every replica): the leader
/// drops the standby's row at every check, so the more preferred one is invisible; and two
/// standbys overwrite each other's row. Each is said at ERROR, naming the fix (before, nothing
/// was said and preferences silently did nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_replicas_with_one_identity_are_said_at_error() {
    let _timing = timing();
    let db = fresh_db().await;
    let capture = common::capture::Capture::default();
    let run = |name: &str, preference: u64| {
        Replica::run_captured(
            Elector::builder(db.pool(2), LockKey::new(0xf96, 1))
                .check_interval(I)
                .identity(name)
                .preference(preference)
                .build()
                .unwrap(),
            &capture,
        )
    };
    let leader = run("svc", 1);
    wait_for(3 * I, || leader.elector.is_leader())
        .await
        .expect("the first replica leads");
    let twin = run("svc", 5);
    let said = capture
        .logged(
            "another live replica of this key has this leader's identity",
            6 * I,
        )
        .await;
    assert!(said.is_some(), "the leader says so at ERROR");
    let event = &capture.events("another live replica of this key has this leader's identity")[0];
    assert_eq!(event.level, tracing::Level::ERROR);
    assert_eq!(event.field("identity"), "svc");
    assert!(
        leader.elector.is_leader(),
        "the twin stays invisible to the leader"
    );

    // Two standbys named alike, beside a leader of another name.
    twin.stop().await.unwrap();
    leader.stop().await.unwrap();
    let other = run("other", 9);
    wait_for(3 * I, || other.elector.is_leader())
        .await
        .expect("another leads");
    let (a, b) = (run("twin", 1), run("twin", 2));
    let said = capture
        .logged(
            "another live replica of this key has this replica's identity",
            6 * I,
        )
        .await;
    assert!(said.is_some(), "a standby says so at ERROR");
    for r in [a, b, other] {
        r.stop().await.unwrap();
    }
}

/// The database host's clock steps back a minute (a VM restored, NTP): a dead standby's row,
/// written just before the step, says it is live for a minute more by the new clock. It no
/// longer counts (it was heard "in the future"), so a less preferred standby does not leave
/// the free lock to it for that minute: it leads within two intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_standby_heard_before_a_clock_step_back_does_not_count() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf97, 1);
    let admin = db.connect().await.unwrap();
    // The table, made by a preferred replica's first try.
    let maker = preferring(db.pool(1), key, "maker", 1);
    wait_for(3 * I, || maker.elector.is_leader())
        .await
        .expect("the maker leads");
    maker.stop().await.unwrap();
    // Written a moment before the clock stepped back by a minute, at I = 200 ms.
    admin
        .execute(
            "INSERT INTO pg_elector_candidates \
               (class, object, identity, preference, live_until, live_since, waits, heard_at) \
             VALUES ($1, $2, 'stepped', 100, now() + interval '60.4 s', now(), false, \
                     now() + interval '60 s')",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
    let standby = preferring(db.pool(2), key, "standby", 1);
    wait_for(2 * I + I / 2, || standby.elector.is_leader())
        .await
        .expect("the live standby leads, not leaving the lock to the stepped row");
    standby.stop().await.unwrap();
}

/// A preferred replica that stops gracefully within its term's first interval (before the
/// term's first look at the candidates, which drops the row it wrote as a standby) drops that
/// row before it unlocks: the next most preferred standby takes the free lock at its next try.
/// Before, it left the lock to the stopped replica's row, live for up to two of that replica's
/// intervals. The stopping replica checks every 5·I, so that its row, written at its last try
/// before it led, would stay live for at least 5·I after it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_before_its_first_look_leaves_no_live_row() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0xf98, 1);
    let low = preferring(db.pool(3), key, "low", 1);
    wait_for(3 * I, || low.elector.is_leader())
        .await
        .expect("low leads");
    let mid = preferring(db.pool(3), key, "mid", 5);
    wait_for(4 * I, || mid.elector.is_leader())
        .await
        .expect("mid takes the lead from low");
    let top = Replica::run(
        Elector::builder(db.pool(3), key)
            .check_interval(5 * I)
            .identity("top")
            .preference(9)
            .fast_takeover(true)
            .build()
            .expect("a valid elector"),
    );
    wait_for(20 * I, || top.elector.is_leader())
        .await
        .expect("top takes the lead from mid");
    // Stopped at once, long before its term's first check and look.
    top.stop().await.unwrap();
    let took = wait_for(4 * I, || mid.elector.is_leader())
        .await
        .expect("mid takes the free lock at its next try");
    eprintln!("mid led {took:?} after top stopped");
    mid.stop().await.unwrap();
    low.stop().await.unwrap();
}

/// A handover asked while the synchronous standby confirms nothing (its link blackholed):
/// the request's write waits for no standby, so the call answers within its bound and the
/// target leads within two intervals. (Before, the request's COMMIT waited for the standby:
/// the call gave up at its bound, and the request landed whenever the standby came back,
/// seconds later, moving the lead then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_request_does_not_wait_for_a_silent_synchronous_standby() {
    let _timing = timing();
    let cluster = common::failover::cluster(common::failover::Follow::MultiHost, true).await;
    let key = LockKey::new(0xf9a, 1);
    let a = preferring(cluster.pool(3), key, "a", 1);
    wait_for(3 * I, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = preferring(cluster.pool(3), key, "b", 1);
    tokio::time::sleep(2 * I).await;
    cluster.wal.blackhole();
    let asker = cluster.pool(1);
    let asked = std::time::Instant::now();
    let to = request_handover(&asker, key, HandoverTo::Identity("b".into()), 300 * I, ASK).await;
    let answered = asked.elapsed();
    let led = wait_for(3 * I, || b.elector.is_leader()).await;
    cluster.wal.pass();
    b.stop().await.unwrap();
    a.stop().await.unwrap();
    assert_eq!(to.expect("the request is made"), "b");
    assert!(answered < I, "answered in {answered:?}");
    assert!(
        led.is_some(),
        "the target leads within three intervals of the request"
    );
}
