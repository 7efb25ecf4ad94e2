//! The database side of the election: the try on a borrowed connection, and the session that
//! holds the lock once it is granted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::types::{ToSql, Type};

use super::borrower::Borrower;
use super::candidates::{CandidatesTable, Deferred, Gate};
use super::handover::{self, Unlocked};
pub(crate) use super::prepared::Prepared;
use super::prepared::send;
pub(crate) use super::session_error::SessionError;
pub(super) use super::session_error::bounded;
use crate::LockKey;
use crate::lease::now_ms;
use crate::pooled::Borrowed;

/// The try, in one statement so that even a transaction pooler runs it on one
/// server session, and so that a granted lock never exists on a session without its bounds.
/// Its first column answers:
/// - `recovery`: the server is a hot standby, whose advisory locks are local to it, so a
///   lock granted there proves nothing;
/// - `marked`: this server session already carries some elector's mark, so it is shared by a
///   transaction-mode pooler; the try leaves a visit mark for that elector to find;
/// - `granted`: the lock is ours; the session now carries our mark ($3), the replica's
///   identity as its `application_name` ($9),
///   `idle_session_timeout` = $4 ms and the TCP bounds of [`SessionBounds`];
/// - `granted_unbounded`: the same on a server without `idle_session_timeout` (before 14);
/// - `refused`: another session holds the lock; or, for the exclusive lock, this session still
///   holds the shared lock of [`ASK`], which only happens inside a transaction the application
///   left open on the pooled connection: a lock granted there would keep that transaction open
///   on the lock session, where `idle_session_timeout` does not apply (the connection is then
///   closed, which ends that transaction).
///
/// `$10` asks for the key's shared lock instead (the membership lock of a group of shards,
/// which every member holds at once); everything else about the grant is the same.
///
/// The other columns read back the bounds as the server applied them to the session (a
/// keepalive setting the kernel refused shows the kernel's value); they are logged at the grant.
/// A refused try reads none of them. `OFFSET 0` keeps the subqueries from being flattened, so
/// the answer is computed once and the settings are read after they were set.
///
/// A standby for the key's exclusive lock sends it only once [`ASK`] found the lock free
/// ([`try_acquire`]). Whether the lock was handed over gracefully is asked in a statement
/// of its own, only after a grant ([`handover::taken_over`]).
///
/// Setting the bounds in the granting statement matters: if the answer is lost (a partition
/// right after the grant), the server still ends the silent session after 4·I.
const TRY_LOCK: &str = "SELECT answer, \
     CASE WHEN granted THEN pg_catalog.current_setting('idle_session_timeout', true) END, \
     CASE WHEN granted THEN pg_catalog.current_setting('tcp_user_timeout', true) END, \
     CASE WHEN granted THEN pg_catalog.current_setting('tcp_keepalives_idle', true) END, \
     CASE WHEN granted THEN pg_catalog.current_setting('tcp_keepalives_interval', true) END, \
     CASE WHEN granted THEN pg_catalog.current_setting('tcp_keepalives_count', true) END, \
     pg_catalog.pg_backend_pid() \
   FROM (SELECT answer, answer LIKE 'granted%' AS granted FROM (SELECT CASE \
     WHEN pg_catalog.pg_is_in_recovery() THEN 'recovery' \
     WHEN coalesce(pg_catalog.current_setting('pg_elector.session', true), '') <> '' THEN \
       CASE WHEN pg_catalog.set_config('pg_elector.visited', $3::text, false) = $3::text \
            THEN 'marked' END \
     WHEN NOT $10::bool AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
            WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() \
            AND mode = 'ShareLock' AND classid = $1::int4::oid AND objid = $2::int4::oid \
            AND objsubid = 2) THEN 'refused' \
     WHEN CASE WHEN $10::bool THEN pg_catalog.pg_try_advisory_lock_shared($1::int4, $2::int4) \
               ELSE pg_catalog.pg_try_advisory_lock($1::int4, $2::int4) END THEN \
       CASE WHEN pg_catalog.set_config('pg_elector.session', $3::text, false) = $3::text \
             AND pg_catalog.set_config('application_name', $9::text, false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_user_timeout', $5::text, false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_idle', $6::text, false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_interval', $7::text, false) IS NOT NULL \
             AND pg_catalog.set_config('tcp_keepalives_count', $8::text, false) IS NOT NULL \
       THEN CASE WHEN pg_catalog.current_setting('server_version_num')::int < 140000 \
                 THEN 'granted_unbounded' \
                 WHEN pg_catalog.set_config('idle_session_timeout', $4::text, false) IS NOT NULL \
                 THEN 'granted' END END \
     ELSE 'refused' END AS answer OFFSET 0) AS try OFFSET 0) AS read_back";

/// The first statement of a standby's try for the key's exclusive lock: whether the lock is
/// free, asked with a shared transaction-level lock that the server lets go as soon as the
/// statement ends. It grants nothing, so it needs none of the bounds of [`TRY_LOCK`] (a lost
/// answer leaves no lock behind). Prepared, it costs the server what a bare prepared try costs;
/// unnamed, the parsing and planning about as much again (a larger question, such as a session
/// lock taken and let go in one statement, costs more to parse). Only when it answers true does
/// [`TRY_LOCK`] follow, on the same connection, with everything a try proves (recovery, a
/// pooler's shared session, the bounds set in the granting statement).
///
/// Shared, so that its momentary hold never reads as a leader: whoever looks for the key's
/// holder in `pg_locks` (the graceful unlock's handover mark, [`crate::current_leader`]) looks
/// for the exclusive lock only. A lock held exclusively or waited for by another session
/// refuses it, as it refuses [`TRY_LOCK`]. On a server session that some elector's lock session
/// marked (a transaction pooler shares it), it answers true without asking, whichever key that
/// elector holds, so that the try that follows answers `marked` and leaves the visit mark that
/// makes that elector step down. On a hot standby (advisory locks are local there) it answers
/// true, and the try that follows answers `recovery`.
///
/// On a pool connection the application left inside a transaction, the hold lasts until that
/// transaction ends: [`try_acquire`] closes the connection when the question answered true
/// and the try was not granted. Its last column, as [`TRY_LOCK`]'s, is the answering backend
/// (see [`send`]).
const ASK: &str = "SELECT CASE \
     WHEN pg_catalog.current_setting('pg_elector.session', true) <> '' THEN true \
     ELSE pg_catalog.pg_try_advisory_xact_lock_shared($1::int4, $2::int4) END, \
     pg_catalog.pg_backend_pid()";

/// The SQL test that the server session is this grant's alone: it carries the grant's mark
/// (the text parameter `$mark`, such as `"$3"`) and no other elector's visit (which a try that
/// found the mark left, see [`TRY_LOCK`]). Every statement after a grant that must see a server
/// session shared by a transaction-mode pooler tests it: the leader's check, a shard member's
/// check and its tries.
macro_rules! ours_alone {
    ($mark:literal) => {
        concat!(
            "(coalesce(pg_catalog.current_setting('pg_elector.session', true), '') = ",
            $mark,
            "::text AND coalesce(pg_catalog.current_setting('pg_elector.visited', true), '') = '')"
        )
    };
}
pub(crate) use ours_alone;

/// The leader check: the session answers, still holds the lock, and is still ours alone
/// ([`ours_alone`]). Its third column says whether the candidates table of preferred leaders
/// exists (a catalog lookup), so that a leader reads that table only once it does; its last,
/// the answering backend (see [`send`]).
///
/// It reads `pg_locks` alone and takes no lock of the server's shared lock table (a shared
/// catalog such as `pg_database` would take one), so a leader keeps passing its check when
/// that table is full. The session's own advisory locks are all in its own database.
const CHECK: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
     WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND granted AND pid = pg_catalog.pg_backend_pid()), ",
    ours_alone!("$3"),
    ", pg_catalog.to_regclass('pg_elector_candidates') IS NOT NULL, pg_catalog.pg_backend_pid()"
);

