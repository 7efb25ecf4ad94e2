//! A private PostgreSQL server's life: a temp dir, `initdb`, `pg_ctl` start, stop and restart,
//! its log, and a watchdog that cleans up even if the test process is killed. Copying it into a
//! standby is in `private_server/standby_copy.rs`; what it needs from the host (the `postgres`
//! user, a temp dir, a free port) in `host.rs`; its TLS in `private_server/tls.rs` (and the
//! certificates' paths in `private_server/tls_files.rs`).

mod standby_copy;
mod tls;
mod tls_files;

pub use tls_files::TlsFiles;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::command::{COMMAND_TIMEOUT, output_within};
use crate::host::{RunAs, free_port, make_temp_root};
use crate::server::ShutdownMode;
use crate::watchdog::Watchdog;
use crate::{KitError, binaries, error, runtime};

/// How long `pg_ctl` may wait for a start, stop or restart.
const PG_CTL_TIMEOUT_SECS: &str = "30";
/// How long to wait for the server to accept a connection after starting.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports to try when startup fails on a port conflict.
const PORT_ATTEMPTS: usize = 5;

/// A server this process created and controls.
#[derive(Debug)]
pub(crate) struct PrivateServer {
    bin_dir: PathBuf,
    root: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    run_as: Option<RunAs>,
    port: u16,
    /// Serialises start/stop/restart.
    control: Mutex<()>,
    /// The watchdog process; closing its stdin triggers the cleanup.
    watchdog: Mutex<Option<Watchdog>>,
}

impl PrivateServer {
    /// Finds the binaries, creates a temp dir, runs initdb and starts the server.
    pub(crate) fn spawn() -> Result<Self, KitError> {
        let started = Instant::now();
        let bin_dir = binaries::find_bin_dir()?;
        let mut server = PrivateServer::empty(bin_dir, RunAs::when_root()?)?;
        server.init_data_dir()?;
        server.start_on_free_port()?;
        tracing::info!(
            port = server.port,
            data_dir = %server.data_dir.display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "private PostgreSQL server started"
        );
        Ok(server)
    }

    /// A server with a temp dir and a watchdog, but no data dir yet. From
    /// here on the value owns the temp dir: dropping it cleans up.
    fn empty(bin_dir: PathBuf, run_as: Option<RunAs>) -> Result<Self, KitError> {
        let root = make_temp_root()?;
        let mut server = PrivateServer {
            bin_dir,
            data_dir: root.join("data"),
            log_file: root.join("server.log"),
            root,
            run_as,
            port: 0,
            control: Mutex::new(()),
            watchdog: Mutex::new(None),
        };
        if let Some(run_as) = run_as {
            run_as.chown(&server.root)?;
        }
        server.start_watchdog()?;
        Ok(server)
    }

