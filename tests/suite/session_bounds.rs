//! E13 and E14: the server-side bounds of the lock session. `idle_session_timeout` is 4·I, and
//! no server-side TCP timeout (user timeout, keepalives) may end a partitioned lock session, and
//! free the lock, sooner than that: PostgreSQL's `0` for those means the operating system's
//! default, not "off".
//!
//! The elector reads the settings back on the lock session in the granting statement and logs
//! them at DEBUG; the TCP ones are what the server's socket reports (a value the kernel refused
//! shows the kernel's own), so these tests read what the server applied.

use crate::common;

use std::time::Duration;

use common::capture::{Capture, Event};
use common::*;
use pg_elector::{Elector, LockKey};

const GRANTED: &str = "lock granted; the server's bounds on the lock session";

/// Leads once at `interval` on `db` and returns the logged bounds of the lock session.
async fn bounds_of_a_grant(db: &TestDb, key: LockKey, interval: Duration) -> Event {
    let capture = Capture::default();
    let elector = Elector::builder(db.pool(2), key)
        .check_interval(interval)
        .build()
        .unwrap();
    let replica = Replica::run_captured(elector.clone(), &capture);
    // The first try runs at once, whatever the interval.
    wait_for(Duration::from_secs(5), || elector.is_leader())
        .await
        .expect("the only replica leads");
    replica.stop().await.unwrap();
    let granted = capture.events(GRANTED);
    assert_eq!(granted.len(), 1, "one grant, logged once");
    granted[0].clone()
}

/// A duration as PostgreSQL shows it: a number with an optional unit (`800ms`, `12h`, `7200`),
/// the number alone being in `unit`.
fn shown(text: &str, unit: Duration) -> Duration {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let n: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("a number: {text:?}"));
    let unit = match suffix {
        "" => unit,
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        other => panic!("unit {other:?} in {text:?}"),
    };
    unit * n as u32
}

/// Asserts that no server-side bound in `event` ends a silent session before 4·I.
fn assert_no_bound_below_four_intervals(event: &Event, interval: Duration, has_idle_timeout: bool) {
    let four = 4 * interval;
    let second = Duration::from_secs(1);
    let idle_session_timeout = event.field("idle_session_timeout");
    if has_idle_timeout {
        assert_eq!(
            shown(idle_session_timeout, Duration::from_millis(1)),
            four,
            "idle_session_timeout: {event:?}"
        );
    } else {
        assert_eq!(idle_session_timeout, "(none)", "PostgreSQL 13: {event:?}");
    }
    let user_timeout = shown(event.field("tcp_user_timeout"), Duration::from_millis(1));
    assert!(
        user_timeout >= four,
        "tcp_user_timeout {user_timeout:?} < 4·I = {four:?}: {event:?}"
    );
    let idle = shown(event.field("tcp_keepalives_idle"), second);
    let every = shown(event.field("tcp_keepalives_interval"), second);
    let count: u32 = event.field("tcp_keepalives_count").parse().unwrap();
    assert!(
        idle > Duration::ZERO && every > Duration::ZERO && count > 0,
        "{event:?}"
    );
    assert!(
        idle + every * count >= four,
        "keepalives drop a silent peer after {:?} < 4·I = {four:?}: {event:?}",
        idle + every * count
    );
    eprintln!(
        "I = {interval:?}: idle_session_timeout {idle_session_timeout}, tcp_user_timeout \
         {user_timeout:?}, keepalives {idle:?} + {count} × {every:?}"
    );
}

mod e14 {
    use super::*;

    /// The lock session has no server TCP bound shorter than four intervals, at a small and a large
    /// interval.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_server_tcp_bound_is_shorter_than_four_intervals() {
        let _timing = timing();
        let db = fresh_db().await;
        let has_idle_timeout = has_idle_session_timeout(&db).await;
        // A short interval, and one long enough that 4·I passes the usual kernel keepalive time
        // (2 h), the keepalive idle limit of the kernel (32 767 s) included.
        for (object, interval) in [(1, I), (2, Duration::from_secs(3 * 3600))] {
            let granted = bounds_of_a_grant(&db, LockKey::new(14, object), interval).await;
            assert_no_bound_below_four_intervals(&granted, interval, has_idle_timeout);
        }
    }

    /// A server with short keepalives still gives the lock session four intervals.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_server_keepalives_still_give_four_intervals() {
        let _timing = timing();
        let db = fresh_db().await;
        let has_idle_timeout = has_idle_session_timeout(&db).await;
        // Every new session of this database starts with keepalives and a user timeout far below
        // 4·I, as on a host tuned for fast dead-peer detection.
        let admin = db.connect().await.unwrap();
        for (setting, value) in [
            ("tcp_keepalives_idle", "1"),
            ("tcp_keepalives_interval", "1"),
            ("tcp_keepalives_count", "1"),
            ("tcp_user_timeout", "100"),
        ] {
            admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{}\" SET {setting} = {value}",
                    db.name()
                ))
                .await
                .unwrap();
        }
        let probe = db.connect().await.unwrap();
        let short: String = probe
            .query_one("SELECT current_setting('tcp_keepalives_idle')", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(short, "1", "new sessions start with the short setting");

        let interval = Duration::from_secs(2);
        let granted = bounds_of_a_grant(&db, LockKey::new(14, 3), interval).await;
        assert_no_bound_below_four_intervals(&granted, interval, has_idle_timeout);
    }
}
