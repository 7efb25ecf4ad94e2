//! The replica processes: spawning, their first lines, their warnings.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector_testkit::TestDb;
use pg_elector_tools::Mode;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::options::Options;
use crate::snapshot::{Plan, Proc};
use crate::{
    CHILD_FLAG, ENV_BARE, ENV_ELECTORS, ENV_FAST, ENV_INDEX, ENV_INTERVAL_MS, ENV_POOL,
    ENV_PREPARED, ENV_SHAPE, ENV_URL, MARK,
};

/// The fleet's WARN and ERROR lines counted by their message and `error` field (a tracing line
/// reads `<time> WARN <spans>: pg_elector::<module>: <message> key=… error=…`).
pub(crate) fn is_warning(line: &str) -> bool {
    line.contains(" WARN ") || line.contains(" ERROR ")
}

pub(crate) fn warning_kinds(logs: &[String]) -> Vec<(String, usize)> {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for line in logs {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        let rest = &line[at + 1..];
        let level = rest.split_whitespace().next().unwrap_or("");
        let message = rest
            .find(" pg_elector")
            .and_then(|t| rest[t + 1..].find(": ").map(|c| &rest[t + 1 + c + 2..]))
            .unwrap_or(rest);
        let text: Vec<&str> = message
            .split_whitespace()
            .take_while(|w| !w.contains('='))
            .collect();
        let error = message
            .find("error=")
            .map(|e| {
                let value: String = message[e + 6..].chars().take(80).collect();
                format!(" (error={value})")
            })
            .unwrap_or_default();
        *kinds
            .entry(format!("{level} {}{error}", text.join(" ")))
            .or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    kinds
}

pub(crate) fn spawn_child(
    db: &TestDb,
    plan: &Plan,
    options: &Options,
    index: usize,
    electors: usize,
    logs: Arc<Mutex<Vec<String>>>,
) -> Proc {
    let mut command = Command::new(std::env::current_exe().expect("this binary"));
    command
        .arg(CHILD_FLAG)
        .env(ENV_URL, db.url())
        .env(ENV_INDEX, index.to_string())
        .env(ENV_ELECTORS, electors.to_string())
        .env(ENV_SHAPE, plan.shape.name())
        .env(ENV_INTERVAL_MS, options.interval.as_millis().to_string())
        .env(ENV_POOL, options.pool.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if plan.bare {
        command.env(ENV_BARE, "1");
    } else {
        command.env_remove(ENV_BARE);
    }
    match options.prepared {
        Some(on) => command.env(ENV_PREPARED, if on { "on" } else { "off" }),
        None => command.env_remove(ENV_PREPARED),
    };
    if plan.mode == Mode::Fast {
        command.env(ENV_FAST, "1");
    } else {
        command.env_remove(ENV_FAST);
    }
    let mut child = command.spawn().expect("start a replica process");
    let pid = child.id().expect("a running child") as i32;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if let Some(rest) = line.strip_prefix(MARK) {
                let _ = tx.send(rest.to_owned());
            }
        }
    });
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            logs.lock().unwrap().push(format!("fleet-{index}: {line}"));
        }
    });
    Proc {
        child,
        stdin,
        pid,
        lines,
    }
}

/// The next line from `proc` that starts with `prefix` (without it), within `limit`.
pub(crate) async fn expect_line(
    proc: &mut Proc,
    prefix: &str,
    limit: Duration,
) -> Result<String, String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, proc.lines.recv()).await {
            Err(_) => return Err(format!("no `{}` within {limit:?}", prefix.trim())),
            Ok(None) => return Err("the process ended".into()),
            Ok(Some(line)) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Ok(rest.to_owned());
                }
            }
        }
    }
}
