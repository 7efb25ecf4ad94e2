//! The try: on a borrowed connection, the question whether the lock is free, the gate of
//! preferred leaders, then the statement that takes the lock and bounds its session.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::types::{ToSql, Type};

use super::sql::{ASK, TRY_LOCK};
use super::{
    Answer, Attempt, LockMode, LockSession, MIN_TRY_BOUND, SessionBounds, SessionError, bounded,
    session_mark,
};
use crate::LockKey;
use crate::lease::now_ms;
use crate::pooled::Borrowed;
use crate::postgres::borrower::Borrower;
use crate::postgres::candidates::{CandidatesTable, Deferred, Gate};
use crate::postgres::handover;
use crate::postgres::prepared::{Prepared, send};

/// Tries the lock once on a connection borrowed through `borrower`, waiting at most `interval`
/// for the connection and the interval (at least [`MIN_TRY_BOUND`]) for each statement.
///
/// `defer_as`, for a leader's lock, is this replica's preference: once the question found the
/// lock free, a live standby that should have it instead (see
/// [`candidates`](crate::postgres::candidates)) makes the try answer [`Attempt::Deferred`] without
/// taking it; the connection goes back to the pool unless the question's hold outlasts the
/// question there (a transaction the application left open), which only closing it ends.
///
/// For the key's exclusive lock, the try first asks whether the lock is free ([`ASK`]), and
/// sends [`TRY_LOCK`] only then: a refused try is one small statement that grants nothing.
/// Both go as statements prepared once per pool connection where [`Prepared`] says so for
/// that connection (by default: it reaches the server directly), and as one unnamed statement
/// each otherwise (parse, bind and execute in one round trip), which works through any pooler
/// (see [`send`]).
///
/// A try refused by [`ASK`] gives the connection back to the pool unchanged. A try that [`ASK`]
/// found free and that was not granted gives it back too (another standby took the lock
/// between the question and the try, most likely right after a leader let go; or the gate left
/// it to another standby), unless the session still holds the question's hold: that happens
/// only inside a transaction the application left open, where the hold would last until the
/// transaction ends and refuse every other standby meanwhile, so that connection is closed
/// ([`TRY_LOCK`] answers `in_transaction` then, and grants nothing there). A try for the
/// exclusive lock that finds a transaction pooler closes its connection too (a shard member's,
/// for the shared lock, asks no question and gives it back). A granted try takes the connection out of the
/// pool for good. A server in recovery gets its connection closed, so that the next try
/// opens a new one. Any other outcome (an error, a timeout,
/// an answer this elector does not know, or this future being dropped mid-way) closes the
/// connection instead of returning it, because the lock may have been granted on it without
/// our hearing of it.
pub(crate) async fn try_acquire(borrower: &mut Borrower, asked: &TryFor<'_>) -> Tried {
    let mut sent_at = None;
    let attempt = attempt(borrower, asked, &mut sent_at).await;
    Tried {
        granting: attempt.is_err() && sent_at.is_some(),
        attempt,
    }
}

/// What a try asks for: `key`'s lock in `mode`, for `identity`, with the lock session's
/// `bounds` and the standby's `interval`; `defer_as` as [`try_acquire`] says.
pub(crate) struct TryFor<'a> {
    pub(crate) key: LockKey,
    pub(crate) mode: LockMode,
    pub(crate) identity: &'a str,
    pub(crate) bounds: &'a SessionBounds,
    pub(crate) interval: Duration,
    pub(crate) defer_as: Option<u64>,
    /// Where the candidates `defer_as` reads are.
    pub(crate) candidates: &'a CandidatesTable,
}

/// What [`try_acquire`] found, and how far a failed try got.
pub(crate) struct Tried {
    pub(crate) attempt: Result<Attempt, SessionError>,
    /// The try failed after [`TRY_LOCK`] was sent: the lock was free and not left to another
    /// standby, and it may even have been granted unseen (the connection is closed, which
    /// frees it). A failure before that (the borrow, the question) came nowhere near the lock.
    pub(crate) granting: bool,
}

