//! What a try, a wait and a check found: plain types, without I/O.

use super::{AppliedBounds, LockSession};

/// What a try found.
pub(crate) enum Attempt {
    /// The lock is ours, on this session; `sent_at` is when the try was sent ([`now_ms`](crate::lease::now_ms)).
    Granted {
        session: Box<LockSession>,
        sent_at: u64,
        /// The lock came from a graceful unlock whose session still held the handover marker
        /// (only a waiting session looks).
        handed_over: bool,
        /// The server has no `idle_session_timeout` (PostgreSQL 13 and older).
        unbounded: bool,
        applied: AppliedBounds,
    },
    /// Another session holds the lock.
    Refused,
    /// The server is a hot standby (or recovering): it must never yield leadership.
    InRecovery,
    /// The server session carries another elector's mark: a transaction pooler shares it.
    SharedSession,
    /// Fast takeover: every waiting slot of the key is taken, so this standby only tries.
    QueueFull,
    /// The lock is free, and left to a live standby that should have it (a more preferred
    /// one, or the target of a handover asked).
    Deferred,
}

impl Attempt {
    /// A grant, from the answer row of a statement whose columns 1 to 5 read back the bounds
    /// as [`TRY_LOCK`](super::sql::TRY_LOCK)'s do; `handed_over` says whether a graceful unlock gave the lock up.
    pub(crate) fn granted(
        session: LockSession,
        row: &tokio_postgres::Row,
        answer: Answer,
        sent_at: u64,
        handed_over: bool,
    ) -> Self {
        let setting = |i: usize| row.try_get::<_, Option<String>>(i).ok().flatten();
        Attempt::Granted {
            handed_over,
            unbounded: answer == Answer::GrantedUnbounded,
            applied: AppliedBounds {
                idle_session_timeout: setting(1),
                tcp_user_timeout: setting(2),
                keepalives_idle: setting(3),
                keepalives_interval: setting(4),
                keepalives_count: setting(5),
            },
            session: Box::new(session),
            sent_at,
        }
    }
}

/// The first column of the try (and of the waiting session's statements), as far as this
/// elector knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Granted,
    GrantedUnbounded,
    Refused,
    /// The session still holds the question's shared lock: it is inside a transaction the
    /// application left open.
    InTransaction,
    Recovery,
    Marked,
    /// The waiting session's statements ran on two server sessions: a transaction pooler.
    Moved,
    /// The waiting session is ready to wait, holding this waiting slot.
    Armed(u8),
    /// Every waiting slot of the key is taken: the standby only tries.
    Full,
}

impl Answer {
    /// `None` for anything else (a NULL included): the lock state is then unknown.
    pub(crate) fn parse(answer: Option<&str>) -> Option<Self> {
        Some(match answer? {
            "granted" => Self::Granted,
            "granted_unbounded" => Self::GrantedUnbounded,
            "refused" => Self::Refused,
            "in_transaction" => Self::InTransaction,
            "recovery" => Self::Recovery,
            "marked" => Self::Marked,
            "moved" => Self::Moved,
            "full" => Self::Full,
            armed => match armed.strip_prefix("armed")?.parse() {
                Ok(slot) => Self::Armed(slot),
                Err(_) => return None,
            },
        })
    }
}

/// What a check found: a leader's of its lock, or a shard member's of its membership lock.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The session holds the lock and is ours alone.
    Holds,
    /// The session no longer holds the lock.
    Lost,
    /// The check ran on a server session without our mark, or one another elector's try has
    /// visited: the connection goes through a transaction-mode pooler.
    SharedSession,
}

impl Check {
    /// What a check's two findings mean: whether the server session is ours alone
    /// ([`ours_alone`](super::ours_alone)), and whether it holds the lock. A session that is not ours alone proves
    /// nothing about the lock, whatever the lock's finding says.
    pub(crate) fn of(ours_alone: bool, holds: bool) -> Self {
        if !ours_alone {
            Self::SharedSession
        } else if holds {
            Self::Holds
        } else {
            Self::Lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_the_elector_does_not_know_is_not_taken_for_a_known_one() {
        for known in [
            "granted",
            "granted_unbounded",
            "refused",
            "in_transaction",
            "recovery",
            "marked",
            "moved",
            "armed0",
            "armed2",
            "full",
        ] {
            assert!(Answer::parse(Some(known)).is_some(), "{known}");
        }
        for unknown in [
            None,
            Some(""),
            Some("GRANTED"),
            Some("shared"),
            Some("t"),
            Some("armed"),
            Some("armedx"),
        ] {
            assert_eq!(Answer::parse(unknown), None, "{unknown:?}");
        }
    }
}
