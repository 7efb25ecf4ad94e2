//! Helpers shared by the background-plane tests (`ticker`, `while_leader`, `readiness`, `gate`,
//! `supervisor`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The period of the paused-time tests.
pub const P: Duration = Duration::from_millis(100);

/// Sets its flag to false when dropped: shows that a loop or a worker was stopped.
pub struct Running(pub Arc<AtomicBool>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
