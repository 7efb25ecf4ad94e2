//! Running a harness command (`initdb`, `pg_ctl`, `pg_basebackup`) with a bound on how long it
//! may take: a copy through a proxy that went silent, or a server that never answers, ends in
//! an error instead of a test that hangs.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::KitError;

/// How long a harness command may run: far above what `initdb` or a test database's
/// `pg_basebackup` takes on a loaded machine (seconds), and above `pg_ctl`'s own 30 s wait.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// How often a running command is looked at.
const POLL: Duration = Duration::from_millis(10);

/// Runs `command` to its end and returns its status and output, as [`Command::output`] does;
/// a command still running after `timeout` is killed, and that is an error naming `what`.
pub(crate) fn output_within(
    mut command: Command,
    timeout: Duration,
    what: &str,
) -> Result<Output, KitError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| KitError::io(format!("{what}: running {program}"), e))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                // The readers are left to end with the pipes (a process the command started
                // may still hold them).
                return Err(KitError::Server(format!(
                    "{what}: {program} was still running after {timeout:?}; killed it"
                )));
            }
            Err(e) => return Err(KitError::io(format!("{what}: waiting for {program}"), e)),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Reads a pipe to its end on a thread of its own, so that a command that writes much is
/// never blocked on a full pipe.
fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_ends_gives_its_status_and_output() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2; exit 3"]);
        let output = output_within(command, Duration::from_secs(10), "a test").unwrap();
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
    }

    #[test]
    fn a_command_past_its_bound_is_killed_and_is_an_error() {
        let mut command = Command::new("sleep");
        command.arg("30");
        let started = Instant::now();
        let error = output_within(command, Duration::from_millis(200), "a test").unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "returned after {:?}",
            started.elapsed()
        );
        assert!(error.to_string().contains("still running"), "{error}");
    }
}
