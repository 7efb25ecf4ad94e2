//! What the tests of this crate (`faults`, `frozen`) share: the invoices they give the service,
//! and how they look at what it sent.

use std::time::Duration;

use expire_invoices::SCHEMA;
use pg_elector_testkit::FencedWrites;
use tokio_postgres::Client;

/// How many invoices a test gives the service.
pub const INVOICES: i64 = 150;

/// Creates the service's tables, and [`INVOICES`] invoices falling due one every `spacing`
/// from now.
pub async fn add_invoices(client: &Client, spacing: Duration) {
    client.batch_execute(SCHEMA).await.unwrap();
    client
        .execute(
            "INSERT INTO invoices (id, due_at) \
             SELECT n, now() + n * $2::bigint * interval '1 ms' \
             FROM generate_series(1, $1::bigint) n",
            &[&INVOICES, &(spacing.as_millis() as i64)],
        )
        .await
        .unwrap();
}

/// How many invoices are not sent yet, looked at up to `polls` times, 50 ms apart, until none
/// is left.
pub async fn unsent_after_polling(client: &Client, polls: u32) -> i64 {
    let mut left = i64::MAX;
    for _ in 0..polls {
        left = client
            .query_one("SELECT count(*) FROM invoices WHERE NOT sent", &[])
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    left
}

/// The invoices in `outbox` more than once.
pub async fn sent_twice(client: &Client) -> Vec<i64> {
    let rows = client
        .query(
            "SELECT invoice_id FROM outbox GROUP BY 1 HAVING count(*) > 1",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}

/// The sends in `outbox`, as fenced writes, having checked that no deposed leader's send
/// came after a later leader's.
pub async fn sends_not_interleaved(client: &Client) -> FencedWrites {
    let sends = FencedWrites::query(
        client,
        "SELECT epoch, invoice_id::text, queued_at FROM outbox ORDER BY queued_at",
    )
    .await
    .unwrap();
    assert!(
        sends.interleavings().is_empty(),
        "{:?}",
        sends.interleavings()
    );
    sends
}
