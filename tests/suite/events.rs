//! What a service can watch: `Elector::subscribe` (every change of leadership), the cause of
//! a lost term (`LossCause`) and the changes counter by cause, through a real promotion, a
//! terminated lock session, a partition and a shutdown.

use crate::common;

use common::*;
use std::time::Duration;

use pg_elector::{CHANGES_NAME, CHECK_DURATION_NAME, Elector, LockKey, LossCause, TermEnd};
use prometheus::Registry;

fn changes(registry: &Registry, cause: &str) -> f64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == CHANGES_NAME)
        .and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| m.get_label().iter().any(|l| l.value() == cause))
                .map(|m| m.get_counter().value())
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_each_promotion_and_demotion_with_its_cause() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(11, 30);
    let registry = Registry::new();
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(I)
        .registry(&registry)
        .build()
        .unwrap();
    let mut leadership = elector.subscribe();
    assert!(
        !leadership.borrow_and_update().is_leader,
        "a standby at first"
    );
    let replica = Replica::run(elector);

    tokio::time::timeout(3 * I, leadership.changed())
        .await
        .expect("told of the promotion within 3·I")
        .unwrap();
    let now = leadership.borrow_and_update().clone();
    assert!(
        now.is_leader && now.changes == 1 && now.last_end.is_none(),
        "{now:?}"
    );

    // The server ends the lock session: the replica notices the closed connection.
    terminate_holder(&db, key).await;
    tokio::time::timeout(I, leadership.changed())
        .await
        .expect("told of the demotion within I")
        .unwrap();
    let now = leadership.borrow_and_update().clone();
    assert!(!now.is_leader, "{now:?}");
    assert_eq!(now.last_end, Some(TermEnd::LeadershipLost));
    // Seen as the closed connection, or, if a check was in flight, as that check failing.
    assert_eq!(
        changes(&registry, "connection_closed") + changes(&registry, "check_failed"),
        1.0
    );
    let cause = now.loss_cause.expect("a lost term has a cause");
    assert_eq!(
        changes(&registry, cause.as_str()),
        1.0,
        "the cause told is the one counted: {cause:?}"
    );

    // It leads again at its next try, then shuts down.
    tokio::time::timeout(3 * I, leadership.wait_for(|l| l.is_leader))
        .await
        .expect("leads again within 3·I")
        .unwrap();
    replica.stop().await.unwrap();
    let now = leadership.borrow_and_update().clone();
    assert!(!now.is_leader, "{now:?}");
    assert_eq!(now.last_end, Some(TermEnd::Shutdown));
    assert_eq!(now.changes, 4, "two terms, each begun and ended");
    assert_eq!(
        (
            changes(&registry, "acquired"),
            changes(&registry, "released")
        ),
        (2.0, 1.0)
    );
}

/// With fencing, the epoch gauge and the subscription carry the term's epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epoch_gauge_and_the_watch_carry_the_terms_epoch() {
    let _timing = timing();
    let db = fresh_db().await;
    let registry = Registry::new();
    let elector = Elector::builder(db.pool(2), LockKey::new(11, 31))
        .check_interval(I)
        .fencing(true)
        .registry(&registry)
        .build()
        .unwrap();
    let leadership = elector.subscribe();
    let replica = Replica::run(elector);
    let term = tokio::time::timeout(3 * I, replica.elector.wait_for_leadership())
        .await
        .expect("leads within 3·I");
    let epoch = term.epoch().expect("a fenced term has an epoch");
    assert_eq!(leadership.borrow().epoch, Some(epoch));
    let gauge = registry
        .gather()
        .iter()
        .find(|f| f.name() == pg_elector::EPOCH_NAME)
        .map(|f| f.get_metric()[0].get_gauge().value());
    assert_eq!(gauge, Some(epoch as f64));
    replica.stop().await.unwrap();
}

/// Leader checks completed so far, from the check duration histogram.
fn checks(registry: &Registry) -> u64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == CHECK_DURATION_NAME)
        .map_or(0, |f| f.get_metric()[0].get_histogram().get_sample_count())
}

/// A session the server terminates is lost as a closed connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_is_lost_as_a_closed_connection() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(11, 32);
    // A long interval, and the terminate sent right after a check has answered, so that no
    // check is in flight when the session ends: the closed connection is noticed first.
    let interval = Duration::from_secs(1);
    let registry = Registry::new();
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(interval)
        .registry(&registry)
        .build()
        .unwrap();
    let mut leadership = elector.subscribe();
    let replica = Replica::run(elector);
    let term = tokio::time::timeout(3 * interval, replica.elector.wait_for_leadership())
        .await
        .expect("leads within 3·I");
    let admin = db.connect().await.unwrap();
    let pid = holders(&admin, key).await[0];
    let before = checks(&registry);
    wait_for(2 * interval, || checks(&registry) > before)
        .await
        .expect("a check within 2·I");
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();

    tokio::time::timeout(interval / 2, leadership.wait_for(|l| !l.is_leader))
        .await
        .expect("demoted within I/2, before the next check")
        .unwrap();
    let now = leadership.borrow_and_update().clone();
    assert_eq!(now.last_end, Some(TermEnd::LeadershipLost), "{now:?}");
    assert_eq!(now.loss_cause, Some(LossCause::ConnectionClosed), "{now:?}");
    assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
    assert_eq!(term.loss_cause(), Some(LossCause::ConnectionClosed));
    assert_eq!(changes(&registry, "connection_closed"), 1.0);

    // The next term ends with the shutdown, which is no loss.
    tokio::time::timeout(2 * interval, leadership.wait_for(|l| l.is_leader))
        .await
        .expect("leads again at its next try")
        .unwrap();
    replica.stop().await.unwrap();
    let now = leadership.borrow_and_update().clone();
    assert_eq!(now.last_end, Some(TermEnd::Shutdown), "{now:?}");
    assert_eq!(now.loss_cause, None, "a shutdown is no loss: {now:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_lost_in_a_partition_is_lost_as_a_check_timeout() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(11, 33);
    let proxy = shared_server_proxy().await;
    let registry = Registry::new();
    let elector = Elector::builder(db.pool_via(proxy.addr(), 2), key)
        .check_interval(I)
        .registry(&registry)
        .build()
        .unwrap();
    let mut leadership = elector.subscribe();
    let replica = Replica::run(elector);
    let term = tokio::time::timeout(3 * I, replica.elector.wait_for_leadership())
        .await
        .expect("leads within 3·I");

    // The next check, within I, gets no answer; it gives up after I, well before the lease
    // (4·I from the last answered check, less a margin) runs out.
    proxy.blackhole();
    tokio::time::timeout(3 * I, term.cancelled())
        .await
        .expect("demoted within 2·I and some slack");
    assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
    assert_eq!(term.loss_cause(), Some(LossCause::CheckTimeout));
    // Subscribers are told just after the term's token is cancelled.
    let now = tokio::time::timeout(I, leadership.wait_for(|l| !l.is_leader))
        .await
        .expect("subscribers told of the demotion")
        .unwrap()
        .clone();
    assert_eq!(now.loss_cause, Some(LossCause::CheckTimeout), "{now:?}");
    assert_eq!(changes(&registry, LossCause::CheckTimeout.as_str()), 1.0);

    proxy.pass();
    replica.stop().await.unwrap();
}
