//! [`PgServer`]: a PostgreSQL server for tests, private or external.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::config::Host;

use crate::private_server::{PrivateServer, TlsFiles};
use crate::{KitError, runtime};

/// The connect timeout put on every configuration the harness hands out.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a server is shut down (`pg_ctl -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShutdownMode {
    /// Wait for every client to disconnect (can hang while a pool holds connections).
    Smart,
    /// Disconnect clients, roll back their transactions, shut down cleanly.
    Fast,
    /// Kill every server process at once, without a shutdown checkpoint; the
    /// next start runs crash recovery (like a crash of the server).
    Immediate,
}

impl ShutdownMode {
    /// The name `pg_ctl -m` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            ShutdownMode::Smart => "smart",
            ShutdownMode::Fast => "fast",
            ShutdownMode::Immediate => "immediate",
        }
    }
}

/// A running PostgreSQL for tests: spawned privately from the machine's
/// binaries, or external via `DATABASE_URL`.
///
/// A private server listens on `127.0.0.1` on a free port, trusts every
/// connection (user `postgres`, no password), has durability turned off
/// (`fsync`, `synchronous_commit`, `full_page_writes`), `max_connections =
/// 300`, `wal_level = replica`, and logs (with `log_connections`) to
/// `server.log` next to its data dir. It is stopped and its files are removed
/// when the value is dropped, and also — through a small watchdog process —
/// when the test process exits or is killed.
#[derive(Debug)]
pub struct PgServer {
    /// Connection settings for the maintenance database.
    config: tokio_postgres::Config,
    addr: SocketAddr,
    url: String,
    private: Option<PrivateServer>,
}