/// How often the leader looks at its connection and its lease between checks, in both modes: a
/// closed socket, or a lease that expired while the process was frozen, is noticed within this
/// time rather than at the next check. A grant that was not handed over gracefully waits
/// [`super::standby::SETTLE`], five times this, before its term starts, so that an old leader whose
/// session was ended under it has stepped down first, whichever mode either of them runs in.
pub(crate) const WATCH_POLL: Duration = Duration::from_millis(1);

/// The least time a standby's try query is given. A try that times out costs a backend: its
/// connection must be closed, since the lock may have been granted unseen. So a standby with
/// a very short interval does not give up on a merely slow answer; this is far above any
/// healthy round trip, and the try still waits at most I for a pool connection.
pub(super) const MIN_TRY_BOUND: Duration = Duration::from_secs(1);

/// Which lock of the key a try asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// The key's exclusive lock: one holder, the leader.
    Exclusive,
    /// The key's shared lock: every member of a group of shards holds it at once.
    Shared,
}

/// The server-side bounds a granted lock session gets, all derived from the interval I.
///
/// `idle_session_timeout` (4·I) is the server's bound on a silent session. The TCP
/// settings make sure no server-side TCP timeout ends the session, and frees the lock, earlier
/// than that while the old leader may still think it leads: PostgreSQL's `0` means the
/// operating system's default (keepalive idle time often 60–300 s on cloud images), not "off".
/// So `tcp_user_timeout` is 4·I, and the keepalive idle time plus its probes add up to at least
/// 4·I (the kernel takes at most 32767 s for the idle time and the interval, 127 probes). On a
/// server without `idle_session_timeout` (PostgreSQL 13) the keepalives are then the bound: a
/// peer that stops answering is dropped about idle + interval after its last packet, that is
/// ⌈4·I⌉ + ⌈I⌉ in whole seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionBounds {
    pub(crate) idle_session_timeout_ms: u64,
    pub(crate) tcp_user_timeout_ms: u64,
    pub(crate) keepalives_idle_s: u64,
    pub(crate) keepalives_interval_s: u64,
    pub(crate) keepalives_count: u64,
}

