//! [`Pgbouncer`]: a private PgBouncer in front of a test server.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use crate::host::{RunAs, free_port, make_temp_root};
use crate::watchdog::Watchdog;
use crate::{KitError, PgServer, TestDb};

/// How long PgBouncer may take to start listening.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports to try when PgBouncer cannot bind one.
const PORT_ATTEMPTS: usize = 5;

/// PgBouncer's `pool_mode`: when a server session goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolMode {
    /// When the client disconnects (after `DISCARD ALL`): a client keeps
    /// one server session for its whole connection, so session advisory
    /// locks work.
    Session,
    /// After every transaction: consecutive statements of one client may run
    /// on different server sessions, and one server session serves many
    /// clients, so a session advisory lock cannot be carried.
    Transaction,
    /// After every statement (multi-statement transactions are refused).
    Statement,
}

impl PoolMode {
    /// The name PgBouncer's `pool_mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// A PgBouncer for tests, in front of a [`PgServer`].
///
/// Listens on `127.0.0.1` on a free port and forwards every database name
/// (`* = host=… port=…`) to the server, with `pool_mode` and
/// `default_pool_size` as given (`min_pool_size` and `reserve_pool_size` 0,
/// `max_client_conn` 1000). Clients authenticate with `auth_type = trust`;
/// PgBouncer logs in to the server as the client's user, with the password
/// of the server's configuration if it has one. Runs from a temp dir
/// (`pgbouncer.ini`, `pgbouncer.log`), as the `postgres` user when the tests
/// run as root (PgBouncer refuses to run as root). Killed and its files
/// removed when dropped, or by a watchdog process when the test process
/// exits or is killed.
///
/// The program is `PGBOUNCER` if set, else `pgbouncer` on `PATH`, else
/// `/usr/sbin/pgbouncer` (Debian's package `pgbouncer`).
///
/// ```no_run
/// use pg_elector_testkit::PgServer;
/// use pg_elector_testkit::server::pooler::{Pgbouncer, PoolMode};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let server = PgServer::shared()?;
/// let db = server.create_database().await?;
/// let bouncer = Pgbouncer::start(server, PoolMode::Transaction, 1)?;
/// let pool = db.pool_via(bouncer.addr(), 4); // or bouncer.pool_for(&db, 4)
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Pgbouncer {
    addr: SocketAddr,
    mode: PoolMode,
    pool_size: usize,
    root: PathBuf,
    log_file: PathBuf,
    child: Child,
    watchdog: Option<Watchdog>,
}

impl Pgbouncer {
    /// Starts PgBouncer in front of `server` with this `pool_mode` and
    /// `default_pool_size` (server sessions per database and user pair).
    ///
    /// Blocking: returns once PgBouncer listens (at most about 10 s). Fails
    /// with [`KitError::NoPgbouncer`] when there is no `pgbouncer`
    /// program (install it with `apt-get install pgbouncer`).
    pub fn start(
        server: &PgServer,
        mode: PoolMode,
        pool_size: usize,
    ) -> Result<Pgbouncer, KitError> {
        let program = find_pgbouncer()?;
        let run_as = RunAs::when_root()?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let bouncer = Self::start_once(&program, run_as, server, mode, pool_size)?;
            match bouncer {
                Ok(bouncer) => {
                    tracing::debug!(
                        addr = %bouncer.addr,
                        mode = mode.as_str(),
                        pool_size,
                        "pgbouncer started"
                    );
                    return Ok(bouncer);
                }
                // Its port was taken meanwhile: try another.
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| KitError::Server("could not start pgbouncer".into())))
    }

