//! A primary with a streaming standby (the harness's [`Cluster`]), started for a test.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Metrics, Pool, RecyclingMethod, Runtime};
pub use pg_elector_testkit::server::failover::{Cluster, Follow};
use tokio_postgres::NoTls;

use super::init_tracing;

/// A primary with a fresh database and a standby copied from it, followed as `follow` says;
/// with `synchronous`, commits on the primary wait for the standby.
pub async fn cluster(follow: Follow, synchronous: bool) -> Cluster {
    init_tracing();
    Cluster::start(follow, synchronous)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Every step of every borrow from the pools [`Borrows::pool`] makes, as deadpool's hooks see
/// it: which connection (by the instant it was made) was looked at, handed out again, or made
/// for a borrow. With `RecyclingMethod::Fast` a pooled connection is looked at and then handed
/// out, unless it is closed: then it is dropped and the next one is looked at.
#[derive(Clone, Default)]
pub struct Borrows(Arc<Mutex<Vec<Borrow>>>);

/// One step of a borrow.
#[derive(Clone, Copy, Debug)]
pub struct Borrow {
    pub step: Step,
    /// When the step ran.
    pub at: Instant,
    /// When the connection was made: it names the connection.
    pub made: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A pooled connection taken out to be recycled (`pre_recycle`).
    Looked,
    /// A pooled connection handed out again (`post_recycle`).
    Reused,
    /// A new connection made and handed out (`post_create`).
    Made,
}

impl Borrows {
    /// A pool of `size` connections made with `cluster`'s [`config`](Cluster::config), recycled
    /// as the harness's pools are (`RecyclingMethod::Fast`), whose borrows are recorded here.
    pub fn pool(&self, cluster: &Cluster, size: usize) -> Pool {
        let manager = Manager::from_config(
            cluster.config(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .pre_recycle(self.hook(Step::Looked))
            .post_recycle(self.hook(Step::Reused))
            .post_create(self.hook(Step::Made))
            .build()
            .unwrap()
    }

    fn hook(&self, step: Step) -> Hook {
        let borrows = self.clone();
        Hook::sync_fn(move |_, metrics: &Metrics| {
            borrows.0.lock().unwrap().push(Borrow {
                step,
                at: Instant::now(),
                made: metrics.created,
            });
            Ok(())
        })
    }

    /// The steps `step` that ran at or after `from` on connections made before `before`, one
    /// per connection and step.
    pub fn of_old(&self, step: Step, before: Instant, from: Instant) -> Vec<Borrow> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b.step == step && b.made < before && b.at >= from)
            .copied()
            .collect()
    }

    /// The first connection handed out (reused or made) at or after `from`.
    pub fn first_handed_out(&self, from: Instant) -> Option<Borrow> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|b| b.step != Step::Looked && b.at >= from)
            .copied()
    }
}