impl PgServer {
    /// The process-wide shared server, started on first use.
    ///
    /// Thread-safe, and works from any tokio runtime or none (the first call
    /// blocks while the server starts, typically one to three seconds).
    /// Uses `DATABASE_URL` when it is set and not empty (the server is checked
    /// with one connection), else spawns a private server. A failure is
    /// cached: later calls return the same error.
    ///
    /// The shared server is never dropped; a private one is stopped and its
    /// files removed by a watchdog process when the test process exits. Give
    /// each test its own database with [`create_database`](Self::create_database),
    /// and use [`spawn`](Self::spawn) for tests that stop or restart the server.
    pub fn shared() -> Result<&'static PgServer, KitError> {
        static SHARED: OnceLock<Result<PgServer, KitError>> = OnceLock::new();
        SHARED
            .get_or_init(|| match std::env::var("DATABASE_URL") {
                Ok(url) if !url.trim().is_empty() => PgServer::external(url.trim()),
                _ => PgServer::spawn(),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Spawns a new private server from the machine's binaries (see
    /// [the crate docs](crate#what-it-needs-on-the-machine) for where they are looked for).
    ///
    /// Blocking: it runs `initdb` and `pg_ctl start` and waits until the
    /// server accepts connections (at most about 30 s). It may be called from
    /// inside an async test, but blocks that runtime's thread meanwhile. When
    /// running as root, the server runs as the `postgres` user.
    pub fn spawn() -> Result<PgServer, KitError> {
        PrivateServer::spawn().map(PgServer::from_private)
    }

    /// Wraps a private server this process started.
    pub(crate) fn from_private(private: PrivateServer) -> PgServer {
        let port = private.port();
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(CONNECT_TIMEOUT);
        PgServer {
            config,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            private: Some(private),
        }
    }

    /// Uses an existing server given by a connection string (URL or
    /// `key=value` form). Checks that one connection succeeds.
    pub fn external(url: &str) -> Result<PgServer, KitError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            KitError::Config(format!(
                "DATABASE_URL is not a valid connection string: {e}"
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let addr = resolve_addr(&config)?;
        let check = config.clone();
        let result = runtime::block_on_thread(
            async move {
                let (client, conn) = check.connect(tokio_postgres::NoTls).await?;
                let conn = tokio::spawn(conn);
                let r = client.simple_query("SELECT 1").await.map(|_| ());
                drop(client);
                let _ = conn.await;
                r
            },
            CONNECT_TIMEOUT + Duration::from_secs(5),
        );
        let describe = || {
            format!(
                "cannot use the server in DATABASE_URL ({addr}, user {:?}, database {:?})",
                config.get_user().unwrap_or_default(),
                config.get_dbname().unwrap_or_default()
            )
        };
        match result {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(KitError::pg(describe(), e)),
            None => return Err(KitError::Config(format!("{}: timed out", describe()))),
        }
        Ok(PgServer {
            config,
            addr,
            url: url.to_owned(),
            private: None,
        })
    }

    /// Connection settings for the server's maintenance database (`postgres`
    /// for a private server, the URL's for an external one), with a 5 s
    /// connect timeout. Use [`create_database`](Self::create_database) for
    /// test data.
    pub fn config(&self) -> tokio_postgres::Config {
        self.config.clone()
    }

    /// The server's TCP address (for putting a [`FaultProxy`](crate::FaultProxy) in front).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `postgres://` URL for the maintenance database (for an external
    /// server, `DATABASE_URL` as given, which may contain a password).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Whether the harness spawned this server (and so can stop and restart it).
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }

    pub(crate) fn private(&self) -> Result<&PrivateServer, KitError> {
        self.private.as_ref().ok_or(KitError::NotPrivate)
    }

    /// `pg_ctl restart -m <mode>`: same port and data; returns once the
    /// server accepts connections again. Blocking. Every connection is cut.
    /// Avoid on the shared server: other tests use it.
    pub fn restart(&self, mode: ShutdownMode) -> Result<(), KitError> {
        self.private()?.restart(mode)
    }

    /// Turns TLS on (private server only; [`KitError::NotPrivate`] otherwise), for tests of a
    /// client that speaks it: makes a test CA and certificates with the `openssl` command
    /// (install it with `apt-get install openssl`; what they are is in [`TlsFiles`]), sets
    /// `ssl = on` with the server's certificate and key and the CA as `ssl_ca_file` (so `cert`
    /// lines of `pg_hba.conf` accept the client certificate), puts the `hba` lines (e.g.
    /// `"hostssl all tls_client 127.0.0.1/32 cert"`) at the top of `pg_hba.conf`, before the
    /// `trust` lines, then restarts the server (`pg_ctl restart -m fast`: every connection is
    /// cut) and returns once it accepts connections again. Blocking.
    ///
    /// Plain connections still work unless `hba` refuses them, and the harness needs one:
    /// it checks the server is up as `postgres` on 127.0.0.1 without TLS, so leave that open.
    /// TLS stays on across [`restart`](Self::restart) and [`stop`](Self::stop) +
    /// [`start_again`](Self::start_again). Calling it again makes new certificates and adds
    /// `hba` on top of the earlier lines.
    pub fn enable_tls(&self, hba: &[&str]) -> Result<TlsFiles, KitError> {
        self.private()?.enable_tls(hba)
    }

    /// `pg_ctl stop -m <mode>` (waits until the server is down, at most
    /// 30 s; with [`ShutdownMode::Smart`] that means until every client has
    /// gone). Blocking. Bring it back with [`start_again`](Self::start_again).
    pub fn stop(&self, mode: ShutdownMode) -> Result<(), KitError> {
        self.private()?.stop(mode)
    }

    /// Starts a stopped server again on the same port; returns once it
    /// accepts connections. Blocking.
    pub fn start_again(&self) -> Result<(), KitError> {
        self.private()?.start_again()
    }

    /// The directory of `initdb`, `postgres` and `pg_ctl` (private server only).
    pub fn bin_dir(&self) -> Option<&Path> {
        self.private.as_ref().map(PrivateServer::bin_dir)
    }

    /// The data directory (private server only).
    pub fn data_dir(&self) -> Option<&Path> {
        self.private.as_ref().map(PrivateServer::data_dir)
    }

    /// The server log file (private server only).
    pub fn log_file(&self) -> Option<&Path> {
        self.private.as_ref().map(PrivateServer::log_file)
    }

    /// The last `lines` lines of the server log (private server only; empty
    /// otherwise). Handy in assertion messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.private
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }
}

/// The first TCP address of a configuration (`hostaddr` first, then the
/// first TCP host), resolved.
fn resolve_addr(config: &tokio_postgres::Config) -> Result<SocketAddr, KitError> {
    let ports = config.get_ports();
    let port_at = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    if let Some(ip) = config.get_hostaddrs().first() {
        return Ok(SocketAddr::new(*ip, port_at(0)));
    }
    let (index, host) = config
        .get_hosts()
        .iter()
        .enumerate()
        .find_map(|(i, h)| match h {
            Host::Tcp(name) => Some((i, name.clone())),
            #[allow(unreachable_patterns)]
            _ => None,
        })
        .ok_or_else(|| {
            KitError::Config(
                "DATABASE_URL must name a TCP host (the harness needs a TCP address, \
                 e.g. for fault-injection proxies)"
                    .into(),
            )
        })?;
    let port = port_at(index);
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| KitError::io(format!("resolving {host}:{port} from DATABASE_URL"), e))?
        .next()
        .ok_or_else(|| KitError::Config(format!("{host}:{port} resolves to no address")))
}
