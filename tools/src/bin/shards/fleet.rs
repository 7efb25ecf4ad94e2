//! The replica processes and what they report: who owns which shard, as `is_owner` says it.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector_testkit::replica::unix_us;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::{CHILD_FLAG, ENV_COUNT, ENV_ELECTORS, ENV_INTERVAL_MS, ENV_URL, MARK};

/// One ownership change a child reported: (child, shard, gained, µs).
pub(crate) type Change = (usize, u32, bool, u64);

/// What every child reported.
#[derive(Default)]
pub(crate) struct Reports {
    pub(crate) changes: Vec<Change>,
    /// (child, µs) of each child's `joined` line.
    pub(crate) joined: Vec<(usize, u64)>,
    /// Children whose electors run (the old way).
    pub(crate) up: usize,
    /// The current owners of each shard, by child.
    pub(crate) owners: Vec<Vec<usize>>,
    /// Killed children, whose late lines are ignored.
    dead: Vec<usize>,
}

/// A running replica process.
pub(crate) struct Proc {
    pub(crate) index: usize,
    pub(crate) pid: i32,
    child: Child,
    stdin: ChildStdin,
}

pub(crate) struct Fleet {
    pub(crate) url: String,
    pub(crate) count: u32,
    pub(crate) interval: Duration,
    pub(crate) procs: Vec<Proc>,
    pub(crate) reports: Arc<Mutex<Reports>>,
    next: usize,
}

impl Fleet {
    pub(crate) fn new(url: String, count: u32, interval: Duration) -> Self {
        let reports = Reports {
            owners: vec![Vec::new(); count as usize],
            ..Reports::default()
        };
        Self {
            url,
            count,
            interval,
            procs: Vec::new(),
            reports: Arc::new(Mutex::new(reports)),
            next: 0,
        }
    }

    /// Starts one more replica process: a member, or (`electors`) 1 024 electors the old way.
    pub(crate) fn spawn(&mut self, electors: bool) -> usize {
        let index = self.next;
        self.next += 1;
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .arg(CHILD_FLAG)
            .env(ENV_URL, &self.url)
            .env(ENV_COUNT, self.count.to_string())
            .env(ENV_INTERVAL_MS, self.interval.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if electors {
            command.env(ENV_ELECTORS, "1");
        } else {
            command.env_remove(ENV_ELECTORS);
        }
        let mut child = command.spawn().expect("start a replica process");
        let pid = child.id().expect("a running child") as i32;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let reports = self.reports.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.strip_prefix(MARK) {
                    record(&reports, index, rest);
                }
            }
        });
        self.procs.push(Proc {
            index,
            pid,
            child,
            stdin,
        });
        index
    }

    /// SIGKILLs the process at `at` in `procs`; returns its index and the kill's µs. Its
    /// shards are no longer its own from then on, as far as `is_owner` can tell.
    pub(crate) async fn kill(&mut self, at: usize) -> (usize, u64) {
        let mut proc = self.procs.remove(at);
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(proc.pid).expect("a pid"),
            rustix::process::Signal::KILL,
        );
        let killed_at = unix_us();
        let _ = proc.child.wait().await;
        // The lines it wrote before it died are still in the pipe.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut reports = self.reports.lock().unwrap();
        reports.dead.push(proc.index);
        for shard in 0..self.count {
            if reports.owners[shard as usize].contains(&proc.index) {
                reports.changes.push((proc.index, shard, false, killed_at));
                reports.owners[shard as usize].retain(|&c| c != proc.index);
            }
        }
        (proc.index, killed_at)
    }

    /// Asks the process at `at` to leave gracefully and waits for it; returns its index and
    /// when it was asked.
    pub(crate) async fn leave(&mut self, at: usize) -> (usize, u64) {
        let mut proc = self.procs.remove(at);
        let asked = unix_us();
        let _ = proc.stdin.write_all(b"leave\n").await;
        let _ = proc.stdin.flush().await;
        let _ = tokio::time::timeout(Duration::from_secs(30), proc.child.wait()).await;
        (proc.index, asked)
    }

    /// Stops every process gracefully.
    pub(crate) async fn stop_all(&mut self) {
        while !self.procs.is_empty() {
            self.leave(0).await;
        }
    }

    /// Whether every shard has exactly one owner among the running processes, each owning
    /// ⌊S/N⌋ or ⌈S/N⌉.
    pub(crate) fn balanced(&self) -> bool {
        let n = self.procs.len();
        if n == 0 {
            return false;
        }
        let reports = self.reports.lock().unwrap();
        let mut per = vec![0usize; self.next];
        for owners in &reports.owners {
            if owners.len() != 1 {
                return false;
            }
            per[owners[0]] += 1;
        }
        let (lo, hi) = (self.count as usize / n, (self.count as usize).div_ceil(n));
        self.procs.iter().all(|p| (lo..=hi).contains(&per[p.index]))
    }

    /// The owner of each shard now (`usize::MAX` for none).
    pub(crate) fn owner_map(&self) -> Vec<usize> {
        let reports = self.reports.lock().unwrap();
        reports
            .owners
            .iter()
            .map(|o| o.first().copied().unwrap_or(usize::MAX))
            .collect()
    }

    /// Polls `cond` every 5 ms until it holds (returning the µs it first held) or `limit` passes.
    pub(crate) async fn until(&self, limit: Duration, cond: impl Fn(&Self) -> bool) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if cond(self) {
                return Some(unix_us());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }
}

fn record(reports: &Mutex<Reports>, child: usize, line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut r = reports.lock().unwrap();
    if r.dead.contains(&child) {
        return;
    }
    match words.as_slice() {
        ["joined", us] => r.joined.push((child, us.parse().unwrap_or(0))),
        ["up"] => r.up += 1,
        [kind @ ("gain" | "lose"), shard, us] => {
            let (Ok(shard), Ok(us)) = (shard.parse::<u32>(), us.parse::<u64>()) else {
                return;
            };
            let gained = *kind == "gain";
            r.changes.push((child, shard, gained, us));
            let owners = &mut r.owners[shard as usize];
            owners.retain(|&c| c != child);
            if gained {
                owners.push(child);
            }
        }
        _ => {}
    }
}

/// The total time, over every shard, during which two processes said they owned it (µs).
pub(crate) fn two_owner_us(changes: &[Change], count: u32) -> u64 {
    let mut total = 0;
    for shard in 0..count {
        let mut events: Vec<(u64, i64)> = changes
            .iter()
            .filter(|c| c.1 == shard)
            .map(|c| (c.3, if c.2 { 1 } else { -1 }))
            .collect();
        // Ends before starts at the same µs: a handover within one µs is not an overlap.
        events.sort_by_key(|&(us, d)| (us, d));
        let (mut owners, mut since) = (0i64, 0u64);
        for (us, d) in events {
            if owners >= 2 {
                total += us - since;
            }
            owners += d;
            since = us;
        }
    }
    total
}
