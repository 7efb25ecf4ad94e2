//! [`Cluster`]: a private primary with a streaming standby, for database-failover tests, and
//! the two ways clients follow a failover ([`Follow`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio_postgres::config::TargetSessionAttrs;

use crate::database::pool_from_config;
use crate::server::ShutdownMode;
use crate::{FaultProxy, KitError, PgServer, TestDb};

/// How long a promoted standby may take to accept writes, as clients see it.
const WRITABLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How clients find the primary across a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Follow {
    /// A multi-host connection string, the primary first:
    /// `host=primary,standby target_session_attrs=read-write`.
    MultiHost,
    /// One address (a [`FaultProxy`]) that the failover re-points at the promoted standby,
    /// as a virtual IP or a DNS name would be.
    MovingAddress,
}

/// A private primary, a test database on it, and a hot standby streaming from it through a
/// proxy ([`wal`](Self::wal): blackhole it and the standby is cut off from the primary's WAL
/// while both run).
///
/// Clients connect with [`config`](Self::config) or [`pool`](Self::pool), which follow the
/// failover as [`Follow`] says. [`stop_primary`](Self::stop_primary) crashes or stops the
/// primary, [`promote`](Self::promote) promotes the standby, and
/// [`rejoin_old_primary`](Self::rejoin_old_primary) makes the old primary a standby of the
/// new one. Both servers are removed when the cluster is dropped.
#[derive(Debug)]
pub struct Cluster {
    /// The primary: the one the cluster starts with, the promoted one after each
    /// [`fail_over`](Self::fail_over).
    pub primary: Arc<PgServer>,
    /// The standby, promoted by [`promote`](Self::promote) (and then, after
    /// [`fail_over`](Self::fail_over), the old primary streaming from it).
    pub standby: Arc<PgServer>,
    /// The test database, made on the primary before the standby was copied from it.
    pub db: TestDb,
    /// The standby's link to the primary's WAL.
    pub wal: FaultProxy,
    /// The address clients connect to, with [`Follow::MovingAddress`].
    pub front: Option<FaultProxy>,
    /// How clients follow the failover.
    pub follow: Follow,
    /// Whether commits on the primary wait for the standby.
    synchronous: bool,
}

impl Cluster {
    /// A private primary with a fresh database, then a standby copied from it; with
    /// `synchronous`, commits on the primary wait until the standby has flushed them (set
    /// after the copy, so that the promoted standby does not wait for a standby of its own).
    /// Needs a tokio runtime; the blocking steps run on its blocking threads.
    pub async fn start(follow: Follow, synchronous: bool) -> Result<Cluster, KitError> {
        let primary = Arc::new(blocking(PgServer::spawn).await?);
        let db = primary.create_database().await?;
        let wal = FaultProxy::start(primary.addr())
            .await
            .map_err(|e| KitError::io("starting the WAL proxy", e))?;
        let standby = Arc::new(
            blocking({
                let (primary, upstream) = (primary.clone(), wal.addr());
                move || primary.spawn_standby_via(upstream)
            })
            .await?,
        );
        if synchronous {
            let primary = primary.clone();
            blocking(move || primary.set_synchronous_standby(true)).await?;
        }
        let front = match follow {
            Follow::MultiHost => None,
            Follow::MovingAddress => Some(
                FaultProxy::start(primary.addr())
                    .await
                    .map_err(|e| KitError::io("starting the moving address", e))?,
            ),
        };
        Ok(Cluster {
            primary,
            standby,
            db,
            wal,
            front,
            follow,
            synchronous,
        })
    }

    /// What clients connect with: the moving address, or both servers with
    /// `target_session_attrs=read-write`.
    pub fn config(&self) -> tokio_postgres::Config {
        match &self.front {
            Some(front) => self.db.config_via(front.addr()),
            None => {
                let mut config = self.db.config_via(self.primary.addr());
                config
                    .host("127.0.0.1")
                    .port(self.standby.addr().port())
                    .target_session_attrs(TargetSessionAttrs::ReadWrite);
                config
            }
        }
    }

    /// A pool of `size` connections made with [`config`](Self::config).
    pub fn pool(&self, size: usize) -> Pool {
        pool_from_config(self.config(), size)
    }

    /// Whether commits on the primary wait for the standby (as [`start`](Self::start) was
    /// asked).
    pub fn is_synchronous(&self) -> bool {
        self.synchronous
    }

    /// Settings for the test database on the standby, straight to it.
    pub fn on_standby(&self) -> tokio_postgres::Config {
        self.db.config_via(self.standby.addr())
    }

    /// Stops the primary: `Immediate` is a crash, `Fast` a planned switchover.
    pub async fn stop_primary(&self, mode: ShutdownMode) -> Result<(), KitError> {
        let primary = self.primary.clone();
        blocking(move || primary.stop(mode)).await
    }

