//! The replica processes as the parent sees them: spawning, signals, stdin commands, and what
//! each one said on stdout (parsed into [`Event`]s) and stderr (kept for log excerpts).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::replica::for_each_line;
use pg_elector_tools::procfs::rss_kb;
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use crate::child::{self, MARK, unix_us};
pub(crate) use crate::link::{Link, Links};

/// What a replica said, or what the parent did to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// The process runs.
    Started,
    /// It leads: certainly from the event's time, possibly from `possible`.
    Leader {
        /// The earliest moment it may have led.
        possible: u64,
        /// The term's fencing epoch.
        epoch: Option<u64>,
    },
    /// It stopped leading: possibly until the event's time, certainly until `definite`.
    Standby {
        /// The latest moment it certainly led.
        definite: u64,
    },
    /// The watcher's first read after a gap of more than 100 ms since `previous`.
    Woke {
        /// The read before the gap.
        previous: u64,
        /// Whether this read found it leading.
        leading: bool,
        /// The epoch it found, when leading.
        epoch: Option<u64>,
    },
    /// `Term::fence` refused a tick of this epoch.
    Fenced {
        /// The refused term's epoch.
        epoch: Option<u64>,
    },
    /// `resign` returned.
    Resigned {
        /// Whether it led when asked.
        led: bool,
    },
    /// The dummy borrowers hold `n` connections of the elector's pool.
    Exhausted {
        /// Connections held.
        n: usize,
    },
    /// The dummy borrowers gave them back.
    Released,
    /// A graceful shutdown ended.
    Exited,
    /// A run of the schedule's job started.
    Run {
        /// Its due instant (ms since the UNIX epoch).
        due: u64,
        /// 1, or 2 for a rerun.
        attempt: u32,
    },
    /// A run ended (returned or cut off).
    Ran {
        /// Its due instant (ms since the UNIX epoch).
        due: u64,
    },
    /// The answer to a probe of the application's pool.
    Pool(crate::check::pool::Answer),
    /// The parent SIGKILLed it (stamped just before the signal).
    Killed,
    /// The parent SIGSTOPped it (stamped just before the signal).
    Stopped,
    /// The parent SIGCONTed it (stamped just before the signal).
    Continued,
}

/// One event of one replica process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    /// The process (its index in [`Fleet::procs`]).
    pub(crate) replica: usize,
    /// The key it is about: the shard's index in shard mode, else 0; 0 for what is about the
    /// whole process (see [`What::of_process`]).
    pub(crate) lane: usize,
    /// µs since the UNIX epoch.
    pub(crate) at: u64,
    /// What happened.
    pub(crate) what: What,
}

impl What {
    /// Whether it is about the process (every lane), not about one key's term.
    pub(crate) fn of_process(&self) -> bool {
        !matches!(
            self,
            What::Leader { .. } | What::Standby { .. } | What::Woke { .. } | What::Fenced { .. }
        )
    }
}

impl Event {
    /// An event about the whole process.
    pub(crate) fn of_process(replica: usize, at: u64, what: What) -> Self {
        Event {
            replica,
            lane: 0,
            at,
            what,
        }
    }
}

/// Parses one stdout line of a replica.
pub(crate) fn parse(replica: usize, line: &str) -> Option<Event> {
    let rest = line.strip_prefix(MARK)?;
    let mut words = rest.split_whitespace();
    let word = words.next()?;
    let (kind, lane) = match word.split_once('/') {
        Some((kind, lane)) => (kind, lane.parse().ok()?),
        None => (word, 0),
    };
    let mut number = || words.next()?.parse::<u64>().ok();
    let at = number()?;
    let epoch = |w: Option<u64>| w;
    let what = match kind {
        "started" => What::Started,
        "leader" => {
            let possible = number()?;
            What::Leader {
                possible,
                epoch: epoch(number()),
            }
        }
        "standby" => {
            // `standby <definite> <possible>`: the event's time is the possible end.
            let possible = number()?;
            return Some(Event {
                replica,
                lane,
                at: possible,
                what: What::Standby { definite: at },
            });
        }
        "woke" => {
            let previous = number()?;
            let leading = number()? == 1;
            What::Woke {
                previous,
                leading,
                epoch: epoch(number()),
            }
        }
        "fenced" => What::Fenced {
            epoch: epoch(number()),
        },
        "resigned" => What::Resigned {
            led: number()? == 1,
        },
        "exhausted" => What::Exhausted {
            n: number()? as usize,
        },
        "released" => What::Released,
        "exited" => What::Exited,
        "run" => What::Run {
            due: number()?,
            attempt: number()? as u32,
        },
        "ran" => What::Ran { due: number()? },
        "pool" => What::Pool(crate::check::pool::Answer {
            probe: number()? as usize,
            answered: number()? as u32,
            stuck: number()? as u32,
            failed: number()? as u32,
            unborrowed: number()? as u32,
        }),
        _ => return None,
    };
    Some(Event {
        replica,
        lane,
        at,
        what,
    })
}

