//! [`FencedWrites`]: a table of writes stamped with their term's epoch, and the check that
//! writes of two terms never interleaved.

use std::time::SystemTime;

use pg_elector::{Fenced, Term};

use crate::KitError;

const TABLE: &str = "pg_elector_testkit_writes";

/// A table where each leader-gated write leaves one row with its term's epoch, stamped by the
/// server's clock inside the write's transaction, and the check that the writes of two terms
/// never interleaved: once a write of a later term is in, no write of an earlier term follows.
///
/// Put [`record`](Self::record) in the same transaction as the write it stands for, as its
/// last statement before the commit: the row commits or rolls back with the write.
///
/// ```no_run
/// # async fn demo(db: &pg_elector_testkit::TestDb, term: pg_elector::Term) -> Result<(), Box<dyn std::error::Error>> {
/// use pg_elector_testkit::FencedWrites;
///
/// let admin = db.connect().await?;
/// FencedWrites::create(&admin).await?;
/// // ... in the leader's work:
/// let mut client = db.pool(1).get().await?;
/// let tx = client.transaction().await?;
/// // ... the work's own statements ...
/// FencedWrites::record(&tx, &term, "sent invoice 7").await?;
/// tx.commit().await?;
/// // ... at the end of the test:
/// FencedWrites::read(&admin).await?.assert_not_interleaved();
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct FencedWrites {
    /// Every write, in the order the server's clock stamped them.
    pub writes: Vec<Write>,
}

/// One recorded write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Its term's epoch.
    pub epoch: i64,
    /// What the work said it wrote.
    pub what: String,
    /// When, by the server's clock (`clock_timestamp()` in the write's transaction).
    pub at: SystemTime,
}

/// A write of an earlier term that came after a write of a later one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interleaving {
    /// The later term's write that came first.
    pub later: Write,
    /// The earlier term's write that followed it.
    pub earlier: Write,
}

impl FencedWrites {
    /// The table's name.
    pub const TABLE: &'static str = TABLE;

