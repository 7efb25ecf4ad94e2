//! The per-shard launcher: one self-paced loop for every shard this replica owns.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{ShardId, Shards};
use crate::Term;
use crate::background::{Probe, Readiness, WhileLeader};

/// Runs a self-paced loop for each shard this replica owns: started when the shard is gained,
/// stopped when it moves or the replica leaves, and drained before the shard is unlocked.
///
/// It is a [`WhileLeader`] per shard (named `<name>/<index>` in the log), on the shard's
/// [`elector`](Shards::elector), so it stops a loop exactly as a while-leader loop is
/// stopped: a shard handed to another member, or the group's shutdown, ends the shard's term
/// gracefully, and the loop may run on for the drain timeout while the shard stays locked; a
/// lost session ends it at once (or after the [grace](Self::stop_grace)). For a per-shard
/// ticker, run a [`LeaderTicker`](crate::background::LeaderTicker) on each shard's elector
/// the same way.
///
/// **Readiness**, with [`readiness`](Self::readiness): one probe per shard, named as its loop.
/// A shard this replica does not own passes (it runs nothing here), and a shard that moved
/// away clears its failure when its loop sees it gone, as a demoted leader's probe does; so
/// a failing shard fails `/readyz` only on the replica that owns it, never on the others.
///
/// ```no_run
/// use pg_elector::shards::{ShardLoops, Shards};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(shards: Shards, shutdown: CancellationToken) {
/// ShardLoops::new("reconcile", &shards)
///     .run(shutdown, |shard, term| async move {
///         while term.is_leader() {
///             // ... reconcile one batch of shard.index()'s tenants ...
///             tokio::select! {
///                 _ = term.cancelled() => {}
///                 _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
///             }
///         }
///         Ok::<_, std::io::Error>(())
///     })
///     .await;
/// # }
/// ```
pub struct ShardLoops {
    name: String,
    shards: Shards,
    grace: Duration,
    probes: Option<Vec<Probe>>,
}

impl ShardLoops {
    /// A launcher for the loop `name` on every shard of `shards`.
    pub fn new(name: impl Into<String>, shards: &Shards) -> Self {
        Self {
            name: name.into(),
            shards: shards.clone(),
            grace: Duration::ZERO,
            probes: None,
        }
    }

    /// Adds one probe per shard to `readiness` (named `<name>/<index>`), each reporting its
    /// shard's loop as a [`WhileLeader`]'s probe does. Default: no probes.
    pub fn readiness(mut self, readiness: &Readiness) -> Self {
        let probes = self
            .shards
            .all()
            .map(|shard| readiness.probe(self.loop_name(shard)))
            .collect();
        self.probes = Some(probes);
        self
    }

    fn loop_name(&self, shard: ShardId) -> String {
        format!("{}/{shard}", self.name)
    }

    /// How long a loop may keep running after its shard's session was lost, as
    /// [`WhileLeader::stop_grace`]. Default zero.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs the loop on every owned shard until `shutdown` is cancelled; `run_loop` is called
    /// once per shard term, with the shard and its term.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops every loop at once (their tasks are aborted).
    pub async fn run<F, Fut, E>(&self, shutdown: CancellationToken, run_loop: F)
    where
        F: Fn(ShardId, Term) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let mut loops = JoinSet::new();
        for shard in self.shards.all() {
            let Some(elector) = self.shards.elector(shard) else {
                continue;
            };
            let mut launcher =
                WhileLeader::new(self.loop_name(shard), elector).stop_grace(self.grace);
            if let Some(probe) = self
                .probes
                .as_ref()
                .and_then(|p| p.get(shard.index() as usize))
            {
                launcher = launcher.probe(probe);
            }
            let (run_loop, shutdown) = (run_loop.clone(), shutdown.clone());
            loops.spawn(async move {
                launcher
                    .run(shutdown, move |term| run_loop(shard, term))
                    .await
            });
        }
        while loops.join_next().await.is_some() {}
    }
}

impl fmt::Debug for ShardLoops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardLoops")
            .field("name", &self.name)
            .field("group", &self.shards.group())
            .finish_non_exhaustive()
    }
}