/// [`try_acquire`]'s work; `sent_at` is set when [`TRY_LOCK`] is sent.
async fn attempt(
    borrower: &mut Borrower,
    asked: &TryFor<'_>,
    sent_at: &mut Option<u64>,
) -> Result<Attempt, SessionError> {
    let &TryFor {
        key,
        mode,
        identity,
        bounds,
        interval,
        defer_as,
        candidates,
    } = asked;
    let bound = interval.max(MIN_TRY_BOUND);
    let object = borrower.get(interval).await?;
    let borrowed = Borrowed::new(object);
    let args = TryArgs::new(key, mode, identity, bounds);
    let params = args.params();
    let client: &ClientWrapper = borrowed.client();
    let asking = ask_then_try(
        &borrower.prepared,
        key,
        mode,
        client,
        &params,
        Gate::new(defer_as, identity, candidates),
        sent_at,
    );
    let rows = match bounded(bound, asking).await? {
        Asked::Held => {
            borrowed.give_back();
            return Ok(Attempt::Refused);
        }
        // A connection whose question's hold outlasts the question (a transaction the
        // application left open) is closed by dropping `borrowed`; any other goes back clean.
        Asked::Deferred(left) => {
            if !left.hold_outlasts {
                borrowed.give_back();
            }
            return Ok(Attempt::Deferred);
        }
        Asked::Tried(rows) => rows,
    };
    let visit = Visit {
        borrowed,
        key,
        mode,
        mark: args.mark,
        bound,
    };
    let sent_at = sent_at.unwrap_or_else(now_ms);
    visit.outcome(&borrower.prepared, rows, sent_at).await
}

/// [`TRY_LOCK`]'s parameters: the key, a new mark for the session it may grant, the bounds
/// as `set_config` takes them, the identity, and whether the shared lock is asked.
struct TryArgs<'a> {
    class: i32,
    object: i32,
    mark: String,
    settings: [String; 5],
    identity: &'a str,
    shared: bool,
}

impl<'a> TryArgs<'a> {
    fn new(key: LockKey, mode: LockMode, identity: &'a str, bounds: &SessionBounds) -> Self {
        Self {
            class: key.class(),
            object: key.object(),
            mark: session_mark(),
            settings: bounds.as_settings(),
            identity,
            shared: mode == LockMode::Shared,
        }
    }

    /// In [`TRY_LOCK`]'s order, `$1` to `$10` ([`ASK`] takes the first two).
    fn params(&self) -> [(&(dyn ToSql + Sync), Type); 10] {
        let [idle, user, k_idle, k_interval, k_count] = &self.settings;
        [
            (&self.class, Type::INT4),
            (&self.object, Type::INT4),
            (&self.mark, Type::TEXT),
            (idle, Type::TEXT),
            (user, Type::TEXT),
            (k_idle, Type::TEXT),
            (k_interval, Type::TEXT),
            (k_count, Type::TEXT),
            (&self.identity, Type::TEXT),
            (&self.shared, Type::BOOL),
        ]
    }
}

/// A try's connection, once [`TRY_LOCK`] answered.
struct Visit {
    borrowed: Borrowed,
    key: LockKey,
    mode: LockMode,
    /// The mark a grant set on the server session.
    mark: String,
    bound: Duration,
}

