//! Two `pg-elector run` replicas of one key, each reaching the server through a proxy of its
//! own, and the faults the bench puts on the one that leads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::replica::unix_us;
use pg_elector_testkit::server::sql::lock_sessions;
use pg_elector_testkit::{FaultProxy, TestDb};
use rustix::process::{Pid, Signal, kill_process};

use crate::timeline::Timeline;

/// A fault put on the leading replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// SIGKILL to the leading `pg-elector`.
    Kill,
    /// `pg_terminate_backend` of its lock session.
    Terminate,
    /// Its proxy resets every connection (RST both ways).
    Reset,
    /// Its proxy drops everything, both ways, until healed.
    Partition,
    /// SIGSTOP for one interval, then SIGCONT: too short for anything to change.
    ShortStop,
    /// SIGSTOP for five intervals, then SIGCONT: the server frees the silent leader's lock
    /// four intervals after its last check, and the standby takes over.
    Stop,
    /// `pg-elector handover KEY --to` the standby.
    Handover,
}

impl Fault {
    /// Every fault, in the order the bench puts them.
    pub(crate) const ALL: [Fault; 7] = [
        Fault::Kill,
        Fault::Terminate,
        Fault::Reset,
        Fault::Partition,
        Fault::ShortStop,
        Fault::Stop,
        Fault::Handover,
    ];

    /// The fault as the report names it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL of the leading `pg-elector`",
            Fault::Terminate => "`pg_terminate_backend` of its lock session",
            Fault::Reset => "its connections reset (proxy RST)",
            Fault::Partition => "partition (proxy blackhole)",
            Fault::ShortStop => "SIGSTOP for 1·I, then SIGCONT",
            Fault::Stop => "SIGSTOP for 5·I, then SIGCONT",
            Fault::Handover => "`pg-elector handover --to` the standby",
        }
    }
}

/// One `pg-elector run` process and its proxy.
struct Replica {
    name: &'static str,
    process: Child,
    proxy: FaultProxy,
}

/// The two replicas of one key.
pub(crate) struct Pair {
    db: TestDb,
    key: String,
    fast: bool,
    interval: Duration,
    bin: PathBuf,
    log: PathBuf,
    replicas: Vec<Replica>,
}

impl Pair {
    /// Starts replica `a`, waits for its command, then starts `b` as its standby.
    pub(crate) async fn start(
        db: TestDb,
        key: &str,
        fast: bool,
        interval: Duration,
        [bin, log]: [&Path; 2],
        timeline: &Timeline,
    ) -> Self {
        let mut pair = Pair {
            db,
            key: key.to_owned(),
            fast,
            interval,
            bin: bin.to_owned(),
            log: log.to_owned(),
            replicas: Vec::new(),
        };
        for name in ["a", "b"] {
            let proxy = FaultProxy::start(pair.db.server_addr())
                .await
                .expect("a proxy");
            let process = pair.spawn(name, &proxy);
            pair.replicas.push(Replica {
                name,
                process,
                proxy,
            });
            if name == "a" {
                wait_until(Duration::from_secs(20), || timeline.running())
                    .await
                    .expect("a's command starts");
            }
        }
        tokio::time::sleep(4 * interval).await;
        pair
    }

    /// `pg-elector run` as replica `name`, through `proxy`.
    fn spawn(&self, name: &str, proxy: &FaultProxy) -> Child {
        let server_port = format!(":{}/", self.db.server_addr().port());
        let url = self
            .db
            .url()
            .replace(&server_port, &format!(":{}/", proxy.addr().port()));
        let interval = format!("{}ms", self.interval.as_millis());
        let mut command = Command::new(&self.bin);
        command
            .env("DATABASE_URL", url)
            .env_remove("PG_ELECTOR_LOG")
            .args([
                "run",
                &self.key,
                "--interval",
                &interval,
                "--identity",
                name,
            ])
            .args(["--preference", "1"]);
        if self.fast {
            command.arg("--fast-takeover");
        }
        command
            .arg("--")
            .arg(std::env::current_exe().expect("this binary's path"))
            .args([crate::RUN_CHILD, &self.log.to_string_lossy()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.bin.display()))
    }

