//! E17: bad configuration is a clear error from `build()`.

use std::time::Duration;

use deadpool_postgres::{Manager, Pool};
use pg_elector::{BuildError, DEFAULT_CHECK_INTERVAL, Elector, Error, LockKey, MAX_CHECK_INTERVAL};

const KEY: LockKey = LockKey::new(1, 2);

/// A pool that is never used: building an elector opens no connection.
fn pool() -> Pool {
    let config: tokio_postgres::Config = "host=127.0.0.1 port=1 user=nobody".parse().unwrap();
    Pool::builder(Manager::new(config, tokio_postgres::NoTls))
        .build()
        .unwrap()
}

mod e17 {
    use super::*;

    /// An interval whose four times overflows `idle_session_timeout` is rejected.
    #[test]
    fn an_interval_overflowing_idle_session_timeout_is_rejected() {
        // 4 × 536 870 912 ms = 2^31 ms, one more than idle_session_timeout's maximum.
        let interval = Duration::from_millis(536_870_912);
        match Elector::builder(pool(), KEY)
            .check_interval(interval)
            .build()
        {
            Err(Error::Build(BuildError::IntervalTooLarge { interval: got })) => {
                assert_eq!(got, interval)
            }
            other => panic!("expected IntervalTooLarge, got {other:?}"),
        }
        let err = Elector::builder(pool(), KEY)
            .check_interval(Duration::from_secs(u64::MAX))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("idle_session_timeout"), "{err}");
    }

    #[test]
    fn the_largest_interval_that_fits_is_accepted() {
        assert_eq!(MAX_CHECK_INTERVAL, Duration::from_millis(536_870_911));
        let elector = Elector::builder(pool(), KEY)
            .check_interval(MAX_CHECK_INTERVAL)
            .build()
            .unwrap();
        assert_eq!(elector.check_interval(), Some(MAX_CHECK_INTERVAL));
    }

    #[test]
    fn zero_means_the_default_interval() {
        let elector = Elector::builder(pool(), KEY)
            .check_interval(Duration::ZERO)
            .build()
            .unwrap();
        assert_eq!(elector.check_interval(), Some(DEFAULT_CHECK_INTERVAL));
        assert_eq!(DEFAULT_CHECK_INTERVAL, Duration::from_secs(5));
        let elector = Elector::builder(pool(), KEY).build().unwrap();
        assert_eq!(elector.check_interval(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn an_interval_below_ten_milliseconds_is_rejected() {
        match Elector::builder(pool(), KEY)
            .check_interval(Duration::from_micros(9_999))
            .build()
        {
            Err(Error::Build(BuildError::IntervalTooSmall { .. })) => {}
            other => panic!("expected IntervalTooSmall, got {other:?}"),
        }
    }

    /// With a preference, standbys are found by their identity in the candidates table and
    /// in `pg_stat_activity`'s `application_name`, which keeps 63 bytes of printable ASCII:
    /// an identity it would show otherwise is refused; without one it is fine (it shows cut).
    #[test]
    fn with_a_preference_an_identity_postgres_would_not_show_whole_is_rejected() {
        let long = "x".repeat(64);
        for identity in [long.as_str(), "café", "tab\there"] {
            match Elector::builder(pool(), KEY)
                .identity(identity)
                .preference(1)
                .build()
            {
                Err(Error::Build(BuildError::InvalidIdentity { identity: given })) => {
                    assert_eq!(given, identity)
                }
                other => panic!("{identity:?}: expected InvalidIdentity, got {other:?}"),
            }
            Elector::builder(pool(), KEY)
                .identity(identity)
                .build()
                .unwrap_or_else(|e| panic!("{identity:?} without a preference: {e}"));
        }
        let fits = "y".repeat(63);
        let elector = Elector::builder(pool(), KEY)
            .identity(fits.as_str())
            .preference(1)
            .build()
            .unwrap();
        assert_eq!(elector.identity(), Some(fits.as_str()));
        // The default identity always fits.
        let default = Elector::builder(pool(), KEY).preference(1).build().unwrap();
        let identity = default.identity().unwrap();
        assert!(identity.len() <= 63, "{identity}");
    }

    #[test]
    fn a_metric_name_taken_by_another_collector_type_is_rejected() {
        let registry = prometheus::Registry::new();
        let counter = prometheus::IntCounter::new("pg_elector_leader", "a counter").unwrap();
        registry.register(Box::new(counter)).unwrap();
        match Elector::builder(pool(), KEY).registry(&registry).build() {
            Err(Error::Build(BuildError::MetricClash { name })) => {
                assert_eq!(name, "pg_elector_leader")
            }
            other => panic!("expected MetricClash, got {other:?}"),
        }
        // Under another name it is fine.
        Elector::builder(pool(), KEY)
            .registry(&registry)
            .gauge_name("sweeper_leader")
            .build()
            .unwrap();
    }
}

#[test]
fn every_public_type_is_send_and_sync() {
    use pg_elector::background::*;
    use pg_elector::schedule::*;
    use pg_elector::*;

    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Elector>();
    check::<Term>();
    check::<LockKey>();
    check::<ManualControl>();
    check::<LeaderInfo>();
    check::<Leadership>();
    check::<LossCause>();
    check::<TermEnd>();
    check::<Gate>();
    check::<LeaderTicker>();
    check::<WhileLeader>();
    check::<Probe>();
    check::<ProbeStatus>();
    check::<TickOutcome>();
    check::<Readiness>();
    check::<ReadinessReport>();
    check::<FailingProbe>();
    check::<RestartPolicy>();
    check::<ScheduleHandle>();
    check::<Job>();
    check::<JobRun>();
    check::<CatchUp>();
    check::<RunKind>();
    check::<LostState>();
    check::<SkipReason>();
    check::<pg_elector::shards::Shards>();
    check::<pg_elector::shards::ShardId>();
    check::<pg_elector::shards::Ownership>();
    // Not Clone: the builders, a schedule before it runs, the errors.
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<ElectorBuilder>();
    send_sync::<LocalBuilder>();
    send_sync::<Schedule>();
    send_sync::<pg_elector::shards::ShardsBuilder>();
    send_sync::<pg_elector::shards::ShardLoops>();
    // The supervisor holds its workers' `FnMut`s: Send, moved into its task, not Sync.
    fn send<T: Send + 'static>() {}
    send::<Supervisor>();
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    error::<Error>();
    error::<Fenced>();
    error::<ScheduleError>();
}

/// Every duration a user hands the elector and the background plane, at its extremes, is an
/// error from `build()` or a bound, never a panic or an overflow: the drain timeout, a resign's
/// cooldown, a ticker's period, a while-leader loop's grace, the supervisor's backoff, budget
/// window and shutdown timeout. (The check interval's extremes are errors, above.)
#[tokio::test(start_paused = true)]
async fn extreme_durations_are_errors_or_bounds_never_panics() {
    use pg_elector::background::{LeaderTicker, RestartPolicy, Supervisor, WhileLeader};
    use tokio_util::sync::CancellationToken;

    for drain in [Duration::ZERO, Duration::MAX] {
        let elector = Elector::builder(pool(), KEY).drain_timeout(drain).build();
        assert_eq!(elector.unwrap().drain_timeout(), drain);
    }
    for period in [Duration::ZERO, Duration::MAX] {
        let period = LeaderTicker::new("t", Elector::always_leader(), period).period();
        assert!(period >= pg_elector::background::MIN_TICK_PERIOD);
        assert!(period <= pg_elector::background::MAX_TICK_PERIOD);
    }
    let policy = RestartPolicy::new()
        .backoff(Duration::MAX, Duration::MAX)
        .budget(u32::MAX, Duration::MAX);
    assert_eq!(policy.backoff_after(u32::MAX), Duration::MAX);

    // A resign that never ends its cooldown ("never again") on a manual elector.
    let (elector, control) = Elector::manual();
    control.promote();
    assert!(elector.resign(Duration::MAX).await);
    assert!(!elector.is_leader());

    // A loop with an endless grace whose term is lost: it returns on its token, and the
    // launcher goes on.
    let (elector, control) = Elector::manual();
    let shutdown = CancellationToken::new();
    let launcher = WhileLeader::new("w", &elector).stop_grace(Duration::MAX);
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            launcher
                .run(shutdown, |term| async move {
                    term.cancelled().await;
                    Ok::<_, String>(())
                })
                .await
        }
    });
    control.promote();
    tokio::time::sleep(Duration::from_millis(10)).await;
    control.demote();
    shutdown.cancel();
    run.await.unwrap();

    // A supervisor that waits without end at shutdown, for a worker that stops at once.
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    Supervisor::new()
        .shutdown_timeout(Duration::MAX)
        .restart_policy(policy)
        .worker("w", |token: CancellationToken| async move {
            token.cancelled().await
        })
        .run(shutdown)
        .await;
}