/// The kernel's largest `TCP_KEEPIDLE` and `TCP_KEEPINTVL` (Linux), in seconds.
const MAX_KEEPALIVE_S: u64 = 32_767;
/// The kernel's largest `TCP_KEEPCNT` (Linux).
const MAX_KEEPALIVE_COUNT: u64 = 127;

impl SessionBounds {
    /// The settings as `set_config` takes them: `idle_session_timeout`, `tcp_user_timeout`,
    /// and the keepalives' idle time, interval and count.
    pub(super) fn as_settings(&self) -> [String; 5] {
        [
            self.idle_session_timeout_ms,
            self.tcp_user_timeout_ms,
            self.keepalives_idle_s,
            self.keepalives_interval_s,
            self.keepalives_count,
        ]
        .map(|n| n.to_string())
    }

    pub(crate) fn for_interval(interval: Duration) -> Self {
        let bound_ms = (4 * interval).as_millis() as u64;
        let ceil_s = |ms: u64| ms.div_ceil(1000).clamp(1, MAX_KEEPALIVE_S);
        let keepalives_idle_s = ceil_s(bound_ms);
        let keepalives_interval_s = ceil_s(interval.as_millis() as u64);
        let left_s = bound_ms.div_ceil(1000).saturating_sub(keepalives_idle_s);
        let keepalives_count = left_s
            .div_ceil(keepalives_interval_s)
            .clamp(1, MAX_KEEPALIVE_COUNT);
        Self {
            idle_session_timeout_ms: bound_ms,
            tcp_user_timeout_ms: bound_ms,
            keepalives_idle_s,
            keepalives_interval_s,
            keepalives_count,
        }
    }
}

/// The bounds as the server reports them on the lock session right after the grant; `None`
/// for a setting the server does not have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AppliedBounds {
    pub(crate) idle_session_timeout: Option<String>,
    pub(crate) tcp_user_timeout: Option<String>,
    pub(crate) keepalives_idle: Option<String>,
    pub(crate) keepalives_interval: Option<String>,
    pub(crate) keepalives_count: Option<String>,
}

