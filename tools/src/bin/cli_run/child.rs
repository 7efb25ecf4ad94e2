//! The commands the bench's `pg-elector` processes run: this binary again, recording its life
//! in the log with the wall clock (µs since 1970), each line one `write` of a file opened for
//! appending, so that lines of several processes never mix.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use pg_elector_testkit::replica::unix_us;

/// Appends `line` to the log at `log`.
pub(crate) fn record(log: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    file.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
}

fn identity() -> String {
    std::env::var("PG_ELECTOR_IDENTITY").unwrap_or_else(|_| "?".into())
}

/// `run`'s command: `start NAME PID US` at once; on SIGTERM `term NAME PID US`, then
/// `end NAME PID US` and exit 0. SIGKILL leaves no end: the bench sees the process gone.
pub(crate) fn run_command(log: &Path) {
    let (name, pid) = (identity(), std::process::id());
    record(log, &format!("start {name} {pid} {}", unix_us()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        term.recv().await;
    });
    record(log, &format!("term {name} {pid} {}", unix_us()));
    record(log, &format!("end {name} {pid} {}", unix_us()));
}

/// `cron`'s command: `due DUE NAME` at its start, `done DUE NAME` once its 300 ms of work are
/// done (a run cut off by a kill or a handover's SIGTERM has no `done`).
pub(crate) fn cron_command(log: &Path) {
    let due = std::env::var("PG_ELECTOR_DUE").unwrap_or_else(|_| "?".into());
    let name = identity();
    record(log, &format!("due {due} {name}"));
    std::thread::sleep(Duration::from_millis(300));
    record(log, &format!("done {due} {name}"));
}
