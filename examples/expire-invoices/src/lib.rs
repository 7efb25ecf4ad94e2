//! A small service in the shape of a user's crate: every few milliseconds, on the leader only,
//! send the invoices that fell due, each exactly once. "Sending" is a row in `outbox` (what a
//! mailer would read), written in the same fenced transaction that marks the invoice sent, so
//! that a deposed leader's late transaction cannot send it again.
//!
//! `tests/faults.rs` runs three replicas of it under each fault of `pg-elector-testkit`.

use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::Elector;
use pg_elector::Term;
use pg_elector::background::{LeaderTicker, Supervisor};
use tokio_util::sync::CancellationToken;

/// The tables the service needs.
pub const SCHEMA: &str = "
    CREATE TABLE invoices (
        id bigint PRIMARY KEY,
        due_at timestamptz NOT NULL,
        sent boolean NOT NULL DEFAULT false
    );
    CREATE TABLE outbox (
        invoice_id bigint NOT NULL,
        epoch bigint NOT NULL,
        queued_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );";

/// How many invoices one tick sends at most.
pub const BATCH: i64 = 10;

/// Sends up to [`BATCH`] invoices that fell due, in one transaction fenced by `term`; returns
/// how many. A leader deposed while this runs gets an error and sends nothing.
pub async fn expire_invoices(
    term: &Term,
    pool: &Pool,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    term.fence(&tx).await?;
    let epoch = term.epoch().map(|e| e as i64);
    let sent = tx
        .execute(
            "WITH due AS (
                 UPDATE invoices SET sent = true
                 WHERE id IN (SELECT id FROM invoices WHERE NOT sent AND due_at <= now()
                              ORDER BY id LIMIT $1)
                 RETURNING id)
             INSERT INTO outbox (invoice_id, epoch) SELECT id, $2 FROM due",
            &[&BATCH, &epoch],
        )
        .await?;
    // The mailer's work takes a while: a fault often lands in the middle of it.
    tx.execute("SELECT pg_sleep(0.02)", &[]).await?;
    tx.commit().await?;
    Ok(sent)
}

/// The service as `main` runs it: the election and the sweep, every `every`, until `shutdown`.
pub async fn serve(elector: Elector, pool: Pool, shutdown: CancellationToken, every: Duration) {
    let sweep = LeaderTicker::new("expire-invoices", &elector, every);
    Supervisor::new()
        .election(&elector)
        .ticker(sweep, move |term| {
            let pool = pool.clone();
            async move { expire_invoices(&term, &pool).await.map(|_| ()) }
        })
        .run(shutdown)
        .await;
}
