//! The database connection of every command: a pool from `--url` or `DATABASE_URL`, checked
//! once before anything else so that a wrong address is a clear failure, not a quiet retry.

mod params;
mod stream;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use deadpool_postgres::tokio_postgres::Config;

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
    config.ssl_mode(plan.wire);
    let tls = MakeTls(Arc::new(tls::client_config(&plan).map_err(bad_url)?));
    let recycling_method = RecyclingMethod::Fast;
    let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method });
    (Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build())
    .map_err(|e| Failure::new(exit::INTERNAL, e.to_string()))
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
