//! TLS as libpq's settings in the URL say, against a server of its own that speaks TLS and
//! refuses plain sessions to its TLS users (so a command that succeeds spoke TLS): the server's
//! certificate names `localhost` only, and one user logs in by client certificate.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use pg_elector_testkit::PgServer;
use pg_elector_testkit::server::TlsFiles;

use crate::common::*;

/// A user that the server refuses without TLS.
const TLS_ONLY: &str = "tls_only";
/// A user that logs in by client certificate (the kit's client certificate names it).
const BY_CERT: &str = "tls_client";

struct TlsServer {
    server: PgServer,
    files: TlsFiles,
}

/// The module's server, started (and given its users and TLS) on first use.
fn tls_server() -> &'static TlsServer {
    static SERVER: OnceLock<TlsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = PgServer::spawn().unwrap_or_else(|e| panic!("{e}"));
        std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(add_users(&server));
            });
        });
        let files = server
            .enable_tls(&[
                &format!("hostnossl all {TLS_ONLY},{BY_CERT} 127.0.0.1/32 reject"),
                &format!("hostssl all {BY_CERT} 127.0.0.1/32 cert"),
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        TlsServer { server, files }
    })
}

async fn add_users(server: &PgServer) {
    let (client, connection) = server
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for user in [TLS_ONLY, BY_CERT] {
        let sql = format!("CREATE ROLE {user} LOGIN SUPERUSER");
        client.batch_execute(&sql).await.unwrap();
    }
}

/// `postgres://USER@HOST:PORT/postgres?QUERY` on the module's server.
fn url(user: &str, host: &str, query: &str) -> String {
    let port = tls_server().server.addr().port();
    format!("postgres://{user}@{host}:{port}/postgres?{query}")
}

/// `sslrootcert=FILE`, percent-encoded as a URL's query needs.
fn root(file: &Path) -> String {
    format!("sslrootcert={}", file.display()).replace('/', "%2F")
}

/// `pg-elector ARGS…` with `DATABASE_URL` = `url` and `HOME` = `home` (where libpq's default
/// files are looked for); at most 10 s.
fn pg_elector_at(url: &str, home: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pg-elector"));
    command
        .env("DATABASE_URL", url)
        .env("HOME", home)
        .env_remove("PG_ELECTOR_LOG")
        .args(args);
    let (output, took) = output_within(&mut command, Duration::from_secs(10));
    assert!(took < Duration::from_secs(10), "{url}: {took:?}");
    output
}

/// `pg-elector status` with `url` ends with `status`, its stderr saying `says`.
fn status_is(url: &str, home: &Path, status: i32, says: &str) {
    let out = pg_elector_at(url, home, &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{url}: {stderr}");
    assert!(
        stderr.contains(says),
        "{url}: expected {says:?} in {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{url}: {stderr}");
}

/// An empty home: no `~/.postgresql` files.
fn empty_home(scratch: &Scratch) -> PathBuf {
    let home = scratch.path("home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

#[test]
fn the_server_is_checked_as_sslmode_says() {
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-modes"));
    let home = empty_home(&scratch);
    let (ca, stranger) = (root(&files.root_cert()), root(&files.stranger_root_cert()));
    let full = url(TLS_ONLY, "localhost", &format!("sslmode=verify-full&{ca}"));
    status_is(&full, &home, 0, "");
    let port = tls_server().server.addr().port();
    let key_values = format!(
        "host=localhost port={port} user={TLS_ONLY} dbname=postgres sslmode=verify-full \
         sslrootcert='{}'",
        files.root_cert().display()
    );
    status_is(&key_values, &home, 0, "");
    // The certificate names localhost, not 127.0.0.1: verify-full refuses, verify-ca does not.
    let by_address = url(TLS_ONLY, "127.0.0.1", &format!("sslmode=verify-full&{ca}"));
    status_is(&by_address, &home, 68, "not valid for name");
    let chain_only = url(TLS_ONLY, "127.0.0.1", &format!("sslmode=verify-ca&{ca}"));
    status_is(&chain_only, &home, 0, "");
    // require: encrypted without a root; with a root, the chain must lead to it.
    status_is(&url(TLS_ONLY, "127.0.0.1", "sslmode=require"), &home, 0, "");
    let strange = url(
        TLS_ONLY,
        "localhost",
        &format!("sslmode=require&{stranger}"),
    );
    status_is(&strange, &home, 68, "invalid peer certificate");
    // The default: TLS when offered, and this user needs it.
    status_is(&url(TLS_ONLY, "localhost", ""), &home, 0, "");
    status_is(
        &url(TLS_ONLY, "localhost", "sslmode=disable"),
        &home,
        68,
        "reject",
    );
}

#[test]
fn missing_roots_and_files_are_bad_urls_and_home_roots_count() {
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-files"));
    let home = empty_home(&scratch);
    let full = url(TLS_ONLY, "localhost", "sslmode=verify-full");
    status_is(&full, &home, 78, "no root certificate");
    let missing = url(
        TLS_ONLY,
        "localhost",
        "sslmode=verify-full&sslrootcert=/nonexistent.pem",
    );
    status_is(&missing, &home, 78, "/nonexistent.pem");
    let system = url(TLS_ONLY, "localhost", "sslmode=require&sslrootcert=system");
    status_is(&system, &home, 78, "verify-full");
    // ~/.postgresql/root.crt is the root when the URL names none, as in libpq.
    std::fs::create_dir_all(home.join(".postgresql")).unwrap();
    let home_root = home.join(".postgresql/root.crt");
    std::fs::copy(files.root_cert(), &home_root).unwrap();
    status_is(&full, &home, 0, "");
    std::fs::copy(files.stranger_root_cert(), &home_root).unwrap();
    let require = url(TLS_ONLY, "localhost", "sslmode=require");
    status_is(&require, &home, 68, "invalid peer certificate");
}

#[test]
fn a_client_certificate_logs_in_where_the_server_asks_for_one() {
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-cert"));
    let home = empty_home(&scratch);
    let (cert, key) = (files.client_cert(), files.client_key());
    let with_cert = url(
        BY_CERT,
        "localhost",
        &format!(
            "sslmode=verify-full&{}&sslcert={}&sslkey={}",
            root(&files.root_cert()),
            cert.display(),
            key.display()
        ),
    );
    status_is(&with_cert, &home, 0, "");
    status_is(
        &url(BY_CERT, "localhost", "sslmode=require"),
        &home,
        68,
        "certificate",
    );
}

/// `run` elects and runs its command over TLS (the user is refused without it): the lock
/// session and the standby's checks go through the same pool.
#[test]
fn run_leads_over_tls() {
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-run"));
    let home = empty_home(&scratch);
    let full = url(
        TLS_ONLY,
        "localhost",
        &format!("sslmode=verify-full&{}", root(&files.root_cert())),
    );
    let ran = scratch.path("ran");
    let script = format!("echo \"$PG_ELECTOR_KEY\" > {}; exit 4", ran.display());
    let args = [
        "run",
        "jobs/tls",
        "--interval",
        "200ms",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let out = pg_elector_at(&full, &home, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "the command's status: {stderr}");
    assert_eq!(scratch.lines("ran"), ["jobs/tls"], "{stderr}");
}
