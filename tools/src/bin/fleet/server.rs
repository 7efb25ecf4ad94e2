//! The private server: its settings, restarts, connections, and its CPU from /proc.

use std::sync::Arc;

use pg_elector_testkit::PgServer;
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_tools::Mode;
use pg_elector_tools::procfs::postmaster_pid;
pub(crate) use pg_elector_tools::procfs::server_ticks;

use crate::APP;
use crate::snapshot::Plan;

// ---------------------------------------------------------------------------------------------
// The server.

pub(crate) struct Server {
    pub(crate) pg: Arc<PgServer>,
    pub(crate) postmaster: i32,
    pub(crate) max_connections: usize,
    pub(crate) statements: bool,
}

impl Server {
    pub(crate) async fn start(statements: bool, max_connections: usize, extra: &[String]) -> Self {
        let pg = Arc::new(
            tokio::task::spawn_blocking(PgServer::spawn)
                .await
                .expect("spawn the server")
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let mut server = Server {
            pg,
            postmaster: 0,
            max_connections: 0,
            statements: false,
        };
        let admin = connect(server.pg.config()).await;
        let mut settings = vec![format!("max_connections = {max_connections}")];
        settings.extend(extra.iter().map(|s| {
            let (name, value) = s.split_once('=').expect("name=value");
            format!("{} = '{}'", name.trim(), value.trim().replace('\'', "''"))
        }));
        if statements {
            // The library must exist, or the server would not start again.
            let lib: Option<String> = admin
                .query_opt(
                    "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'",
                    &[],
                )
                .await
                .ok()
                .flatten()
                .map(|r| r.get(0));
            match lib {
                Some(dir)
                    if std::path::Path::new(&dir)
                        .join("pg_stat_statements.so")
                        .exists() =>
                {
                    settings.push("shared_preload_libraries = 'pg_stat_statements'".into());
                    server.statements = true;
                }
                _ => eprintln!("fleet: pg_stat_statements is not installed: no tries per second"),
            }
        }
        for setting in &settings {
            admin
                .batch_execute(&format!("ALTER SYSTEM SET {setting}"))
                .await
                .expect("ALTER SYSTEM");
        }
        drop(admin);
        server.restart(max_connections).await;
        server
    }

    pub(crate) async fn restart(&mut self, max_connections: usize) {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.restart(ShutdownMode::Fast))
            .await
            .expect("restart the server")
            .unwrap_or_else(|e| panic!("{e}"));
        self.postmaster = postmaster_pid(self.pg.data_dir().expect("a private server"))
            .expect("a pid in postmaster.pid");
        let admin = connect(self.pg.config()).await;
        if self.statements {
            // Known to the server only once the library is loaded; a reload applies it.
            admin
                .batch_execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
                .await
                .expect("pg_stat_statements.track_planning");
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .expect("pg_stat_statements.track_planning");
        }
        let row = admin
            .query_one("SHOW max_connections", &[])
            .await
            .expect("max_connections");
        let shown: String = row.get(0);
        self.max_connections = shown.parse().expect("a number");
        assert_eq!(
            self.max_connections, max_connections,
            "max_connections after the restart"
        );
    }

    /// Sets `max_connections` to `need` (a restart) when it differs. Not just raised: reading
    /// `pg_locks`, as the leader's check does, costs time in proportion to it, so each run
    /// gets the server it needs rather than the largest run's.
    pub(crate) async fn ensure(&mut self, need: usize) {
        if need == self.max_connections {
            return;
        }
        let admin = connect(self.pg.config()).await;
        admin
            .batch_execute(&format!("ALTER SYSTEM SET max_connections = {need}"))
            .await
            .expect("ALTER SYSTEM");
        drop(admin);
        self.restart(need).await;
    }
}

pub(crate) async fn connect(mut config: tokio_postgres::Config) -> tokio_postgres::Client {
    config.application_name(APP);
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("a bench connection");
    tokio::spawn(connection);
    client
}

/// What a run needs of `max_connections`.
pub(crate) fn connections_needed(plan: &Plan, pool: usize) -> usize {
    let waiting = if plan.mode == Mode::Fast {
        plan.electors
    } else {
        0
    };
    let need = plan.procs() * pool + plan.keys() + waiting + 20;
    (need + need / 5).max(300)
}
