//! The server-side bounds a lock session gets at its grant, and as the server applied them.

use std::time::Duration;

/// The server-side bounds a granted lock session gets, all derived from the interval I.
///
/// `idle_session_timeout` (4·I) is the server's bound on a silent session. The TCP
/// settings make sure no server-side TCP timeout ends the session, and frees the lock, earlier
/// than that while the old leader may still think it leads: PostgreSQL's `0` means the
/// operating system's default (keepalive idle time often 60–300 s on cloud images), not "off".
/// So `tcp_user_timeout` is 4·I, and the keepalive idle time plus its probes add up to at least
/// 4·I (the kernel takes at most 32767 s for the idle time and the interval, 127 probes). On a
/// server without `idle_session_timeout` (PostgreSQL 13) the keepalives are then the bound: a
/// peer that stops answering is dropped about idle + interval after its last packet, that is
/// ⌈4·I⌉ + ⌈I⌉ in whole seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionBounds {
    pub(crate) idle_session_timeout_ms: u64,
    pub(crate) tcp_user_timeout_ms: u64,
    pub(crate) keepalives_idle_s: u64,
    pub(crate) keepalives_interval_s: u64,
    pub(crate) keepalives_count: u64,
}

/// The kernel's largest `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (Linux), in seconds.
const MAX_KEEPALIVE_S: u64 = 32_767;
/// The kernel's largest `TCP_KEEPCNT` (Linux).
const MAX_KEEPALIVE_COUNT: u64 = 127;

impl SessionBounds {
    /// The settings as `set_config` takes them: `idle_session_timeout`, `tcp_user_timeout`,
    /// and the keepalives' idle time, interval and count.
    pub(crate) fn as_settings(&self) -> [String; 5] {
        [
            self.idle_session_timeout_ms,
            self.tcp_user_timeout_ms,
            self.keepalives_idle_s,
            self.keepalives_interval_s,
            self.keepalives_count,
        ]
        .map(|n| n.to_string())
    }

    pub(crate) fn for_interval(interval: Duration) -> Self {
        let bound_ms = (4 * interval).as_millis() as u64;
        let ceil_s = |ms: u64| ms.div_ceil(1000).clamp(1, MAX_KEEPALIVE_S);
        let keepalives_idle_s = ceil_s(bound_ms);
        let keepalives_interval_s = ceil_s(interval.as_millis() as u64);
        let left_s = bound_ms.div_ceil(1000).saturating_sub(keepalives_idle_s);
        let keepalives_count = left_s
            .div_ceil(keepalives_interval_s)
            .clamp(1, MAX_KEEPALIVE_COUNT);
        Self {
            idle_session_timeout_ms: bound_ms,
            tcp_user_timeout_ms: bound_ms,
            keepalives_idle_s,
            keepalives_interval_s,
            keepalives_count,
        }
    }
}

/// The bounds as the server reports them on the lock session right after the grant; `None`
/// for a setting the server does not have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AppliedBounds {
    pub(crate) idle_session_timeout: Option<String>,
    pub(crate) tcp_user_timeout: Option<String>,
    pub(crate) keepalives_idle: Option<String>,
    pub(crate) keepalives_interval: Option<String>,
    pub(crate) keepalives_count: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_server_side_tcp_bound_is_shorter_than_four_intervals() {
        for interval in [
            Duration::from_millis(10),
            Duration::from_millis(200),
            Duration::from_secs(5),
            Duration::from_secs(3600),
            Duration::from_secs(3 * 3600),
            crate::MAX_CHECK_INTERVAL,
        ] {
            let b = SessionBounds::for_interval(interval);
            let four = (4 * interval).as_millis() as u64;
            assert_eq!(b.idle_session_timeout_ms, four);
            assert_eq!(b.tcp_user_timeout_ms, four);
            assert!(b.tcp_user_timeout_ms <= i32::MAX as u64, "{interval:?}");
            let keepalive_ms =
                (b.keepalives_idle_s + b.keepalives_interval_s * b.keepalives_count) * 1000;
            assert!(keepalive_ms >= four, "{interval:?}: {b:?}");
            assert!(b.keepalives_idle_s * 1000 >= four.min(MAX_KEEPALIVE_S * 1000));
            assert!(
                (1..=MAX_KEEPALIVE_S).contains(&b.keepalives_idle_s),
                "{b:?}"
            );
            assert!(
                (1..=MAX_KEEPALIVE_S).contains(&b.keepalives_interval_s),
                "{b:?}"
            );
            assert!(
                (1..=MAX_KEEPALIVE_COUNT).contains(&b.keepalives_count),
                "{b:?}"
            );
        }
    }
}
