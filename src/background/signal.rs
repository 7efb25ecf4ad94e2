//! The stop every service wires the same way: at SIGTERM (how Kubernetes, systemd and docker
//! stop a process) or SIGINT (Ctrl-C).

use tokio_util::sync::CancellationToken;

/// A token cancelled at the first SIGTERM or SIGINT the process gets (on other platforms than
/// Unix, at the first Ctrl-C): the `shutdown` to hand [`Supervisor::run`](super::Supervisor::run)
/// or [`Elector::run`](crate::Elector::run), so that the leader's term ends, its work drains
/// and it unlocks before the process exits (what
/// [`Supervisor::run_until_signal`](super::Supervisor::run_until_signal) does).
///
/// On Unix, listening starts at the call: a signal before it has the process's default
/// effect (it ends the process), one after it only cancels the token. From then on the
/// process keeps both signals for itself (tokio never gives the default action back): a
/// second SIGTERM or Ctrl-C while the shutdown drains does nothing more, and the drain is
/// bounded by the elector's drain timeout and the supervisor's shutdown timeout; SIGKILL
/// ends the process at once. A signal that cannot be listened for is said at ERROR; the token
/// then waits for the other one.
///
/// ```no_run
/// # async fn example(elector: pg_elector::Elector) -> Result<(), pg_elector::Error> {
/// let shutdown = pg_elector::background::shutdown_on_signal();
/// elector.run(shutdown).await
/// # }
/// ```
///
/// # Panics
///
/// When called outside a tokio runtime, or in one built without its I/O driver
/// (`#[tokio::main]` and `Builder::enable_all` have it).
pub fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signalled = first_signal();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        let name = signalled.await;
        tracing::info!(signal = name, "stop signal received; shutting down");
        cancel.cancel();
    });
    shutdown
}

/// The name of the first SIGTERM or SIGINT to come, listened for from the call on.
#[cfg(unix)]
fn first_signal() -> impl Future<Output = &'static str> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &'static str| match signal(kind) {
        Ok(listening) => Some(listening),
        Err(e) => {
            tracing::error!(error = %e, signal = name, "cannot listen for a stop signal");
            None
        }
    };
    let terminate = listen(SignalKind::terminate(), "SIGTERM");
    let interrupt = listen(SignalKind::interrupt(), "SIGINT");
    async move {
        let next = |listening: Option<tokio::signal::unix::Signal>| async move {
            match listening {
                Some(mut listening) => listening.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = next(terminate) => "SIGTERM",
            _ = next(interrupt) => "SIGINT",
        }
    }
}

/// The first Ctrl-C.
#[cfg(not(unix))]
fn first_signal() -> impl Future<Output = &'static str> + Send + 'static {
    async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, signal = "Ctrl-C", "cannot listen for a stop signal");
            std::future::pending::<()>().await;
        }
        "Ctrl-C"
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Elector;
    use crate::background::Supervisor;

    /// Sends `signal` to this process, as `kill` would.
    fn send(signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &std::process::id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigterm_and_sigint_each_cancel_a_token_and_end_a_supervisor() {
        let token = shutdown_on_signal();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!token.is_cancelled(), "no signal yet");
        send("-TERM");
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .expect("SIGTERM cancels the token");

        // A supervisor of the election and a worker, stopped by SIGINT: its run returns, the
        // elector no longer leads.
        let elector = Elector::always_leader();
        let supervisor = Supervisor::new()
            .election(&elector)
            .worker("idle", |stop| async move {
                stop.cancelled().await;
                Ok::<_, std::io::Error>(())
            });
        let running = tokio::spawn(supervisor.run_until_signal());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(elector.is_leader(), "the election runs");
        send("-INT");
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("SIGINT ends run_until_signal")
            .expect("the supervisor's task");
        assert!(!elector.is_leader(), "the term ended with the run");
    }
}
