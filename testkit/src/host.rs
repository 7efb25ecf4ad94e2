//! Facts about the host a private server or pooler runs on: whether to run it as the
//! `postgres` user (when this process is root), a fresh temp dir, a free port.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::KitError;

/// The owner of the server processes when the harness runs as root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl RunAs {
    /// `Some(postgres)` when this process runs as root, else `None`.
    pub(crate) fn when_root() -> Result<Option<RunAs>, KitError> {
        if rustix::process::getuid().is_root() {
            postgres_user().map(Some)
        } else {
            Ok(None)
        }
    }

    /// Gives `path` to this user.
    pub(crate) fn chown(self, path: &Path) -> Result<(), KitError> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .map_err(|e| KitError::io(format!("chown of {} to postgres", path.display()), e))
    }
}

/// The uid and gid of the `postgres` user (needed when running as root).
pub(crate) fn postgres_user() -> Result<RunAs, KitError> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) if uid != 0 => Ok(RunAs { uid, gid }),
        _ => Err(KitError::NoServer(
            "running as root, but PostgreSQL refuses to run as root and there is no \
             `postgres` user to run it as: create one (e.g. `useradd --system postgres`, \
             or install the `postgresql` package), or run the tests as a normal user, \
             or set DATABASE_URL to use an existing server"
                .into(),
        )),
    }
}

/// Creates a fresh directory under the system temp dir.
pub(crate) fn make_temp_root() -> Result<PathBuf, KitError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let pid = std::process::id();
    for _ in 0..100 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("pg-elector-testkit-{pid}-{n}-{nanos:x}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(KitError::io(
                    format!("creating a temp dir in {}", base.display()),
                    e,
                ));
            }
        }
    }
    Err(KitError::Server(format!(
        "could not create a unique temp dir in {}",
        base.display()
    )))
}

/// A TCP port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16, KitError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| KitError::io("finding a free port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| KitError::io("finding a free port on 127.0.0.1", e))
}
