//! [`TestDb`]: one throwaway database per test, and pool helpers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::{KitError, PgServer, runtime};

/// How many names to try when a database with the generated name exists
/// (a leftover from an earlier process with the same pid).
const NAME_ATTEMPTS: usize = 20;

impl PgServer {
    /// Creates a fresh, empty database with a unique name
    /// (`pg_elector_t_<pid>_<n>`), so tests sharing one server are isolated:
    /// advisory locks, `pg_stat_database` and `pg_stat_activity.datname` are
    /// per database. The database is dropped when the [`TestDb`] is.
    ///
    /// Needs a tokio runtime (it spawns the admin connection's task).
    pub async fn create_database(&self) -> Result<TestDb, KitError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let admin = self.config();
        let client =
            connect_config(&admin, "connecting to the server to create a database").await?;
        let pid = std::process::id();
        let strategy = copy_strategy(&client).await?;
        for _ in 0..NAME_ATTEMPTS {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("pg_elector_t_{pid}_{n}");
            let sql = format!(
                "CREATE DATABASE {} TEMPLATE template0{strategy}",
                quote_ident(&name)
            );
            match client.batch_execute(&sql).await {
                Ok(()) => {
                    tracing::debug!(database = %name, "created test database");
                    let mut config = admin.clone();
                    config.dbname(&name);
                    return Ok(TestDb {
                        name,
                        config,
                        admin,
                        server: self.addr(),
                    });
                }
                Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => continue,
                Err(e) => {
                    return Err(KitError::pg(format!("creating database {name}"), e));
                }
            }
        }
        Err(KitError::Server(format!(
            "could not find a free database name after {NAME_ATTEMPTS} tries"
        )))
    }
}

/// How `CREATE DATABASE` copies the template, as a clause: by copying its files
/// (`STRATEGY FILE_COPY`, PostgreSQL 15 and later) rather than block by block through the WAL
/// (15's default), which costs several times the CPU for a template as small as `template0`;
/// nothing before 15, which has no such clause and copies files anyway.
async fn copy_strategy(client: &tokio_postgres::Client) -> Result<&'static str, KitError> {
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(|e| KitError::pg("reading the server's version", e))?
        .get(0);
    Ok(if version >= 150_000 {
        " STRATEGY FILE_COPY"
    } else {
        ""
    })
}

/// One database on a [`PgServer`], created by
/// [`PgServer::create_database`].
///
/// Dropping it drops the database (`DROP DATABASE ... WITH (FORCE)`, which
/// also ends its sessions). The drop is best effort, never panics, needs no
/// runtime, and blocks the dropping thread for at most a few seconds (it runs
/// on a short-lived thread of its own). A `TestDb` does not keep the server
/// alive: drop it before dropping a spawned [`PgServer`], or the drop just
/// fails quietly.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    config: tokio_postgres::Config,
    admin: tokio_postgres::Config,
    server: SocketAddr,
}

impl TestDb {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's address (what a [`FaultProxy`](crate::FaultProxy) in front of it
    /// forwards to).
    pub fn server_addr(&self) -> SocketAddr {
        self.server
    }

    /// Connection settings for this database, straight to the server.
    pub fn config(&self) -> tokio_postgres::Config {
        self.config.clone()
    }

    /// The same settings, but connecting to `addr` instead (e.g. a
    /// [`FaultProxy`](crate::FaultProxy) in front of the server).
    pub fn config_via(&self, addr: SocketAddr) -> tokio_postgres::Config {
        config_with_addr(&self.config, addr)
    }

    /// A `postgres://` URL for this database, straight to the server. Built
    /// from the settings (host, port, user, password, database); other URL
    /// parameters of an external server are not carried over.
    pub fn url(&self) -> String {
        config_url(&self.config)
    }

    /// A pool of direct connections (tokio runtime, fast recycling).
    pub fn pool(&self, max_size: usize) -> Pool {
        pool_from_config(self.config(), max_size)
    }

    /// A pool whose connections go to `addr` (e.g. a
    /// [`FaultProxy`](crate::FaultProxy)).
    pub fn pool_via(&self, addr: SocketAddr, max_size: usize) -> Pool {
        pool_from_config(self.config_via(addr), max_size)
    }

    /// A direct client; its connection task is spawned on the current tokio
    /// runtime (errors are logged at debug level).
    pub async fn connect(&self) -> Result<tokio_postgres::Client, KitError> {
        connect_config(
            &self.config,
            &format!("connecting to database {}", self.name),
        )
        .await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(&name)
        );
        let result = runtime::block_on_thread(
            async move {
                let (client, conn) = admin.connect(NoTls).await?;
                let conn = tokio::spawn(conn);
                let r = client.batch_execute(&sql).await;
                drop(client);
                let _ = conn.await;
                r
            },
            Duration::from_secs(10),
        );
        match result {
            Some(Ok(())) => tracing::debug!(database = %self.name, "dropped test database"),
            Some(Err(e)) => {
                tracing::debug!(database = %self.name, error = %e, "could not drop test database");
            }
            None => tracing::debug!(database = %self.name, "dropping test database timed out"),
        }
    }
}

