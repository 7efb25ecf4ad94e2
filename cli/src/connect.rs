//! The database connection of every command: a pool from `--url` or `DATABASE_URL`, checked
//! once before anything else so that a wrong address is a clear failure, not a quiet retry.

use std::time::Duration;

use deadpool_postgres::Pool;

use crate::exit::{self, Failure};

/// How long the first connection of `run` and `cron` may take before they give up.
pub(crate) const FIRST_ANSWER: Duration = Duration::from_secs(10);

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
    refuse_tls(url)?;
    let pool = pg_elector::pool_from_url(url)
        .map_err(|e| Failure::new(exit::BAD_URL, format!("the database URL: {e}")))?;
    let answered = tokio::time::timeout(bound, async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        client
            .simple_query("SELECT 1")
            .await
            .map(drop)
            .map_err(|e| e.to_string())
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

/// A URL that requires TLS (`sslmode=require`) is refused with its reason: the command line
/// connects without TLS for now, and the connection would fail as if the server were down.
fn refuse_tls(url: &str) -> Result<(), Failure> {
    use deadpool_postgres::tokio_postgres::config::{Config, SslMode};
    match url.parse::<Config>() {
        Ok(config) if config.get_ssl_mode() == SslMode::Require => Err(Failure::new(
            exit::BAD_URL,
            "the database URL asks for TLS (sslmode=require), which pg-elector does not speak \
             yet: use sslmode=prefer or disable, or the library with a TLS connector",
        )),
        _ => Ok(()),
    }
}

/// A second pool for `url` (already checked by [`pool`]), for a schedule: larger than the
/// election's, same settings.
pub(crate) fn schedule_pool(url: &str) -> Result<Pool, Failure> {
    use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};
    let config: deadpool_postgres::tokio_postgres::Config = url
        .parse()
        .map_err(|e| Failure::new(exit::BAD_URL, format!("the database URL: {e}")))?;
    let manager = Manager::from_config(
        config,
        deadpool_postgres::tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(SCHEDULE_POOL)
        .build()
        .map_err(|e| Failure::new(exit::INTERNAL, e.to_string()))
}
