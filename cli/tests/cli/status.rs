//! `pg-elector status`: the table and the JSON show the leader of each key by the name given,
//! its waiting standby and the candidates; `--watch` prints each change of leader as it
//! happens and stops cleanly at SIGTERM; a bad environment has its status.

use std::process::Stdio;
use std::time::Duration;

use pg_elector_testkit::replicas::timing;
use serde_json::Value;

use crate::common::*;

/// A command that records its start in `$SCRATCH/log` and runs until stopped.
const RECORDER: &str = r#"
echo "start $PG_ELECTOR_IDENTITY" >> "$SCRATCH/log"
while :; do sleep 0.02; done
"#;

/// `pg-elector status ARGS…`: its stdout, after checking it exited 0 within 10 s.
fn status(db: &pg_elector_testkit::TestDb, args: &[&str]) -> String {
    let (out, _) = output_within(
        pg_elector(db).arg("status").args(args),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn the_table_and_the_json_show_leader_standby_and_candidates_by_name() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("status"));
    let a = Replica::start(
        &db,
        &scratch,
        "jobs/status",
        "a",
        &["--preference", "3"],
        RECORDER,
    );
    scratch.wait_for_lines("log", 1, Duration::from_secs(10));
    let _b = Replica::start(
        &db,
        &scratch,
        "jobs/status",
        "b",
        &["--preference", "1"],
        RECORDER,
    );
    // b waits (fast takeover) and has written its row (at its first try, before it waits).
    waits(&db, "jobs/status").await;

    let table = status(&db, &["jobs/status", "jobs/none"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let cells = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cells(lines[0]),
        [
            "KEY",
            "LEADER",
            "PID",
            "ADDRESS",
            "AGE",
            "EPOCH",
            "WAITING",
            "CANDIDATES",
            "HANDOVER"
        ]
    );
    let row = cells(lines[1]);
    assert_eq!(row[0..2], ["jobs/status", "a"], "{table}");
    assert!(row[2].parse::<i32>().is_ok(), "a pid: {table}");
    assert_eq!(row[6..], ["b", "b:1*", "-"], "{table}");
    assert_eq!(
        cells(lines[2])[0..3],
        ["jobs/none", "(nobody)", "-"],
        "{table}"
    );

    let doc: Value = serde_json::from_str(&status(&db, &["jobs/status", "--json"])).unwrap();
    let keys = doc["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{doc}");
    let key = &keys[0];
    assert_eq!(key["name"], "jobs/status");
    assert_eq!(key["leader"]["identity"], "a");
    assert_eq!(key["waiting"][0]["identity"], "b");
    assert_eq!(key["candidates"][0]["identity"], "b");
    assert_eq!(key["candidates"][0]["preference"], 1);
    assert_eq!(key["candidates"][0]["live"], true);
    assert_eq!(key["candidates"][0]["waits"], true);
    assert_eq!(key["handover"], Value::Null);
    drop(a);
}

#[tokio::test]
async fn watch_prints_each_change_of_leader_and_stops_at_sigterm() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("status-watch"));
    let out = std::fs::File::create(scratch.path("watch.out")).unwrap();
    // Killed when the test ends, however it ends.
    let mut watch = Replica {
        child: pg_elector(&db)
            .args(["status", "jobs/watched", "--watch", "--interval", "50ms"])
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    let changes = |n: usize| {
        wait_until(Duration::from_secs(10), || {
            let lines: Vec<String> = scratch
                .lines("watch.out")
                .into_iter()
                .filter(|l| l.contains("jobs/watched: leader"))
                .collect();
            (lines.len() >= n).then_some(lines)
        })
        .unwrap_or_else(|| panic!("{n} changes: {:?}", scratch.lines("watch.out")))
    };
    // Its first table (nobody leads) is out before the first replica starts.
    scratch.wait_for_lines("watch.out", 2, Duration::from_secs(10));
    let a = Replica::start(&db, &scratch, "jobs/watched", "a", &[], RECORDER);
    let first = changes(1);
    assert!(
        first[0].contains("jobs/watched: leader nobody -> a (pid "),
        "{first:?}"
    );
    let _b = Replica::start(&db, &scratch, "jobs/watched", "b", &[], RECORDER);
    waits(&db, "jobs/watched").await;
    a.signal("KILL");
    // b's waiting session takes the lock within milliseconds; a 50 ms read may still see
    // nobody in between.
    let both = wait_until(Duration::from_secs(10), || {
        let lines = changes(2);
        lines
            .last()
            .unwrap()
            .contains(" -> b (pid ")
            .then_some(lines)
    })
    .unwrap_or_else(|| panic!("no change to b: {:?}", scratch.lines("watch.out")));
    assert!(
        both[1].contains("jobs/watched: leader a (pid "),
        "a's end is the next change: {both:?}"
    );
    assert!(both.len() <= 3, "at most a -> nobody -> b: {both:?}");
    // The table is drawn again after each change (right after its line): once at the start
    // and once per change.
    let redrawn = wait_until(Duration::from_secs(2), || {
        let lines = scratch.lines("watch.out");
        let headers = lines.iter().filter(|l| l.starts_with("KEY ")).count();
        (headers > both.len()).then_some(())
    });
    assert!(redrawn.is_some(), "{:?}", scratch.lines("watch.out"));

    watch.signal("TERM");
    assert_eq!(
        watch.exit_within(Duration::from_secs(5)),
        Some(0),
        "exit 0 at SIGTERM"
    );
}

