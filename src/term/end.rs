//! How a term ended, and why a term was lost.

/// Why a [`Term`](super::Term) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEnd {
    /// The replica stopped leading: a failed or late leader check, a lost connection, an
    /// expired local lease, or a `run` that was dropped or panicked.
    /// [`Term::loss_cause`](super::Term::loss_cause) and [`Leadership::loss_cause`](super::Leadership::loss_cause) say which.
    LeadershipLost,
    /// The replica gave the lock up because `run`'s shutdown token was cancelled.
    Shutdown,
    /// The parent token given to [`Elector::term_with`](crate::Elector::term_with) was
    /// cancelled first.
    ParentCancelled,
    /// The term was asked for on a standby: it never led and is born ended.
    NotLeader,
    /// The replica gave the lock up through [`Elector::resign`](crate::Elector::resign).
    Resigned,
    /// The replica handed the lead over gracefully to another: a live standby that prefers to
    /// lead more (see [`ElectorBuilder::preference`](crate::ElectorBuilder::preference)), or
    /// the standby a [`request_handover`](crate::request_handover) named.
    HandedOver,
    /// The shard moved to another member of its group of shards: the
    /// assignment made it another replica's, so this one ended its term, drained its work and
    /// unlocked it.
    Moved,
}

/// Why a replica stopped leading, when its term ended with [`TermEnd::LeadershipLost`].
///
/// Read it from [`Term::loss_cause`](super::Term::loss_cause) or from [`Leadership::loss_cause`](super::Leadership::loss_cause) (through
/// [`Elector::subscribe`](crate::Elector::subscribe)). The log line `leadership lost` says the
/// same with more detail (the server's message, the bound that ran out).
/// [`as_str`](Self::as_str) is the `cause` label under which the changes counter
/// ([`CHANGES_NAME`](crate::CHANGES_NAME)) counts it.
///
/// ```
/// use pg_elector::{Elector, LossCause, TermEnd};
///
/// let (elector, control) = Elector::manual();
/// let term = control.promote();
/// control.demote();
/// assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
/// assert_eq!(term.loss_cause(), Some(LossCause::Demoted));
/// assert_eq!(elector.subscribe().borrow().loss_cause, Some(LossCause::Demoted));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossCause {
    /// The lock connection closed: the server ended the session (`pg_terminate_backend`, a
    /// restart or crash of the server) or the network reset it.
    ConnectionClosed,
    /// A leader check found that the session no longer holds the lock.
    LockGone,
    /// A leader check ran on a server session shared by a transaction-mode pooler, which
    /// cannot carry a session lock.
    Pooler,
    /// A leader check got no answer within the check interval: a partition, or a server too
    /// slow to answer.
    CheckTimeout,
    /// A leader check failed with an error (logged with the server's message).
    CheckFailed,
    /// The local lease ran out: the process was paused or starved (SIGSTOP, a suspended
    /// machine) for longer than the lease, after which the server may have freed the lock.
    LeaseExpired,
    /// [`run`](crate::Elector::run) was dropped or panicked while leading; the lock
    /// connection was closed without an unlock.
    Abandoned,
    /// A manual elector was demoted by [`ManualControl::demote`](crate::ManualControl::demote).
    Demoted,
}

impl LossCause {
    /// The cause as the changes counter's `cause` label writes it (`"connection_closed"`,
    /// `"check_timeout"`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::ConnectionClosed => "connection_closed",
            Self::LockGone => "lock_gone",
            Self::Pooler => "pooler",
            Self::CheckTimeout => "check_timeout",
            Self::CheckFailed => "check_failed",
            Self::LeaseExpired => "lease_expired",
            Self::Abandoned => "abandoned",
            Self::Demoted => "demoted",
        }
    }
}

impl std::fmt::Display for LossCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ConnectionClosed => "the lock connection closed",
            Self::LockGone => "the session no longer holds the lock",
            Self::Pooler => "the lock session is shared by a transaction-mode pooler",
            Self::CheckTimeout => "the leader check got no answer in time",
            Self::CheckFailed => "the leader check failed",
            Self::LeaseExpired => "the local lease expired",
            Self::Abandoned => "run was dropped or panicked while leading",
            Self::Demoted => "demoted by hand",
        })
    }
}
