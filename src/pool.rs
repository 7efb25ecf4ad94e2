//! The small pool the election needs, from a URL: what every service's `main` would build the
//! same way.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::{BuildError, Error};

/// How many connections [`pool_from_url`]'s pool holds: a standby borrows one for one short
/// query every check interval, and the leader's lock session leaves the pool when granted.
const SIZE: usize = 2;

/// A pool of two connections to the database at `url`, without TLS: the election's own pool,
/// the size the operations guide recommends. `url` is what tokio-postgres reads, a URL
/// (`postgres://app@db:5432/app`, several hosts too) or a key-value string (`host=db
/// user=app`). Connections are made when first borrowed (so an unreachable server shows in
/// the election's log, and the election tries again every interval), recycled with
/// deadpool's `Fast` method, with no pool timeouts of its own (the elector bounds every
/// borrow by its check interval).
///
/// Build the pool yourself for TLS, for timeouts, or to share one with the application.
///
/// ```no_run
/// # fn example() -> Result<(), pg_elector::Error> {
/// use pg_elector::{Elector, LockKey};
///
/// let pool = pg_elector::pool_from_url("postgres://app@db:5432/app")?;
/// let elector = Elector::builder(pool, LockKey::from_name("billing/sweep")).build()?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`BuildError::InvalidUrl`](crate::BuildError::InvalidUrl) when tokio-postgres cannot read `url`.
pub fn pool_from_url(url: &str) -> Result<Pool, Error> {
    let config: tokio_postgres::Config = url.parse().map_err(BuildError::InvalidUrl)?;
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(SIZE)
        .runtime(Runtime::Tokio1)
        .build();
    // A build fails only for timeouts without a runtime; this one has a runtime and no
    // timeouts.
    Ok(pool.expect("a pool with a runtime and no timeouts always builds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_url_gives_a_pool_of_two_and_a_bad_one_a_typed_error() {
        let pool = pool_from_url("postgres://app@localhost:5432/app").expect("a valid URL");
        assert_eq!(pool.status().max_size, SIZE);
        let pool = pool_from_url("host=localhost user=app").expect("a key-value string");
        assert_eq!(pool.status().max_size, SIZE);
        let bad = pool_from_url("postgres://app@localhost:5432/app?nosuchoption=1");
        assert!(
            matches!(bad, Err(Error::Build(BuildError::InvalidUrl(_)))),
            "{bad:?}"
        );
        let text = pool_from_url("postgres://app:secret@localhost/app?sslmode=bogus")
            .expect_err("a bad sslmode")
            .to_string();
        assert!(text.starts_with("invalid database URL"), "{text}");
        assert!(!text.contains("secret"), "the password stays out: {text}");
    }
}