    /// `pg_ctl {action} -w -t {PG_CTL_TIMEOUT_SECS} -s -D {data dir} {extra…}`, checked.
    fn pg_ctl(&self, action: &str, extra: &[&str], what: &str) -> Result<(), KitError> {
        let data = self.data_dir.to_string_lossy().into_owned();
        let mut args = vec![action, "-w", "-t", PG_CTL_TIMEOUT_SECS, "-s", "-D", &data];
        args.extend_from_slice(extra);
        let out = self.run("pg_ctl", &args, what)?;
        self.check(&out, what)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub(crate) fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// A command for one of the server binaries, run as the right user.
    fn command(&self, program: &str) -> Command {
        self.command_as(self.bin_dir.join(program))
    }

    /// A command for any program, run as the server's user in its temp dir.
    fn command_as(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some(RunAs { uid, gid }) = self.run_as {
            // std drops the supplementary groups when switching from root.
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Runs one of the server binaries to its end, killed after [`COMMAND_TIMEOUT`].
    fn run(&self, program: &str, args: &[&str], what: &str) -> Result<Output, KitError> {
        let mut command = self.command(program);
        command.args(args);
        output_within(command, COMMAND_TIMEOUT, what)
    }

    fn start_watchdog(&mut self) -> Result<(), KitError> {
        let watchdog = Watchdog::start(
            &self.bin_dir.join("pg_ctl"),
            &self.data_dir,
            &self.root,
            self.run_as.is_some(),
        )?;
        *lock(&self.watchdog) = Some(watchdog);
        Ok(())
    }

    /// A data directory as `initdb` makes it: a copy of this process's template for these
    /// binaries, which the first server of the process makes with `initdb` (a copy costs a
    /// tenth of an `initdb`'s CPU, and a suite starts dozens of servers).
    fn init_data_dir(&self) -> Result<(), KitError> {
        let template = template_for(&self.bin_dir, self.run_as)?;
        let (from, to) = (template.data_dir(), &self.data_dir);
        let mut copy = self.command_as("cp");
        copy.arg("-a").arg(from).arg(to);
        let out = output_within(copy, COMMAND_TIMEOUT, "copying the template data directory")?;
        self.check_command(&out, "copying the template data directory", "cp", "")
    }

    fn initdb(&self) -> Result<(), KitError> {
        let data = self.data_dir.to_string_lossy().into_owned();
        let out = self.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            "initdb",
        )?;
        if !out.status.success() {
            let hint = if self.run_as.is_some() {
                format!(
                    "\n(the server runs as the `postgres` user: it must be able to reach {})",
                    self.root.display()
                )
            } else {
                String::new()
            };
            return Err(KitError::Server(format!(
                "initdb failed ({}):\n{}{}{hint}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data_dir.join("postgresql.conf"))
            .map_err(|e| KitError::io("opening postgresql.conf", e))?;
        conf.write_all(b"\n# Added by pg-elector-testkit\ninclude 'harness.conf'\n")
            .map_err(|e| KitError::io("writing postgresql.conf", e))
    }

    /// Writes the harness settings, including the port, and the TLS settings once
    /// `enable_tls` made the certificates (so that rewriting the settings keeps TLS on).
    fn write_settings(&self, port: u16) -> Result<(), KitError> {
        let path = self.data_dir.join("harness.conf");
        let mut settings = format!(
            "listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = ''\n\
             max_connections = 300\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             wal_level = replica\n\
             max_wal_senders = 10\n\
             logging_collector = off\n\
             log_connections = on\n\
             log_line_prefix = '%m [%p] %q%u@%d '\n"
        );
        settings.push_str(&self.tls_settings());
        std::fs::write(&path, settings).map_err(|e| KitError::io("writing harness.conf", e))?;
        if let Some(RunAs { uid, gid }) = self.run_as {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(|e| KitError::io("chown of harness.conf", e))?;
        }
        Ok(())
    }

    fn start_on_free_port(&mut self) -> Result<(), KitError> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            self.write_settings(port)?;
            self.port = port;
            let log_start = self.log_len();
            match self.start_and_wait("starting the server") {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let new_log = self.log_since(log_start);
                    if new_log.contains("could not bind")
                        || new_log.contains("Address already in use")
                    {
                        tracing::debug!(port, "port taken while starting PostgreSQL, retrying");
                        // Make sure no half-started postmaster is left behind.
                        let _ = self.pg_ctl_stop(ShutdownMode::Immediate);
                        last = Some(e);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| KitError::Server("could not start the server".into())))
    }

    /// `pg_ctl start`, then waits until a connection succeeds.
    fn start_and_wait(&self, what: &str) -> Result<(), KitError> {
        let log = self.log_file.to_string_lossy().into_owned();
        self.pg_ctl("start", &["-l", &log], what)?;
        self.wait_accepting(what)
    }

    fn check(&self, out: &Output, what: &str) -> Result<(), KitError> {
        self.check_command(out, what, "pg_ctl", "")
    }

    /// Ok when `out` (of `tool`) succeeded; otherwise an error with its output and the tail of
    /// this server's log, headed `--- tail of {log_label}{path} ---`.
    fn check_command(
        &self,
        out: &Output,
        what: &str,
        tool: &str,
        log_label: &str,
    ) -> Result<(), KitError> {
        if out.status.success() {
            return Ok(());
        }
        Err(KitError::Server(format!(
            "{what}: {tool} failed ({}): {}{}\n--- tail of {log_label}{} ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim(),
            self.log_file.display(),
            self.log_tail(30)
        )))
    }

    /// Waits until the server accepts a connection and answers a query.
    fn wait_accepting(&self, what: &str) -> Result<(), KitError> {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + READY_TIMEOUT;
        let result = runtime::block_on_thread(
            async move {
                loop {
                    let attempt = async {
                        let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
                        let conn = tokio::spawn(conn);
                        let r = client.simple_query("SELECT 1").await.map(|_| ());
                        drop(client);
                        let _ = conn.await;
                        r
                    };
                    match attempt.await {
                        Ok(()) => return Ok(()),
                        Err(e) if Instant::now() >= deadline => return Err(error::chain(&e)),
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            },
            READY_TIMEOUT + Duration::from_secs(5),
        );
        match result {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(self.not_ready(what, &e)),
            None => Err(self.not_ready(what, "timed out")),
        }
    }

    fn not_ready(&self, what: &str, err: &str) -> KitError {
        KitError::Server(format!(
            "{what}: the server on 127.0.0.1:{} did not accept connections within {}s ({err})\n\
             --- tail of {} ---\n{}",
            self.port,
            READY_TIMEOUT.as_secs(),
            self.log_file.display(),
            self.log_tail(30)
        ))
    }

    fn pg_ctl_stop(&self, mode: ShutdownMode) -> Result<(), KitError> {
        self.pg_ctl("stop", &["-m", mode.as_str()], "stopping the server")
    }

    pub(crate) fn restart(&self, mode: ShutdownMode) -> Result<(), KitError> {
        let _guard = lock(&self.control);
        let log = self.log_file.to_string_lossy().into_owned();
        let what = "restarting the server";
        self.pg_ctl("restart", &["-l", &log, "-m", mode.as_str()], what)?;
        self.wait_accepting(what)
    }

    pub(crate) fn stop(&self, mode: ShutdownMode) -> Result<(), KitError> {
        let _guard = lock(&self.control);
        self.pg_ctl_stop(mode)
    }

    pub(crate) fn start_again(&self) -> Result<(), KitError> {
        let _guard = lock(&self.control);
        self.start_and_wait("starting the server again")
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log_file).map_or(0, |m| m.len())
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_file) {
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let mut bytes = Vec::new();
                let _ = f.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        text
    }

    /// The last `lines` lines of the server log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let len = self.log_len();
        let text = self.log_since(len.saturating_sub(64 * 1024));
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops the server and removes the temp dir (through the watchdog).
    fn cleanup(&mut self) {
        let watchdog = self
            .watchdog
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(watchdog) = watchdog {
            watchdog.finish();
        }
        if self.root.exists() {
            // The watchdog did not finish the job: do it here.
            if self.data_dir.join("postmaster.pid").exists() {
                let _ = self.pg_ctl_stop(ShutdownMode::Immediate);
            }
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// This process's template for the binaries in `bin_dir`: a server never started whose data
/// directory is fresh from `initdb` (its watchdog removes it when the process ends).
fn template_for(bin_dir: &Path, run_as: Option<RunAs>) -> Result<Arc<PrivateServer>, KitError> {
    static TEMPLATES: Mutex<Vec<Arc<PrivateServer>>> = Mutex::new(Vec::new());
    let mut templates = lock(&TEMPLATES);
    if let Some(found) = templates.iter().find(|t| t.bin_dir == bin_dir) {
        return Ok(found.clone());
    }
    let template = PrivateServer::empty(bin_dir.to_path_buf(), run_as)?;
    template.initdb()?;
    let template = Arc::new(template);
    templates.push(template.clone());
    Ok(template)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
