//! F3: fencing epochs. Each new term bumps its key's epoch row before it starts; a write fenced
//! with `Term::fence` in its own transaction fails once its term is over or a later term has
//! begun, and a new term's bump waits for an old term's open fenced transaction, so fenced
//! writes of two terms never interleave. Epochs only grow, across handovers and server
//! restarts; the table is created when missing, and a role that may not create it is told the
//! statement to run.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::capture::Capture;
use common::roles::{drop_role, limited_role, pool_as};
use common::*;
use pg_elector::{Elector, LockKey, TermEnd};
use pg_elector_testkit::server::ShutdownMode;
use tokio_util::sync::CancellationToken;

/// Replica `a`, fenced, at `I` on a pool of two, once it leads (within 3·I).
async fn a_leads(db: &TestDb, key: LockKey) -> Replica {
    let a = Replica::run(fenced_elector(db.pool(2), key, "a", I));
    wait_a_leads(&a).await;
    a
}

/// Replica `b`, fenced, at `I` on a pool of two (a standby while `a` leads).
fn b_runs(db: &TestDb, key: LockKey) -> Replica {
    Replica::run(fenced_elector(db.pool(2), key, "b", I))
}

/// Takes a timing slot, then makes a fresh database with the [`writes_table`].
async fn timing_writes_db() -> (pg_elector_testkit::replicas::SerialGuard, TestDb) {
    let timing = timing();
    let db = fresh_db().await;
    writes_table(&db).await;
    (timing, db)
}

/// A timing slot, a fresh database with the [`writes_table`], and replica `a` on it leading
/// `key` (see [`a_leads`]).
async fn a_leads_on_a_writes_db(
    key: LockKey,
) -> (pg_elector_testkit::replicas::SerialGuard, TestDb, Replica) {
    let (timing, db) = timing_writes_db().await;
    let a = a_leads(&db, key).await;
    (timing, db, a)
}