    /// Re-points the moving address at the standby (nothing with a multi-host URL).
    pub fn point_at_standby(&self) {
        if let Some(front) = &self.front {
            front.retarget(self.standby.addr());
        }
    }

    /// Promotes the standby and points the moving address at it; returns the first instant
    /// a connection made with [`config`](Self::config) reached a server that accepts writes
    /// (tried every 5 ms from before the promotion).
    pub async fn promote(&self) -> Result<Instant, KitError> {
        let mut prober = tokio::spawn(first_writable(self.config()));
        self.point_at_standby();
        let standby = self.standby.clone();
        if let Err(e) = blocking(move || standby.promote()).await {
            prober.abort();
            return Err(e);
        }
        match tokio::time::timeout(WRITABLE_TIMEOUT, &mut prober).await {
            Ok(Ok(at)) => Ok(at),
            _ => {
                prober.abort();
                Err(KitError::Server(format!(
                    "the promoted standby on {} took no write connection within {}s",
                    self.standby.addr(),
                    WRITABLE_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Makes the old primary a standby of the promoted one, on its own port again (see
    /// [`PgServer::rejoin_as_standby_of`]).
    pub async fn rejoin_old_primary(&self) -> Result<(), KitError> {
        let (old, new) = (self.primary.clone(), self.standby.clone());
        blocking(move || old.rejoin_as_standby_of(&new)).await
    }

    /// One whole failover, which can be repeated: stops the primary (`Immediate` is a crash,
    /// `Fast` a switchover), promotes the standby, swaps [`primary`](Self::primary) and
    /// [`standby`](Self::standby), and makes the old primary a standby of the promoted one,
    /// streaming through [`wal`](Self::wal) (re-pointed at the new primary, its faults
    /// cleared), so that the cluster is as [`start`](Self::start) left it, with the roles
    /// exchanged. A synchronous cluster is asynchronous from the promotion until the old
    /// primary runs as a standby again (the promoted server has no standby to wait for
    /// meanwhile), then synchronous again: commits may wait a moment until it streams.
    ///
    /// Clients made with [`config`](Self::config) before the call keep following: a
    /// multi-host string names both servers, and the moving address is re-pointed. Returns
    /// the first instant such a connection reached the promoted server out of recovery.
    ///
    /// # Errors
    ///
    /// A step that failed (the promotion, the copy, the old primary's start). The cluster is
    /// then left part-way (after a failed copy, [`standby`](Self::standby) has no data dir):
    /// drop it.
    pub async fn fail_over(&mut self, mode: ShutdownMode) -> Result<Instant, KitError> {
        self.stop_primary(mode).await?;
        let writable = self.promote().await?;
        self.rejoin_after_promotion().await?;
        Ok(writable)
    }

    /// The end of a failover begun with [`stop_primary`](Self::stop_primary) and
    /// [`promote`](Self::promote), for a caller that acts between the steps (re-points
    /// addresses of its own, reads the promoted server): what [`fail_over`](Self::fail_over)
    /// does after the promotion. Swaps [`primary`](Self::primary) and
    /// [`standby`](Self::standby) and makes the old primary a standby of the promoted one
    /// through [`wal`](Self::wal); synchronous again if the cluster was.
    ///
    /// # Errors
    ///
    /// As [`fail_over`](Self::fail_over): the copy or the old primary's start failed.
    pub async fn rejoin_after_promotion(&mut self) -> Result<(), KitError> {
        std::mem::swap(&mut self.primary, &mut self.standby);
        self.wal.retarget(self.primary.addr());
        self.wal.pass();
        self.wal.delay(Duration::ZERO);
        self.wal.stop_rewriting();
        let (old, new, via) = (self.standby.clone(), self.primary.clone(), self.wal.addr());
        blocking(move || old.rejoin_as_standby_via(&new, via)).await?;
        if self.synchronous {
            let primary = self.primary.clone();
            blocking(move || primary.set_synchronous_standby(true)).await?;
        }
        Ok(())
    }
}

/// The first instant a connection made with `config` reaches a server out of recovery,
/// tried every 5 ms.
async fn first_writable(config: tokio_postgres::Config) -> Instant {
    loop {
        let connected = tokio::time::timeout(
            Duration::from_secs(1),
            config.connect(tokio_postgres::NoTls),
        );
        if let Ok(Ok((client, connection))) = connected.await {
            tokio::spawn(connection);
            let recovery = client
                .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
                .await;
            if recovery.is_ok_and(|row| !row.get::<_, bool>(0)) {
                return Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs a blocking harness call on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KitError> + Send + 'static,
) -> Result<T, KitError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| KitError::Server(format!("a blocking harness call failed: {e}")))?
}
