//! `pg-elector run`: the command on the leader only, its process group ended with the term.

use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::server::sql::{holders, terminate};

use crate::common::*;

/// A command that records its start (`start NAME PID`) and its SIGTERM (`term NAME`) in
/// `$SCRATCH/log`, its pid in `NAME.child`, and starts two grandchildren in the background
/// that ignore SIGTERM: one in its process group (its pid in `NAME.grandchild`), one that left
/// it with `setsid`, as a daemon does (`NAME.escapee`).
const RECORDER: &str = r#"
echo "start $PG_ELECTOR_IDENTITY $$" >> "$SCRATCH/log"
setsid sh -c 'trap "" TERM; exec sleep 1000' &
echo $! > "$SCRATCH/$PG_ELECTOR_IDENTITY.escapee"
sh -c 'trap "" TERM; exec sleep 1000' &
echo $! > "$SCRATCH/$PG_ELECTOR_IDENTITY.grandchild"
echo $$ > "$SCRATCH/$PG_ELECTOR_IDENTITY.child"
trap 'echo "term $PG_ELECTOR_IDENTITY" >> "$SCRATCH/log"; exit 0' TERM
while :; do sleep 0.02; done
"#;

/// The pids of `name`'s command, of its grandchild and of the one that left its group, once
/// all are recorded.
fn family(scratch: &Scratch, name: &str) -> (i32, i32, i32) {
    let within = Duration::from_secs(5);
    let pid = |what: &str| pid_in(&scratch.path(&format!("{name}.{what}")), within);
    (pid("child"), pid("grandchild"), pid("escapee"))
}

/// Whether none of `pids` runs.
fn all_gone(pids: &[i32]) -> bool {
    pids.iter().all(|&pid| !alive(pid))
}

/// The command is told its key, its replica and its term's epoch; when it ends on its own,
/// `run` gives the lead up and exits with its status, and the standby's command starts.
#[tokio::test]
async fn the_command_gets_key_identity_and_epoch_and_its_status_ends_the_lead() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("env"));
    let script = r#"echo "$PG_ELECTOR_KEY $PG_ELECTOR_IDENTITY $PG_ELECTOR_EPOCH" >> "$SCRATCH/env"; sleep 0.5; exit 3"#;
    let mut a = Replica::start(&db, &scratch, "jobs/env", "a", &["--fencing"], script);
    scratch.wait_for_lines("env", 1, Duration::from_secs(10));
    let mut b = Replica::start(&db, &scratch, "jobs/env", "b", &["--fencing"], script);
    assert_eq!(
        a.exit_within(Duration::from_secs(10)),
        Some(3),
        "a: its command's status"
    );
    assert_eq!(
        b.exit_within(Duration::from_secs(10)),
        Some(3),
        "b: its command's status"
    );
    let env = scratch.lines("env");
    let parsed: Vec<(&str, &str, u64)> = env
        .iter()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            (words[0], words[1], words[2].parse().expect("an epoch"))
        })
        .collect();
    assert_eq!(parsed.len(), 2, "{env:?}");
    assert_eq!((parsed[0].0, parsed[0].1), ("jobs/env", "a"));
    assert_eq!((parsed[1].0, parsed[1].1), ("jobs/env", "b"));
    assert!(
        parsed[1].2 > parsed[0].2,
        "a later term, a larger epoch: {env:?}"
    );
}

/// A SIGKILLed `pg-elector` takes its command's whole group with it (the grandchild that
/// ignores SIGTERM too), and the standby's command starts only once they are gone.
#[tokio::test]
async fn a_killed_leader_takes_its_whole_group_with_it() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("killed"));
    let a = Replica::start(&db, &scratch, "jobs/killed", "a", &[], RECORDER);
    let (child, grandchild, escapee) = family(&scratch, "a");
    let _b = Replica::start(&db, &scratch, "jobs/killed", "b", &[], RECORDER);
    waits(&db, "jobs/killed").await;
    a.signal("KILL");
    let killed = Instant::now();
    let log = scratch.wait_for_lines("log", 2, Duration::from_secs(5));
    let took = killed.elapsed();
    let alive_then = [child, grandchild, escapee].map(alive);
    eprintln!("b's command started {took:?} after a was killed");
    assert!(log[1].starts_with("start b"), "{log:?}");
    // All but certain, not guaranteed: the kernel closes a's socket a moment before it
    // signals the keeper, which then kills the group within microseconds, while b's command
    // starts milliseconds after the server frees the lock.
    assert_eq!(
        alive_then, [false; 3],
        "a's command, grandchild, escapee alive when b's started"
    );
    // Fast takeover: milliseconds; 5·I of slack for a loaded machine.
    assert!(
        took < 5 * I,
        "b's command started {took:?} after a was killed"
    );
}

