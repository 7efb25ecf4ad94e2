//! `status --watch`: read every interval until SIGINT or SIGTERM; a line for each change of
//! leader as it is seen, and the table (or a JSON line) whenever anything changed.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use pg_elector::LockKey;

use super::{Shown, Snapshot, StatusArgs, emit, read, render, write_failed};
use crate::connect;
use crate::exit::{self, Failure};

/// The shortest `--interval`: shorter would only load the server.
const SHORTEST: Duration = Duration::from_millis(10);

/// How many change lines a terminal keeps under the table it redraws.
const KEPT: usize = 10;

/// Parses `--interval`: a duration of [`SHORTEST`] or more.
pub(super) fn interval(text: &str) -> Result<Duration, String> {
    let every = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if every < SHORTEST {
        return Err(format!("at least {}", humantime::format_duration(SHORTEST)));
    }
    Ok(every)
}

/// Watches until SIGINT or SIGTERM (exit 0), which it hears from the start, a read in flight
/// included. A failed read is a line on stderr and the next interval reads again (a server
/// restart does not end the watch); only the first connection must succeed.
pub(super) async fn watch(url: Option<&str>, args: &StatusArgs) -> Result<i32, Failure> {
    let stop = stop_signals()?;
    tokio::pin!(stop);
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut screen = Screen {
        terminal,
        changes: VecDeque::new(),
    };
    let first = tokio::select! {
        biased;
        () = &mut stop => return Ok(exit::OK),
        first = first_read(url, args) => first?,
    };
    if let Err(e) = screen.draw(&first.0, args) {
        return write_failed(&e);
    }
    let mut last = first;
    loop {
        let next = tokio::select! {
            biased;
            () = &mut stop => return Ok(exit::OK),
            next = next_read(&last.1, args) => next,
        };
        let Some(next) = next else { continue };
        let changes = leader_changes(&last.0.keys, &next.keys);
        let redraw = next != last.0 || terminal;
        let drawn = screen.note(changes, args).and_then(|()| {
            if redraw {
                screen.draw(&next, args)
            } else {
                Ok(())
            }
        });
        if let Err(e) = drawn {
            return write_failed(&e);
        }
        last.0 = next;
    }
}

/// The pool and the first read; a failure here ends the watch with its status.
async fn first_read(
    url: Option<&str>,
    args: &StatusArgs,
) -> Result<(Snapshot, deadpool_postgres::Pool), Failure> {
    let pool = connect::pool(url, args.timeout).await?;
    let snapshot = read(&pool, args).await?;
    Ok((snapshot, pool))
}

/// Waits `--interval`, then reads; a failure is a line on stderr and `None`.
async fn next_read(pool: &deadpool_postgres::Pool, args: &StatusArgs) -> Option<Snapshot> {
    tokio::time::sleep(args.interval).await;
    match read(pool, args).await {
        Ok(shown) => Some(shown),
        Err(failure) => {
            let _ = writeln!(std::io::stderr(), "pg-elector: {}", failure.message);
            None
        }
    }
}

/// What the watch has printed: on a terminal the table is redrawn in place, with the latest
/// change lines under it; elsewhere every line is appended.
struct Screen {
    terminal: bool,
    changes: VecDeque<String>,
}

impl Screen {
    /// Prints `changes` (each stamped with the time), or keeps them for the next redraw on a
    /// terminal. JSON has no change lines: each document shows the leaders.
    fn note(&mut self, changes: Vec<String>, args: &StatusArgs) -> std::io::Result<()> {
        if args.json {
            return Ok(());
        }
        let at = humantime::format_rfc3339_seconds(SystemTime::now());
        for change in changes {
            let line = format!("{at} {change}");
            if self.terminal {
                self.changes.push_back(line);
                if self.changes.len() > KEPT {
                    self.changes.pop_front();
                }
            } else {
                emit(&line)?;
            }
        }
        Ok(())
    }

    /// The table (on a terminal: the screen cleared first, the kept change lines under it),
    /// or a JSON line.
    fn draw(&self, snapshot: &Snapshot, args: &StatusArgs) -> std::io::Result<()> {
        let mut text = render(snapshot, args, SystemTime::now());
        if self.terminal {
            text.insert_str(0, "\x1b[H\x1b[2J");
            for line in &self.changes {
                text.push('\n');
                text.push_str(line);
            }
        }
        emit(&text)
    }
}

/// A line for each key whose leader changed between `before` and `after`.
pub(crate) fn leader_changes(before: &[Shown], after: &[Shown]) -> Vec<String> {
    let mut keys: Vec<LockKey> = Vec::new();
    for key in before.iter().chain(after).map(|s| s.key) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let find = |list: &[Shown], key| list.iter().find(|s| s.key == key).and_then(Shown::leader);
    let who = |l: &Option<(String, i32, Option<u64>)>| match l {
        Some((identity, pid, Some(epoch))) => format!("{identity} (pid {pid}, epoch {epoch})"),
        Some((identity, pid, None)) => format!("{identity} (pid {pid})"),
        None => "nobody".to_owned(),
    };
    let mut lines = Vec::new();
    for key in keys {
        let (was, now) = (find(before, key), find(after, key));
        if was.as_ref().map(|l| l.1) == now.as_ref().map(|l| l.1) {
            continue;
        }
        let label = before
            .iter()
            .chain(after)
            .find(|s| s.key == key)
            .map(Shown::label)
            .unwrap_or_default();
        lines.push(format!("{label}: leader {} -> {}", who(&was), who(&now)));
    }
    lines
}

/// Resolves at the first SIGINT or SIGTERM.
fn stop_signals() -> Result<impl std::future::Future<Output = ()>, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind| {
        signal(kind)
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot listen for signals: {e}")))
    };
    let mut int = listen(SignalKind::interrupt())?;
    let mut term = listen(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_elector::LockKey;

    #[test]
    fn an_interval_under_10ms_is_refused() {
        assert!(interval("5ms").is_err());
        assert_eq!(interval("10ms"), Ok(Duration::from_millis(10)));
        assert!(interval("soon").is_err());
    }

    #[test]
    fn no_leader_on_either_side_is_no_change() {
        let shown = |name: &str| Shown {
            name: Some(name.into()),
            key: LockKey::from_name(name),
            status: None,
        };
        assert!(leader_changes(&[shown("a")], &[shown("a"), shown("b")]).is_empty());
    }
}
