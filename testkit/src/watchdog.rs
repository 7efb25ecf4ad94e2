//! The cleanup watchdog of a private server: a small `sh` process that stops
//! the server and removes its temp dir once the test process is gone.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::KitError;

/// The watchdog: waits for EOF on stdin (the test process closed it or died),
/// then stops the server and removes the temp dir. Own process group and
/// ignored signals, so a Ctrl-C aimed at the test run does not skip cleanup.
///
/// Arguments: `$1` pg_ctl, `$2` data dir, `$3` temp dir, `$4` `root` or
/// `user`. As root it cannot use pg_ctl (which refuses to run as root) and
/// runs as root so that it may remove the temp dir wherever TMPDIR points: it
/// stops the postmaster the way `pg_ctl stop -m immediate` does, with SIGQUIT,
/// after checking that the pid is still that server's postmaster.
const WATCHDOG_SCRIPT: &str = r#"trap '' INT HUP TERM QUIT PIPE
while read -r _line; do :; done
if [ "$4" = root ]; then
  pid=$(head -n 1 "$2/postmaster.pid" 2>/dev/null)
  if [ -n "$pid" ] && grep -qF -- "$2" "/proc/$pid/cmdline" 2>/dev/null; then
    # Alive and not a zombie (it is nobody's child here, so it may stay a
    # zombie until init reaps it).
    alive() { read -r _ _ st _ < "/proc/$pid/stat" 2>/dev/null && [ "$st" != Z ]; }
    kill -QUIT "$pid" 2>/dev/null
    i=0
    while alive && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
    alive && kill -KILL "$pid" 2>/dev/null
  fi
else
  "$1" stop -D "$2" -m immediate -w -t 10 >/dev/null 2>&1
fi
rm -rf "$3"
"#;

/// The watchdog of a helper process (e.g. PgBouncer): waits for EOF on
/// stdin, then kills the process — after checking that `/proc/<pid>/cmdline`
/// still names its marker, so a reused pid is left alone — and removes the
/// temp dir. Arguments: `$1` pid, `$2` marker (a path unique to the process),
/// `$3` temp dir.
const PROCESS_WATCHDOG_SCRIPT: &str = r#"trap '' INT HUP TERM QUIT PIPE
while read -r _line; do :; done
if grep -qF -- "$2" "/proc/$1/cmdline" 2>/dev/null; then
  kill -KILL "$1" 2>/dev/null
fi
rm -rf "$3"
"#;

/// A running watchdog. Its stdin is a pipe whose only writer is this process
/// (std opens pipes close-on-exec, so no other child inherits it): when this
/// process closes it — by [`finish`](Watchdog::finish), by exiting, or by
/// being killed — the watchdog's `read` returns and it does the cleanup.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
}

impl Watchdog {
    /// Starts the watchdog for a server. `as_root`: the harness runs as root
    /// and the server as another user.
    pub(crate) fn start(
        pg_ctl: &Path,
        data_dir: &Path,
        root: &Path,
        as_root: bool,
    ) -> Result<Watchdog, KitError> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("pg-elector-testkit-watchdog")
            .arg(pg_ctl)
            .arg(data_dir)
            .arg(root)
            .arg(if as_root { "root" } else { "user" });
        Self::spawn(cmd)
    }

    /// Starts the watchdog of a helper process `pid`, whose command line
    /// contains `marker`; it kills the process and removes `root`.
    pub(crate) fn for_process(pid: u32, marker: &Path, root: &Path) -> Result<Watchdog, KitError> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(PROCESS_WATCHDOG_SCRIPT)
            .arg("pg-elector-testkit-watchdog")
            .arg(pid.to_string())
            .arg(marker)
            .arg(root);
        Self::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Result<Watchdog, KitError> {
        let child = cmd
            .current_dir("/")
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C to the test run does not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| KitError::io("starting the cleanup watchdog (/bin/sh)", e))?;
        Ok(Watchdog { child })
    }

    /// Triggers the cleanup now and waits (at most 20 s) until it is done.
    pub(crate) fn finish(mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}
