//! The soak's PostgreSQL: one server, or with `--cluster` a primary and a streaming standby
//! that the `failover` fault swaps. What the rest of the soak needs of it: the current
//! primary (for restarts), the cluster (for a failover), the checker's settings (which follow
//! the primary), and the database's URL and name.

use std::net::SocketAddr;
use std::sync::Arc;

use pg_elector_testkit::server::failover::{Cluster, Follow};
use pg_elector_testkit::{PgServer, TestDb};
use tokio_postgres::config::TargetSessionAttrs;

use crate::options::{Options, Replication};

/// One server and its database, or a cluster (which holds its own).
#[derive(Debug)]
enum Topology {
    One {
        server: Arc<PgServer>,
        /// Dropped with the soak (the database is dropped then).
        _db: TestDb,
    },
    Cluster(tokio::sync::Mutex<Cluster>),
}

/// The soak's servers.
#[derive(Debug)]
pub(crate) struct Servers {
    topology: Topology,
    /// The soak's own connections (the checker's): straight to the server, or to both
    /// servers with `target_session_attrs=read-write`, so that they reach the primary.
    pub(crate) checker: tokio_postgres::Config,
    /// The soak database's URL (user and database name; the replicas connect to their own
    /// addresses).
    pub(crate) url: String,
    /// The soak database's name.
    pub(crate) db_name: String,
    /// The servers' addresses: the primary's first (at the start; both keep their ports
    /// across failovers).
    pub(crate) addrs: Vec<SocketAddr>,
    /// Whether the servers are the harness's own (restarts and failovers need that).
    pub(crate) private: bool,
}

impl Servers {
    /// One server (`DATABASE_URL`'s, or a private one) with a fresh database, or with
    /// `--cluster` a private primary and standby.
    pub(crate) async fn start(options: &Options) -> Result<Servers, String> {
        match options.cluster {
            None => Self::one().await,
            Some(replication) => Self::primary_and_standby(replication).await,
        }
    }

    async fn one() -> Result<Servers, String> {
        let server = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => {
                tokio::task::spawn_blocking(move || PgServer::external(url.trim())).await
            }
            _ => tokio::task::spawn_blocking(PgServer::spawn).await,
        }
        .map_err(|e| format!("starting the server: {e}"))?
        .map_err(|e| e.to_string())?;
        let server = Arc::new(server);
        let db = server.create_database().await.map_err(|e| e.to_string())?;
        Ok(Servers {
            checker: db.config(),
            url: db.url(),
            db_name: db.name().to_owned(),
            addrs: vec![server.addr()],
            private: server.is_private(),
            topology: Topology::One { server, _db: db },
        })
    }

    async fn primary_and_standby(replication: Replication) -> Result<Servers, String> {
        // The soak routes the replicas itself (proxies per slot); the cluster's own config is
        // the multi-host one, which the checker uses.
        let cluster = Cluster::start(Follow::MultiHost, replication == Replication::Sync)
            .await
            .map_err(|e| e.to_string())?;
        let mut checker = cluster.config();
        checker.target_session_attrs(TargetSessionAttrs::ReadWrite);
        Ok(Servers {
            checker,
            url: cluster.db.url(),
            db_name: cluster.db.name().to_owned(),
            addrs: vec![cluster.primary.addr(), cluster.standby.addr()],
            private: true,
            topology: Topology::Cluster(tokio::sync::Mutex::new(cluster)),
        })
    }

    /// The server that takes writes now.
    pub(crate) async fn primary(&self) -> Arc<PgServer> {
        match &self.topology {
            Topology::One { server, .. } => server.clone(),
            Topology::Cluster(cluster) => cluster.lock().await.primary.clone(),
        }
    }

    /// The cluster, with `--cluster`.
    pub(crate) fn cluster(&self) -> Option<&tokio::sync::Mutex<Cluster>> {
        match &self.topology {
            Topology::One { .. } => None,
            Topology::Cluster(cluster) => Some(cluster),
        }
    }
}
