//! What fencing costs: a fenced write against the same write unfenced (one transaction each:
//! fence, insert, commit), and a grant with the epoch bump against one without.
//!
//! Runs against the harness's server (a private one unless DATABASE_URL is set), over TCP on
//! loopback.
//!
//! cargo bench --bench fencing

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::PgServer;
use tokio_util::sync::CancellationToken;

fn fencing(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    let db = rt.block_on(server.create_database()).unwrap();
    rt.block_on(async {
        db.connect()
            .await
            .unwrap()
            .batch_execute("CREATE TABLE writes (n bigint)")
            .await
            .unwrap();
    });
    let build = |key: LockKey, fenced: bool| {
        Elector::builder(db.pool(2), key)
            .check_interval(Duration::from_secs(1))
            .fencing(fenced)
            .build()
            .unwrap()
    };

    // A fenced leader, and the application's pool.
    let leader = build(LockKey::new(0x6665_6e63, 1), true);
    let shutdown = CancellationToken::new();
    let term = rt.block_on(async {
        leader.spawn(shutdown.clone());
        leader.wait_for_leadership().await
    });
    let app = db.pool(2);
    c.bench_function("write/unfenced", |b| {
        b.to_async(&rt).iter(|| async {
            let mut client = app.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            tx.execute("INSERT INTO writes VALUES (1)", &[])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        })
    });
    c.bench_function("write/fenced", |b| {
        b.to_async(&rt).iter(|| async {
            let mut client = app.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            term.fence(&tx).await.unwrap();
            tx.execute("INSERT INTO writes VALUES (1)", &[])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        })
    });
    shutdown.cancel();

    // A grant: from `run` to leadership, a fresh elector each time on a warm pool of its own.
    for (name, fenced, object) in [("grant/unfenced", false, 2), ("grant/fenced", true, 3)] {
        let elector = build(LockKey::new(0x6665_6e63, object), fenced);
        c.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let shutdown = CancellationToken::new();
                let run = elector.spawn(shutdown.clone());
                elector.wait_for_leadership().await;
                shutdown.cancel();
                run.await.unwrap().unwrap();
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = fencing
}
criterion_main!(benches);
