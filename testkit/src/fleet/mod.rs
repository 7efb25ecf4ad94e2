//! Replicas as real processes, shared by `tests/processes.rs` and the tools' `failover` (the
//! `replica` feature).
//!
//! Each replica is the running binary started again (as an ignored test, or with
//! `--replica`: the binary decides how it enters [`child`]), with its settings in the
//! environment. It runs one elector and a leader ticker and prints every transition and tick on
//! stdout with a timestamp (µs since the UNIX epoch, so that the parent can compare it with its
//! own clock):
//!
//! ```text
//! @replica 1732900000123456 started
//! @replica 1732900000125000 leader
//! @replica 1732900000145000 tick
//! @replica 1732900000190000 standby
//! ```
//!
//! A watcher thread in the child reads `is_leader()` every millisecond, so a transition is
//! stamped at most about 1 ms after it happened. A `tick` is stamped when `do_work` is called,
//! before it looks at leadership.
//!
//! When the watcher finds that more than [`WOKE_GAP_US`] passed since its previous read (the
//! process was stopped, or starved), it first says what that first read found, stamped just
//! before the read: `woke leader` or `woke standby` (then the transition, if any, as usual).
//! So a parent that SIGSTOPs a leader can tell whether it still led when it ran again.
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pg_elector::LockKey;
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

/// The connection URL of the replica's database.
pub const ENV_URL: &str = "PG_ELECTOR_REPLICA_URL";
/// The address to connect to instead of the URL's (a fault proxy), if set.
pub const ENV_ADDR: &str = "PG_ELECTOR_REPLICA_ADDR";
/// The lock key, as `class,object`.
pub const ENV_KEY: &str = "PG_ELECTOR_REPLICA_KEY";
/// The check interval I in milliseconds.
pub const ENV_INTERVAL_MS: &str = "PG_ELECTOR_REPLICA_INTERVAL_MS";
/// The replica's name (`replica-<n>`), also its elector's identity.
pub const ENV_NAME: &str = "PG_ELECTOR_REPLICA_NAME";
/// Set: the elector fences, and each tick writes one fenced row into `replica_writes`
/// (`replica text, epoch bigint, at timestamptz DEFAULT clock_timestamp()`), which the parent
/// creates.
pub const ENV_FENCED: &str = "PG_ELECTOR_REPLICA_FENCED";
/// Set to a period in ms: the replica also runs a schedule with one job, `tick`, every that
/// period (`CatchUp::All`), each run logged into `job_log` (`job text, due timestamptz,
/// replica text, kind text`), which the parent creates.
pub const ENV_JOB_MS: &str = "PG_ELECTOR_REPLICA_JOB_MS";
/// Set: the elector runs with fast takeover.
pub const ENV_FAST: &str = "PG_ELECTOR_REPLICA_FAST";
/// The elector's preference (see `ElectorBuilder::preference`); unset: none.
pub const ENV_PREFERENCE: &str = "PG_ELECTOR_REPLICA_PREFERENCE";
const MARK: &str = "@replica ";
/// A gap between two reads of the watcher (µs) after which it says `woke …`.
pub const WOKE_GAP_US: u64 = 100_000;

/// µs since the UNIX epoch.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as u64
}

/// `d` in whole µs.
pub fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

// ---------------------------------------------------------------------------------------------
// The child: one replica.

/// Logs this process's tracing events on stderr, plain text, filtered by `RUST_LOG` or else
/// by `default_filter`: what a replica process does first, so that its parent reads its lines.
pub fn log_to_stderr(default_filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

/// Spawns a task that hands every line of `reader` (a child's stdout or stderr) to `each`,
/// until its end or a read error.
pub fn for_each_line<R>(reader: R, mut each: impl FnMut(String) + Send + 'static)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            each(line);
        }
    });
}

mod child;

/// Whether this process is a replica that a [`Fleet`] started (its settings are in the
/// environment): what the ignored test that enters [`child_with`] checks first.
pub fn is_child() -> bool {
    std::env::var(ENV_URL).is_ok()
}

pub use child::{child, child_with};
#[cfg(feature = "protocol")]
pub use child::{key_setting, ms_setting, on_current_thread, setting};

