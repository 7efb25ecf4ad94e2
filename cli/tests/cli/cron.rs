//! `pg-elector cron`: each due once across three replicas, through a SIGKILL of the leader
//! and a handover; the command's status is the run's outcome in the jobs table.

use std::collections::BTreeMap;
use std::time::Duration;

use pg_elector_testkit::replicas::timing;

use crate::common::*;

/// Records each due it runs (`DUE IDENTITY` in `$SCRATCH/dues`), then works for 300 ms.
const RECORDER: &str =
    r#"echo "$PG_ELECTOR_DUE $PG_ELECTOR_IDENTITY" >> "$SCRATCH/dues"; sleep 0.3"#;

/// Every second, on replicas that may take a handover.
const EVERY_SECOND: [&str; 4] = ["--schedule", "* * * * * *", "--preference", "1"];

fn cron(
    db: &pg_elector_testkit::TestDb,
    scratch: &Scratch,
    name: &str,
    extra: &[&str],
    script: &str,
) -> Replica {
    Replica::start_as(db, scratch, "cron", "jobs/tick", name, extra, script)
}

/// The identity that ran the latest due.
fn latest(scratch: &Scratch) -> String {
    let dues = scratch.lines("dues");
    dues.last()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn each_due_runs_once_across_replicas_through_a_kill_and_a_handover() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("cron"));
    let mut replicas: BTreeMap<String, Replica> = BTreeMap::new();
    replicas.insert(
        "a".into(),
        cron(&db, &scratch, "a", &EVERY_SECOND, RECORDER),
    );
    scratch.wait_for_lines("dues", 1, Duration::from_secs(10));
    for name in ["b", "c"] {
        replicas.insert(
            name.into(),
            cron(&db, &scratch, name, &EVERY_SECOND, RECORDER),
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    let killed = latest(&scratch);
    replicas[&killed].signal("KILL");
    std::thread::sleep(Duration::from_millis(2000));
    let leader = latest(&scratch);
    assert_ne!(
        leader, killed,
        "another replica runs the dues after the kill"
    );
    let target = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != killed && *n != leader)
        .unwrap();
    handover_to(&db, "jobs/tick", target, &[]);
    std::thread::sleep(Duration::from_millis(2000));
    for (name, replica) in replicas.iter_mut().filter(|(n, _)| **n != killed) {
        replica.signal("TERM");
        assert_eq!(
            replica.exit_within(Duration::from_secs(15)),
            Some(0),
            "{name}: a clean stop"
        );
    }
    let dues = scratch.lines("dues");
    let mut runs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in &dues {
        let (due, by) = line.split_once(' ').unwrap();
        runs.entry(due).or_default().push(by);
    }
    let twice: Vec<_> = runs.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "dues that ran twice: {twice:?}");
    let ran_by: std::collections::BTreeSet<&str> = runs.values().flatten().copied().collect();
    assert!(
        ran_by.contains(target),
        "the handover's target ran dues: {dues:?}"
    );
    // About six seconds of dues, none missed across the kill and the handover.
    assert!(runs.len() >= 5, "{} dues ran: {dues:?}", runs.len());
    let seconds: Vec<u64> = runs
        .keys()
        .map(|due| {
            humantime::parse_rfc3339(due)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        })
        .collect();
    let gaps: Vec<_> = seconds.windows(2).filter(|w| w[1] != w[0] + 1).collect();
    assert!(gaps.is_empty(), "dues missed between: {gaps:?} in {dues:?}");
}

#[tokio::test]
async fn the_commands_status_is_the_runs_outcome() {
    let (db, scratch) = (database().await, Scratch::new("cron-outcome"));
    let script = r#"echo "$PG_ELECTOR_DUE" >> "$SCRATCH/dues"; exit 4"#;
    let mut a = cron(&db, &scratch, "a", &["--schedule", "* * * * * *"], script);
    scratch.wait_for_lines("dues", 2, Duration::from_secs(10));
    a.signal("TERM");
    assert_eq!(a.exit_within(Duration::from_secs(15)), Some(0));
    let client = db.connect().await.unwrap();
    let rows = client
        .query(
            "SELECT outcome, coalesce(error, '') FROM pg_elector_job_runs WHERE job = 'jobs/tick'",
            &[],
        )
        .await
        .unwrap();
    let failed = rows
        .iter()
        .filter(|row| row.get::<_, String>(0) == "failed")
        .count();
    assert!(failed >= 1, "failed runs recorded");
    let error: String = rows[0].get(1);
    assert!(
        error.contains("the command exited with status 4"),
        "{error}"
    );
    // `status` shows the job, its next due and its last run's outcome.
    let (out, _) = output_within(
        pg_elector(&db).args(["status", "--json"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = &doc["jobs"][0];
    assert_eq!(job["job"], "jobs/tick", "{doc}");
    assert_eq!(job["schedule"], "cron * * * * * * UTC", "{doc}");
    assert_eq!(job["last_run"]["outcome"], "failed", "{doc}");
    assert_eq!(job["last_run"]["by"], "a", "{doc}");
    assert!(job["next_due"].is_string(), "{doc}");
}

#[tokio::test]
async fn a_bad_schedule_is_65_before_anything_else() {
    let db = database().await;
    for (schedule, zone, says) in [
        ("* 25 * * *", "UTC", "* 25 * * *"),
        ("0 * * * *", "Mars/Olympus", "Mars/Olympus"),
    ] {
        let args = [
            "cron",
            "jobs/bad",
            "--schedule",
            schedule,
            "--tz",
            zone,
            "--",
            "true",
        ];
        let (out, took) = output_within(pg_elector(&db).args(args), Duration::from_secs(10));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(65),
            "{schedule} in {zone}: {stderr}"
        );
        assert!(stderr.contains(says), "{stderr}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
