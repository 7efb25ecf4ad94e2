//! The drains of a member's moved shards: one task each, which waits for the shard's work (up
//! to the drain timeout) and then ends its term's fence grace, before the member unlocks the
//! shard.
//!
//! # Invariants
//!
//! - Every task spawned here comes back from [`Drains::next`] with its shard, whether it ran to
//!   its end, panicked or was aborted, so that no shard stays draining (never unlocked, never
//!   tried again) until the session is lost.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinError, JoinSet};

/// The drains under way.
#[derive(Debug, Default)]
pub(super) struct Drains {
    tasks: JoinSet<()>,
    /// The shard of each task, by the task's id (which a failed task's error still carries).
    shards: HashMap<Id, u32>,
}

/// A drain that ended.
#[derive(Debug)]
pub(super) struct Drained {
    pub(super) shard: u32,
    /// Why the task did not run to its end (it panicked or was aborted); `None` when it did.
    pub(super) failure: Option<JoinError>,
}

impl Drains {
    /// Runs `drain`, the drain of `shard`, as a task of its own.
    pub(super) fn spawn<F>(&mut self, shard: u32, drain: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = self.tasks.spawn(drain);
        self.shards.insert(task.id(), shard);
    }

    /// The next drain that ended, however it ended; `None` while none is under way.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a drain that ends while this future is dropped is returned by the next call.
    pub(super) async fn next(&mut self) -> Option<Drained> {
        let (id, failure) = match self.tasks.join_next_with_id().await? {
            Ok((id, ())) => (id, None),
            Err(e) => (e.id(), Some(e)),
        };
        let shard = self.shards.remove(&id)?;
        Some(Drained { shard, failure })
    }

    /// The drains that have ended by now, without waiting for the others.
    pub(super) fn ended(&mut self) -> Vec<Drained> {
        let mut ended = Vec::new();
        while let Some(joined) = self.tasks.try_join_next_with_id() {
            let (id, failure) = match joined {
                Ok((id, ())) => (id, None),
                Err(e) => (e.id(), Some(e)),
            };
            if let Some(shard) = self.shards.remove(&id) {
                ended.push(Drained { shard, failure });
            }
        }
        ended
    }

    /// Aborts every drain and forgets them (the member's session is gone, or it leaves with
    /// every shard at once).
    pub(super) fn abort_all(&mut self) {
        // Dropping the set aborts its tasks.
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_that_panics_still_gives_its_shard_back() {
        let mut drains = Drains::default();
        assert!(drains.next().await.is_none(), "none under way");
        drains.spawn(3, async { panic!("a drain that fails") });
        let drained = drains.next().await.expect("the failed drain comes back");
        assert_eq!(drained.shard, 3);
        assert!(drained.failure.is_some_and(|e| e.is_panic()));
        drains.spawn(5, async {});
        let drained = drains.next().await.expect("the drain comes back");
        assert_eq!(drained.shard, 5);
        assert!(drained.failure.is_none());
        assert!(drains.next().await.is_none(), "none left");
    }

    #[tokio::test]
    async fn the_drains_ended_by_now_come_together_the_others_stay() {
        let mut drains = Drains::default();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        drains.spawn(1, async {});
        drains.spawn(2, async { panic!("a drain that fails") });
        drains.spawn(3, async {
            let _ = released.await;
        });
        let first = drains.next().await.expect("one has ended");
        tokio::task::yield_now().await;
        let mut ended: Vec<u32> = std::iter::once(first)
            .chain(drains.ended())
            .map(|d| d.shard)
            .collect();
        ended.sort_unstable();
        assert_eq!(
            ended,
            [1, 2],
            "the two that ended, the failed one with them"
        );
        assert!(drains.ended().is_empty(), "the third still drains");
        release.send(()).unwrap();
        assert_eq!(drains.next().await.map(|d| d.shard), Some(3));
    }

    #[tokio::test]
    async fn aborted_drains_are_forgotten() {
        let mut drains = Drains::default();
        drains.spawn(1, std::future::pending());
        drains.abort_all();
        assert!(drains.next().await.is_none());
    }
}
