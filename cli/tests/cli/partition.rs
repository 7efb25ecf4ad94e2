//! `pg-elector run` cut off from the database by a blackholed proxy: the library demotes it
//! within two intervals, before the server frees the lock, and its command is killed at once,
//! so the standby's command never runs beside it. Once the network heals, the cut-off replica
//! stands by again.

use std::time::{Duration, Instant};

use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::{FaultProxy, PgServer};

use crate::common::*;

/// A command that records its start in `$SCRATCH/log` and its pid in `NAME.child`.
const RECORDER: &str = r#"
echo "start $PG_ELECTOR_IDENTITY" >> "$SCRATCH/log"
echo $$ > "$SCRATCH/$PG_ELECTOR_IDENTITY.child"
while :; do sleep 0.02; done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_kills_its_command_before_the_standby_starts_its_own() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("partition"));
    let server = PgServer::shared().unwrap().addr();
    let proxy = FaultProxy::start(server).await.unwrap();
    let direct = db.url();
    let via = direct.replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    assert_ne!(via, direct, "the URL names the server's port");
    let mut a = Replica::start_via(&db, &via, &scratch, ["jobs/cut", "a"], &[], RECORDER);
    let child = pid_in(&scratch.path("a.child"), Duration::from_secs(10));
    let _b = Replica::start(&db, &scratch, "jobs/cut", "b", &[], RECORDER);
    waits(&db, "jobs/cut").await;

    proxy.blackhole();
    let cut = Instant::now();
    let mut a_gone = None;
    let b_started = loop {
        if a_gone.is_none() && !alive(child) {
            a_gone = Some(cut.elapsed());
        }
        let log = scratch.lines("log");
        if log.iter().any(|l| l == "start b") {
            break cut.elapsed();
        }
        assert!(cut.elapsed() < 20 * I, "b never started: {log:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    eprintln!("a's command gone {a_gone:?}, b's started {b_started:?} after the cut");
    let a_gone = a_gone.expect("a's command still ran when b's started");
    // Demoted within two intervals (its check's bound), the command killed at once: I of
    // slack for a loaded machine.
    assert!(a_gone < 3 * I, "a's command ran {a_gone:?} into the cut");
    // The server frees the lock within 4·I and milliseconds; 4·I of slack.
    assert!(b_started < 8 * I, "b's command started {b_started:?} after");

    proxy.pass();
    tokio::time::sleep(5 * I).await;
    assert_eq!(a.exit_within(Duration::ZERO), None, "a stands by again");
    assert_eq!(
        scratch.lines("log"),
        ["start a", "start b"],
        "b keeps the lead"
    );
}