    /// Creates the table (once per database; again is a no-op).
    ///
    /// # Errors
    ///
    /// [`KitError::Postgres`] when the statement fails.
    pub async fn create(client: &tokio_postgres::Client) -> Result<(), KitError> {
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {TABLE} (\
                   seq bigserial PRIMARY KEY, epoch bigint NOT NULL, what text NOT NULL, \
                   at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ))
            .await
            .map_err(|e| KitError::pg(format!("creating {TABLE}"), e))
    }

    /// Fences `tx` with `term` (see `Term::fence`), then records one write of the term.
    ///
    /// # Errors
    ///
    /// [`RecordError::Fenced`] when the term may no longer write (roll back: dropping `tx`
    /// does); [`RecordError::Postgres`] when the insert fails.
    pub async fn record(
        tx: &tokio_postgres::Transaction<'_>,
        term: &Term,
        what: &str,
    ) -> Result<(), RecordError> {
        term.fence(tx).await.map_err(RecordError::Fenced)?;
        let epoch = term.epoch().map(|e| e as i64).ok_or(RecordError::NoEpoch)?;
        tx.execute(
            &format!("INSERT INTO {TABLE} (epoch, what) VALUES ($1, $2)"),
            &[&epoch, &what],
        )
        .await
        .map_err(RecordError::Postgres)?;
        Ok(())
    }

    /// Every write recorded so far.
    ///
    /// # Errors
    ///
    /// [`KitError::Postgres`] when the query fails (the table is missing, say).
    pub async fn read(client: &tokio_postgres::Client) -> Result<Self, KitError> {
        Self::query(
            client,
            &format!("SELECT epoch, what, at FROM {TABLE} ORDER BY at, seq"),
        )
        .await
    }

    /// The writes of the service's own table, from `sql`: a query whose rows are (epoch
    /// `bigint`, what `text`, at `timestamptz`), each row a write of the term of that epoch
    /// stamped by the server's clock inside the write's transaction. The rows are put in order
    /// of `at` (ties keep the query's order).
    ///
    /// ```no_run
    /// # async fn demo(admin: &tokio_postgres::Client) -> Result<(), pg_elector_testkit::KitError> {
    /// use pg_elector_testkit::FencedWrites;
    /// let sends = FencedWrites::query(
    ///     admin,
    ///     "SELECT epoch, invoice_id::text, queued_at FROM outbox ORDER BY queued_at",
    /// )
    /// .await?;
    /// sends.assert_not_interleaved();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`KitError::Postgres`] when the query fails or its columns are not of those types.
    pub async fn query(client: &tokio_postgres::Client, sql: &str) -> Result<Self, KitError> {
        let rows = client
            .query(sql, &[])
            .await
            .map_err(|e| KitError::pg(format!("reading the writes ({sql})"), e))?;
        let mut writes = Vec::with_capacity(rows.len());
        for row in &rows {
            let column = |e| KitError::pg(format!("reading the writes ({sql})"), e);
            writes.push(Write {
                epoch: row.try_get(0).map_err(column)?,
                what: row.try_get(1).map_err(column)?,
                at: row.try_get(2).map_err(column)?,
            });
        }
        writes.sort_by_key(|w| w.at);
        Ok(Self { writes })
    }

    /// Every write of an earlier term that came after a write of a later term (empty when the
    /// terms never interleaved).
    pub fn interleavings(&self) -> Vec<Interleaving> {
        let mut found = Vec::new();
        let mut latest: Option<&Write> = None;
        for write in &self.writes {
            match latest {
                Some(later) if write.epoch < later.epoch => found.push(Interleaving {
                    later: later.clone(),
                    earlier: write.clone(),
                }),
                Some(later) if write.epoch == later.epoch => {}
                _ => latest = Some(write),
            }
        }
        found
    }

    /// Panics when the writes of two terms interleaved (see
    /// [`interleavings`](Self::interleavings)), saying, for each write of an earlier term that
    /// came after one of a later term, both writes and when they were stamped (from the first
    /// write).
    ///
    /// ```no_run
    /// # async fn demo(admin: &tokio_postgres::Client) -> Result<(), pg_elector_testkit::KitError> {
    /// use pg_elector_testkit::FencedWrites;
    /// FencedWrites::read(admin).await?.assert_not_interleaved();
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn assert_not_interleaved(&self) {
        let found = self.interleavings();
        if found.is_empty() {
            return;
        }
        let first = self.writes.first().map_or(SystemTime::UNIX_EPOCH, |w| w.at);
        let since = |w: &Write| w.at.duration_since(first).unwrap_or_default();
        let mut message = format!(
            "writes of two terms interleaved, {} time(s) in {} writes:",
            found.len(),
            self.writes.len()
        );
        for i in &found {
            message.push_str(&format!(
                "\n  epoch {}'s write {:?} came {:?} after epoch {}'s write {:?} (at {:?} and \
                 {:?} from the first write)",
                i.earlier.epoch,
                i.earlier.what,
                since(&i.earlier).saturating_sub(since(&i.later)),
                i.later.epoch,
                i.later.what,
                since(&i.earlier),
                since(&i.later)
            ));
        }
        panic!("{message}");
    }

    /// The epochs of the terms that wrote, in the order they first wrote.
    pub fn terms(&self) -> Vec<i64> {
        let mut terms: Vec<i64> = Vec::new();
        for write in &self.writes {
            if !terms.contains(&write.epoch) {
                terms.push(write.epoch);
            }
        }
        terms
    }
}

/// Why [`FencedWrites::record`] did not record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The term may no longer write: another term has begun, or this one ended.
    #[error(transparent)]
    Fenced(Fenced),
    /// The elector has no fencing, so the term has no epoch (build it with `.fencing(true)`).
    #[error("the term has no epoch: build the elector with .fencing(true)")]
    NoEpoch,
    /// The insert failed.
    #[error("recording the write: {0}")]
    Postgres(tokio_postgres::Error),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn write(epoch: i64, what: &str, after_ms: u64) -> Write {
        Write {
            epoch,
            what: what.to_owned(),
            at: SystemTime::UNIX_EPOCH
                + Duration::from_secs(1_800_000_000)
                + Duration::from_millis(after_ms),
        }
    }

    #[test]
    fn terms_one_after_another_pass() {
        let writes = FencedWrites {
            writes: vec![write(1, "a", 0), write(1, "b", 5), write(2, "c", 10)],
        };
        writes.assert_not_interleaved();
    }

    #[test]
    #[should_panic(
        expected = "writes of two terms interleaved, 1 time(s) in 3 writes:\n  \
                               epoch 1's write \"c\" came 15ms after epoch 2's write \"b\" \
                               (at 25ms and 10ms from the first write)"
    )]
    fn an_earlier_terms_late_write_says_which_and_when() {
        let writes = FencedWrites {
            writes: vec![write(1, "a", 0), write(2, "b", 10), write(1, "c", 25)],
        };
        writes.assert_not_interleaved();
    }
}
