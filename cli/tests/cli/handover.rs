//! `pg-elector handover`: the lead moves to the named live standby, whose command starts once
//! the old leader's command has ended; a refusal is a clear message and its own status.

use std::time::{Duration, Instant};

use pg_elector_testkit::replicas::timing;

use crate::common::*;

/// A command that records its start and its SIGTERM in `$SCRATCH/log`.
const RECORDER: &str = r#"
echo "start $PG_ELECTOR_IDENTITY" >> "$SCRATCH/log"
trap 'echo "term $PG_ELECTOR_IDENTITY" >> "$SCRATCH/log"; exit 0' TERM
while :; do sleep 0.02; done
"#;

#[tokio::test]
async fn a_handover_moves_the_lead_to_the_named_standby() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("handover"));
    let prefer = ["--preference", "1"];
    let _a = Replica::start(&db, &scratch, "jobs/move", "a", &prefer, RECORDER);
    scratch.wait_for_lines("log", 1, Duration::from_secs(10));
    let _b = Replica::start(&db, &scratch, "jobs/move", "b", &prefer, RECORDER);
    let _c = Replica::start(&db, &scratch, "jobs/move", "c", &prefer, RECORDER);
    // Both standbys live: they tried the lock at least once.
    std::thread::sleep(3 * I);
    let asked = Instant::now();
    let said = handover_to(&db, "jobs/move", "c", &["--stay-away", "1m"]);
    assert_eq!(said, "jobs/move: the lead goes to c\n");
    let log = scratch.wait_for_lines("log", 3, Duration::from_secs(5));
    assert_eq!(log, ["start a", "term a", "start c"]);
    // Seen at a's next check, drained, then c's next try or its waiting session.
    let took = asked.elapsed();
    assert!(
        took < 5 * I,
        "c's command started {took:?} after the request"
    );
}

#[tokio::test]
async fn a_refused_handover_says_why_with_its_own_status() {
    let (db, scratch) = (database().await, Scratch::new("refused"));
    let out = pg_elector(&db)
        .args(["handover", "jobs/nobody"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "nobody leads");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no replica leads the key"), "{said}");

    let _a = Replica::start(
        &db,
        &scratch,
        "jobs/refused",
        "a",
        &["--preference", "1"],
        RECORDER,
    );
    scratch.wait_for_lines("log", 1, Duration::from_secs(10));
    let out = pg_elector(&db)
        .args(["handover", "jobs/refused", "--to", "nobody"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(67), "no such standby");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no live standby named \"nobody\""), "{said}");
}
