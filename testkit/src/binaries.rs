//! Locating the PostgreSQL server binaries (`initdb`, `postgres`, `pg_ctl`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::KitError;

/// The programs a bin dir must contain for the harness to use it.
const REQUIRED: [&str; 3] = ["initdb", "postgres", "pg_ctl"];

/// Returns the names of the required programs missing from `dir`.
fn missing_in(dir: &Path) -> Vec<&'static str> {
    REQUIRED
        .iter()
        .copied()
        .filter(|name| !dir.join(name).is_file())
        .collect()
}

fn advice() -> &'static str {
    "Install them with `apt-get install postgresql` (Debian/Ubuntu), or point PG_BINDIR \
     at a bin dir containing initdb, postgres and pg_ctl, or set DATABASE_URL to use an \
     existing server."
}

/// Finds the directory holding the server binaries.
///
/// Order: `PG_BINDIR` (if set, it must be valid: no fallback), `pg_config
/// --bindir`, the newest `/usr/lib/postgresql/<version>/bin`,
/// `/usr/pgsql-<version>/bin`, `/usr/local/pgsql/bin`, then the directory of an
/// `initdb` found on `PATH`.
pub(crate) fn find_bin_dir() -> Result<PathBuf, KitError> {
    if let Some(dir) = std::env::var_os("PG_BINDIR").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        let missing = missing_in(&dir);
        if missing.is_empty() {
            return Ok(dir);
        }
        return Err(KitError::NoServer(format!(
            "PostgreSQL server binaries not found: PG_BINDIR is set to {} but it lacks {}. {}",
            dir.display(),
            missing.join(", "),
            advice()
        )));
    }

    let mut looked = Vec::new();
    for candidate in candidates(&mut looked) {
        if missing_in(&candidate).is_empty() {
            tracing::debug!(bin_dir = %candidate.display(), "found PostgreSQL server binaries");
            return Ok(candidate);
        }
    }
    Err(KitError::NoServer(format!(
        "PostgreSQL server binaries (initdb, postgres, pg_ctl) not found; looked in: {}. {}",
        looked.join("; "),
        advice()
    )))
}

/// Candidate bin dirs in order of preference; `looked` collects a description
/// of every place searched, for the error message.
fn candidates(looked: &mut Vec<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();

    // 1. pg_config --bindir (on Debian it may come from libpq-dev and name a
    //    client-only dir: the caller checks the programs exist).
    match Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            looked.push(format!("`pg_config --bindir` ({dir})"));
            if !dir.is_empty() {
                out.push(PathBuf::from(dir));
            }
        }
        _ => looked.push("`pg_config --bindir` (no pg_config on PATH)".to_owned()),
    }

    // 2. Debian/Ubuntu layout, newest version first; 3. PGDG RPM layout.
    looked.push("/usr/lib/postgresql/*/bin".to_owned());
    out.extend(versioned_dirs(Path::new("/usr/lib/postgresql"), "", "bin"));
    looked.push("/usr/pgsql-*/bin".to_owned());
    out.extend(versioned_dirs(Path::new("/usr"), "pgsql-", "bin"));

    // 4. Source-build default prefix.
    looked.push("/usr/local/pgsql/bin".to_owned());
    out.push(PathBuf::from("/usr/local/pgsql/bin"));

    // 5. `initdb` on PATH (symlinks resolved, so the real bin dir is used).
    looked.push("the directory of `initdb` on PATH".to_owned());
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file() {
                if let Some(parent) = initdb
                    .canonicalize()
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                {
                    out.push(parent);
                }
                break;
            }
        }
    }
    out
}

/// `<parent>/<prefix><version>/<sub>` for every numeric version, newest first.
fn versioned_dirs(parent: &Path, prefix: &str, sub: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u64>, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix(prefix)?;
            let key = version
                .split('.')
                .map(|part| part.parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()?;
            Some((key, e.path().join(sub)))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_dirs_sort_numerically() {
        let root = std::env::temp_dir().join(format!("pgeh-bintest-{}", std::process::id()));
        for v in ["9.6", "10", "15", "13", "x"] {
            std::fs::create_dir_all(root.join(v)).unwrap();
        }
        let dirs = versioned_dirs(&root, "", "bin");
        let names: Vec<String> = dirs
            .iter()
            .map(|p| {
                p.parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["15", "13", "10", "9.6"]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