/// The latest state of one process, as its events tell.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct State {
    /// It said `started`.
    pub(crate) started: bool,
    /// The lanes whose latest transition says it leads, one bit each.
    pub(crate) leading: u64,
    /// The epoch of its latest term in lane 0 (the one key).
    pub(crate) epoch: Option<u64>,
    /// SIGSTOPped and not yet SIGCONTed.
    pub(crate) stopped: bool,
    /// Killed or exited.
    pub(crate) ended: bool,
    /// Its latest `resigned` line (a counter, to wait for the next one).
    pub(crate) resigned: u64,
    /// Runs of the schedule's job in progress.
    pub(crate) running: u32,
    /// Runs of the schedule's job started.
    pub(crate) runs: u64,
}

impl State {
    /// Whether its latest transition in `lane` says it leads.
    pub(crate) fn leads(&self, lane: usize) -> bool {
        self.leading & (1 << lane) != 0
    }
}

/// Everything the replicas said, in arrival order, and their latest states.
#[derive(Debug, Default)]
pub(crate) struct Board {
    events: Mutex<Vec<Event>>,
    states: Mutex<Vec<State>>,
    /// Per process: its stderr lines, each stamped on arrival (the latest few thousand).
    logs: Mutex<Vec<VecDeque<(u64, String)>>>,
    /// Per process: its preference (`--preferences`).
    preferences: Mutex<Vec<Option<u64>>>,
    version: watch::Sender<u64>,
}

/// The group every replica's shards belong to in shard mode (`soak-<n>` for process n under
/// `--sabotage split-key`).
pub(crate) const SHARD_GROUP: &str = "soak";

/// Stderr lines kept per process.
const LOG_LINES: usize = 4000;

impl Board {
    /// Records an event and updates the process's state.
    pub(crate) fn push(&self, event: Event) {
        {
            let mut states = self.states.lock().unwrap();
            if states.len() <= event.replica {
                states.resize(event.replica + 1, State::default());
            }
            let state = &mut states[event.replica];
            match event.what {
                What::Started => state.started = true,
                What::Leader { epoch, .. } => {
                    state.leading |= 1 << event.lane;
                    if event.lane == 0 {
                        state.epoch = epoch;
                    }
                }
                What::Standby { .. } => state.leading &= !(1 << event.lane),
                What::Killed | What::Exited => {
                    state.leading = 0;
                    state.ended = true;
                }
                What::Stopped => state.stopped = true,
                What::Continued => state.stopped = false,
                What::Resigned { .. } => state.resigned += 1,
                What::Run { .. } => {
                    state.running += 1;
                    state.runs += 1;
                }
                What::Ran { .. } => state.running = state.running.saturating_sub(1),
                What::Woke { .. }
                | What::Pool(_)
                | What::Fenced { .. }
                | What::Exhausted { .. }
                | What::Released => {}
            }
        }
        self.events.lock().unwrap().push(event);
        self.version.send_modify(|v| *v += 1);
    }

    fn log(&self, replica: usize, line: String) {
        let mut logs = self.logs.lock().unwrap();
        if logs.len() <= replica {
            logs.resize_with(replica + 1, VecDeque::new);
        }
        let lines = &mut logs[replica];
        if lines.len() == LOG_LINES {
            lines.pop_front();
        }
        lines.push_back((unix_us(), line));
    }

    /// Records the preference process `replica` was built with.
    pub(crate) fn set_preference(&self, replica: usize, preference: Option<u64>) {
        let mut preferences = self.preferences.lock().unwrap();
        if preferences.len() <= replica {
            preferences.resize(replica + 1, None);
        }
        preferences[replica] = preference;
    }

    /// The preference process `replica` was built with.
    pub(crate) fn preference(&self, replica: usize) -> Option<u64> {
        self.preferences
            .lock()
            .unwrap()
            .get(replica)
            .copied()
            .flatten()
    }

