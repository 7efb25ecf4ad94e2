//! The exit statuses of `pg-elector`, for scripts. `run` exits with its command's status
//! when the command ended on its own; every status below is `pg-elector`'s own: most are
//! given before any command was started, 70 (an error inside `pg-elector`) at any time.

use pg_elector::HandoverError;

/// Done: the handover was asked; `run` or `cron` stopped cleanly at SIGTERM or SIGINT.
pub(crate) const OK: i32 = 0;
/// The command line could not be read (an unknown option, a bad duration, no command).
pub(crate) const USAGE: i32 = 64;
/// `cron`: the schedule cannot be read (a bad cron expression, an unknown time zone).
pub(crate) const BAD_SCHEDULE: i32 = 65;
/// The database could not be reached, or refused the login (TLS included: the server's
/// certificate did not check out, or the server speaks no TLS where it is required).
pub(crate) const UNREACHABLE: i32 = 68;
/// The handover was refused: nobody leads the key.
pub(crate) const NO_LEADER: i32 = 69;
/// The handover was refused: no live standby with that identity (or none at all).
pub(crate) const NO_SUCH_STANDBY: i32 = 67;
/// A query failed, or something else went wrong inside `pg-elector`.
pub(crate) const INTERNAL: i32 = 70;
/// No answer in time: the handover may or may not have been asked.
pub(crate) const TIMEOUT: i32 = 75;
/// The database URL is missing or cannot be read, or its TLS settings cannot be carried out
/// (a certificate file that cannot be read, no root certificate for `verify-full`).
pub(crate) const BAD_URL: i32 = 78;
/// `run`: the command was found but cannot be run (as a shell says).
pub(crate) const CANNOT_RUN: i32 = 126;
/// `run`: the command was not found (as a shell says).
pub(crate) const NOT_FOUND: i32 = 127;

/// The table `--help` shows.
pub(crate) const HELP: &str = "\
Exit statuses:
  0    done (run, cron: stopped cleanly at SIGTERM, SIGINT or SIGHUP; status --watch: at
       SIGTERM or SIGINT)
  64   the command line cannot be read
  65   cron: the schedule cannot be read (a bad cron expression, an unknown time zone)
  67   handover refused: no live standby with that identity (or none at all)
  68   the database cannot be reached, or refused the login (TLS too: a certificate
       that does not check out, a server without TLS under sslmode=require)
  69   handover refused: nobody leads the key
  70   a query failed, or an error inside pg-elector
  75   no answer in time (a handover may or may not have been asked)
  78   the database URL is missing or cannot be read, or names a certificate file that
       cannot be read (or none where sslmode=verify-ca or verify-full needs one)
  126  run, cron: the command cannot be run
  127  run, cron: the command was not found
  run exits with its command's own status when the command ends while leading
  (128 + N when a signal N ended it).";

/// A failure of `pg-elector` itself: its message and exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: i32,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: i32, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<HandoverError> for Failure {
    fn from(e: HandoverError) -> Self {
        let status = match &e {
            HandoverError::NoLeader => NO_LEADER,
            HandoverError::NoSuchStandby { .. } => NO_SUCH_STANDBY,
            HandoverError::Timeout(_) => TIMEOUT,
            HandoverError::Pool(_) => UNREACHABLE,
            _ => INTERNAL,
        };
        Self::new(status, e.to_string())
    }
}