/// A deadpool pool for `config`: `Runtime::Tokio1`, `RecyclingMethod::Fast`,
/// no TLS, and deadpool's default timeouts (none: `get()` waits for a free
/// connection; creating one is bounded by the config's connect timeout).
pub fn pool_from_config(config: tokio_postgres::Config, max_size: usize) -> Pool {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .build()
        .expect("a pool with a runtime and no timeouts always builds")
}

/// Connects and spawns the connection task on the current runtime.
pub(crate) async fn connect_config(
    config: &tokio_postgres::Config,
    context: &str,
) -> Result<tokio_postgres::Client, KitError> {
    let (client, conn) = config
        .connect(NoTls)
        .await
        .map_err(|e| KitError::pg(context, e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "test connection ended with an error");
        }
    });
    Ok(client)
}

/// `base` with its host and port replaced by `addr`. (`tokio_postgres::Config`
/// can add hosts but not remove them, so this copies every other setting.)
pub fn config_with_addr(base: &tokio_postgres::Config, addr: SocketAddr) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    if let Some(user) = base.get_user() {
        c.user(user);
    }
    if let Some(password) = base.get_password() {
        c.password(password);
    }
    if let Some(dbname) = base.get_dbname() {
        c.dbname(dbname);
    }
    if let Some(options) = base.get_options() {
        c.options(options);
    }
    if let Some(name) = base.get_application_name() {
        c.application_name(name);
    }
    if let Some(t) = base.get_connect_timeout() {
        c.connect_timeout(*t);
    }
    if let Some(t) = base.get_tcp_user_timeout() {
        c.tcp_user_timeout(*t);
    }
    if let Some(i) = base.get_keepalives_interval() {
        c.keepalives_interval(i);
    }
    if let Some(r) = base.get_keepalives_retries() {
        c.keepalives_retries(r);
    }
    c.ssl_mode(base.get_ssl_mode())
        .keepalives(base.get_keepalives())
        .keepalives_idle(base.get_keepalives_idle())
        .target_session_attrs(base.get_target_session_attrs())
        .channel_binding(base.get_channel_binding())
        .host(addr.ip().to_string())
        .port(addr.port());
    c
}

/// A `postgres://` URL for the first TCP host of `config`.
fn config_url(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hostaddrs()
        .first()
        .map(|ip| match ip {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            std::net::IpAddr::V4(v4) => v4.to_string(),
        })
        .or_else(|| {
            config.get_hosts().iter().find_map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) if name.contains(':') => {
                    Some(format!("[{name}]"))
                }
                tokio_postgres::config::Host::Tcp(name) => Some(name.clone()),
                #[allow(unreachable_patterns)]
                _ => None,
            })
        })
        .unwrap_or_else(|| "localhost".to_owned());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut url = String::from("postgres://");
    if let Some(user) = config.get_user() {
        url.push_str(&percent_encode(user.as_bytes()));
        if let Some(password) = config.get_password() {
            url.push(':');
            url.push_str(&percent_encode(password));
        }
        url.push('@');
    }
    url.push_str(&format!("{host}:{port}/"));
    if let Some(db) = config.get_dbname() {
        url.push_str(&percent_encode(db.as_bytes()));
    }
    url
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Quotes an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_with_addr_replaces_host_and_keeps_the_rest() {
        let base: tokio_postgres::Config =
            "postgres://u%40x:p%3Aw@db.example:6543/mydb?connect_timeout=7&application_name=t"
                .parse()
                .unwrap();
        let c = config_with_addr(&base, "127.0.0.1:4000".parse().unwrap());
        assert_eq!(
            c.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("127.0.0.1".into())]
        );
        assert_eq!(c.get_ports(), &[4000]);
        assert_eq!(c.get_user(), Some("u@x"));
        assert_eq!(c.get_password(), Some(&b"p:w"[..]));
        assert_eq!(c.get_dbname(), Some("mydb"));
        assert_eq!(c.get_application_name(), Some("t"));
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(7)));
        let url = config_url(&c);
        assert_eq!(url, "postgres://u%40x:p%3Aw@127.0.0.1:4000/mydb");
        let back: tokio_postgres::Config = url.parse().unwrap();
        assert_eq!(back.get_user(), Some("u@x"));
        assert_eq!(back.get_password(), Some(&b"p:w"[..]));
    }
}