/// A lock session the server ends: the command's group is killed at once (another replica
/// may already lead), and the replica stands by again and leads again.
#[tokio::test]
async fn a_lost_lock_session_kills_the_group_at_once() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("lost"));
    let _a = Replica::start(&db, &scratch, "jobs/lost", "a", &[], RECORDER);
    let (child, grandchild, escapee) = family(&scratch, "a");
    std::fs::remove_file(scratch.path("a.child")).unwrap();
    let client = db.connect().await.unwrap();
    let holder = holders(&client, LockKey::from_name("jobs/lost"))
        .await
        .unwrap();
    terminate(&client, holder[0]).await.unwrap();
    let ended = Instant::now();
    let gone = wait_until(Duration::from_secs(5), || {
        all_gone(&[child, grandchild, escapee]).then_some(())
    });
    let took = ended.elapsed();
    eprintln!("the group was gone {took:?} after the lock session ended");
    assert!(gone.is_some(), "the group outlived the lost lead");
    // The session's end is seen within milliseconds; I of slack.
    assert!(
        took < I,
        "the group was gone {took:?} after the session ended"
    );
    assert!(
        !scratch.lines("log").iter().any(|l| l.starts_with("term")),
        "killed, not asked"
    );
    let again = pid_in(&scratch.path("a.child"), 5 * I);
    assert_ne!(again, child, "a leads again with a new command");
}

/// SIGTERM (or SIGINT) to `pg-elector`: the command gets SIGTERM, the grandchild that ignores
/// it SIGKILL after the grace, and only then is the lock given up: the standby's command
/// starts after the group is gone. `pg-elector` exits 0.
#[tokio::test]
async fn sigterm_ends_the_group_within_the_grace_before_the_lock_goes() {
    for signal in ["TERM", "INT"] {
        let _timing = timing();
        let (db, scratch) = (
            database().await,
            Scratch::new(&format!("graceful-{signal}")),
        );
        let mut a = Replica::start(
            &db,
            &scratch,
            "jobs/graceful",
            "a",
            &["--grace", "1s"],
            RECORDER,
        );
        let (_, grandchild, escapee) = family(&scratch, "a");
        let _b = Replica::start(&db, &scratch, "jobs/graceful", "b", &[], RECORDER);
        waits(&db, "jobs/graceful").await;
        a.signal(signal);
        let asked = Instant::now();
        let log = scratch.wait_for_lines("log", 3, Duration::from_secs(10));
        let took = asked.elapsed();
        let grandchild_alive = !all_gone(&[grandchild, escapee]);
        assert_eq!(
            log[1], "term a",
            "{signal}: the command was asked to end: {log:?}"
        );
        assert!(log[2].starts_with("start b"), "{log:?}");
        assert!(
            !grandchild_alive,
            "{signal}: a grandchild outlived the lock"
        );
        // The grandchild ignores SIGTERM: killed at the 1 s grace, then the unlock.
        assert!(
            took >= Duration::from_millis(900),
            "{signal}: b started {took:?} after"
        );
        assert_eq!(
            a.exit_within(Duration::from_secs(5)),
            Some(0),
            "{signal}: a clean stop"
        );
    }
}

/// `--restart on-failure`: a failed command runs again after a pause, on the same term; a
/// success ends `run` with 0.
#[tokio::test]
async fn restart_on_failure_runs_a_failed_command_again() {
    let (db, scratch) = (database().await, Scratch::new("restart"));
    let script = r#"echo run >> "$SCRATCH/runs"; [ "$(wc -l < "$SCRATCH/runs")" -ge 2 ]"#;
    let mut a = Replica::start(
        &db,
        &scratch,
        "jobs/restart",
        "a",
        &["--restart", "on-failure"],
        script,
    );
    assert_eq!(a.exit_within(Duration::from_secs(10)), Some(0));
    assert_eq!(scratch.lines("runs").len(), 2);
}

/// `--once`: a replica whose lead was lost leaves, with its command's status (killed).
#[tokio::test]
async fn once_leaves_after_the_first_term() {
    let (db, scratch) = (database().await, Scratch::new("once"));
    let mut a = Replica::start(&db, &scratch, "jobs/once", "a", &["--once"], RECORDER);
    family(&scratch, "a");
    let client = db.connect().await.unwrap();
    let holder = holders(&client, LockKey::from_name("jobs/once"))
        .await
        .unwrap();
    terminate(&client, holder[0]).await.unwrap();
    assert_eq!(
        a.exit_within(Duration::from_secs(5)),
        Some(137),
        "SIGKILL's status"
    );
}

