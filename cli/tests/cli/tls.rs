//! TLS as libpq's settings in the URL say, against a server of its own that speaks TLS and
//! refuses plain sessions to its TLS users (so a command that succeeds spoke TLS): the server's
//! certificate names `localhost` only, and one user logs in by client certificate.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pg_elector::LockKey;
use pg_elector_testkit::PgServer;
use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::server::TlsFiles;
use pg_elector_testkit::server::sql::{holders, terminate};

use crate::common::*;

/// A user that the server refuses without TLS.
const TLS_ONLY: &str = "tls_only";
/// A user that logs in by client certificate (the kit's client certificate names it).
const BY_CERT: &str = "tls_client";
/// A user that logs in by password (SCRAM), over TLS only.
const BY_PASSWORD: &str = "tls_scram";

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
                &format!("hostnossl all {TLS_ONLY},{BY_CERT},{BY_PASSWORD} 127.0.0.1/32 reject"),
                &format!("hostssl all {BY_CERT} 127.0.0.1/32 cert"),
                &format!("hostssl all {BY_PASSWORD} 127.0.0.1/32 scram-sha-256"),
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
    let sql = format!(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE {BY_PASSWORD} LOGIN SUPERUSER PASSWORD 'secret'"
    );
    client.batch_execute(&sql).await.unwrap();
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

/// `pg-elector status` with `url` ends with `status`, its stderr saying `says`; its stderr.
fn status_is(url: &str, home: &Path, status: i32, says: &str) -> String {
    let out = pg_elector_at(url, home, &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{url}: {stderr}");
    assert!(
        stderr.contains(says),
        "{url}: expected {says:?} in {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{url}: {stderr}");
    stderr.into_owned()
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
    let strange_chain = url(
        TLS_ONLY,
        "127.0.0.1",
        &format!("sslmode=verify-ca&{stranger}"),
    );
    status_is(&strange_chain, &home, 68, "invalid peer certificate");
    // An address alone (hostaddr, no host) is the name TLS checks.
    let address_only = |mode: &str| {
        format!(
            "hostaddr=127.0.0.1 port={port} user={TLS_ONLY} dbname=postgres sslmode={mode} \
             sslrootcert='{}'",
            files.root_cert().display()
        )
    };
    status_is(&address_only("verify-ca"), &home, 0, "");
    status_is(
        &address_only("verify-full"),
        &home,
        68,
        "not valid for name",
    );
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

/// A password login binds itself to the TLS session (SCRAM-SHA-256-PLUS): with
/// `channel_binding=require`, it logs in only if the binding from the server's certificate is
/// the server's own.
#[test]
fn a_password_login_binds_to_the_tls_session() {
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-scram"));
    let home = empty_home(&scratch);
    let user = format!("{BY_PASSWORD}:secret");
    let ca = root(&files.root_cert());
    let bound = url(
        &user,
        "localhost",
        &format!("sslmode=verify-full&{ca}&channel_binding=require"),
    );
    status_is(&bound, &home, 0, "");
    let unchecked = url(
        &user,
        "127.0.0.1",
        "sslmode=require&channel_binding=require",
    );
    status_is(&unchecked, &home, 0, "");
    let wrong = url(
        &format!("{BY_PASSWORD}:n0tit"),
        "localhost",
        &format!("sslmode=verify-full&{ca}"),
    );
    let said = status_is(&wrong, &home, 68, "password authentication failed");
    assert!(!said.contains("n0tit"), "the password stays out: {said}");
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

/// A lock session over TLS that the server ends: the command is killed at once, as over a
/// plain connection (the end of the TLS session is the end of the socket).
#[tokio::test]
async fn a_lost_lock_session_over_tls_ends_the_command_at_once() {
    let _timing = timing();
    let (files, scratch) = (&tls_server().files, Scratch::new("tls-lost"));
    let home = empty_home(&scratch);
    let ca = root(&files.root_cert());
    let full = url(TLS_ONLY, "localhost", &format!("sslmode=verify-full&{ca}"));
    let pid_file = scratch.path("child");
    let script = format!("echo $$ > {}; exec sleep 1000", pid_file.display());
    let mut run = Command::new(env!("CARGO_BIN_EXE_pg-elector"))
        .env("DATABASE_URL", &full)
        .env("HOME", &home)
        .args([
            "run",
            "jobs/tls-lost",
            "--interval",
            "200ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(scratch.path("run.err")).unwrap())
        .spawn()
        .unwrap();
    let child = pid_in(&pid_file, Duration::from_secs(10));
    let (admin, connection) = tls_server()
        .server
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let holder = holders(&admin, LockKey::from_name("jobs/tls-lost"))
        .await
        .unwrap();
    assert_eq!(holder.len(), 1, "one lock session: {holder:?}");
    let tls: bool = admin
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&holder[0]])
        .await
        .unwrap()
        .get(0);
    assert!(tls, "the lock session speaks TLS");
    terminate(&admin, holder[0]).await.unwrap();
    let ended = Instant::now();
    let gone = wait_until(Duration::from_secs(5), || (!alive(child)).then_some(()));
    let took = ended.elapsed();
    let _ = run.kill();
    let _ = run.wait();
    assert!(gone.is_some(), "the command outlived the lost lead");
    // The session's end is seen within milliseconds; I of slack.
    assert!(
        took < I,
        "the command was gone {took:?} after the session ended"
    );
}
