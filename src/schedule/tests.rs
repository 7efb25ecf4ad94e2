use std::error::Error as _;
use std::time::Duration;

use super::*;
use crate::Fenced;

const SEC: Duration = Duration::from_secs(1);

#[test]
fn the_grace_after_a_term_is_at_least_the_elector_s_drain_timeout() {
    let poll = Duration::from_millis(200);
    assert_eq!(
        grace(poll, Duration::ZERO),
        2 * SEC,
        "two polls, at least 2 s"
    );
    assert_eq!(grace(poll, Duration::from_millis(200)), 2 * SEC);
    assert_eq!(grace(poll, 6 * SEC), 6 * SEC, "the drain timeout");
    assert_eq!(grace(5 * SEC, 6 * SEC), 10 * SEC, "two polls");
    assert_eq!(grace(poll, Duration::MAX), Duration::MAX);
    assert_eq!(
        grace(poll, Elector::manual().0.drain_timeout()),
        crate::DEFAULT_CHECK_INTERVAL,
        "a local elector's drain timeout"
    );
}

#[test]
fn only_a_lost_answer_leaves_a_commit_unknown() {
    assert!(ScheduleError::Timeout(SEC).leaves_commit_unknown());
    assert!(!ScheduleError::PoolTimeout(SEC).leaves_commit_unknown());
    assert!(
        !ScheduleError::Fence(Fenced::term_ended(Some(7))).leaves_commit_unknown(),
        "a fence refused before the COMMIT"
    );
}

#[test]
fn a_poll_interval_is_kept_between_10_ms_and_an_hour() {
    assert_eq!(
        poll_within_bounds(Duration::ZERO),
        Duration::from_millis(10)
    );
    assert_eq!(poll_within_bounds(Duration::MAX), Duration::from_secs(3600));
    assert_eq!(poll_within_bounds(SEC), SEC);
    let (elector, _control) = Elector::manual();
    let mut config = deadpool_postgres::Config::new();
    config.dbname = Some("never-connected".to_owned());
    let pool = config.create_pool(None, tokio_postgres::NoTls).unwrap();
    let schedule = Schedule::new(&elector, pool).poll_interval(Duration::MAX);
    assert_eq!(schedule.poll, MAX_POLL_INTERVAL);
    assert_eq!(schedule.handle().wait, MAX_POLL_INTERVAL);
}

/// Every bound derived from a user's duration saturates instead of overflowing.
#[test]
fn bounds_from_user_durations_saturate() {
    for poll in [
        Duration::ZERO,
        Duration::from_millis(10),
        SEC,
        Duration::MAX,
    ] {
        // No panic on any input, and each bound at least its floor.
        assert!(query_bound(poll) >= 2 * SEC, "{poll:?}");
        assert!(borrow_bound(poll) >= SEC, "{poll:?}");
    }
    assert_eq!(query_bound(Duration::MAX), Duration::MAX);
    assert_eq!(query_bound(Duration::from_millis(50)), 2 * SEC);
    assert_eq!(query_bound(5 * SEC), 10 * SEC);
    assert_eq!(borrow_bound(MAX_POLL_INTERVAL), MAX_POLL_INTERVAL);
    assert_eq!(grace(Duration::MAX, Duration::MAX), Duration::MAX);
    // What a schedule derives from its largest poll is far from any overflow.
    assert_eq!(query_bound(MAX_POLL_INTERVAL), 2 * MAX_POLL_INTERVAL);
}

#[test]
fn an_error_says_its_cause_once() {
    let pool = ScheduleError::Pool(Box::new(deadpool_postgres::PoolError::Closed));
    let fence = ScheduleError::Fence(Fenced::term_ended(Some(7)));
    for error in [pool, fence] {
        assert!(error.source().is_none(), "{error:?}");
    }
    let fence = ScheduleError::Fence(Fenced::term_ended(Some(7)));
    assert_eq!(
        fence.to_string(),
        "the claim's fence failed: fenced: the term of epoch 7 has ended"
    );
}
