//! Starting `pg-elector` processes, and reading what their commands recorded.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_testkit::{PgServer, TestDb};

/// The check interval of the tests' replicas.
pub(crate) const I: Duration = Duration::from_millis(200);

/// A database of its own on the shared server.
pub(crate) async fn database() -> TestDb {
    PgServer::shared().unwrap().create_database().await.unwrap()
}

/// The binary, told to reach `db`.
pub(crate) fn pg_elector(db: &TestDb) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pg-elector"));
    // No ~/.postgresql file of the machine's user decides how the tests connect.
    command
        .env("DATABASE_URL", db.url())
        .env("HOME", "/nonexistent")
        .env_remove("PG_ELECTOR_LOG");
    command
}

/// A scratch directory for one test's records, removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("pg-elector-cli-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The lines of the file `name` (none while it does not exist).
    pub(crate) fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits (at most `within`) until the file `name` has at least `n` lines; its lines.
    pub(crate) fn wait_for_lines(&self, name: &str, n: usize, within: Duration) -> Vec<String> {
        let lines = wait_until(within, || {
            let lines = self.lines(name);
            (lines.len() >= n).then_some(lines)
        });
        lines.unwrap_or_else(|| {
            panic!(
                "{name}: {n} lines within {within:?}: {:?}",
                self.lines(name)
            )
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `pg-elector run` process, killed (SIGKILL) when dropped.
pub(crate) struct Replica {
    pub(crate) child: Child,
}

impl Replica {
    /// `pg-elector run KEY --interval I --fast-takeover --identity NAME EXTRA… -- sh -c SCRIPT`,
    /// its output in the scratch directory (`NAME.out`, `NAME.err`).
    pub(crate) fn start(
        db: &TestDb,
        scratch: &Scratch,
        key: &str,
        name: &str,
        extra: &[&str],
        script: &str,
    ) -> Self {
        Self::start_as(db, scratch, "run", key, name, extra, script)
    }

    /// As [`start`](Self::start), for the subcommand `verb` (`run`, `cron`).
    pub(crate) fn start_as(
        db: &TestDb,
        scratch: &Scratch,
        verb: &str,
        key: &str,
        name: &str,
        extra: &[&str],
        script: &str,
    ) -> Self {
        Self::spawn(pg_elector(db), scratch, [verb, key, name], extra, script)
    }

    /// As [`start`](Self::start), reaching the database through `url` (a proxy's address).
    pub(crate) fn start_via(
        db: &TestDb,
        url: &str,
        scratch: &Scratch,
        [key, name]: [&str; 2],
        extra: &[&str],
        script: &str,
    ) -> Self {
        let mut command = pg_elector(db);
        command.env("DATABASE_URL", url);
        Self::spawn(command, scratch, ["run", key, name], extra, script)
    }

    fn spawn(
        mut command: Command,
        scratch: &Scratch,
        [verb, key, name]: [&str; 3],
        extra: &[&str],
        script: &str,
    ) -> Self {
        let out = std::fs::File::create(scratch.path(&format!("{name}.out"))).unwrap();
        let err = std::fs::File::create(scratch.path(&format!("{name}.err"))).unwrap();
        let child = command
            .args([
                verb,
                key,
                "--interval",
                "200ms",
                "--fast-takeover",
                "--identity",
                name,
            ])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .env("SCRATCH", scratch.path(""))
            .stdout(out)
            .stderr(err)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Self { child }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` (`TERM`, `KILL`, `STOP`, `CONT`) to the `pg-elector` process.
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {}", self.pid());
    }

    /// Its exit status, waiting at most `within`.
    pub(crate) fn exit_within(&mut self, within: Duration) -> Option<i32> {
        let status = wait_until(within, || self.child.try_wait().unwrap())?;
        Some(status.code().unwrap_or(-1))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the process `pid` runs (exists and is not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Polls `f` every 5 ms until it gives a value or `within` passes.
pub(crate) fn wait_until<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + within;
    loop {
        if let Some(value) = f() {
            return Some(value);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The pid in the file `path` (written by a command), once it is there.
pub(crate) fn pid_in(path: &Path, within: Duration) -> i32 {
    wait_until(within, || {
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    })
    .unwrap_or_else(|| panic!("no pid in {}", path.display()))
}

/// Runs `command` to its end, killed after `within` (then its status is none); its output and
/// how long it took.
pub(crate) fn output_within(
    command: &mut Command,
    within: Duration,
) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if wait_until(within, || child.try_wait().unwrap()).is_none() {
        let _ = child.kill();
    }
    (child.wait_with_output().unwrap(), started.elapsed())
}

/// Waits until a standby of `key` waits on the lock (its waiting session is in `pg_locks`).
pub(crate) async fn waits(db: &pg_elector_testkit::TestDb, key: &str) {
    let client = db.connect().await.unwrap();
    let key = LockKey::from_name(key);
    for _ in 0..200 {
        let sessions = pg_elector_testkit::server::sql::lock_sessions(&client, key)
            .await
            .unwrap();
        if sessions.iter().any(|s| !s.granted) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no standby waits on the lock");
}

/// `pg-elector handover KEY --to IDENTITY ARGS…`, which must succeed: its stdout.
pub(crate) fn handover_to(db: &TestDb, key: &str, to: &str, args: &[&str]) -> String {
    let (out, _) = output_within(
        pg_elector(db)
            .args(["handover", key, "--to", to])
            .args(args),
        Duration::from_secs(10),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