// ---------------------------------------------------------------------------------------------
// The parent: a fleet of replica processes and what they said.

/// What a replica said (or the parent did to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// The process is up, its elector built.
    Started,
    /// `is_leader()` turned true.
    Leader,
    /// `is_leader()` turned false.
    Standby,
    /// The leader ticker called `do_work`.
    Tick,
    /// The elector's run returned after a graceful shutdown.
    Exited,
    /// Not said by the child: the parent SIGKILLed it at this time.
    Killed,
    /// The watcher's first read after a gap longer than 100 ms (a stopped or starved
    /// process), and whether it found the replica leading. Not a transition.
    Woke {
        /// Whether that read found it leading.
        leading: bool,
    },
}

/// One event of one replica.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// The replica's index in its [`Fleet`].
    pub replica: usize,
    /// µs since the UNIX epoch.
    pub at: u64,
    /// What happened.
    pub what: What,
}

/// Parses one stdout line of replica `replica`; `None` for any other line.
pub fn parse(replica: usize, line: &str) -> Option<Event> {
    let rest = &line[line.find(MARK)? + MARK.len()..];
    let mut words = rest.split_whitespace();
    let at = words.next()?.parse().ok()?;
    let what = match words.next()? {
        "started" => What::Started,
        "leader" => What::Leader,
        "standby" => What::Standby,
        "tick" => What::Tick,
        "exited" => What::Exited,
        "woke" => What::Woke {
            leading: words.next()? == "leader",
        },
        _ => return None,
    };
    Some(Event { replica, at, what })
}

/// What every replica said, in arrival order, and a signal for waiters.
#[derive(Debug, Default)]
pub struct Board {
    /// Every event, in arrival order.
    pub events: Mutex<Vec<Event>>,
    /// Every stderr line, as `replica-<n>: <line>`.
    pub logs: Mutex<Vec<String>>,
    /// Bumped at every event.
    pub version: watch::Sender<u64>,
}

impl Board {
    /// Records `event` and wakes the waiters.
    pub fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
        self.version.send_modify(|v| *v += 1);
    }
}

/// One replica process.
#[derive(Debug)]
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Kept open: the child exits when it closes.
    pub stdin: ChildStdin,
    /// Its pid, for signals.
    pub pid: Pid,
}

/// Replica processes; every one is SIGKILLed when the fleet is dropped.
#[derive(Debug)]
pub struct Fleet {
    /// The arguments that make the running binary enter [`child`].
    entry: &'static [&'static str],
    /// The connection URL every replica gets.
    url: String,
    /// The key every replica elects on.
    key: LockKey,
    /// Every replica's check interval.
    interval: Duration,
    /// What the replicas said.
    board: Arc<Board>,
    /// The processes, by index.
    procs: Vec<Proc>,
    /// Replicas fence and write (see [`ENV_FENCED`]).
    fenced: bool,
    /// Replicas run a job every this many ms (see [`ENV_JOB_MS`]).
    job_ms: Option<u64>,
    /// Replicas run with fast takeover (see [`ENV_FAST`]).
    fast: bool,
}

/// Builds a [`Fleet`]; from [`Fleet::builder`].
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug)]
pub struct FleetBuilder {
    fleet: Fleet,
}

impl FleetBuilder {
    /// Whether the replicas' electors fence (default off). The kit's own replica
    /// ([`child`]) then writes one fenced row a tick into `replica_writes`, which the parent
    /// creates; a service run by [`child_with`] gets a fenced elector.
    pub fn fenced(mut self, on: bool) -> Self {
        self.fleet.fenced = on;
        self
    }

    /// Whether the replicas' electors run with fast takeover (default off).
    pub fn fast_takeover(mut self, on: bool) -> Self {
        self.fleet.fast = on;
        self
    }

    /// The kit's own replica ([`child`]) also runs a schedule with one job every `ms`
    /// milliseconds (see [`ENV_JOB_MS`]).
    #[doc(hidden)]
    pub fn job_ms(mut self, ms: Option<u64>) -> Self {
        self.fleet.job_ms = ms;
        self
    }

