//! Epochs never repeat across a database failover (F7.2): the standby is cut off from the
//! primary's WAL (asynchronous replication, a lag), a later term bumps the epoch on the primary
//! alone, the primary crashes and the standby is promoted. The next term's epoch is greater than
//! every epoch handed out before, and a fenced write of the term the standby never heard of is
//! refused by the promoted server's epoch row.

use crate::common;

use std::time::Duration;

use common::failover::{Follow, cluster};
use common::*;
use pg_elector::LockKey;
use pg_elector_testkit::FaultProxy;
use pg_elector_testkit::server::ShutdownMode;

/// The epoch row of `key` as `config`'s server has it.
async fn epoch_on(config: &tokio_postgres::Config, key: LockKey) -> Option<i64> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(connection);
    client
        .query_opt(
            "SELECT epoch FROM pg_elector_epochs WHERE class = $1 AND object = $2",
            &[&key.class(), &key.object()],
        )
        .await
        .ok()
        .flatten()
        .map(|row| row.get(0))
}

mod f7_2 {
    use super::*;

    /// An epoch that the promoted standby never saw (bumped on the primary while the standby was
    /// cut off) is never handed out again, and the old term's fenced write is refused there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unseen_epoch_is_never_handed_out_again() {
        let _timing = timing();
        let cluster = cluster(Follow::MultiHost, false).await;
        let key = LockKey::new(0x4637, 2);
        let admin = cluster.db.connect().await.unwrap();
        admin
            .batch_execute("CREATE TABLE writes (replica text, epoch bigint)")
            .await
            .unwrap();

        // a's term: its epoch reaches the standby.
        let a = Replica::run(fenced_elector(cluster.pool(2), key, "a", I));
        wait_for(10 * I, || a.elector.is_leader())
            .await
            .expect("a leads");
        let first = a.elector.term().epoch().unwrap();
        let standby = cluster.on_standby();
        wait_for_async(Duration::from_secs(10), || async {
            epoch_on(&standby, key).await == Some(first as i64)
        })
        .await
        .expect("the standby replays a's epoch");

        // The standby is cut off; b's term begins on the primary alone. b checks rarely (25·I) and
        // reaches the primary through a proxy that then goes silent: when the primary crashes, b
        // has not noticed, and still believes it leads.
        cluster.wal.blackhole();
        a.stop().await.unwrap();
        let path = FaultProxy::start(cluster.primary.addr()).await.unwrap();
        let b = Replica::run(fenced_elector(
            cluster.db.pool_via(path.addr(), 2),
            key,
            "b",
            25 * I,
        ));
        wait_for(10 * I, || b.elector.is_leader())
            .await
            .expect("b leads at its first try");
        let b_term = b.elector.term();
        let second = b_term.epoch().unwrap();
        assert!(second > first, "epoch {second} after {first}");
        assert_eq!(epoch_on(&standby, key).await, Some(first as i64), "cut off");

        path.blackhole();
        cluster.stop_primary(ShutdownMode::Immediate).await.unwrap();
        cluster.promote().await.unwrap();
        let c = Replica::run(fenced_elector(cluster.pool(2), key, "c", I));
        wait_for(10 * I, || c.elector.is_leader())
            .await
            .expect("c leads on the promoted standby");
        let third = c.elector.term().epoch().unwrap();
        eprintln!("epochs: a {first}, b {second} (never replicated), c {third}");
        assert!(
            third > second,
            "the new term's epoch {third} repeats or precedes one handed out before ({second})"
        );

        // b still believes it leads; its fenced write, on the promoted server, is refused by the
        // row.
        assert!(b_term.is_leader(), "b has not noticed the crash yet");
        let mut client = cluster.pool(1).get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let refused = b_term
            .fence(&tx)
            .await
            .expect_err("the old term's fence fails on the new primary");
        assert_eq!(
            (refused.ours(), refused.current()),
            (Some(second), Some(third)),
            "refused by the epoch row: {refused}"
        );
        drop(tx);
        let mut c_client = cluster.pool(1).get().await.unwrap();
        let tx = c_client.transaction().await.unwrap();
        c.elector
            .term()
            .fence(&tx)
            .await
            .expect("the new term's fence passes");
        tx.execute("INSERT INTO writes VALUES ('c', $1)", &[&(third as i64)])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        c.stop().await.unwrap();
        path.pass();
        b.shutdown.cancel();
    }
}