    /// One attempt on a fresh free port: the inner error means the port was
    /// taken, the outer one any other failure.
    fn start_once(
        program: &Path,
        run_as: Option<RunAs>,
        server: &PgServer,
        mode: PoolMode,
        pool_size: usize,
    ) -> Result<Result<Pgbouncer, KitError>, KitError> {
        let root = make_temp_root()?;
        let mut cleanup = RemoveOnDrop(Some(root.clone()));
        if let Some(run_as) = run_as {
            run_as.chown(&root)?;
        }
        let config = server.config();
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let userlist = root.join("userlist.txt");
        write_file(
            &userlist,
            &format!("{} {}\n", quote(&user), quote(&password)),
            run_as,
        )?;
        let ini = root.join("pgbouncer.ini");
        let log_file = root.join("pgbouncer.log");
        let port = free_port()?;
        let settings = format!(
            "[databases]\n\
             * = host={host} port={server_port}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {userlist}\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 1000\n\
             server_login_retry = 1\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             logfile = {log}\n",
            host = server.addr().ip(),
            server_port = server.addr().port(),
            userlist = userlist.display(),
            mode = mode.as_str(),
            log = log_file.display(),
        );
        write_file(&ini, &settings, run_as)?;
        let mut cmd = Command::new(program);
        cmd.arg(&ini)
            .current_dir(&root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(RunAs { uid, gid }) = run_as {
            // std drops the supplementary groups when switching from root.
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| KitError::io(format!("starting {}", program.display()), e))?;
        let watchdog = match Watchdog::for_process(child.id(), &ini, &root) {
            Ok(w) => w,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        // From here on the value owns the temp dir.
        cleanup.0 = None;
        let mut bouncer = Pgbouncer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            mode,
            pool_size,
            root,
            log_file,
            child,
            watchdog: Some(watchdog),
        };
        match bouncer.wait_listening() {
            Ok(()) => Ok(Ok(bouncer)),
            Err((e, true)) => Ok(Err(e)),
            Err((e, false)) => Err(e),
        }
    }

    /// Waits until PgBouncer logs that it listens on its port; the error says
    /// whether the port was taken.
    fn wait_listening(&mut self) -> Result<(), (KitError, bool)> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let listening = format!("listening on {}", self.addr);
        loop {
            let log = read_from(&self.log_file, 0);
            if log.contains(&listening) {
                return Ok(());
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = read_from(&self.log_file, 0);
                let port_taken = log.contains("Address already in use");
                let why = if exited {
                    "exited"
                } else {
                    "did not listen in time"
                };
                return Err((
                    KitError::Server(format!(
                        "pgbouncer on {} {why}\n--- {} ---\n{}",
                        self.addr,
                        self.log_file.display(),
                        tail(&log, 30)
                    )),
                    port_taken,
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The pool mode it runs in.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// Its `default_pool_size`.
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// Connection settings for `db` through this PgBouncer.
    pub fn config_for(&self, db: &TestDb) -> tokio_postgres::Config {
        db.config_via(self.addr)
    }

    /// A pool of `max_size` connections to `db` through this PgBouncer
    /// (the same as `db.pool_via(self.addr(), max_size)`).
    pub fn pool_for(&self, db: &TestDb, max_size: usize) -> Pool {
        db.pool_via(self.addr, max_size)
    }

    /// The last `lines` lines of PgBouncer's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&read_from(&self.log_file, 0), lines)
    }

    /// The temp dir holding its configuration and log.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    fn kill_child(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        self.kill_child();
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.finish();
        }
        if self.root.exists() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Removes a temp dir unless forgotten.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Finds the `pgbouncer` program.
fn find_pgbouncer() -> Result<PathBuf, KitError> {
    if let Some(path) = std::env::var_os("PGBOUNCER").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(KitError::NoPgbouncer(format!(
            "PGBOUNCER is set to {}, which is not a file; unset it, or install PgBouncer \
             with `apt-get install pgbouncer` (Debian/Ubuntu)",
            path.display()
        )));
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("pgbouncer"))
                .collect()
        })
        .unwrap_or_default();
    candidates.extend(
        [
            "/usr/sbin/pgbouncer",
            "/usr/local/sbin/pgbouncer",
            "/usr/local/bin/pgbouncer",
        ]
        .map(PathBuf::from),
    );
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        KitError::NoPgbouncer(
            "PgBouncer not found (looked at PGBOUNCER, `pgbouncer` on PATH, /usr/sbin, \
             /usr/local/sbin, /usr/local/bin): install it with `apt-get install pgbouncer` \
             (Debian/Ubuntu), or set PGBOUNCER to the program's path"
                .into(),
        )
    })
}

fn write_file(path: &Path, text: &str, run_as: Option<RunAs>) -> Result<(), KitError> {
    std::fs::write(path, text)
        .map_err(|e| KitError::io(format!("writing {}", path.display()), e))?;
    if let Some(run_as) = run_as {
        run_as.chown(path)?;
    }
    Ok(())
}

/// A double-quoted `auth_file` field.
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

fn read_from(path: &Path, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