/// What a try found.
pub(crate) enum Attempt {
    /// The lock is ours, on this session; `sent_at` is when the try was sent ([`now_ms`]).
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
    /// as [`TRY_LOCK`]'s do; `handed_over` says whether a graceful unlock gave the lock up.
    pub(super) fn granted(
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
pub(super) enum Answer {
    Granted,
    GrantedUnbounded,
    Refused,
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
    pub(super) fn parse(answer: Option<&str>) -> Option<Self> {
        Some(match answer? {
            "granted" => Self::Granted,
            "granted_unbounded" => Self::GrantedUnbounded,
            "refused" => Self::Refused,
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
    /// ([`ours_alone`]), and whether it holds the lock. A session that is not ours alone proves
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

/// Tries the lock once on a connection borrowed through `borrower`, waiting at most `interval`
/// for the connection and the interval (at least [`MIN_TRY_BOUND`]) for each statement.
///
/// `defer_as`, for a leader's lock, is this replica's preference: once the question found the
/// lock free, a live standby that should have it instead (see
/// [`candidates`](super::candidates)) makes the try answer [`Attempt::Deferred`] without
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
/// found free, that left the lock to another standby and whose session no longer holds the
/// question's hold, gives it back too. Any other try that [`ASK`] found free and that was not
/// granted closes it: had the application left the connection
/// inside a transaction, the shared hold of [`ASK`] would last until that transaction ends
/// and refuse every other standby meanwhile (and [`TRY_LOCK`] refuses a grant there). That
/// costs a new backend when the lock was free at the question and not at the try: another
/// standby took it, or its question or a fast-takeover waiter got in between (most likely
/// right after a leader lets go), or a session outside the elector holds the key shared; and
/// at every try that finds a transaction pooler. A granted try takes the connection out of the
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
    let mark = session_mark();
    let [idle, user, k_idle, k_interval, k_count] = bounds.as_settings();
    let shared = mode == LockMode::Shared;
    let params: [(&(dyn ToSql + Sync), Type); 10] = [
        (&key.class(), Type::INT4),
        (&key.object(), Type::INT4),
        (&mark, Type::TEXT),
        (&idle, Type::TEXT),
        (&user, Type::TEXT),
        (&k_idle, Type::TEXT),
        (&k_interval, Type::TEXT),
        (&k_count, Type::TEXT),
        (&identity, Type::TEXT),
        (&shared, Type::BOOL),
    ];
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
        mark,
        bound,
    };
    let sent_at = sent_at.unwrap_or_else(now_ms);
    visit.outcome(&borrower.prepared, rows, sent_at).await
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
            Some(Answer::Refused) if asked => {
                tracing::debug!(key = %key, "the lock was taken between the question and the try; \
                     closing the connection, which the question's hold may outlast");
                // Dropping `borrowed` closes the connection.
                return Ok(Attempt::Refused);
            }
            Some(Answer::Refused) => Attempt::Refused,
            // A server in recovery never yields the lock, however often it is asked: closing
            // the connection (dropping `borrowed`) makes the next try open a new one, which
            // follows an address that has moved on (a virtual IP or DNS name re-pointed at the
            // primary after a failover) instead of asking the same standby again for as long
            // as the pool keeps it.
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
pub(super) fn answer_of(
    rows: Vec<tokio_postgres::Row>,
) -> Result<(tokio_postgres::Row, Option<String>), SessionError> {
    let Some(row) = rows.into_iter().next() else {
        return Err(SessionError::Unexpected(None));
    };
    let answer = row.try_get(0).map_err(SessionError::Query)?;
    Ok((row, answer))
}

/// The connection that holds the lock, out of the pool. Dropping it closes the connection,
/// and the server frees the lock with the session.
pub(crate) struct LockSession {
    client: ClientWrapper,
    key: LockKey,
    /// This grant's mark on the server session.
    mark: String,
    /// Whether the check goes as a prepared statement, shared with the tries of the standby
    /// that was granted the lock.
    prepared: Prepared,
}

impl LockSession {
    /// The lock session that `client` became when a statement that marked it with `mark`
    /// was granted the lock.
    pub(super) fn new(
        client: ClientWrapper,
        key: LockKey,
        mark: String,
        prepared: Prepared,
    ) -> Self {
        Self {
            client,
            key,
            mark,
            prepared,
        }
    }

    /// The leader check, as a statement prepared once on the lock session where [`Prepared`]
    /// says so for it, as one unnamed statement otherwise, and unnamed from the first time the
    /// server session does not have it.
    pub(crate) async fn check(&self, bound: Duration) -> Result<Check, SessionError> {
        self.check_seeing(bound, &CandidatesTable::default())
            .await
            .map(|(check, _)| check)
    }

    /// [`check`](Self::check), and whether the candidates table of preferred leaders
    /// (`candidates`) exists.
    pub(crate) async fn check_seeing(
        &self,
        bound: Duration,
        candidates: &CandidatesTable,
    ) -> Result<(Check, bool), SessionError> {
        let class = self.key.class_oid();
        let object = self.key.object_oid();
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&class, Type::OID),
            (&object, Type::OID),
            (&self.mark, Type::TEXT),
        ];
        let (holds, ours_alone, candidates): (bool, bool, bool) = bounded(bound, async {
            let rows = send(
                &self.prepared,
                self.key,
                "check",
                &self.client,
                &candidates.sql(CHECK),
                &params,
            )
            .await?;
            match rows.first() {
                Some(row) => Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)),
                // A SELECT without FROM always returns one row.
                None => Ok((false, false, false)),
            }
        })
        .await?;
        Ok((Check::of(ours_alone, holds), candidates))
    }

    /// Gives the lock up gracefully, marking the session it hands the lock to (see
    /// [`handover`]).
    pub(crate) async fn unlock(&self, bound: Duration) -> Result<Unlocked, SessionError> {
        bounded(bound, handover::unlock(&self.client, self.key)).await
    }

    /// This grant's mark on the server session, which every statement of a shard member's
    /// session checks before it takes a lock.
    pub(crate) fn mark(&self) -> &str {
        &self.mark
    }

    /// The client of the lock session, for the fencing bump.
    pub(crate) fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Whether the connection has closed. tokio-postgres notices a FIN or RST as soon as
    /// it arrives, because its connection task always reads; the client only exposes that as a
    /// flag, which the leader polls every [`WATCH_POLL`].
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// A mark unique to one grant: process, time, and a counter.
pub(super) fn session_mark() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{nanos:x}-{n}", std::process::id())
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

    #[test]
    fn no_server_side_tcp_bound_is_shorter_than_four_intervals() {
        for interval in [
            Duration::from_millis(10),
            Duration::from_millis(200),
            Duration::from_secs(5),
            Duration::from_secs(3600),
            Duration::from_secs(3 * 3600),
            crate::MAX_CHECK_INTERVAL,
        ] {
            let b = SessionBounds::for_interval(interval);
            let four = (4 * interval).as_millis() as u64;
            assert_eq!(b.idle_session_timeout_ms, four);
            assert_eq!(b.tcp_user_timeout_ms, four);
            assert!(b.tcp_user_timeout_ms <= i32::MAX as u64, "{interval:?}");
            let keepalive_ms =
                (b.keepalives_idle_s + b.keepalives_interval_s * b.keepalives_count) * 1000;
            assert!(keepalive_ms >= four, "{interval:?}: {b:?}");
            assert!(b.keepalives_idle_s * 1000 >= four.min(MAX_KEEPALIVE_S * 1000));
            assert!(
                (1..=MAX_KEEPALIVE_S).contains(&b.keepalives_idle_s),
                "{b:?}"
            );
            assert!(
                (1..=MAX_KEEPALIVE_S).contains(&b.keepalives_interval_s),
                "{b:?}"
            );
            assert!(
                (1..=MAX_KEEPALIVE_COUNT).contains(&b.keepalives_count),
                "{b:?}"
            );
        }
    }
}