    /// The fleet, with no process yet: [`spawn`](Fleet::spawn) starts each.
    pub fn build(self) -> Fleet {
        self.fleet
    }
}

impl Fleet {
    /// No process yet: replicas of the running binary started with `entry`, electing on `key`
    /// at `url` every `interval`, neither fenced nor with fast takeover (what
    /// [`builder`](Self::builder) sets).
    pub fn new(
        entry: &'static [&'static str],
        url: String,
        key: LockKey,
        interval: Duration,
    ) -> Self {
        Self::builder(entry, url, key, interval).build()
    }

    /// A fleet of replicas of the running binary started with `entry`, electing on `key` at
    /// `url` every `interval`, with what else the builder sets.
    ///
    /// `entry` is what makes the binary enter [`child_with`] (or [`child`]): for a test binary,
    /// the name of an ignored test and `--exact --ignored --nocapture`.
    pub fn builder(
        entry: &'static [&'static str],
        url: String,
        key: LockKey,
        interval: Duration,
    ) -> FleetBuilder {
        FleetBuilder {
            fleet: Self {
                entry,
                url,
                key,
                interval,
                board: Arc::default(),
                procs: Vec::new(),
                fenced: false,
                job_ms: None,
                fast: false,
            },
        }
    }

    /// The body of the ignored test that `entry` names: in a replica process that a fleet
    /// spawned, runs `service` as [`child_with`] does and returns when the fleet stopped it;
    /// anywhere else (the ignored test run by hand, or by `cargo test -- --ignored`) returns at
    /// once, doing nothing.
    ///
    /// ```no_run
    /// use pg_elector_testkit::Fleet;
    ///
    /// /// Run again by the fleet as `replica_child --exact --ignored --nocapture`.
    /// #[test]
    /// #[ignore = "a replica process the tests of this file start"]
    /// fn replica_child() {
    ///     Fleet::serve_child(|r| async move {
    ///         let _ = r.elector.run(r.shutdown).await; // ... or your service
    ///     });
    /// }
    /// ```
    pub fn serve_child<F, Fut>(service: F)
    where
        F: FnOnce(crate::replicas::Replica) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        if is_child() {
            child_with(service);
        }
    }

    /// How many replicas were spawned (running or not).
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The key the replicas elect on.
    pub fn key(&self) -> LockKey {
        self.key
    }

    /// The replicas' check interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// What the replicas said, and their stderr lines (feature `protocol`).
    #[cfg(feature = "protocol")]
    #[doc(hidden)]
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Starts a replica, connecting straight to the server, or to `via` (a proxy).
    pub fn spawn(&mut self, via: Option<SocketAddr>) -> usize {
        self.spawn_preferring(via, None)
    }

    /// [`spawn`](Self::spawn), with the replica's elector built with `preference` (none:
    /// without one).
    pub fn spawn_preferring(&mut self, via: Option<SocketAddr>, preference: Option<u64>) -> usize {
        let index = self.procs.len();
        let name = format!("replica-{index}");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .args(self.entry)
            .env(ENV_URL, &self.url)
            .env(
                ENV_KEY,
                format!("{},{}", self.key.class(), self.key.object()),
            )
            .env(ENV_INTERVAL_MS, self.interval.as_millis().to_string())
            .env(ENV_NAME, &name)
            .env_remove(ENV_ADDR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(addr) = via {
            command.env(ENV_ADDR, addr.to_string());
        }
        if self.fenced {
            command.env(ENV_FENCED, "1");
        } else {
            command.env_remove(ENV_FENCED);
        }
        match self.job_ms {
            Some(ms) => command.env(ENV_JOB_MS, ms.to_string()),
            None => command.env_remove(ENV_JOB_MS),
        };
        if self.fast {
            command.env(ENV_FAST, "1");
        } else {
            command.env_remove(ENV_FAST);
        }
        match preference {
            Some(p) => command.env(ENV_PREFERENCE, p.to_string()),
            None => command.env_remove(ENV_PREFERENCE),
        };
        let mut child = command.spawn().expect("start a replica process");
        let pid = Pid::from_raw(child.id().expect("a running child") as i32).expect("a pid");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let stdin = child.stdin.take().expect("piped stdin");
        let board = self.board.clone();
        for_each_line(stdout, move |line| {
            if let Some(event) = parse(index, &line) {
                board.push(event);
            }
        });
        let board = self.board.clone();
        for_each_line(stderr, move |line| {
            board.logs.lock().unwrap().push(format!("{name}: {line}"));
        });
        self.procs.push(Proc { child, stdin, pid });
        index
    }

    /// Sends `signal` to a replica; returns the time just before.
    pub fn try_signal(&self, replica: usize, signal: Signal) -> rustix::io::Result<u64> {
        let at = unix_us();
        kill_process(self.procs[replica].pid, signal)?;
        Ok(at)
    }

    /// Sends `signal` to a replica; returns the time just before. Panics if that fails.
    pub fn signal(&self, replica: usize, signal: Signal) -> u64 {
        self.try_signal(replica, signal)
            .expect("signal the replica")
    }

    /// SIGKILLs a replica without waiting for it; returns the time, which is also recorded as
    /// its last event.
    pub fn try_sigkill(&self, replica: usize) -> rustix::io::Result<u64> {
        let at = self.try_signal(replica, Signal::KILL)?;
        self.board.push(Event {
            replica,
            at,
            what: What::Killed,
        });
        Ok(at)
    }

    /// SIGKILLs a replica and waits for it; returns the time, which is also recorded as its
    /// last event.
    pub async fn kill(&mut self, replica: usize) -> u64 {
        let at = self.try_sigkill(replica).expect("signal the replica");
        self.reap(replica).await;
        at
    }

    /// Freezes a replica (SIGSTOP: a long GC pause, a VM stolen from under it): nothing in it
    /// runs, its connections stay open. Returns the time just before, once the kernel shows
    /// the process stopped.
    ///
    /// # Errors
    ///
    /// [`KitError::Fault`](crate::KitError::Fault) when the signal fails (the process is gone)
    /// or the process was not seen stopped within 5 s.
    pub async fn freeze(&self, replica: usize) -> Result<u64, crate::KitError> {
        self.signal_until(replica, Signal::STOP, true).await
    }

    /// Thaws a frozen replica (SIGCONT); returns the time just before, once it runs again.
    ///
    /// # Errors
    ///
    /// As [`freeze`](Self::freeze).
    pub async fn thaw(&self, replica: usize) -> Result<u64, crate::KitError> {
        self.signal_until(replica, Signal::CONT, false).await
    }

    async fn signal_until(
        &self,
        replica: usize,
        signal: Signal,
        stopped: bool,
    ) -> Result<u64, crate::KitError> {
        let fault = |why: String| crate::KitError::Fault(format!("replica {replica}: {why}"));
        let at = self
            .try_signal(replica, signal)
            .map_err(|e| fault(format!("{signal:?} failed: {e}")))?;
        let pid = self.procs[replica].pid;
        let start = std::time::Instant::now();
        while is_stopped(pid) != Some(stopped) {
            if start.elapsed() > Duration::from_secs(5) {
                return Err(fault(format!("not seen {signal:?}ped within 5 s")));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(at)
    }

    /// Waits for a replica's process to end.
    pub async fn reap(&mut self, replica: usize) {
        let _ = self.procs[replica].child.wait().await;
    }

    /// Asks a replica for a graceful shutdown (`stop` on its stdin: a leader drains and
    /// unlocks, as at a deploy), as [`Replicas::stop`](crate::replicas::Members::stop) does for
    /// a replica in the test's process. Returns once the request is written: the process
    /// exits on its own ([`reap`](Self::reap) waits for it). A process already gone has
    /// nothing to stop: use [`try_stop`](Self::try_stop) where a test must know that the
    /// request reached a live process.
    pub async fn stop(&mut self, replica: usize) {
        let _ = self.try_stop(replica).await;
    }

    /// [`stop`](Self::stop), with the error of writing to a process already gone (a test that
    /// asserts a graceful stop should use this one: a crashed child fails it).
    pub async fn try_stop(&mut self, replica: usize) -> std::io::Result<()> {
        let stdin = &mut self.procs[replica].stdin;
        stdin.write_all(b"stop\n").await?;
        stdin.flush().await
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.board.events.lock().unwrap().clone()
    }

    /// Waits until `found` finds something in the events, at most `limit`.
    pub async fn wait<R>(
        &self,
        limit: Duration,
        mut found: impl FnMut(&[Event]) -> Option<R>,
    ) -> Option<R> {
        let mut changed = self.board.version.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            changed.borrow_and_update();
            if let Some(r) = found(&self.board.events.lock().unwrap()) {
                return Some(r);
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }
}

impl Fleet {
    /// Waits until every replica has started and exactly one says it leads: which one, and how
    /// long after the call.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`](crate::KitError::Timeout) when not so within `limit`.
    pub async fn wait_for_leader(
        &self,
        limit: Duration,
    ) -> Result<crate::replicas::Leading, crate::KitError> {
        let n = self.procs.len();
        let start = std::time::Instant::now();
        self.wait(limit, |events| {
            let started = events.iter().filter(|e| e.what == What::Started).count();
            match leaders(events, n)[..] {
                [one] if started >= n => Some(one),
                _ => None,
            }
        })
        .await
        .map(|replica| crate::replicas::Leading {
            replica,
            took: start.elapsed(),
        })
        .ok_or_else(|| {
            crate::KitError::Timeout(format!(
                "no single leader among {n} replica processes within {limit:?} (leading: {:?})",
                leaders(&self.events(), n)
            ))
        })
    }

    /// Waits until exactly one replica other than `old` says it leads, and says how long that
    /// took. What `old` last said does not count: a frozen process cannot say it stopped.
    ///
    /// # Errors
    ///
    /// [`KitError::Timeout`](crate::KitError::Timeout) when not so within `limit`.
    pub async fn wait_for_other_leader(
        &self,
        old: usize,
        limit: Duration,
    ) -> Result<crate::replicas::Leading, crate::KitError> {
        let n = self.procs.len();
        let start = std::time::Instant::now();
        let found = self
            .wait(limit, |events| {
                let others: Vec<usize> = leaders(events, n)
                    .into_iter()
                    .filter(|&r| r != old)
                    .collect();
                match others[..] {
                    [one] => Some(one),
                    _ => None,
                }
            })
            .await;
        found
            .map(|replica| crate::replicas::Leading {
                replica,
                took: start.elapsed(),
            })
            .ok_or_else(|| {
                crate::KitError::Timeout(format!(
                    "no leader other than replica {old} within {limit:?} (leading: {:?})",
                    leaders(&self.events(), n)
                ))
            })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- replica events ---");
            for e in self.events() {
                eprintln!("{} replica-{} {:?}", e.at, e.replica, e.what);
            }
            eprintln!("--- replica logs ---");
            for line in self.board.logs.lock().unwrap().iter() {
                eprintln!("{line}");
            }
        }
        for proc in &mut self.procs {
            let _ = proc.child.start_kill();
        }
    }
}

/// The replicas whose last transition says they lead.
pub fn leaders(events: &[Event], n: usize) -> Vec<usize> {
    let mut leading = vec![false; n];
    for e in events {
        match e.what {
            What::Leader => leading[e.replica] = true,
            What::Standby | What::Killed | What::Exited => leading[e.replica] = false,
            What::Started | What::Tick | What::Woke { .. } => {}
        }
    }
    (0..n).filter(|&i| leading[i]).collect()
}

/// The leadership transitions (leader, standby, killed) in time order; at equal stamps, the end
/// of one term before the start of another.
pub fn transitions(events: &[Event]) -> Vec<Event> {
    let mut transitions: Vec<Event> = events
        .iter()
        .filter(|e| matches!(e.what, What::Leader | What::Standby | What::Killed))
        .copied()
        .collect();
    transitions.sort_by_key(|e| (e.at, e.what == What::Leader));
    transitions
}

/// Whether the kernel shows process `pid` stopped (state `T`), from `/proc/<pid>/stat`; `None`
/// when it cannot be read (the process is gone, or no procfs).
fn is_stopped(pid: Pid) -> Option<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
    Some(state == "T" || state == "t")
}
