//! The hot path: `is_leader()` and the overhead of `do_work` over calling `f`.
//!
//! Runs against the harness's server (a private one unless DATABASE_URL is set), on a real
//! leader whose local lease is live, so `is_leader` reads the clock as it does in production.
//!
//! cargo bench --bench hot_path

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::PgServer;
use tokio_util::sync::CancellationToken;

fn hot_path(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    let db = rt.block_on(server.create_database()).unwrap();
    let key = LockKey::new(0x6265_6e63, 1);
    let build = || {
        Elector::builder(db.pool(2), key)
            .check_interval(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (leader, standby) = (build(), build());
    let shutdown = CancellationToken::new();
    rt.spawn({
        let (leader, shutdown) = (leader.clone(), shutdown.clone());
        async move { leader.run(shutdown).await }
    });
    rt.block_on(async {
        while !leader.is_leader() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    rt.spawn({
        let (standby, shutdown) = (standby.clone(), shutdown.clone());
        async move { standby.run(shutdown).await }
    });

    c.bench_function("is_leader/leader", |b| {
        b.iter(|| black_box(&leader).is_leader())
    });
    c.bench_function("is_leader/standby", |b| {
        b.iter(|| black_box(&standby).is_leader())
    });

    let local = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    c.bench_function("do_work/leader_noop", |b| {
        b.to_async(&local).iter(|| async {
            let out: Result<Option<u64>, ()> =
                leader.do_work(|_term| async { Ok(black_box(1)) }).await;
            assert!(out == Ok(Some(1)));
        })
    });
    c.bench_function("do_work/direct_noop", |b| {
        b.to_async(&local).iter(|| async {
            let f = |_: ()| async { Ok::<u64, ()>(black_box(1)) };
            let out = f(()).await;
            assert!(out == Ok(1));
        })
    });
    c.bench_function("do_work/standby_noop", |b| {
        b.to_async(&local).iter(|| async {
            let out: Result<Option<u64>, ()> =
                standby.do_work(|_term| async { Ok(black_box(1)) }).await;
            assert!(out == Ok(None));
        })
    });

    assert!(leader.is_leader(), "the leader led throughout");
    shutdown.cancel();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = hot_path
}
criterion_main!(benches);