/// The table fenced writes go to: who wrote, in which epoch, at which server time.
async fn writes_table(db: &TestDb) {
    db.connect()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE writes (replica text NOT NULL, epoch bigint NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

/// One fenced write of `replica` in `term`, in a transaction on `pool`: the fence, then the
/// insert, then the commit. Returns the fence's verdict.
async fn fenced_write(
    pool: &deadpool_postgres::Pool,
    term: &pg_elector::Term,
    replica: &str,
) -> Result<(), pg_elector::Fenced> {
    let mut client = pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    term.fence(&tx).await?;
    tx.execute(
        "INSERT INTO writes (replica, epoch) VALUES ($1, $2)",
        &[&replica, &(term.epoch().unwrap() as i64)],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

/// `a`'s term and its epoch, once a fenced write of `a` in that term has passed on `pool`.
async fn leaders_own_write(pool: &deadpool_postgres::Pool, a: &Replica) -> (pg_elector::Term, u64) {
    let term = a.elector.term();
    let epoch = term.epoch().expect("a fenced term has an epoch");
    fenced_write(pool, &term, "a")
        .await
        .expect("the leader's own write passes");
    (term, epoch)
}

/// The new leader's fenced write: `b`'s write in `new_term` passes on `pool`, and the writes
/// are then `a`'s own one, in `old_epoch`, and `b`'s, in the new term's epoch (a refused write
/// of `a` did not commit).
async fn the_new_leaders_write_passes(
    db: &TestDb,
    pool: &deadpool_postgres::Pool,
    new_term: &pg_elector::Term,
    old_epoch: u64,
) {
    fenced_write(pool, new_term, "b")
        .await
        .expect("the new leader's write passes");
    let rows = writes(db).await;
    let who: Vec<(&str, i64)> = rows.iter().map(|(r, e, _)| (r.as_str(), *e)).collect();
    assert_eq!(
        who,
        [
            ("a", old_epoch as i64),
            ("b", new_term.epoch().unwrap() as i64)
        ],
        "a's refused write did not commit"
    );
}

/// The next term after `after` (an epoch), on whichever of `electors` gets it, within 3·I.
async fn next_term(electors: &[&Elector], after: u64) -> pg_elector::Term {
    let found = wait_for(3 * I, || {
        electors
            .iter()
            .any(|e| e.term().epoch().is_some_and(|epoch| epoch > after))
    })
    .await;
    assert!(found.is_some(), "a new term within 3·I");
    electors
        .iter()
        .map(|e| e.term())
        .find(|t| t.epoch().is_some_and(|epoch| epoch > after))
        .expect("the new term")
}

/// One term of `elector`: its `run` from the start until it leads (within `limit`, or a panic
/// that says `leads`), then a shutdown. Returns the term, which the shutdown ended.
async fn one_term(elector: &Elector, limit: Duration, leads: &str) -> pg_elector::Term {
    let shutdown = CancellationToken::new();
    let run = elector.spawn(shutdown.clone());
    let term = tokio::time::timeout(limit, elector.wait_for_leadership())
        .await
        .expect(leads);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(term.end(), Some(TermEnd::Shutdown));
    term
}

/// Every write, oldest first: (replica, epoch, server time).
async fn writes(db: &TestDb) -> Vec<(String, i64, SystemTime)> {
    db.connect()
        .await
        .unwrap()
        .query("SELECT replica, epoch, at FROM writes ORDER BY at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

mod f3 {
    use super::*;

    /// A graceful handover ends the term, then drains its work with the lock still held: a
    /// fenced job cut by the shutdown finishes its fenced writes, and only after the unlock
    /// does its fence fail and the next leader's term begin. (Before, the fence refused as
    /// soon as the term ended: a fenced job failed at its first write after a deploy began.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_draining_terms_fenced_writes_pass_until_the_unlock() {
        let key = LockKey::new(0xf3, 7);
        let (_timing, db) = timing_writes_db().await;
        let a = Replica::run(
            Elector::builder(db.pool(2), key)
                .check_interval(I)
                .identity("a")
                .fencing(true)
                .drain_timeout(10 * I)
                .build()
                .unwrap(),
        );
        wait_a_leads(&a).await;
        let pool = db.pool(4);
        let term = a.elector.term();
        let verdicts: Arc<Mutex<Vec<Result<(), String>>>> = Arc::default();
        let work = tokio::spawn({
            let (elector, pool, verdicts) = (a.elector.clone(), pool.clone(), verdicts.clone());
            async move {
                elector
                    .do_work(|term| async move {
                        for _ in 0..2 {
                            let verdict = fenced_write(&pool, &term, "a").await;
                            verdicts
                                .lock()
                                .unwrap()
                                .push(verdict.map_err(|e| e.to_string()));
                            tokio::time::sleep(2 * I).await;
                        }
                        Ok::<_, ()>(())
                    })
                    .await
            }
        });
        // The first write is done; the second comes after the shutdown began.
        tokio::time::sleep(I).await;
        let b = b_runs(&db, key);
        a.shutdown.cancel();
        let _ = work.await;
        let verdicts = verdicts.lock().unwrap().clone();
        assert_eq!(
            verdicts,
            [Ok(()), Ok(())],
            "both fenced writes of the draining term pass"
        );
        a.task.await.unwrap().unwrap();
        wait_for(3 * I, || b.elector.is_leader())
            .await
            .expect("b leads after a's unlock");
        assert!(
            fenced_write(&pool, &term, "a").await.is_err(),
            "after the unlock, the old term's fence fails"
        );
        b.stop().await.unwrap();
    }

    /// The deposed leader here notices its lost session within milliseconds, so its fence may
    /// refuse on the term's end alone; the next test shows the epoch row refusing a leader that
    /// has not noticed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_leaders_fence_fails_and_the_new_leaders_passes() {
        let key = LockKey::new(0xf3, 1);
        let (_timing, db, a) = a_leads_on_a_writes_db(key).await;
        let b = b_runs(&db, key);
        let pool = db.pool(4);

        // a's tick takes its term, then sleeps before writing; meanwhile its lock session is
        // terminated and b takes over.
        let (old_term, old_epoch) = leaders_own_write(&pool, &a).await;
        terminate_holder(&db, key).await;
        // The next term goes to whichever replica tries first: b, or a itself again.
        let new_term = next_term(&[&a.elector, &b.elector], old_epoch).await;

        let refused = fenced_write(&pool, &old_term, "a")
            .await
            .expect_err("the deposed leader's write is fenced");
        assert_eq!(refused.ours(), Some(old_epoch));
        eprintln!("deposed leader's write: {refused}");
        the_new_leaders_write_passes(&db, &pool, &new_term, old_epoch).await;
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }

    /// The case only the epoch row can catch: the deposed leader has not noticed yet. Its lock
    /// connection goes through a proxy that is then blackholed (a partition), and the server ends
    /// its lock session; another replica takes over and bumps the epoch. The old leader, which
    /// checks every 10·I, still believes it leads (its next check times out at the earliest 10·I
    /// after the partition, its lease lasts 30·I), so its fence passes the local "term ended"
    /// check and is refused by the row alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_deposed_unawares_is_refused_by_the_epoch_row() {
        let (_timing, db) = timing_writes_db().await;
        let key = LockKey::new(0xf3, 8);
        // The application's pool: direct, healthy, shared by both replicas' writes.
        let app = db.pool(4);
        let proxy = shared_server_proxy().await;
        let slow = 10 * I;
        let elector = fenced_elector(db.pool_via(proxy.addr(), 2), key, "a", slow);
        // The epoch table made beforehand, as a migration would: the first term's grant
        // then bumps an existing row (on a loaded machine, a PG 18 run's first term spent
        // longer than 3·I creating the table, and the next try is 10·I later).
        let ddl = elector.fencing_ddl().expect("a fenced elector has a table");
        db.connect()
            .await
            .unwrap()
            .batch_execute(&ddl)
            .await
            .unwrap();
        let a = Replica::run(elector);
        wait_for(3 * I, || a.elector.is_leader())
            .await
            .expect("a leads at its first try");
        let led_at = std::time::Instant::now();
        let b = b_runs(&db, key);
        let (old_term, old_epoch) = leaders_own_write(&app, &a).await;

        proxy.blackhole();
        terminate_holder(&db, key).await;
        // b tries every I; nothing else can take the lock (a's tries would go through the
        // blackholed proxy, and a does not try while it believes it leads).
        let new_term = next_term(&[&b.elector], old_epoch).await;
        let new_epoch = new_term.epoch().unwrap();
        assert!(new_epoch > old_epoch);

        // a's tick goes on as if nothing happened: it still leads, as far as it can tell.
        let believed = a.elector.is_leader() && old_term.is_leader();
        let elapsed = led_at.elapsed();
        let refused = fenced_write(&app, &old_term, "a")
            .await
            .expect_err("the deposed leader's write is fenced");
        assert!(
            believed && old_term.is_leader(),
            "a still believed it led around its fence ({elapsed:?} after it began leading, \
         its first check is due {slow:?} after that): so its local check passed"
        );
        assert!(
            refused.is_superseded(),
            "refused by the epoch row, not by the term's end: {refused}"
        );
        assert_eq!(
            (refused.ours(), refused.current()),
            (Some(old_epoch), Some(new_epoch))
        );
        the_new_leaders_write_passes(&db, &app, &new_term, old_epoch).await;
        eprintln!("old leader, still believing it led: {refused}");

        // The partition heals: a reads its session's end and steps down.
        proxy.pass();
        wait_for(3 * I, || !a.elector.is_leader())
            .await
            .expect("a steps down once its connection closes");
        assert_eq!(term_end(&old_term).await, Some(TermEnd::LeadershipLost));
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }

    /// A fence that finds a later epoch in the row fails as superseded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fence_finding_a_later_epoch_fails_as_superseded() {
        let key = LockKey::new(0xf3, 2);
        let (_timing, db, a) = a_leads_on_a_writes_db(key).await;
        let term = a.elector.term();
        let ours = term.epoch().unwrap();
        // Another term begun behind this replica's back (as the next leader's bump would).
        db.connect()
            .await
            .unwrap()
            .execute(
                "UPDATE pg_elector_epochs SET epoch = epoch + 1 WHERE class = $1 AND object = $2",
                &[&key.class(), &key.object()],
            )
            .await
            .unwrap();
        let pool = db.pool(1);
        let refused = fenced_write(&pool, &term, "a").await.expect_err("fenced");
        assert!(refused.is_superseded(), "{refused}");
        assert_eq!(
            (refused.ours(), refused.current()),
            (Some(ours), Some(ours + 1))
        );
        assert!(writes(&db).await.is_empty());
        a.stop().await.unwrap();
    }

    /// An old leader's open fenced transaction holds the next term until it commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_fenced_transaction_holds_the_next_term() {
        let key = LockKey::new(0xf3, 3);
        let (_timing, db, a) = a_leads_on_a_writes_db(key).await;
        let b = b_runs(&db, key);
        let old_term = a.elector.term();
        let pool = db.pool(4);

        // a's fenced transaction: fence, first write, then it stays open across the takeover.
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        old_term.fence(&tx).await.expect("a's fence passes");
        tx.execute(
            "INSERT INTO writes (replica, epoch) VALUES ('a', $1)",
            &[&(old_term.epoch().unwrap() as i64)],
        )
        .await
        .unwrap();
        terminate_holder(&db, key).await;
        // The next try (b's, or a's own) gets the lock; its bump waits on the row a's transaction
        // holds FOR SHARE, at most I, then gives the lock back and tries again.
        tokio::time::sleep(I + I / 2).await;
        assert!(
            !a.elector.is_leader() && !b.elector.is_leader(),
            "no term begins while a's transaction holds the epoch row"
        );
        tx.execute(
            "INSERT INTO writes (replica, epoch) VALUES ('a', $1)",
            &[&(old_term.epoch().unwrap() as i64)],
        )
        .await
        .unwrap();
        let committed: SystemTime = tx
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
        tx.commit().await.unwrap();
        drop(client);

        // Within 3·I of the commit: a bump still waiting gets the row at once; one that gave up
        // (it waits at most I) is followed by a try within I and a bump that does not wait.
        let new_term = next_term(&[&a.elector, &b.elector], old_term.epoch().unwrap()).await;
        fenced_write(&pool, &new_term, "next").await.unwrap();
        let since = epoch_since(&db.connect().await.unwrap(), key).await;
        assert!(
            since >= committed,
            "b's term began ({since:?}) after a's transaction ended ({committed:?})"
        );
        let rows = writes(&db).await;
        let who: Vec<&str> = rows.iter().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(
            who,
            ["a", "a", "next"],
            "a's writes, then the next term's: never interleaved"
        );
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bump_not_done_within_its_bound_gives_the_lock_back() {
        let _timing = timing();
        let db = fresh_db().await;
        let key = LockKey::new(0xf3, 4);
        let a = a_leads(&db, key).await;
        a.stop().await.unwrap();

        // An abandoned transaction holds the epoch row (as a deposed leader's could).
        let mut holder = db.connect().await.unwrap();
        let tx = holder.transaction().await.unwrap();
        tx.query(
            "SELECT epoch FROM pg_elector_epochs WHERE class = $1 AND object = $2 FOR SHARE",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
        let capture = Capture::default();
        let elector = fenced_elector(db.pool(2), key, "b", I);
        let replica = Replica::run_captured(elector.clone(), &capture);
        // For 5·I: every try gets the lock, waits I for the row, and gives the lock back.
        // Each try that gives the lock back also closes its session, so the next try holds the
        // lock on another backend: a holder that changes shows the lock was given back (the free
        // moment between two tries lasts only milliseconds, too short to sample reliably).
        let admin = db.connect().await.unwrap();
        let mut holders_seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            assert!(!elector.is_leader(), "no term while the row is held");
            holders_seen.extend(holders(&admin, key).await);
            tokio::time::sleep(I / 10).await;
        }
        assert!(
            holders_seen.len() >= 2,
            "the lock was given back between tries: held by {holders_seen:?} over 5·I"
        );
        let gave_back = capture.events("cannot bump the fencing epoch");
        assert!(gave_back.len() >= 2, "each try gave it back: {gave_back:?}");
        assert!(
            gave_back[0].field("error").contains("still open"),
            "{:?}",
            gave_back[0]
        );

        tx.rollback().await.unwrap();
        wait_for(3 * I, || elector.is_leader())
            .await
            .expect("leads within 3·I of the row's release");
        replica.stop().await.unwrap();
    }

    /// Epochs strictly increase over 100 handovers and across server restarts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn epochs_increase_over_100_handovers_and_server_restarts() {
        let _timing = timing();
        let (server, db) = private_server().await;
        let key = LockKey::new(0xf3, 5);
        let fast = Duration::from_millis(20);
        let electors: Vec<Elector> = ["a", "b"]
            .iter()
            .map(|name| fenced_elector(db.pool(2), key, name, fast))
            .collect();
        let mut epochs = Vec::new();
        let mut lead_once = async |elector: &Elector| {
            let term = one_term(elector, Duration::from_secs(5), "leads within 5 s").await;
            epochs.push(term.epoch().expect("an epoch"));
        };
        for round in 0..100 {
            lead_once(&electors[round % 2]).await;
        }
        for mode in [ShutdownMode::Fast, ShutdownMode::Immediate] {
            tokio::task::block_in_place(|| server.restart(mode)).unwrap();
            for round in 0..4 {
                lead_once(&electors[round % 2]).await;
            }
        }
        assert_eq!(epochs.len(), 108);
        assert!(
            epochs.windows(2).all(|w| w[1] > w[0]),
            "epochs strictly increase: {epochs:?}"
        );
        eprintln!("epochs {} .. {}", epochs[0], epochs[epochs.len() - 1]);
    }

    /// The epoch table is created when missing, and a role that may not create it is told the DDL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_table_is_created_or_a_role_that_may_not_is_told_the_ddl() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();

        // Created on the first grant, under a name that needs quoting.
        let table = "Epochs \"ops\"";
        let elector = Elector::builder(db.pool(2), LockKey::new(0xf3, 6))
            .check_interval(I)
            .fencing_table(Some("public"), table)
            .build()
            .unwrap();
        let replica = Replica::run(elector);
        wait_for(3 * I, || replica.elector.is_leader())
            .await
            .expect("leads, having created the table");
        let exists: bool = admin
            .query_one(
                "SELECT to_regclass('public.\"Epochs \"\"ops\"\"\"') IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(exists);
        replica.stop().await.unwrap();

        // A role that may connect but not create tables.
        let role = limited_role(&db, &admin, "limited").await;
        let capture = Capture::default();
        let key = LockKey::new(0xf3, 7);
        let elector = Elector::builder(pool_as(&db, &role, 2), key)
            .check_interval(I)
            .fencing(true)
            .build()
            .unwrap();
        let ddl = elector.fencing_ddl().expect("fencing is on");
        let replica = Replica::run_captured(elector.clone(), &capture);
        tokio::time::sleep(3 * I).await;
        assert!(!elector.is_leader(), "no term without the epoch table");
        let errors = capture.errors(key);
        assert_eq!(errors.len(), 1, "said once, not every try: {errors:?}");
        let said = capture.events("cannot bump the fencing epoch");
        assert!(
            said[0].field("error").contains(&ddl)
                && said[0].field("error").contains("permission denied"),
            "the error names the statement to run: {:?}",
            said[0]
        );

        // An administrator runs it, and grants the role what it needs.
        admin
            .batch_execute(&format!(
                "{ddl}; GRANT SELECT, INSERT, UPDATE ON pg_elector_epochs TO \"{role}\""
            ))
            .await
            .unwrap();
        // The next try (within I) gets the lock and bumps.
        wait_for(2 * I, || elector.is_leader())
            .await
            .expect("leads once the table exists");
        replica.stop().await.unwrap();
        drop_role(&admin, &role).await;
    }

    /// An epoch table in a schema that does not exist is missing, and no role can create it
    /// until the schema is made: an ERROR, once, names the statement to run, as for a role that
    /// may not create the table (it was a WARN, as for a passing failure); once the schema
    /// exists, the table is created and the elector leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_in_a_missing_schema_is_an_error_naming_the_ddl() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        let capture = Capture::default();
        let key = LockKey::new(0xf3, 12);
        let elector = Elector::builder(db.pool(2), key)
            .check_interval(I)
            .fencing_table(Some("ops"), "epochs")
            .build()
            .unwrap();
        let ddl = elector.fencing_ddl().expect("fencing is on");
        let replica = Replica::run_captured(elector.clone(), &capture);
        tokio::time::sleep(3 * I).await;
        assert!(!elector.is_leader(), "no term without the epoch table");
        let errors = capture.errors(key);
        assert_eq!(
            errors.len(),
            1,
            "one ERROR, not a WARN every try: {errors:?}"
        );
        let said = capture.events("cannot bump the fencing epoch");
        assert_eq!(said[0].level, tracing::Level::ERROR, "{:?}", said[0]);
        assert!(
            said[0].field("error").contains(&ddl) && said[0].field("error").contains("\"ops\""),
            "the error names the statement to run and the schema: {:?}",
            said[0]
        );

        admin.batch_execute("CREATE SCHEMA ops").await.unwrap();
        wait_for(2 * I, || elector.is_leader())
            .await
            .expect("leads once the schema exists, having created the table");
        replica.stop().await.unwrap();
    }

    /// A missing table the role cannot create is an ERROR even right after a passing bump
    /// failure: the epoch row held by an open transaction (a WARN), then the table dropped.
    /// The two shared one "once a minute" clock, so the ERROR came at DEBUG for up to a minute.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_table_is_an_error_even_after_a_busy_row_warned() {
        let _timing = timing();
        let db = fresh_db().await;
        let mut admin = db.connect().await.unwrap();
        let role = limited_role(&db, &admin, "limited").await;
        let capture = Capture::default();
        let key = LockKey::new(0xf3, 13);
        let elector = Elector::builder(pool_as(&db, &role, 2), key)
            .check_interval(I)
            .fencing(true)
            .build()
            .unwrap();
        let ddl = elector.fencing_ddl().expect("fencing is on");
        admin
            .batch_execute(&format!(
                "{ddl}; GRANT SELECT, INSERT, UPDATE ON pg_elector_epochs TO \"{role}\"; \
                 INSERT INTO pg_elector_epochs VALUES ({}, {}, 1, 'old', now())",
                key.class(),
                key.object()
            ))
            .await
            .unwrap();
        // An old term's fenced transaction, left open on the row.
        let tx = admin.transaction().await.unwrap();
        tx.batch_execute(&format!(
            "SELECT * FROM pg_elector_epochs WHERE class = {} AND object = {} FOR UPDATE",
            key.class(),
            key.object()
        ))
        .await
        .unwrap();
        let replica = Replica::run_captured(elector.clone(), &capture);
        capture
            .logged("cannot bump the fencing epoch", 4 * I)
            .await
            .expect("the busy row is said");
        let busy = capture.events("cannot bump the fencing epoch");
        assert_eq!(busy[0].level, tracing::Level::WARN, "{:?}", busy[0]);
        assert!(
            busy[0].field("error").contains("stayed locked"),
            "{:?}",
            busy[0]
        );

        // The table goes, in the same transaction; the role may not create it again.
        tx.batch_execute("DROP TABLE pg_elector_epochs")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let said = wait_for(4 * I, || !capture.errors(key).is_empty()).await;
        let errors = capture.errors(key);
        assert!(
            said.is_some(),
            "an ERROR names the missing table, not a DEBUG line: {:?}",
            capture
                .events("cannot bump the fencing epoch")
                .iter()
                .map(|e| (e.level, e.field("error").to_owned()))
                .collect::<Vec<_>>()
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(!elector.is_leader());
        replica.stop().await.unwrap();
        drop_role(&admin, &role).await;
    }

    /// What the role of the application's pool (the one that runs fenced writes) needs on the
    /// epoch table: `SELECT` and `UPDATE`, because the fence reads the row `FOR SHARE`, which
    /// PostgreSQL allows only to a role that may update it; nothing more (no `INSERT`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_role_fences_with_select_and_update_on_the_table() {
        let key = LockKey::new(0xf3, 9);
        let (_timing, db, a) = a_leads_on_a_writes_db(key).await;
        let term = a.elector.term();
        let admin = db.connect().await.unwrap();
        let role = format!("writer_{}", db.name());
        admin
            .batch_execute(&format!(
                "CREATE ROLE \"{role}\" LOGIN; GRANT INSERT ON writes TO \"{role}\"; \
             GRANT SELECT ON pg_elector_epochs TO \"{role}\""
            ))
            .await
            .unwrap();
        let app = pool_as(&db, &role, 1);

        let refused = fenced_write(&app, &term, "a")
            .await
            .expect_err("SELECT alone does not allow FOR SHARE");
        assert!(
            refused.is_query_error() && refused.to_string().contains("permission denied"),
            "{refused}"
        );
        admin
            .batch_execute(&format!("GRANT UPDATE ON pg_elector_epochs TO \"{role}\""))
            .await
            .unwrap();
        fenced_write(&app, &term, "a")
            .await
            .expect("SELECT and UPDATE are enough");
        assert_eq!(writes(&db).await.len(), 1);
        drop(app);
        a.stop().await.unwrap();
        drop_role(&admin, &role).await;
    }

    /// Local electors hand out increasing epochs, and fence on the term alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local_electors_give_increasing_epochs_and_fence_on_the_term() {
        let db = fresh_db().await;
        let (elector, control) = Elector::manual();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let term = control.promote();
            seen.push(term.epoch().expect("a manual term has an epoch"));
            control.demote();
        }
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");

        let term = control.promote();
        let mut client = db.connect().await.unwrap();
        let tx = client.transaction().await.unwrap();
        term.fence(&tx).await.expect("a live local term passes");
        control.demote();
        let refused = term.fence(&tx).await.expect_err("an ended term is fenced");
        assert!(!refused.is_superseded());
        drop(tx);

        assert_eq!(elector.term().epoch(), None, "a standby's term has none");

        // An always-leader elector: each `run` after a shutdown leads in a new term.
        let always = Elector::always_leader();
        let mut epochs = Vec::new();
        for _ in 0..3 {
            let term = one_term(
                &always,
                Duration::from_secs(1),
                "an always-leader leads while its run runs",
            )
            .await;
            epochs.push(term.epoch().expect("an always-leader term has an epoch"));
        }
        assert!(epochs.windows(2).all(|w| w[1] > w[0]), "{epochs:?}");
    }
}
