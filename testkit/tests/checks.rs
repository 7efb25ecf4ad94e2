//! The checks a test asserts on: the timeline finds two leaders at once when there were, and
//! the fenced-writes table finds writes of two terms that interleaved.

use std::time::Duration;

use pg_elector::Elector;
use pg_elector_testkit::replicas::timeline::SAMPLE_EVERY;
use pg_elector_testkit::{FencedWrites, PgServer, Timeline};

#[tokio::test]
async fn the_timeline_sees_two_leaders_at_once() {
    let (a, control_a) = Elector::manual();
    let (b, control_b) = Elector::manual();
    let timeline = Timeline::start(&[a, b], None);
    let _term_a = control_a.promote();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _term_b = control_b.promote();
    tokio::time::sleep(Duration::from_millis(30)).await;
    control_a.demote();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let seen = timeline.finish();
    assert_eq!(seen.leader_order(), vec![0, 1]);
    let overlaps = seen.overlaps();
    assert_eq!(overlaps.len(), 1, "{overlaps:?}");
    let overlap = overlaps[0];
    assert_eq!((overlap.first, overlap.second), (0, 1));
    // 30 ms of overlap, read every 100 µs on a thread that may be scheduled late.
    assert!(
        overlap.length >= Duration::from_millis(25) && overlap.length <= Duration::from_millis(200),
        "{overlap:?}"
    );
    assert_eq!(seen.longest_overlap(), overlap.length);
    assert!(
        seen.leaders[1].to.is_none(),
        "b still leads: {:?}",
        seen.leaders
    );
}

#[tokio::test]
async fn one_leader_after_another_is_no_overlap() {
    let (a, control_a) = Elector::manual();
    let (b, control_b) = Elector::manual();
    let timeline = Timeline::start(&[a, b], None);
    // Back to back: a's demotion and b's promotion often fall between two samples, or in one.
    for _ in 0..5 {
        control_a.promote();
        tokio::time::sleep(SAMPLE_EVERY * 50).await;
        control_a.demote();
        control_b.promote();
        tokio::time::sleep(SAMPLE_EVERY * 50).await;
        control_b.demote();
    }
    let seen = timeline.finish();
    seen.assert_no_two_leaders();
    // A sampler thread descheduled for longer than a term misses it; it must see both lead.
    let order = seen.leader_order();
    assert!(
        order.contains(&0) && order.contains(&1),
        "{:?}",
        seen.leaders
    );
}

#[tokio::test]
async fn fenced_writes_tell_when_two_terms_interleaved() {
    let db = PgServer::shared().unwrap().create_database().await.unwrap();
    let admin = db.connect().await.unwrap();
    FencedWrites::create(&admin).await.unwrap();
    FencedWrites::create(&admin)
        .await
        .expect("creating it again is a no-op");
    let insert = |epoch: i64, what: &'static str| {
        let admin = &admin;
        async move {
            admin
                .execute(
                    &format!(
                        "INSERT INTO {} (epoch, what) VALUES ($1, $2)",
                        FencedWrites::TABLE
                    ),
                    &[&epoch, &what],
                )
                .await
                .unwrap();
        }
    };
    insert(1, "a").await;
    insert(1, "b").await;
    insert(2, "c").await;
    let writes = FencedWrites::read(&admin).await.unwrap();
    writes.assert_not_interleaved();
    assert_eq!(writes.terms(), vec![1, 2]);

    // A write of term 1 after term 2 wrote: the deposed leader's write landed late.
    insert(1, "late").await;
    insert(3, "d").await;
    let writes = FencedWrites::read(&admin).await.unwrap();
    let found = writes.interleavings();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].later.what.as_str(), found[0].earlier.what.as_str()),
        ("c", "late")
    );
}
