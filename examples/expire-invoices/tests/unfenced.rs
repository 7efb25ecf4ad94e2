//! What the checks of `tests/faults.rs` are for: the same sweep written the usual wrong way
//! (read the due invoices, mail them, then record them sent, in separate statements and without
//! `term.fence`) sends invoices twice when its leader is deposed in the middle of a sweep, while
//! the election itself never has two leaders. The election moved on within milliseconds; the
//! old leader's sweep did not look at its term and finished its sends anyway.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use expire_invoices::{BATCH, SCHEMA};
use pg_elector::background::{LeaderTicker, Supervisor};
use pg_elector::{LockKey, Term};
use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::{FencedWrites, PgServer, Replicas, TestDb, Who};
use tokio::sync::watch;

const INVOICES: i64 = 100;
const TICK: Duration = Duration::from_millis(50);
/// How long the mailer takes between reading the due invoices and recording them sent: far
/// longer than a fast takeover and the next leader's first tick, so a leader deposed at the
/// start of a sweep is still mailing when its successor reads the same invoices.
const MAILER: Duration = Duration::from_millis(500);

/// How many sweeps have started, on any replica: the fault lands right after a start it saw.
type Starts = Arc<watch::Sender<u32>>;

/// The wrong way: no fence, and the read and the write in separate statements.
async fn expire_invoices_unfenced(
    term: &Term,
    pool: &Pool,
    starts: &Starts,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = pool.get().await?;
    let due: Vec<i64> = client
        .query(
            "SELECT id FROM invoices WHERE NOT sent AND due_at <= now() ORDER BY id LIMIT $1",
            &[&BATCH],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if due.is_empty() {
        return Ok(());
    }
    starts.send_modify(|n| *n += 1);
    tokio::time::sleep(MAILER).await;
    let epoch = term.epoch().map(|e| e as i64);
    for id in &due {
        client
            .execute(
                "INSERT INTO outbox (invoice_id, epoch) VALUES ($1, $2)",
                &[id, &epoch],
            )
            .await?;
        client
            .execute("UPDATE invoices SET sent = true WHERE id = $1", &[id])
            .await?;
    }
    Ok(())
}

async fn invoices_db(server: &PgServer) -> TestDb {
    let db = server.create_database().await.expect("a test database");
    let client = db.connect().await.unwrap();
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .execute(
            "INSERT INTO invoices (id, due_at) SELECT n, now() FROM generate_series(1, $1::bigint) n",
            &[&INVOICES],
        )
        .await
        .unwrap();
    db
}

#[tokio::test]
async fn an_unfenced_sweep_sends_twice_and_the_checks_say_so() {
    let _timing = timing();
    let db = invoices_db(PgServer::shared().unwrap()).await;
    let starts: Starts = Arc::new(watch::Sender::new(0));
    let service_starts = starts.clone();
    let replicas = Replicas::builder(&db, LockKey::new(7, 3))
        .count(3)
        .fast_takeover(true)
        .configure(|_, elector| elector.fencing(true))
        .service(move |replica| {
            let starts = service_starts.clone();
            let (pool, elector) = (replica.pool, replica.elector);
            let sweep = LeaderTicker::new("expire-invoices-unfenced", &elector, TICK);
            Supervisor::new()
                .election(&elector)
                .ticker(sweep, move |term| {
                    let (pool, starts) = (pool.clone(), starts.clone());
                    async move { expire_invoices_unfenced(&term, &pool, &starts).await }
                })
                .run(replica.shutdown)
        })
        .start()
        .await
        .unwrap();
    replicas
        .wait_for_leader(Duration::from_secs(5))
        .await
        .unwrap();
    let mut started = starts.subscribe();
    started.borrow_and_update();
    started.changed().await.unwrap();
    // Just after the leader read its batch: it mails for MAILER, deposed meanwhile.
    replicas.kill_session(Who::Leader).await.unwrap();
    let next = replicas
        .wait_for_next_term(Duration::from_secs(1))
        .await
        .unwrap();
    println!(
        "replica {} leads {:?} after the kill",
        next.replica, next.took
    );
    tokio::time::sleep(3 * MAILER).await;
    let seen = replicas.finish().await;

    let client = db.connect().await.unwrap();
    let twice: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT invoice_id FROM outbox GROUP BY 1 HAVING count(*) > 1) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let sends = FencedWrites::query(
        &client,
        "SELECT epoch, invoice_id::text, queued_at FROM outbox ORDER BY queued_at",
    )
    .await
    .unwrap();
    println!(
        "two leaders at once: {:?}; invoices sent twice: {twice}; terms that sent: {:?}",
        seen.overlaps(),
        sends.terms()
    );
    // The election never had two leaders.
    seen.assert_no_two_leaders();
    // The deposed term's sends land before its successor's here (they both mail for MAILER),
    // so they do not interleave: the duplicates are what shows the missing fence.
    assert!(
        twice > 0,
        "the deposed leader's batch was sent again by its successor: {:?}",
        sends.terms()
    );
}