/// A frozen `pg-elector` (SIGSTOP) cannot end its command, so its keeper does: once it has
/// seen `pg-elector` stopped for two intervals, it kills the group, before the server frees
/// the silent leader's lock (four intervals after its last check): the standby's command
/// starts only after it, never beside it. Thawed, `pg-elector` stands by again.
#[tokio::test]
async fn a_frozen_leaders_command_is_killed_before_the_standby_leads() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("frozen"));
    let mut a = Replica::start(&db, &scratch, "jobs/frozen", "a", &[], RECORDER);
    let (child, grandchild, escapee) = family(&scratch, "a");
    let _b = Replica::start(&db, &scratch, "jobs/frozen", "b", &[], RECORDER);
    waits(&db, "jobs/frozen").await;
    a.signal("STOP");
    let stopped = Instant::now();
    let mut gone = None;
    let b_started = loop {
        if gone.is_none() && all_gone(&[child, grandchild, escapee]) {
            gone = Some(stopped.elapsed());
        }
        if scratch
            .lines("log")
            .iter()
            .any(|l| l.starts_with("start b"))
        {
            break stopped.elapsed();
        }
        assert!(stopped.elapsed() < 20 * I, "b never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    a.signal("CONT");
    eprintln!(
        "the frozen leader's group gone {gone:?}, b's command started {b_started:?} after the stop"
    );
    let gone = gone.expect("the frozen leader's command ran beside b's");
    // Two intervals seen stopped, looked at every half interval: I of slack.
    assert!(gone < 3 * I, "the group was gone {gone:?} after the stop");
    tokio::time::sleep(3 * I).await;
    assert_eq!(a.exit_within(Duration::ZERO), None, "a stands by again");
}

/// Should the server end a frozen leader's session at once (`pg_terminate_backend`), the
/// standby leads at once, and the frozen leader's command runs beside it until its keeper
/// has seen `pg-elector` stopped for two intervals (the exception the README names).
#[tokio::test]
async fn a_frozen_leaders_command_ends_two_intervals_into_the_stop() {
    let _timing = timing();
    let (db, scratch) = (database().await, Scratch::new("frozen-ended"));
    let a = Replica::start(&db, &scratch, "jobs/frozen-ended", "a", &[], RECORDER);
    let (child, grandchild, escapee) = family(&scratch, "a");
    let _b = Replica::start(&db, &scratch, "jobs/frozen-ended", "b", &[], RECORDER);
    waits(&db, "jobs/frozen-ended").await;
    a.signal("STOP");
    let stopped = Instant::now();
    let client = db.connect().await.unwrap();
    let holder = holders(&client, LockKey::from_name("jobs/frozen-ended"))
        .await
        .unwrap();
    terminate(&client, holder[0]).await.unwrap();
    let log = scratch.wait_for_lines("log", 2, Duration::from_secs(5));
    assert!(log[1].starts_with("start b"), "{log:?}");
    let gone = wait_until(Duration::from_secs(5), || {
        all_gone(&[child, grandchild, escapee]).then_some(())
    });
    let took = stopped.elapsed();
    a.signal("CONT");
    eprintln!("the frozen leader's group was gone {took:?} after the stop");
    assert!(gone.is_some(), "the group outlived the stop");
    assert!(
        took >= 2 * I,
        "killed {took:?} into the stop, before two intervals"
    );
    assert!(took < 3 * I, "gone {took:?} after the stop");
}

/// A command that is no shell (a shell clears the signal mask it was started with; most
/// programs do not) gets the graceful end too: `sleep` ends at SIGTERM, long before the
/// grace. It used to start with SIGTERM blocked, the keeper's mask, and to be killed only
/// when the grace ran out.
#[tokio::test]
async fn a_command_that_is_no_shell_ends_at_sigterm() {
    let _timing = timing();
    let db = database().await;
    let mut a = pg_elector(&db)
        .args(["run", "jobs/plain", "--interval", "200ms", "--grace", "10s"])
        .args(["--", "sleep", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = db.connect().await.unwrap();
    let key = LockKey::from_name("jobs/plain");
    let mut leads = false;
    for _ in 0..500 {
        let sessions = pg_elector_testkit::server::sql::lock_sessions(&client, key)
            .await
            .unwrap();
        if sessions.iter().any(|s| s.granted) {
            leads = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(leads, "pg-elector leads within 10 s");
    // The command is started right after the grant.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = wait_until(Duration::from_secs(15), || a.try_wait().unwrap());
    let took = asked.elapsed();
    let _ = a.kill();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "a clean stop");
    assert!(
        took < Duration::from_secs(3),
        "pg-elector stopped {took:?} after SIGTERM: the command waited for the 10 s grace"
    );
}
