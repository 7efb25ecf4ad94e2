//! The child: one replica process with many electors.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use pg_elector::{CHANGES_NAME, CHECK_DURATION_NAME, DEFAULT_GAUGE_NAME, Elector, LockKey};
use pg_elector_testkit::replica;
use pg_elector_testkit::replica::{log_to_stderr, on_current_thread, setting};
use pg_elector_testkit::server::config::pool_from_config;
use pg_elector_tools::rng::xorshift;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::options::Shape;
use crate::{
    BARE_TRY, CLASS, ENV_BARE, ENV_ELECTORS, ENV_FAST, ENV_INDEX, ENV_INTERVAL_MS, ENV_POOL,
    ENV_PREPARED, ENV_SHAPE, ENV_URL, MARK,
};

pub(super) fn main() {
    on_current_thread(run());
}

async fn run() {
    log_to_stderr("pg_elector=warn");
    let number = |name: &str| -> u64 { setting(name).parse().expect("a number") };
    let index = number(ENV_INDEX);
    let electors = number(ENV_ELECTORS) as i32;
    let one_key = setting(ENV_SHAPE) == Shape::OneKey.name();
    let interval = Duration::from_millis(number(ENV_INTERVAL_MS));
    let fast = std::env::var(ENV_FAST).is_ok();
    let bare = std::env::var(ENV_BARE).is_ok();
    let prepared = std::env::var(ENV_PREPARED).ok().map(|on| on == "on");
    let config: tokio_postgres::Config = setting(ENV_URL).parse().expect("a connection URL");
    let pool = pool_from_config(config, number(ENV_POOL) as usize);
    let registry = Registry::new();

    let shutdown = CancellationToken::new();
    let mut seed = replica::unix_us() ^ (index << 32) ^ u64::from(std::process::id()) | 1;
    for i in 0..electors {
        let key = LockKey::new(CLASS, if one_key { 0 } else { i });
        let delay = Duration::from_micros(xorshift(&mut seed) % replica::us(interval));
        // A bare run: the leaders of process 0 are electors, every other one a bare try.
        if bare && !(index == 0 && (i == 0 || !one_key)) {
            tokio::spawn(bare_try(pool.clone(), key, interval, delay));
            continue;
        }
        let mut builder = Elector::builder(pool.clone(), key)
            .check_interval(interval)
            .identity(format!("fleet-{index}-{i}"))
            .fast_takeover(fast)
            .registry(&registry);
        if let Some(on) = prepared {
            builder = builder.prepared_statements(on);
        }
        let elector = builder.build().expect("a valid elector");
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            elector.run(shutdown).await
        });
    }

    // stdin: `snap` prints the metrics; end of file means the parent is gone.
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            match line {
                Ok(line) if line.trim() == "snap" => {
                    let snap = snap(&registry);
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{MARK}snap {snap}");
                    let _ = out.flush();
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });

    // Every elector has called `run` once the longest start delay has passed.
    tokio::time::sleep(interval + Duration::from_millis(50)).await;
    println!("{MARK}ready");
    std::future::pending::<()>().await;
}

/// A standby of a bare run: every `interval` from `delay` on, a connection of `pool` sends
/// [`BARE_TRY`] on `key`, prepared once per connection; a grant is unlocked at once.
async fn bare_try(
    pool: deadpool_postgres::Pool,
    key: LockKey,
    interval: Duration,
    delay: Duration,
) {
    use tokio_postgres::types::Type;
    tokio::time::sleep(delay).await;
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Ok(Ok(client)) = tokio::time::timeout(interval, pool.get()).await else {
            continue;
        };
        let Ok(statement) = client
            .prepare_typed_cached(BARE_TRY, &[Type::INT4, Type::INT4])
            .await
        else {
            continue;
        };
        let granted = client
            .query_one(&statement, &[&key.class(), &key.object()])
            .await
            .is_ok_and(|row| row.get::<_, bool>(0));
        if granted {
            let _ = client
                .execute(
                    "SELECT pg_catalog.pg_advisory_unlock($1::int4, $2::int4)",
                    &[&key.class(), &key.object()],
                )
                .await;
        }
    }
}

/// The process's metrics on one line: `leaders acquired lost count sum b1:c1,b2:c2,…`,
/// the histogram merged over keys (cumulative counts per upper bound).
fn snap(registry: &Registry) -> String {
    let mut leaders = 0.0;
    let mut acquired = 0.0;
    let mut lost = 0.0;
    let mut count = 0u64;
    let mut sum = 0.0;
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    for family in registry.gather() {
        let name = family.name();
        for metric in family.get_metric() {
            if name == DEFAULT_GAUGE_NAME {
                leaders += metric.get_gauge().value();
            } else if name == CHANGES_NAME {
                let cause = metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == "cause")
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default();
                let value = metric.get_counter().value();
                if cause == "acquired" {
                    acquired += value;
                } else {
                    lost += value;
                }
            } else if name == CHECK_DURATION_NAME {
                let histogram = metric.get_histogram();
                count += histogram.sample_count();
                sum += histogram.sample_sum();
                for bucket in &histogram.bucket {
                    *buckets.entry(bucket.upper_bound().to_bits()).or_default() +=
                        bucket.cumulative_count();
                }
            }
        }
    }
    let buckets: Vec<String> = buckets
        .iter()
        .map(|(bound, c)| format!("{}:{c}", f64::from_bits(*bound)))
        .collect();
    format!(
        "{leaders} {acquired} {lost} {count} {sum} {}",
        buckets.join(",")
    )
}
