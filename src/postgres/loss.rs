//! Why a leader on PostgreSQL stopped leading: the public cause, with what the log adds.

use std::time::Duration;

use super::session::{Check, SessionError};
use crate::key::LockKey;
use crate::term::LossCause;

/// What the logs say when a transaction-mode pooler is detected.
pub(crate) const POOLER: &str = "the connection goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction), which cannot carry a session advisory lock; connect directly or through a session-mode pooler";

const LEASE_EXPIRED: &str =
    "the local lease expired: the process was paused or starved for longer than the lease";

/// The statement on a lock session whose failure or silence ended a term: the log names it,
/// so that a failed try or unlock is not reported as a failed check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Statement {
    /// The leader's check, or a shard member's.
    Check,
    /// A shard member's try of the shards it should own.
    Try,
    /// A shard member's unlock of the shards it gives up.
    Unlock,
    /// A shard member's lock of its live mark, after its first check.
    LiveMark,
    /// A shard member's read of whether the holders of new live marks have spoken since.
    Heard,
    /// The leader's read of the candidates table (preferred leaders, handovers asked).
    Candidates,
}

impl Statement {
    fn name(self) -> &'static str {
        match self {
            Self::Check => "the leader check",
            Self::Try => "the try of the member's shards",
            Self::Unlock => "the unlock of the member's moved shards",
            Self::LiveMark => "the lock of the member's live mark",
            Self::Heard => "the read of whether new members hear the server",
            Self::Candidates => "the leader's read of the candidates table",
        }
    }
}

/// A lost term: its cause, and for the log the statement's bound or error.
#[derive(Debug)]
pub(crate) struct Loss {
    pub(crate) cause: LossCause,
    /// The statement that got no answer or failed.
    statement: Statement,
    /// The bound a statement that got no answer was given.
    bound: Option<Duration>,
    /// The error of a statement that failed.
    error: Option<SessionError>,
}

impl Loss {
    /// A loss with nothing to add to its cause.
    pub(crate) fn of(cause: LossCause) -> Self {
        Self {
            cause,
            statement: Statement::Check,
            bound: None,
            error: None,
        }
    }

    /// The loss a `statement` other than a check tells of when it got no answer or failed:
    /// the public cause is a check's (the session proved nothing), the log names the
    /// statement.
    pub(crate) fn failed(statement: Statement, error: SessionError) -> Self {
        Self {
            statement,
            ..Self::from_check(Err(error))
        }
    }

    /// The loss a check that did not find the lock held tells of (a `Holds` is not a loss; it
    /// maps to [`LossCause::LockGone`] only if passed by mistake).
    pub(crate) fn from_check(check: Result<Check, SessionError>) -> Self {
        match check {
            Ok(Check::Holds | Check::Lost) => Self::of(LossCause::LockGone),
            Ok(Check::SharedSession) => Self::of(LossCause::Pooler),
            Err(SessionError::Timeout(bound)) => Self {
                bound: Some(bound),
                ..Self::of(LossCause::CheckTimeout)
            },
            Err(e) => Self {
                error: Some(e),
                ..Self::of(LossCause::CheckFailed)
            },
        }
    }
}

/// What a check's answer proves of a live term's session: `Ok` when the session is ours alone
/// and holds the lock; otherwise the loss, with an ERROR naming the pooler when the check ran
/// on a server session a transaction-mode pooler shares. The one reading of a leader's checks
/// and a shard member's.
pub(crate) fn proven(check: Result<Check, SessionError>, key: LockKey) -> Result<(), Loss> {
    match check {
        Ok(Check::Holds) => Ok(()),
        Ok(Check::SharedSession) => {
            tracing::error!(key = %key, "{POOLER}: a check ran on a server session that is not its lock session, or that another elector's try reached");
            Err(Loss::of(LossCause::Pooler))
        }
        other => Err(Loss::from_check(other)),
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.cause, self.bound, &self.error) {
            (LossCause::LeaseExpired, ..) => f.write_str(LEASE_EXPIRED),
            (LossCause::Pooler, ..) => f.write_str(POOLER),
            (LossCause::CheckTimeout, Some(bound), _) => {
                write!(
                    f,
                    "{} got no answer within {bound:?}",
                    self.statement.name()
                )
            }
            (LossCause::CheckFailed, _, Some(e)) => {
                write!(f, "{} failed: {e}", self.statement.name())
            }
            (cause, ..) => write!(f, "{cause}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_says_what_the_public_cause_says_and_the_check_adds() {
        assert_eq!(
            Loss::of(LossCause::ConnectionClosed).to_string(),
            "the lock connection closed"
        );
        assert_eq!(
            Loss::of(LossCause::LockGone).to_string(),
            "the session no longer holds the lock"
        );
        assert_eq!(Loss::of(LossCause::LeaseExpired).to_string(), LEASE_EXPIRED);
        let timeout = Loss::from_check(Err(SessionError::Timeout(Duration::from_secs(1))));
        assert_eq!(timeout.cause, LossCause::CheckTimeout);
        assert_eq!(
            timeout.to_string(),
            "the leader check got no answer within 1s"
        );
        assert_eq!(
            Loss::from_check(Ok(Check::SharedSession)).cause,
            LossCause::Pooler
        );
    }

    /// A failed try or unlock of a shard member's session is named as what failed, not as a
    /// failed check; its public cause stays a check's.
    #[test]
    fn a_failed_try_or_unlock_is_named_by_what_failed() {
        let refused = || SessionError::Unexpected(Some("x".into()));
        let tried = Loss::failed(Statement::Try, refused());
        assert_eq!(tried.cause, LossCause::CheckFailed);
        assert_eq!(
            tried.to_string(),
            "the try of the member's shards failed: unexpected answer to the try: Some(\"x\")"
        );
        let unlocked = Loss::failed(
            Statement::Unlock,
            SessionError::Timeout(Duration::from_secs(2)),
        );
        assert_eq!(unlocked.cause, LossCause::CheckTimeout);
        assert_eq!(
            unlocked.to_string(),
            "the unlock of the member's moved shards got no answer within 2s"
        );
        assert_eq!(
            Loss::from_check(Err(refused())).to_string(),
            "the leader check failed: unexpected answer to the try: Some(\"x\")"
        );
    }
}
