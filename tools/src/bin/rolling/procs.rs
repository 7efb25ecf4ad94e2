//! The replica processes as the parent sees them: started one at a time, stopped oldest first
//! with SIGTERM, and what each said on stdout.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector_testkit::replica::for_each_line;
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, ChildStdin, Command};

use crate::CHILD_FLAG;
use crate::child::{
    ENV_FAST, ENV_INTERVAL_US, ENV_NAME, ENV_PREFERENCE, ENV_SHARDS, ENV_URL, MARK,
};

/// What a replica said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    Started,
    Leader,
    Standby,
    Member,
    Gain(u32),
    Lose(u32),
    Exited,
}

/// One line of one replica: µs since the UNIX epoch, by the replica's clock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) child: usize,
    pub(crate) at: u64,
    pub(crate) what: What,
}

fn parse(child: usize, line: &str) -> Option<Event> {
    let mut words = line.strip_prefix(MARK)?.split_whitespace();
    let at = words.next()?.parse().ok()?;
    let word = words.next()?;
    let shard = words.next().and_then(|s| s.parse().ok());
    let what = match word {
        "started" => What::Started,
        "leader" => What::Leader,
        "standby" => What::Standby,
        "member" => What::Member,
        "gain" => What::Gain(shard?),
        "lose" => What::Lose(shard?),
        "exited" => What::Exited,
        _ => return None,
    };
    Some(Event { child, at, what })
}

/// What every replica of a part gets.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) url: String,
    pub(crate) interval: Duration,
    /// Each replica's preference is its version.
    pub(crate) pref: bool,
    pub(crate) fast: bool,
    /// Members of a group of this many shards instead of electors.
    pub(crate) shards: Option<u32>,
}

struct Replica {
    index: usize,
    pid: Pid,
    child: Child,
    /// Kept open: the replica ends when it closes.
    _stdin: ChildStdin,
}

/// The replicas of one part.
pub(crate) struct Procs {
    spec: Spec,
    /// The live replicas, oldest first.
    live: VecDeque<Replica>,
    /// Every replica's version and name, by index.
    pub(crate) versions: Vec<u64>,
    pub(crate) names: Vec<String>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Procs {
    /// The replicas run with fast takeover.
    pub(crate) fn fast(&self) -> bool {
        self.spec.fast
    }

    pub(crate) fn new(spec: Spec) -> Self {
        Procs {
            spec,
            live: VecDeque::new(),
            versions: Vec::new(),
            names: Vec::new(),
            events: Arc::default(),
        }
    }

    /// Starts a replica of `version`, named `v<version>-r<index>`; returns its index.
    pub(crate) fn spawn(&mut self, version: u64) -> usize {
        let index = self.names.len();
        let name = format!("v{version}-r{index}");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .arg(CHILD_FLAG)
            .env(ENV_URL, &self.spec.url)
            .env(ENV_NAME, &name)
            .env(ENV_INTERVAL_US, self.spec.interval.as_micros().to_string())
            .env_remove(ENV_PREFERENCE)
            .env_remove(ENV_FAST)
            .env_remove(ENV_SHARDS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if self.spec.pref {
            command.env(ENV_PREFERENCE, version.to_string());
        }
        if self.spec.fast {
            command.env(ENV_FAST, "1");
        }
        if let Some(count) = self.spec.shards {
            command.env(ENV_SHARDS, count.to_string());
        }
        let mut child = command.spawn().expect("start a replica process");
        let pid = Pid::from_raw(child.id().expect("a running child") as i32).expect("a pid");
        let events = self.events.clone();
        for_each_line(child.stdout.take().expect("piped stdout"), move |line| {
            if let Some(event) = parse(index, &line) {
                events.lock().unwrap().push(event);
            }
        });
        let stdin = child.stdin.take().expect("piped stdin");
        self.live.push_back(Replica {
            index,
            pid,
            child,
            _stdin: stdin,
        });
        self.versions.push(version);
        self.names.push(name);
        index
    }

    /// The live replicas' indices, oldest first.
    pub(crate) fn live(&self) -> Vec<usize> {
        self.live.iter().map(|r| r.index).collect()
    }

    /// SIGTERMs the oldest live replica and waits for it to exit and say `exited`; returns its
    /// index.
    pub(crate) async fn stop_oldest(&mut self) -> Result<usize, String> {
        let mut replica = self.live.pop_front().ok_or("no live replica")?;
        let name = &self.names[replica.index];
        kill_process(replica.pid, Signal::TERM).map_err(|e| format!("SIGTERM {name}: {e}"))?;
        let limit = 10 * self.spec.interval + Duration::from_secs(30);
        match tokio::time::timeout(limit, replica.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => return Err(format!("{name} exited with {status}")),
            Ok(Err(e)) => return Err(format!("{name}: {e}")),
            Err(_) => return Err(format!("{name} did not exit within {limit:?} of SIGTERM")),
        }
        let index = replica.index;
        // Its last lines may still be in the pipe.
        self.until(Duration::from_secs(5), |events| {
            events
                .iter()
                .any(|e| e.child == index && e.what == What::Exited)
                .then_some(())
        })
        .await
        .ok_or_else(|| format!("{name} exited without saying so"))?;
        Ok(index)
    }

    /// Stops every live replica, oldest first; errors are ignored (the processes are killed
    /// when dropped).
    pub(crate) async fn stop_all(&mut self) {
        while !self.live.is_empty() {
            let _ = self.stop_oldest().await;
        }
    }

    /// Everything the replicas said so far, in arrival order.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Polls `found` on the events every 5 ms until it finds something or `limit` passes.
    pub(crate) async fn until<T>(
        &self,
        limit: Duration,
        found: impl Fn(&[Event]) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(t) = found(&self.events.lock().unwrap()) {
                return Some(t);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
