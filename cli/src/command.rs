//! The command of `run` and `cron`, checked before the replica stands by: a typo is said at
//! once, not when the replica first leads, perhaps days later.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::exit::{self, Failure};

/// Checks that `command`'s program can be run, as a shell would find it (a path, or a name on
/// `PATH`).
pub(crate) fn check(command: &[OsString]) -> Result<(), Failure> {
    let Some(program) = command.first() else {
        return Err(Failure::new(exit::USAGE, "no command given after --"));
    };
    let shown = program.to_string_lossy();
    let found = find(Path::new(program))
        .ok_or_else(|| Failure::new(exit::NOT_FOUND, format!("{shown}: command not found")))?;
    if executable(&found) {
        Ok(())
    } else {
        Err(Failure::new(
            exit::CANNOT_RUN,
            format!(
                "{shown}: cannot run it: {} is not an executable file",
                found.display()
            ),
        ))
    }
}

/// Where `program` is: itself when it names a path, else the first match on `PATH`.
fn find(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 || program.is_absolute() {
        return program.exists().then(|| program.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .or_else(|| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        })
}

fn executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(command: &[&str]) -> i32 {
        let command: Vec<OsString> = command.iter().map(OsString::from).collect();
        check(&command).map_or_else(|failure| failure.status, |()| exit::OK)
    }

    #[test]
    fn a_program_is_found_as_a_shell_finds_it() {
        assert_eq!(status(&["sh", "-c", "true"]), exit::OK);
        assert_eq!(status(&["/bin/sh"]), exit::OK);
        assert_eq!(status(&["no-such-program-anywhere"]), exit::NOT_FOUND);
        assert_eq!(status(&["/nonexistent/command"]), exit::NOT_FOUND);
        assert_eq!(status(&["/etc/passwd"]), exit::CANNOT_RUN);
        assert_eq!(status(&["/"]), exit::CANNOT_RUN);
    }
}
