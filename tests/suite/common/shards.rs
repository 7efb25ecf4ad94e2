//! Members of a group of shards as tasks, and a monitor that watches every shard's owners.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use pg_elector::Error;
use pg_elector::shards::{Shards, ShardsBuilder};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One member: a group handle whose `run` is a task.
pub struct Member {
    pub shards: Shards,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), Error>>,
}

impl Member {
    pub fn start(pool: Pool, group: &str, count: u32, interval: Duration) -> Self {
        Self::run(
            Shards::builder(pool, group, count)
                .check_interval(interval)
                .build()
                .expect("valid group"),
        )
    }

    pub fn build(builder: ShardsBuilder) -> Self {
        Self::run(builder.build().expect("valid group"))
    }

    /// Like [`Member::run`], with every event of its `run` recorded in `capture`.
    pub fn run_captured(builder: ShardsBuilder, capture: &super::capture::Capture) -> Self {
        use tracing::instrument::WithSubscriber;
        let shards = builder.build().expect("valid group");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            {
                let (shards, shutdown) = (shards.clone(), shutdown.clone());
                async move { shards.run(shutdown).await }
            }
            .with_subscriber(capture.dispatch()),
        );
        Self {
            shards,
            shutdown,
            task,
        }
    }

    pub fn run(shards: Shards) -> Self {
        let shutdown = CancellationToken::new();
        let task = shards.spawn(shutdown.clone());
        Self {
            shards,
            shutdown,
            task,
        }
    }

    /// A graceful leave: cancels the shutdown token and waits for `run` to return.
    pub async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.task.await.expect("run does not panic")
    }

    /// A crash as the server sees it: `run` is dropped, its session closed without an unlock.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// What a monitor saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Samples in which a shard had two owners: (shard, owners).
    pub two_owners: Vec<(u32, usize)>,
    /// The longest time any shard had no owner, after the first time all were owned.
    pub longest_unowned: Duration,
    /// Samples taken.
    pub samples: u64,
}

/// Samples every member's `is_owner` for every shard every millisecond.
pub struct Monitor {
    members: Arc<Mutex<Vec<Shards>>>,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Monitor {
    pub fn start(count: u32) -> Self {
        let members: Arc<Mutex<Vec<Shards>>> = Arc::default();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (members, seen, stop) = (members.clone(), seen.clone(), stop.clone());
            async move {
                let mut unowned_since: Vec<Option<Instant>> = vec![None; count as usize];
                let mut all_owned_once = false;
                while !stop.is_cancelled() {
                    let handles = members.lock().unwrap().clone();
                    let now = Instant::now();
                    {
                        let mut s = seen.lock().unwrap();
                        s.samples += 1;
                        let mut owned_all = true;
                        for index in 0..count {
                            let owners = handles
                                .iter()
                                .filter(|m| m.shard(index).is_some_and(|id| m.is_owner(id)))
                                .count();
                            if owners > 1 {
                                s.two_owners.push((index, owners));
                            }
                            let since = &mut unowned_since[index as usize];
                            if owners == 0 {
                                owned_all = false;
                                let start = *since.get_or_insert(now);
                                if all_owned_once {
                                    s.longest_unowned = s.longest_unowned.max(now - start);
                                }
                            } else {
                                *since = None;
                            }
                        }
                        all_owned_once |= owned_all;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
        Self {
            members,
            seen,
            stop,
            task,
        }
    }

    pub fn watch(&self, shards: &Shards) {
        self.members.lock().unwrap().push(shards.clone());
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    pub async fn finish(self) -> Seen {
        self.stop.cancel();
        self.task.await.unwrap();
        self.seen.lock().unwrap().clone()
    }
}

/// How many shards each member owns now.
pub fn shares(members: &[&Shards]) -> Vec<usize> {
    members.iter().map(|m| m.owned().len()).collect()
}

/// Whether every shard has exactly one owner among `members`, each owning ⌊S/N⌋ or ⌈S/N⌉.
pub fn balanced(members: &[&Shards], count: u32) -> bool {
    let n = members.len();
    let (lo, hi) = (count as usize / n, (count as usize).div_ceil(n));
    let s = shares(members);
    s.iter().sum::<usize>() == count as usize && s.iter().all(|&k| k == lo || k == hi)
}

/// Waits until every one of `members` has joined (its lock session is established), which a
/// loaded machine may take a few intervals to do; the bounds of the tests count from there.
pub async fn joined(members: &[&Shards], interval: Duration) {
    let start = Instant::now();
    while !members.iter().all(|m| m.is_member()) {
        assert!(
            start.elapsed() < 10 * interval,
            "not every member joined within 10·I"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What `pg_locks` shows of `shards`' group in this session's database (read from `pg_locks`
/// and this backend's own activity, no shared catalog, so that it needs no slot of a full lock
/// table): the sessions holding any of its keys, or the shards held.
pub async fn on_server(client: &tokio_postgres::Client, shards: &Shards, what: Held) -> i64 {
    let class = shards.shard(0).unwrap().key().class();
    let count = match what {
        Held::Sessions => "count(DISTINCT pid)",
        Held::Shards => "count(*) FILTER (WHERE mode = 'ExclusiveLock')",
    };
    client
        .query_one(
            &format!(
                "SELECT {count} FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid = $1 AND objsubid = 2 AND database = \
                 (SELECT datid FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()))"
            ),
            &[&(class as u32)],
        )
        .await
        .unwrap()
        .get(0)
}

/// What [`on_server`] counts.
pub enum Held {
    Sessions,
    Shards,
}