impl Visit {
    /// What [`TRY_LOCK`]'s `rows` mean, sent at `sent_at`: a grant takes the connection out of
    /// the pool; a plain refusal gives it back; anything else closes it (see [`try_acquire`]).
    /// A server in recovery never yields the lock, however often it is asked: closing the
    /// connection makes the next try open a new one, which follows an address that has moved
    /// on (a virtual IP or DNS name re-pointed at the primary after a failover) instead of
    /// asking the same standby again for as long as the pool keeps it.
    async fn outcome(
        self,
        prepared: &Prepared,
        rows: Vec<tokio_postgres::Row>,
        sent_at: u64,
    ) -> Result<Attempt, SessionError> {
        let Self {
            borrowed,
            key,
            mode,
            mark,
            bound,
        } = self;
        // The question was asked (and found the lock free) only for the exclusive lock.
        let asked = mode == LockMode::Exclusive;
        let (row, answer) = answer_of(rows)?;
        let attempt = match Answer::parse(answer.as_deref()) {
            Some(granted @ (Answer::Granted | Answer::GrantedUnbounded)) => {
                let session =
                    LockSession::new(Object::take(borrowed.keep()), key, mark, prepared.clone());
                // Dropped on an error here, the session is closed and the server frees the lock.
                let handed_over =
                    bounded(bound, handover::taken_over(&session.client, key)).await?;
                return Ok(Attempt::granted(
                    session,
                    &row,
                    granted,
                    sent_at,
                    handed_over,
                ));
            }
            // Taken between the question and the try (or held shared elsewhere): the question's
            // hold ended with it (else `in_transaction`), so the connection goes back clean.
            Some(Answer::Refused) => Attempt::Refused,
            Some(Answer::InTransaction) => {
                tracing::debug!(key = %key, "the try ran inside a transaction the application left open; \
                     closing the connection, which ends it");
                // Dropping `borrowed` closes the connection.
                return Ok(Attempt::Refused);
            }
            // Closed (see above).
            Some(Answer::Recovery) => return Ok(Attempt::InRecovery),
            Some(Answer::Marked) => {
                // A transaction pooler shares server sessions: a statement prepared on one is
                // not on the next.
                prepared.behind_a_pooler(key, borrowed.client());
                if asked {
                    // Dropping `borrowed` closes the connection.
                    return Ok(Attempt::SharedSession);
                }
                Attempt::SharedSession
            }
            // Dropping `borrowed` closes the connection.
            Some(Answer::Moved | Answer::Armed(_) | Answer::Full) | None => {
                return Err(SessionError::Unexpected(answer));
            }
        };
        borrowed.give_back();
        Ok(attempt)
    }
}

/// What the statements of one try found.
enum Asked {
    /// The question found the lock held.
    Held,
    /// The lock is free, and left to a live standby that should have it.
    Deferred(Deferred),
    /// [`TRY_LOCK`]'s rows.
    Tried(Vec<tokio_postgres::Row>),
}

/// The statements of one try on `client`: for the exclusive lock [`ASK`] first, and when it
/// finds the lock free, the `gate` (if any); then [`TRY_LOCK`] with `params`. `sent_at` is when
/// [`TRY_LOCK`] was sent.
async fn ask_then_try(
    prepared: &Prepared,
    key: LockKey,
    mode: LockMode,
    client: &ClientWrapper,
    params: &[(&(dyn ToSql + Sync), Type)],
    gate: Option<Gate<'_>>,
    sent_at: &mut Option<u64>,
) -> Result<Asked, tokio_postgres::Error> {
    if mode == LockMode::Exclusive {
        let rows = send(prepared, key, "try", client, ASK, &params[..2]).await?;
        // No row (which never happens) asks the full try, whose answer is the one that counts.
        let free = rows
            .first()
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()?;
        if free == Some(false) {
            return Ok(Asked::Held);
        }
        if let Some(gate) = gate {
            let left = gate.defers(client, key).await?;
            if left.defers {
                return Ok(Asked::Deferred(left));
            }
        }
    }
    *sent_at = Some(now_ms());
    send(prepared, key, "try", client, TRY_LOCK, params)
        .await
        .map(Asked::Tried)
}

/// The one row a lock statement (the try, the wait) answers with, and its answer (the first
/// column, for [`Answer::parse`]); no row is an answer this elector does not know.
pub(crate) fn answer_of(
    rows: Vec<tokio_postgres::Row>,
) -> Result<(tokio_postgres::Row, Option<String>), SessionError> {
    let Some(row) = rows.into_iter().next() else {
        return Err(SessionError::Unexpected(None));
    };
    let answer = row.try_get(0).map_err(SessionError::Query)?;
    Ok((row, answer))
}
