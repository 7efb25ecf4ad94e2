//! The command's process group as `pg-elector` sees it: the keeper (see
//! [`keeper`](crate::keeper)) started, asked to end gracefully or at once, and waited for.
//! A group dropped before it was waited for (a run cut off) is killed.

use std::ffi::OsString;
use std::io;
use std::time::Duration;

use pg_elector::{Term, TermEnd};

use crate::os;

/// A started command: its keeper process, whose exit means the command's group is gone.
#[derive(Debug)]
pub(crate) struct Group {
    keeper: tokio::process::Child,
    pid: i32,
    /// Whether the keeper's exit was seen: the group is gone.
    gone: bool,
    /// Whether the keeper killed the group because `pg-elector` was stopped.
    killed_for_stop: bool,
}

impl Group {
    /// Starts `command` under a keeper that gives its group `grace` to end, and kills it
    /// should this process be seen stopped for two check `interval`s; with `env` added to its
    /// environment. Call it from the thread that lives as long as the process (the
    /// parent-death signal follows the thread that forked).
    pub(crate) fn start(
        command: &[OsString],
        [grace, interval]: [Duration; 2],
        env: &[(&str, String)],
    ) -> io::Result<Self> {
        // This binary, even if it was replaced on disk since it started.
        let mut keeper = tokio::process::Command::new("/proc/self/exe");
        keeper
            .arg("__keeper")
            .arg("--grace-ms")
            .arg(grace.as_millis().to_string())
            .arg("--stop-limit-ms")
            .arg((2 * interval).as_millis().to_string())
            .arg("--parent")
            .arg(os::own_pid().to_string())
            .arg("--")
            .args(command)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        os::die_with_parent(&mut keeper, os::SIGUSR1);
        let keeper = keeper.spawn()?;
        // Never 0 (a signal to 0 would reach pg-elector's own group): the keeper was just
        // started and not yet waited for.
        let pid = keeper
            .id()
            .map(|pid| pid as i32)
            .ok_or_else(|| io::Error::other("the keeper ended before it could be named"))?;
        Ok(Self {
            keeper,
            pid,
            gone: false,
            killed_for_stop: false,
        })
    }

    /// The command's status once its group is gone (the keeper's exit status; SIGKILL's
    /// when the keeper killed it because this process was stopped).
    pub(crate) async fn wait(&mut self) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        match self.keeper.wait().await {
            Ok(status) => {
                self.gone = true;
                if status.signal() == Some(os::SIGUSR2) {
                    self.killed_for_stop = true;
                    return 128 + os::SIGKILL;
                }
                shell_status(status)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot wait for the command's keeper");
                crate::exit::INTERNAL
            }
        }
    }

    /// Whether the keeper killed the group because this process was stopped (SIGSTOP) for
    /// two check intervals.
    pub(crate) fn killed_for_stop(&self) -> bool {
        self.killed_for_stop
    }

    /// Asks the group to end: SIGTERM, then SIGKILL after the grace.
    pub(crate) fn end(&self) {
        self.signal(os::SIGTERM);
    }

    /// Kills the group at once.
    pub(crate) fn kill(&self) {
        self.signal(os::SIGUSR1);
    }

    /// Stops the group as the end of `term` calls for, and waits until it is gone: at once
    /// when the lead was lost (another replica may already lead), with the grace otherwise.
    pub(crate) async fn stop_for(&mut self, term: &Term) -> i32 {
        if term.end() == Some(TermEnd::LeadershipLost) {
            tracing::warn!(cause = ?term.loss_cause(), "the lead was lost: killing the command's group");
            self.kill();
        } else {
            tracing::info!(end = ?term.end(), "the term ended: stopping the command's group");
            self.end();
        }
        self.wait().await
    }

    fn signal(&self, signal: i32) {
        if let Err(e) = os::signal_process(self.pid, signal) {
            // Gone already: `wait` says how it ended.
            tracing::debug!(error = %e, "cannot signal the command's keeper");
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.gone {
            tracing::warn!("the command's run was cut off: killing its group");
            self.kill();
        }
    }
}

/// An exit status as a shell reports it: the code, or 128 and the signal.
fn shell_status(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(crate::exit::INTERNAL)
}
