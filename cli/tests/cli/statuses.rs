//! What a script sees when something is wrong: a clear message on stderr and a status of its
//! own, quickly, never a panic or a hang.

use std::process::Output;
use std::time::Duration;

use crate::common::*;

/// Runs `pg-elector ARGS` against `db`, with `DATABASE_URL` as `url` says; at most 10 s.
fn pg_elector_with(
    db: &pg_elector_testkit::TestDb,
    url: Option<&str>,
    args: &[&str],
) -> (Output, Duration) {
    let mut command = pg_elector(db);
    match url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    output_within(command.args(args), Duration::from_secs(10))
}

fn check(output: &Output, took: Duration, status: i32, says: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(status), "{stderr}");
    assert!(stderr.contains(says), "expected {says:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn bad_input_and_bad_environments_each_have_a_status() {
    let db = database().await;
    let run = ["run", "jobs/statuses", "--interval", "200ms", "--", "true"];
    let (out, took) = pg_elector_with(&db, None, &run);
    check(&out, took, 78, "no database given");
    let (out, took) = pg_elector_with(&db, Some("postgres://host:notaport/db"), &run);
    check(&out, took, 78, "the database URL");
    let (out, took) = pg_elector_with(&db, Some("postgres://nobody@127.0.0.1:1/db"), &run);
    check(&out, took, 68, "cannot reach the database");
    let tls = format!("{}?sslmode=require", db.url().split('?').next().unwrap());
    let (out, took) = pg_elector_with(&db, Some(&tls), &run);
    check(&out, took, 68, "server does not support TLS");
    let verify = format!(
        "{}?sslmode=verify-full",
        db.url().split('?').next().unwrap()
    );
    let (out, took) = pg_elector_with(&db, Some(&verify), &run);
    check(&out, took, 78, "no root certificate");
    let url = db.url();
    let (out, took) = pg_elector_with(&db, Some(&url), &["run", "jobs/statuses"]);
    check(&out, took, 64, "CMD");
    let (out, took) = pg_elector_with(
        &db,
        Some(&url),
        &["run", "x", "--grace", "soon", "--", "true"],
    );
    check(&out, took, 64, "--grace");
    let (out, took) = pg_elector_with(
        &db,
        Some(&url),
        &["run", "x", "--interval", "1ms", "--", "true"],
    );
    check(&out, took, 64, "interval");
}

#[tokio::test]
async fn a_command_that_cannot_run_is_127_or_126() {
    let (db, scratch) = (database().await, Scratch::new("cannot-run"));
    let url = db.url();
    let run = [
        "run",
        "jobs/missing",
        "--interval",
        "200ms",
        "--",
        "/nonexistent/command",
    ];
    let (out, took) = pg_elector_with(&db, Some(&url), &run);
    check(&out, took, 127, "/nonexistent/command: command not found");
    let script = scratch.path("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let script = script.to_string_lossy();
    let run = ["run", "jobs/missing", "--interval", "200ms", "--", &script];
    let (out, took) = pg_elector_with(&db, Some(&url), &run);
    check(&out, took, 126, "cannot run it");
}
