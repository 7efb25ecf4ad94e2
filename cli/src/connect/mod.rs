//! The database connection of every command: a pool from `--url` or `DATABASE_URL`, checked
//! once before anything else so that a wrong address is a clear failure, not a quiet retry.

mod binding;
mod params;
mod stream;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use deadpool_postgres::tokio_postgres::Config;
use deadpool_postgres::tokio_postgres::config::{Host, SslMode};

use crate::exit::{self, Failure};
use stream::MakeTls;

/// How long the first connection of `run` and `cron` may take before they give up.
pub(crate) const FIRST_ANSWER: Duration = Duration::from_secs(10);

/// The size of the election's pool: a standby borrows one for one short query every check
/// interval, and the leader's lock session leaves the pool when granted.
const ELECTION_POOL: usize = 2;

/// The size of a schedule's pool: its claims, records and, while a synchronous standby is
/// slow, up to six heartbeats of a running run at once.
const SCHEDULE_POOL: usize = 8;

/// A pool for `url`, its server answering within `bound`.
pub(crate) async fn pool(url: Option<&str>, bound: Duration) -> Result<Pool, Failure> {
    let url = url.ok_or_else(|| {
        Failure::new(
            exit::BAD_URL,
            "no database given: pass --url or set DATABASE_URL",
        )
    })?;
    let pool = pool_of(url, ELECTION_POOL)?;
    let answered = tokio::time::timeout(bound, async {
        let client = pool.get().await.map_err(unwrapped)?;
        client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(|e| with_causes(&e))
    });
    match answered.await {
        Ok(Ok(())) => Ok(pool),
        Ok(Err(e)) => Err(Failure::new(
            exit::UNREACHABLE,
            format!("cannot reach the database: {e}"),
        )),
        Err(_) => Err(Failure::new(
            exit::UNREACHABLE,
            format!("cannot reach the database: no answer within {bound:?}"),
        )),
    }
}

/// A second pool for `url` (already checked by [`pool`]), for a schedule: larger than the
/// election's, same settings.
pub(crate) fn schedule_pool(url: &str) -> Result<Pool, Failure> {
    pool_of(url, SCHEDULE_POOL)
}

/// A pool of `size` for `url`, with TLS as its libpq settings say. Connections are made when
/// first borrowed and recycled with deadpool's `Fast` method, with no pool timeouts of its own
/// (the elector bounds every borrow by its check interval), as the library's `pool_from_url`.
fn pool_of(url: &str, size: usize) -> Result<Pool, Failure> {
    use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
    let bad_url = |e: String| Failure::new(exit::BAD_URL, e);
    let split = params::split(url).map_err(bad_url)?;
    let mut config: Config =
        (split.rest.parse()).map_err(|e| bad_url(format!("the database URL: {e}")))?;
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let plan = tls::plan(&split.tls, home.as_deref(), &|file| file.exists()).map_err(bad_url)?;
    let tls = tls::Tls::new(plan).map_err(bad_url)?;
    settle(&mut config, tls.wire()).map_err(bad_url)?;
    let recycling_method = RecyclingMethod::Fast;
    let tls = MakeTls(Arc::new(tls));
    let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method });
    (Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build())
    .map_err(|e| Failure::new(exit::INTERNAL, e.to_string()))
}

/// What tokio-postgres is told of TLS: `wire`, except for Unix sockets alone (which libpq
/// connects without TLS whatever `sslmode` says; a socket host with a `hostaddr` is a TCP
/// connection, and keeps `wire`); and a `hostaddr` without a `host` as the host, so that TLS
/// has a name to check (tokio-postgres refuses TLS without one).
fn settle(config: &mut Config, wire: SslMode) -> Result<(), String> {
    // Every sslmode was taken out of the URL: one that tokio-postgres still read is one the
    // split missed, and setting the plan's over it would weaken what the URL asked.
    if config.get_ssl_mode() != SslMode::Prefer {
        return Err("the database URL: an sslmode where pg-elector cannot read it".to_owned());
    }
    if config.get_hosts().is_empty() {
        for address in config.get_hostaddrs().to_vec() {
            config.host(address.to_string());
        }
    }
    let hosts = config.get_hosts();
    let sockets_only = config.get_hostaddrs().is_empty()
        && !hosts.is_empty()
        && hosts.iter().all(|h| matches!(h, Host::Unix(_)));
    config.ssl_mode(if sockets_only { SslMode::Disable } else { wire });
    Ok(())
}

/// A pool's error without deadpool's "Error occurred while creating a new object" in front,
/// with its causes: tokio-postgres' own text is only its kind ("db error", "error performing
/// TLS handshake"), the server's message or rustls' reason is its source.
fn unwrapped(e: deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => with_causes(&e),
        other => other.to_string(),
    }
}

/// `e: its source: its source's source…`
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(e) = cause {
        text = format!("{text}: {e}");
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled(url: &str) -> Result<Config, String> {
        let split = params::split(url)?;
        let mut config: Config = split.rest.parse().map_err(|e| format!("{e}"))?;
        let plan = tls::plan(&split.tls, None, &|_| false)?;
        settle(&mut config, plan.wire)?;
        Ok(config)
    }

    #[test]
    fn a_hostaddr_alone_names_the_host_and_sockets_go_without_tls() {
        let by_address = settled("hostaddr=127.0.0.1 user=u sslmode=require").unwrap();
        assert_eq!(by_address.get_hosts(), [Host::Tcp("127.0.0.1".into())]);
        assert_eq!(by_address.get_ssl_mode(), SslMode::Require);
        let socket = settled("host=/var/run/postgresql user=u sslmode=require").unwrap();
        assert_eq!(socket.get_ssl_mode(), SslMode::Disable);
        let tcp = "host=/var/run/postgresql hostaddr=10.0.0.5 user=u sslmode=require";
        assert_eq!(
            settled(tcp).unwrap().get_ssl_mode(),
            SslMode::Require,
            "TCP after all"
        );
        let full = settled("postgres://u@db/app?sslmode=verify-full&sslrootcert=/ca").unwrap();
        assert_eq!(full.get_ssl_mode(), SslMode::Require);
        assert_eq!(
            settled("postgres://u@db/app").unwrap().get_ssl_mode(),
            SslMode::Prefer
        );
    }

    #[test]
    fn an_sslmode_the_split_missed_is_refused_not_weakened() {
        let mut config: Config = "host=db sslmode=require".parse().unwrap();
        let plan = tls::plan(&Default::default(), None, &|_| false).unwrap();
        let refused = settle(&mut config, plan.wire).unwrap_err();
        assert!(refused.contains("sslmode"), "{refused}");
    }
}