#[tokio::test]
async fn a_bad_environment_has_its_status() {
    let db = database().await;
    let (out, _) = output_within(
        pg_elector(&db)
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/db")
            .arg("status"),
        Duration::from_secs(10),
    );
    assert_eq!(
        out.status.code(),
        Some(68),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (out, _) = output_within(
        pg_elector(&db).env_remove("DATABASE_URL").arg("status"),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(78));
}

/// `pg-elector status ARGS…` run off the runtime's threads: its stdout, after checking it
/// exited 0 within 10 s.
async fn status_async(db: &pg_elector_testkit::TestDb, args: &[&str]) -> String {
    let url = db.url();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let (out, _) = output_within(
            std::process::Command::new(env!("CARGO_BIN_EXE_pg-elector"))
                .env("DATABASE_URL", url)
                .env_remove("PG_ELECTOR_LOG")
                .arg("status")
                .args(args),
            Duration::from_secs(10),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap()
}

/// A group of shards shows as a group (its members and their shards), named as given, and its
/// shards' keys not as keys of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_shards_shows_its_members_not_its_shard_keys() {
    use pg_elector::shards::Shards;
    let _timing = timing();
    let db = database().await;
    let shards = Shards::builder(db.pool(2), "billing/tenants", 4)
        .check_interval(I)
        .identity("m1")
        .build()
        .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = shards.spawn(shutdown.clone());
    let mut owned = 0;
    for _ in 0..1000 {
        owned = shards.owned().len();
        if owned == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let json = status_async(&db, &["--json", "billing/tenants"]).await;
    let table = status_async(&db, &["billing/tenants"]).await;
    shutdown.cancel();
    let _ = task.await;
    assert_eq!(owned, 4, "the lone member owns the four shards within 10 s");

    let doc: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        doc["keys"],
        Value::Array(vec![]),
        "no shard as a key: {doc}"
    );
    let group = &doc["groups"][0];
    assert_eq!(group["name"], "billing/tenants", "{doc}");
    assert_eq!(group["count"], 4, "{doc}");
    assert_eq!(group["members"][0]["identity"], "m1", "{doc}");
    assert_eq!(
        group["members"][0]["owned"],
        serde_json::json!([0, 1, 2, 3]),
        "{doc}"
    );
    assert_eq!(group["unowned"], serde_json::json!([]), "{doc}");
    let line = table
        .lines()
        .find(|l| l.starts_with("billing/tenants"))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cells,
        ["billing/tenants", "4", "m1", cells[3], "4", "0-3"],
        "{table}"
    );
}