    /// A copy of every event so far.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// The state of process `replica`.
    pub(crate) fn state(&self, replica: usize) -> State {
        self.states
            .lock()
            .unwrap()
            .get(replica)
            .copied()
            .unwrap_or_default()
    }

    /// The processes that lead `lane` now, are not stopped, and live.
    pub(crate) fn leaders(&self, lane: usize) -> Vec<usize> {
        self.states
            .lock()
            .unwrap()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.leads(lane) && !s.stopped && !s.ended)
            .map(|(i, _)| i)
            .collect()
    }

    /// The stderr lines of `replica` that arrived within `[from, to]`.
    pub(crate) fn log_excerpt(&self, replica: usize, from: u64, to: u64) -> Vec<(u64, String)> {
        self.logs
            .lock()
            .unwrap()
            .get(replica)
            .map(|lines| {
                lines
                    .iter()
                    .filter(|(at, _)| (from..=to).contains(at))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until `found` holds, at most `limit`; returns whether it did.
    pub(crate) async fn wait(
        &self,
        limit: Duration,
        mut found: impl FnMut(&Board) -> bool,
    ) -> bool {
        let mut changed = self.version.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            changed.borrow_and_update();
            if found(self) {
                return true;
            }
            // Also look again now and then: some conditions depend on time, not on events.
            let tick = tokio::time::Instant::now() + Duration::from_millis(50);
            match tokio::time::timeout_at(deadline.min(tick), changed.changed()).await {
                Ok(_) => {}
                Err(_) if tokio::time::Instant::now() >= deadline => return found(self),
                Err(_) => {}
            }
        }
    }
}

/// One replica process.
#[derive(Debug)]
pub(crate) struct Proc {
    /// The slot (and so the proxy) it runs in.
    pub(crate) slot: usize,
    /// Its pid.
    pub(crate) pid: Pid,
    /// Whether its elector has fast takeover.
    pub(crate) fast: bool,
    /// Its preference (`--preferences`; `None`: built without one).
    pub(crate) preference: Option<u64>,
    /// When it was spawned.
    pub(crate) spawned: u64,
    /// When it was killed or exited.
    pub(crate) ended: Option<u64>,
    /// RSS samples: (µs, kB).
    pub(crate) rss: Vec<(u64, u64)>,
    child: Child,
    stdin: ChildStdin,
}

/// The replica processes, one live per slot, each behind its slot's link.
#[derive(Debug)]
pub(crate) struct Fleet {
    /// Every process ever spawned; its index is its identity's number.
    pub(crate) procs: Vec<Proc>,
    /// The live process of each slot.
    pub(crate) live: Vec<usize>,
    /// One link per slot.
    pub(crate) links: Vec<Arc<Link>>,
    /// What they said.
    pub(crate) board: Arc<Board>,
    url: String,
    key: LockKey,
    interval: Duration,
    /// Each process elects on a key of its own (`--sabotage split-key`).
    pub(crate) split_key: bool,
    /// Shard mode: each process runs a group of this many shards (0: key mode).
    pub(crate) shards: usize,
    /// Key mode: each process runs a leader schedule whose run lengths this seed fixes.
    pub(crate) schedule: Option<u64>,
    /// With `--preferences`: the preference the next process of each slot gets (see
    /// `soak/prefs.rs`); empty without.
    pub(crate) preferences: Vec<u64>,
    /// With `--preferences`: the latest release (the highest preference handed out).
    pub(crate) release: u64,
}

impl Fleet {
    /// An empty fleet: one link (its proxies) per slot.
    pub(crate) async fn new(
        slots: usize,
        links: Links,
        url: String,
        key: LockKey,
        interval: Duration,
    ) -> Self {
        let mut made = Vec::new();
        for _ in 0..slots {
            made.push(Arc::new(Link::start(&links).await.expect("a fault proxy")));
        }
        Fleet {
            procs: Vec::new(),
            live: vec![usize::MAX; slots],
            links: made,
            board: Arc::default(),
            url,
            key,
            interval,
            split_key: false,
            shards: 0,
            schedule: None,
            preferences: Vec::new(),
            release: 0,
        }
    }

    /// Starts a new replica process in `slot`; returns its index.
    pub(crate) fn spawn(&mut self, slot: usize, fast: bool) -> usize {
        let index = self.procs.len();
        let identity = format!("replica-{index}");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .arg(child::FLAG)
            .env(child::ENV_URL, &self.url)
            .env(child::ENV_ADDR, self.links[slot].addrs())
            .env(
                child::ENV_KEY,
                format!(
                    "{},{}",
                    self.key.class(),
                    self.key.object() + if self.split_key { index as i32 } else { 0 }
                ),
            )
            .env(
                child::ENV_INTERVAL_MS,
                self.interval.as_millis().to_string(),
            )
            .env(child::ENV_IDENTITY, &identity)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if self.shards > 0 {
            let group = if self.split_key {
                format!("{}-{index}", SHARD_GROUP)
            } else {
                SHARD_GROUP.to_owned()
            };
            command.env(child::ENV_SHARDS, format!("{group},{}", self.shards));
        }
        match self.schedule {
            Some(seed) if self.shards == 0 => command.env(child::ENV_SCHEDULE, seed.to_string()),
            _ => command.env_remove(child::ENV_SCHEDULE),
        };
        if fast {
            command.env(child::ENV_FAST, "1");
        } else {
            command.env_remove(child::ENV_FAST);
        }
        let preference = self.preferences.get(slot).copied();
        self.board.set_preference(index, preference);
        match preference {
            Some(p) => command.env(child::ENV_PREFERENCE, p.to_string()),
            None => command.env_remove(child::ENV_PREFERENCE),
        };
        let mut process = command.spawn().expect("start a replica process");
        let pid = Pid::from_raw(process.id().expect("a running child") as i32).expect("a pid");
        let stdout = process.stdout.take().expect("piped stdout");
        let stderr = process.stderr.take().expect("piped stderr");
        let stdin = process.stdin.take().expect("piped stdin");
        let board = self.board.clone();
        for_each_line(stdout, move |line| {
            if let Some(event) = parse(index, &line) {
                board.push(event);
            }
        });
        let board = self.board.clone();
        for_each_line(stderr, move |line| board.log(index, line));
        self.procs.push(Proc {
            slot,
            pid,
            fast,
            preference,
            spawned: unix_us(),
            ended: None,
            rss: Vec::new(),
            child: process,
            stdin,
        });
        self.live[slot] = index;
        index
    }

    /// Sends `signal` to process `replica`; returns the time just before, which is also
    /// recorded as an event for SIGKILL, SIGSTOP and SIGCONT.
    pub(crate) fn signal(&mut self, replica: usize, signal: Signal) -> u64 {
        let at = unix_us();
        let _ = kill_process(self.procs[replica].pid, signal);
        let what = if signal == Signal::KILL {
            self.procs[replica].ended.get_or_insert(at);
            Some(What::Killed)
        } else if signal == Signal::STOP {
            Some(What::Stopped)
        } else if signal == Signal::CONT {
            Some(What::Continued)
        } else {
            None
        };
        if let Some(what) = what {
            self.board.push(Event::of_process(replica, at, what));
        }
        at
    }

    /// Writes one command line to process `replica`'s stdin; returns the time just before.
    pub(crate) async fn command(&mut self, replica: usize, line: &str) -> u64 {
        let at = unix_us();
        let stdin = &mut self.procs[replica].stdin;
        let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
        let _ = stdin.flush().await;
        at
    }

    /// Whether process `replica` has exited (and records when, the first time).
    pub(crate) fn exited(&mut self, replica: usize) -> bool {
        let proc = &mut self.procs[replica];
        match proc.child.try_wait() {
            Ok(Some(_)) | Err(_) => {
                proc.ended.get_or_insert_with(unix_us);
                true
            }
            Ok(None) => false,
        }
    }

    /// Samples the RSS of every live process.
    pub(crate) fn sample_rss(&mut self) {
        let at = unix_us();
        for &index in &self.live {
            if let Some(proc) = self.procs.get_mut(index) {
                if proc.ended.is_none() {
                    if let Some(kb) = rss_kb(proc.pid.as_raw_nonzero().get()) {
                        proc.rss.push((at, kb));
                    }
                }
            }
        }
    }

    /// SIGKILLs every process (at the end of the run).
    pub(crate) fn kill_all(&mut self) {
        for proc in &mut self.procs {
            if proc.ended.is_none() {
                let _ = proc.child.start_kill();
                proc.ended = Some(unix_us());
            }
        }
    }
}
