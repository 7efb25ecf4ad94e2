//! What a service can watch: `Elector::subscribe` (every change of leadership) and the changes
//! counter by cause, through a real promotion, a terminated lock session and a shutdown.

mod common;

use common::*;
use pg_elector::{CHANGES_NAME, Elector, LockKey, TermEnd};
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
    let _serial = serial();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fencing_the_epoch_gauge_and_the_subscription_carry_the_terms_epoch() {
    let _serial = serial();
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
