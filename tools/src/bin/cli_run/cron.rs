//! `pg-elector cron` across three replicas, the one running the dues SIGKILLed and the lead
//! handed over in turn: every due from the first to the last starts once (`--catch-up all`:
//! the dues a new leader finds missed run late rather than being skipped; a run cut off by a
//! SIGKILL holds the job back until it is found abandoned, three seconds at least).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use pg_elector_testkit::TestDb;
use rustix::process::{Pid, Signal, kill_process};

const NAMES: [&str; 3] = ["a", "b", "c"];

/// `pg-elector cron KEY` every second as replica `name`, its command this binary.
fn spawn(db: &TestDb, bin: &Path, log: &Path, name: &str, interval: Duration) -> Child {
    let interval = format!("{}ms", interval.as_millis());
    Command::new(bin)
        .env("DATABASE_URL", db.url())
        .env_remove("PG_ELECTOR_LOG")
        .args([
            "cron",
            "bench/cron",
            "--schedule",
            "* * * * * *",
            "--catch-up",
            "all",
        ])
        .args([
            "--interval",
            &interval,
            "--fast-takeover",
            "--identity",
            name,
        ])
        .args(["--preference", "1", "--"])
        .arg(std::env::current_exe().expect("this binary's path"))
        .args([crate::CRON_CHILD, &log.to_string_lossy()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log.with_file_name(format!("cron-{name}.err")))
                .map_or_else(|_| Stdio::null(), Stdio::from),
        )
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()))
}

/// `(due, replica)` of every line of `kind` (`due`: a run's start, `done`: its end) in `log`.
fn lines(log: &Path, kind: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                [k, due, name] if k == kind => Some((due.to_owned(), name.to_owned())),
                _ => None,
            }
        })
        .collect()
}

/// `(due, replica)` of every run started, in `log`.
fn runs(log: &Path) -> Vec<(String, String)> {
    lines(log, "due")
}

/// Runs the three replicas for `span` and prints what ran.
pub(crate) async fn bench(db: &TestDb, bin: &Path, log: &Path, span: Duration, interval: Duration) {
    let mut replicas: BTreeMap<&str, Child> = NAMES
        .iter()
        .map(|&name| (name, spawn(db, bin, log, name, interval)))
        .collect();
    let (mut kills, mut handovers) = (0, 0);
    let started = tokio::time::Instant::now();
    let mut turn = 0;
    while started.elapsed() < span {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Some((_, runner)) = runs(log).pop() else {
            continue;
        };
        let runner = NAMES.into_iter().find(|n| *n == runner).expect("a replica");
        if turn % 2 == 0 {
            let process = replicas.get_mut(runner).expect("the runner");
            let _ = process.kill();
            let _ = process.wait();
            kills += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            replicas.insert(runner, spawn(db, bin, log, runner, interval));
        } else {
            let to = NAMES[(NAMES.iter().position(|n| *n == runner).unwrap() + 1) % 3];
            let handed = Command::new(bin)
                .env("DATABASE_URL", db.url())
                .args(["handover", "bench/cron", "--to", to, "--stay-away", "2s"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            handovers += usize::from(handed);
        }
        turn += 1;
    }
    for process in replicas.values_mut() {
        let _ = kill_process(Pid::from_child(process), Signal::TERM);
    }
    for process in replicas.values_mut() {
        let _ = process.wait();
    }
    let cut_off = runs(log).len().saturating_sub(lines(log, "done").len());
    report(&runs(log), kills, handovers, cut_off);
}

/// Prints the dues that started, twice, those missed between the first and the last, and the
/// runs cut off (a kill, or a handover's SIGTERM).
fn report(runs: &[(String, String)], kills: usize, handovers: usize, cut_off: usize) {
    let mut by_due: BTreeMap<SystemTime, Vec<&str>> = BTreeMap::new();
    for (due, name) in runs {
        let Ok(due) = humantime::parse_rfc3339(due) else {
            println!("cron: an unreadable due {due:?}");
            continue;
        };
        by_due.entry(due).or_default().push(name);
    }
    let twice = by_due.values().filter(|by| by.len() > 1).count();
    let (Some(first), Some(last)) = (by_due.keys().next(), by_due.keys().next_back()) else {
        println!("\ncron: no due ran");
        return;
    };
    let expected = last.duration_since(*first).unwrap_or_default().as_secs() + 1;
    let missed = expected.saturating_sub(by_due.len() as u64);
    let mut gaps = Vec::new();
    let dues: Vec<&SystemTime> = by_due.keys().collect();
    for pair in dues.windows(2) {
        let gap = pair[1]
            .duration_since(*pair[0])
            .unwrap_or_default()
            .as_secs();
        if gap > 1 {
            let after = pair[0].duration_since(*first).unwrap_or_default().as_secs();
            gaps.push(format!("{} missing after +{after} s", gap - 1));
        }
    }
    if !gaps.is_empty() {
        println!("cron: missed dues: {}", gaps.join(", "));
    }
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for by in by_due.values().flatten() {
        *per_replica.entry(by).or_default() += 1;
    }
    println!(
        "\ncron, three replicas, every second: {} dues started through {kills} SIGKILLs of the \
         replica running them and {handovers} handovers; started twice: {twice}; missed \
         between the first and the last: {missed}; runs cut off: {cut_off}; by replica: \
         {per_replica:?}",
        by_due.len()
    );
}
