//! The local lease: leadership as seen by `is_leader` expires on the replica's own clock.
//!
//! The server cannot free the lock before the lock session has been silent for
//! `idle_session_timeout` (4 × interval) after the last check. The lease therefore ends at the
//! send time of the last successful check plus 4 × interval minus a margin of one interval.
//! A process frozen past that point (SIGSTOP, a long pause, a suspended machine) reads its
//! lease as expired the moment it resumes, before the election loop has had a chance to run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// No lease: the replica does not lead.
const NONE: u64 = 0;
/// A lease that never expires (the local, database-free modes).
const FOREVER: u64 = u64::MAX;

/// The deadline of the current lease, in milliseconds of [`now_ms`].
#[derive(Debug, Default)]
pub(crate) struct Lease {
    deadline: AtomicU64,
}

impl Lease {
    /// Whether the lease is held and not expired: one atomic load, plus one clock read on a
    /// leader whose lease can expire.
    #[inline]
    pub(crate) fn is_live(&self) -> bool {
        match self.deadline.load(Ordering::Acquire) {
            NONE => false,
            FOREVER => true,
            deadline => now_ms() < deadline,
        }
    }

    /// Holds the lease until `deadline` (from [`deadline_after`]).
    pub(crate) fn hold_until(&self, deadline: u64) {
        self.deadline.store(deadline.max(1), Ordering::Release);
    }

    /// Holds a lease that does not expire.
    pub(crate) fn hold_forever(&self) {
        self.deadline.store(FOREVER, Ordering::Release);
    }

    /// Drops the lease.
    pub(crate) fn clear(&self) {
        self.deadline.store(NONE, Ordering::Release);
    }
}

/// The stand-in for "however long": a bound or a cooldown too long for the clock is a
/// century, which no process outlives.
pub(crate) const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The tokio instant `after` from `now`, or a century from it when that is past the clock's
/// range (`Duration::MAX`: "wait however long").
pub(crate) fn instant_after(now: tokio::time::Instant, after: Duration) -> tokio::time::Instant {
    now.checked_add(after).unwrap_or(now + CENTURY)
}

/// The deadline `after` from `start` (a reading of [`now_ms`]).
pub(crate) fn deadline_after(start: u64, after: Duration) -> u64 {
    start.saturating_add(after.as_millis().try_into().unwrap_or(u64::MAX))
}

/// Milliseconds on a clock that keeps counting while the machine is suspended.
///
/// Linux: `CLOCK_BOOTTIME` (read through the vDSO). Elsewhere, or on a kernel or sandbox that
/// refuses `CLOCK_BOOTTIME`: the monotonic clock behind `std::time::Instant`, which on some
/// platforms stops during suspend.
#[cfg(target_os = "linux")]
#[inline]
pub(crate) fn now_ms() -> u64 {
    use rustix::time::{DynamicClockId, clock_gettime_dynamic};
    match clock_gettime_dynamic(DynamicClockId::Boottime) {
        Ok(t) => (t.tv_sec as u64) * 1000 + (t.tv_nsec as u64) / 1_000_000,
        Err(_) => monotonic_ms(),
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn now_ms() -> u64 {
    monotonic_ms()
}

#[cfg_attr(target_os = "linux", cold)]
fn monotonic_ms() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // Start at 1 s so that a reading is never the NONE sentinel.
    1000 + EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lives_until_its_deadline() {
        let lease = Lease::default();
        assert!(!lease.is_live(), "no lease at first");
        lease.hold_until(deadline_after(now_ms(), Duration::from_secs(60)));
        assert!(lease.is_live());
        lease.hold_until(now_ms().saturating_sub(1));
        assert!(!lease.is_live(), "a deadline in the past has expired");
        lease.hold_forever();
        assert!(lease.is_live());
        lease.clear();
        assert!(!lease.is_live());
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ms();
        std::thread::sleep(Duration::from_millis(20));
        let b = now_ms();
        assert!(b >= a + 15, "{a} then {b}");
    }
}
