//! A primary with a streaming standby, and the two ways replicas follow a database failover:
//! a multi-host connection string with `target_session_attrs=read-write`, or one address that
//! moves (a fault proxy re-pointed, as a virtual IP or a DNS name would be).

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use pg_elector_harness::{FaultProxy, PgServer, ShutdownMode, TestDb, pool_from_config};
use tokio_postgres::config::TargetSessionAttrs;

use super::init_tracing;

/// How the replicas find the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// `host=primary,standby target_session_attrs=read-write`.
    MultiHost,
    /// One address (a proxy) that the failover re-points at the promoted standby.
    MovingAddress,
}

/// A primary, a hot standby streaming from it through a proxy (`wal`: blackhole it and the
/// standby is cut off from the primary's WAL), and, for [`Follow::MovingAddress`], the
/// address the replicas connect to (`front`).
pub struct Cluster {
    pub primary: Arc<PgServer>,
    pub standby: Arc<PgServer>,
    /// The test database on the primary (and, copied, on the standby).
    pub db: TestDb,
    pub wal: FaultProxy,
    pub front: Option<FaultProxy>,
    pub follow: Follow,
}

impl Cluster {
    /// A private primary with a fresh database, then a standby copied from it; with
    /// `synchronous`, commits on the primary wait until the standby has flushed them.
    pub async fn start(follow: Follow, synchronous: bool) -> Cluster {
        init_tracing();
        let primary = Arc::new(blocking(PgServer::spawn).await);
        let db = primary.create_database().await.unwrap();
        let wal = FaultProxy::start(primary.addr()).await.unwrap();
        let standby = Arc::new(
            blocking({
                let (primary, upstream) = (primary.clone(), wal.addr());
                move || primary.spawn_standby_via(upstream)
            })
            .await,
        );
        if synchronous {
            blocking({
                let primary = primary.clone();
                move || primary.set_synchronous_standby(true)
            })
            .await;
        }
        let front = match follow {
            Follow::MultiHost => None,
            Follow::MovingAddress => Some(FaultProxy::start(primary.addr()).await.unwrap()),
        };
        Cluster {
            primary,
            standby,
            db,
            wal,
            front,
            follow,
        }
    }

    /// What the replicas connect with.
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

    /// Settings for the test database on the standby, straight to it.
    pub fn on_standby(&self) -> tokio_postgres::Config {
        self.db.config_via(self.standby.addr())
    }

    /// Stops the primary (`Immediate`: a crash; `Fast`: a planned switchover).
    pub async fn stop_primary(&self, mode: ShutdownMode) {
        let primary = self.primary.clone();
        blocking(move || primary.stop(mode)).await;
    }

    /// Re-points the moving address at the standby (nothing with a multi-host URL).
    pub fn point_at_standby(&self) {
        if let Some(front) = &self.front {
            front.retarget(self.standby.addr());
        }
    }

    /// Promotes the standby and points the moving address at it; returns the first instant
    /// a connection made as the replicas make theirs reached a server that accepts writes.
    pub async fn promote(&self) -> Instant {
        let config = self.config();
        let prober = tokio::spawn(async move { first_writable(config).await });
        self.point_at_standby();
        let standby = self.standby.clone();
        blocking(move || standby.promote()).await;
        tokio::time::timeout(Duration::from_secs(30), prober)
            .await
            .expect("the promoted standby accepts writes within 30 s")
            .unwrap()
    }

    /// Makes the old primary a standby of the promoted one (on its own port again).
    pub async fn rejoin_old_primary(&self) {
        let (old, new) = (self.primary.clone(), self.standby.clone());
        blocking(move || old.rejoin_as_standby_of(&new)).await;
    }
}

/// The first instant a connection made with `config` reaches a server out of recovery,
/// tried every 5 ms.
async fn first_writable(config: tokio_postgres::Config) -> Instant {
    loop {
        if let Ok(Ok((client, connection))) = tokio::time::timeout(
            Duration::from_secs(1),
            config.connect(tokio_postgres::NoTls),
        )
        .await
        {
            tokio::spawn(connection);
            if let Ok(row) = client
                .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
                .await
            {
                if !row.get::<_, bool>(0) {
                    return Instant::now();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs a blocking harness call on a blocking thread; panics with its error.
async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"))
}