    fn index(&self, name: &str) -> usize {
        self.replicas
            .iter()
            .position(|r| r.name == name)
            .unwrap_or_else(|| panic!("no replica {name}"))
    }

    /// Puts `fault` on replica `leader`; the instant it took effect (µs since 1970), taken
    /// just before the signal, the statement or the proxy's switch.
    pub(crate) async fn inject(&mut self, fault: Fault, leader: &str) -> u64 {
        let i = self.index(leader);
        let pid = Pid::from_child(&self.replicas[i].process);
        match fault {
            Fault::Kill => {
                let at = unix_us();
                let _ = kill_process(pid, Signal::KILL);
                at
            }
            Fault::Terminate => self.terminate().await,
            Fault::Reset => {
                let at = unix_us();
                self.replicas[i].proxy.reset();
                at
            }
            Fault::Partition => {
                let at = unix_us();
                self.replicas[i].proxy.blackhole();
                at
            }
            Fault::ShortStop | Fault::Stop => {
                let at = unix_us();
                let _ = kill_process(pid, Signal::STOP);
                let intervals = if fault == Fault::Stop { 5 } else { 1 };
                tokio::time::sleep(intervals * self.interval).await;
                let _ = kill_process(pid, Signal::CONT);
                at
            }
            Fault::Handover => {
                let to = self.replicas[1 - i].name;
                let at = unix_us();
                let status = Command::new(&self.bin)
                    .env("DATABASE_URL", self.db.url())
                    .args(["handover", &self.key, "--to", to, "--stay-away", "1s"])
                    .stdout(Stdio::null())
                    .status()
                    .expect("pg-elector handover");
                assert!(status.success(), "the handover to {to} was refused");
                at
            }
        }
    }

    /// Ends the leading lock session from another connection.
    async fn terminate(&self) -> u64 {
        let client = self.db.connect().await.expect("a connection");
        let sessions = lock_sessions(&client, LockKey::from_name(&self.key))
            .await
            .expect("pg_locks");
        let holder = sessions.iter().find(|s| s.granted).expect("a leader").pid;
        let at = unix_us();
        client
            .execute("SELECT pg_catalog.pg_terminate_backend($1)", &[&holder])
            .await
            .expect("pg_terminate_backend");
        at
    }

    /// Undoes what `fault` left behind on replica `leader` (a killed process is started
    /// again, a partition healed), then waits four intervals for it to stand by.
    pub(crate) async fn heal(&mut self, fault: Fault, leader: &str) {
        let i = self.index(leader);
        match fault {
            Fault::Kill => {
                let _ = self.replicas[i].process.wait();
                let process = self.spawn(leader, &self.replicas[i].proxy);
                self.replicas[i].process = process;
            }
            Fault::Partition => self.replicas[i].proxy.pass(),
            // The old leader stays away for a second: the next round hands the lead back.
            Fault::Handover => tokio::time::sleep(Duration::from_secs(1)).await,
            _ => {}
        }
        tokio::time::sleep(4 * self.interval).await;
    }

    /// Stops both replicas (SIGTERM, then SIGKILL after 10 s).
    pub(crate) async fn stop(mut self) {
        for replica in &mut self.replicas {
            let _ = kill_process(Pid::from_child(&replica.process), Signal::TERM);
        }
        for replica in &mut self.replicas {
            let exited = wait_until(Duration::from_secs(10), || {
                replica.process.try_wait().ok().flatten()
            })
            .await;
            if exited.is_none() {
                let _ = replica.process.kill();
                let _ = replica.process.wait();
            }
        }
    }
}

/// Polls `f` every millisecond until it gives a value or `within` passes.
pub(crate) async fn wait_until<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = f() {
            return Some(value);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
