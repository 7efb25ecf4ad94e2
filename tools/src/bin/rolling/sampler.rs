//! The server's side: who holds the key's exclusive advisory lock, read from `pg_locks` every
//! millisecond on a connection of its own, each change stamped with the parent's wall clock
//! (µs since the UNIX epoch) just before the read that saw it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector_testkit::TestDb;
use pg_elector_testkit::replica::unix_us;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::KEY;

const HOLDER: &str = "SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
     AND granted AND mode = 'ExclusiveLock' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND database = $3";
const NAME: &str = "SELECT application_name FROM pg_catalog.pg_stat_activity WHERE pid = $1";

/// A change of holder: from `at` on, `pid` holds the lock (`None`: nobody does).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    pub(crate) at: u64,
    pub(crate) pid: Option<i32>,
}

#[derive(Default)]
struct Seen {
    changes: Mutex<Vec<Change>>,
    /// The `application_name` of each holder, read when it first held the lock.
    names: Mutex<HashMap<i32, String>>,
    reads: AtomicU64,
}

pub(crate) struct Sampler {
    seen: Arc<Seen>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    started: u64,
}

impl Sampler {
    pub(crate) async fn start(db: &TestDb) -> Result<Self, String> {
        let client = db.connect().await.map_err(|e| e.to_string())?;
        let database: u32 = client
            .query_one(
                "SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let holder = client.prepare(HOLDER).await.map_err(|e| e.to_string())?;
        let name = client.prepare(NAME).await.map_err(|e| e.to_string())?;
        let (seen, stop) = (Arc::new(Seen::default()), CancellationToken::new());
        let task = tokio::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            async move {
                let mut every = tokio::time::interval(Duration::from_millis(1));
                every.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let (class, object) = (KEY.class() as u32, KEY.object() as u32);
                let mut last = None;
                while !stop.is_cancelled() {
                    every.tick().await;
                    let at = unix_us();
                    let Ok(row) = client
                        .query_opt(&holder, &[&class, &object, &database])
                        .await
                    else {
                        continue;
                    };
                    seen.reads.fetch_add(1, Ordering::Relaxed);
                    let pid: Option<i32> = row.map(|r| r.get(0));
                    if pid == last {
                        continue;
                    }
                    last = pid;
                    seen.changes.lock().unwrap().push(Change { at, pid });
                    let Some(pid) = pid else { continue };
                    if seen.names.lock().unwrap().contains_key(&pid) {
                        continue;
                    }
                    if let Ok(Some(row)) = client.query_opt(&name, &[&pid]).await {
                        seen.names.lock().unwrap().insert(pid, row.get(0));
                    }
                }
            }
        });
        Ok(Sampler {
            seen,
            stop,
            task,
            started: unix_us(),
        })
    }

    pub(crate) fn changes(&self) -> Vec<Change> {
        self.seen.changes.lock().unwrap().clone()
    }

    /// The holder's identity (`application_name`), or its pid if it was gone before it was read.
    pub(crate) fn name(&self, pid: i32) -> String {
        let names = self.seen.names.lock().unwrap();
        names
            .get(&pid)
            .cloned()
            .unwrap_or_else(|| format!("pid {pid}"))
    }

    /// Stops it; how many reads it made and their mean period (ms).
    pub(crate) async fn stop(self) -> (u64, f64) {
        self.stop.cancel();
        let _ = self.task.await;
        let reads = self.seen.reads.load(Ordering::Relaxed);
        let ms = (unix_us() - self.started) as f64 / 1e3;
        (reads, ms / reads.max(1) as f64)
    }
}

/// What the server showed over `[from, to]` (µs): the holders in order (identity, how long it
/// held within the window), how many times the holder changed (gaps with no holder in between
/// ignored), and how long nobody held the lock.
pub(crate) struct Holders {
    pub(crate) held: Vec<(i32, u64)>,
    pub(crate) changes: usize,
    pub(crate) none_us: u64,
}

pub(crate) fn holders(changes: &[Change], from: u64, to: u64) -> Holders {
    let before = changes.iter().take_while(|c| c.at <= from).last();
    let mut current = before.map_or(
        Change {
            at: from,
            pid: None,
        },
        |c| Change { at: from, ..*c },
    );
    let mut out = Holders {
        held: Vec::new(),
        changes: 0,
        none_us: 0,
    };
    let mut last_pid = current.pid;
    let after = changes.iter().filter(|c| c.at > from && c.at <= to);
    for next in after.copied().chain([Change { at: to, pid: None }]) {
        let span = next.at - current.at;
        match current.pid {
            Some(pid) => match out.held.last_mut() {
                Some((p, us)) if *p == pid => *us += span,
                _ => out.held.push((pid, span)),
            },
            None => out.none_us += span,
        }
        if let Some(pid) = next.pid {
            if last_pid.is_some_and(|l| l != pid) {
                out.changes += 1;
            }
            last_pid = Some(pid);
        }
        current = next;
    }
    out
}
