//! Why a leader on PostgreSQL stopped leading: the public cause, with what the log adds.

use std::time::Duration;

use super::session::{Check, SessionError};
use crate::key::LockKey;
use crate::term::LossCause;

/// What the logs say when a transaction-mode pooler is detected.
pub(super) const POOLER: &str = "the connection goes through a transaction-mode pooler (such as PgBouncer with pool_mode = transaction), which cannot carry a session advisory lock; connect directly or through a session-mode pooler";

const LEASE_EXPIRED: &str =
    "the local lease expired: the process was paused or starved for longer than the lease";

/// A lost term: its cause, and for the log the check's bound or error.
#[derive(Debug)]
pub(super) struct Loss {
    pub(super) cause: LossCause,
    /// The bound a check that got no answer was given.
    bound: Option<Duration>,
    /// The error of a check that failed.
    error: Option<SessionError>,
}

impl Loss {
    /// A loss with nothing to add to its cause.
    pub(super) fn of(cause: LossCause) -> Self {
        Self {
            cause,
            bound: None,
            error: None,
        }
    }

    /// The loss a check that did not find the lock held tells of (a `Holds` is not a loss; it
    /// maps to [`LossCause::LockGone`] only if passed by mistake).
    pub(super) fn from_check(check: Result<Check, SessionError>) -> Self {
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
pub(super) fn proven(check: Result<Check, SessionError>, key: LockKey) -> Result<(), Loss> {
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
                write!(f, "the leader check got no answer within {bound:?}")
            }
            (LossCause::CheckFailed, _, Some(e)) => write!(f, "the leader check failed: {e}"),
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
}
