//! Setup the demo examples share (`demo`, `fenced`, `cron`, `shards`): each includes it as `mod common;`.
//! A folder without a `main.rs`, so Cargo does not take it for an example of its own.

use std::time::Instant;

/// Logs to stderr: `pg_elector` warnings unless `RUST_LOG` says otherwise, coloured on a
/// terminal.
pub(crate) fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "pg_elector=warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Prints a line headed by the milliseconds since this was called: `[   123 ms] text`.
pub(crate) fn say_since_now() -> impl Fn(String) + Copy {
    let started = Instant::now();
    move |text: String| println!("[{:>6} ms] {text}", started.elapsed().as_millis())
}
