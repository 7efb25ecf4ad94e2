//! Work running on the leader (`do_work` calls and while-leader loops), so that a graceful
//! handover can wait for it before it gives the lock up.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use crate::sync::lock;

/// The work running now, by name.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    running: Mutex<Vec<(u64, Arc<str>)>>,
    next: AtomicU64,
    exited: Notify,
}

impl InFlight {
    /// Counts `name` as running until the guard drops.
    pub(crate) fn enter(&self, name: Arc<str>) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).push((id, name));
        Running { set: self, id }
    }

    /// Completes when nothing runs.
    ///
    /// Cancel safe.
    pub(crate) async fn drained(&self) {
        loop {
            let exited = self.exited.notified();
            tokio::pin!(exited);
            exited.as_mut().enable();
            if lock(&self.running).is_empty() {
                return;
            }
            exited.await;
        }
    }

    /// The names of what runs now.
    pub(crate) fn names(&self) -> Vec<String> {
        lock(&self.running)
            .iter()
            .map(|(_, name)| name.to_string())
            .collect()
    }
}

/// One piece of running work; dropping it says it ended.
#[derive(Debug)]
pub(crate) struct Running<'a> {
    set: &'a InFlight,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = lock(&self.set.running);
        if let Some(at) = running.iter().position(|(id, _)| *id == self.id) {
            running.swap_remove(at);
        }
        // Only the last one out wakes a drain (which waits for an empty set).
        if running.is_empty() {
            drop(running);
            self.set.exited.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn drained_waits_for_every_running_piece() {
        let set = InFlight::default();
        set.drained().await;
        let a = set.enter("a".into());
        let b = set.enter("b".into());
        assert_eq!(set.names(), ["a", "b"]);
        let waited = tokio::time::timeout(Duration::from_millis(10), set.drained()).await;
        assert!(waited.is_err(), "still running");
        drop(a);
        assert_eq!(set.names(), ["b"]);
        let (_, ()) = tokio::join!(
            async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(b);
            },
            set.drained()
        );
        assert!(set.names().is_empty());
    }
}
