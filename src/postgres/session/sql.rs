//! The statements of the try and of the lock session's check, with the test that a server
//! session is a grant's alone.

/// The try, in one statement so that even a transaction pooler runs it on one
/// server session, and so that a granted lock never exists on a session without its bounds.
/// Its first column answers:
/// - `recovery`: the server is a hot standby, whose advisory locks are local to it, so a
///   lock granted there proves nothing;
/// - `marked`: this server session already carries some elector's mark, so it is shared by a
///   transaction-mode pooler; the try leaves a visit mark for that elector to find;
/// - `granted`: the lock is ours; the session now carries our mark ($3), the replica's
///   identity as its `application_name` ($9),
///   `idle_session_timeout` = $4 ms and the TCP bounds of [`SessionBounds`](super::SessionBounds);
/// - `granted_unbounded`: the same on a server without `idle_session_timeout` (before 14);
/// - `refused`: another session holds the lock;
/// - `in_transaction`: for the exclusive lock, this session still holds the shared lock of
///   [`ASK`], which only happens inside a transaction the application left open on the pooled
///   connection: a lock granted there would keep that transaction open on the lock session,
///   where `idle_session_timeout` does not apply, and the question's hold would refuse every
///   other standby until that transaction ends (the connection is then closed, which ends it).
///   So a plain `refused` after [`ASK`] found the lock free says that no hold of the question
///   outlasts it: the connection goes back to the pool clean.
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
/// ([`try_acquire`](super::try_acquire)). Whether the lock was handed over gracefully is asked in a statement
/// of its own, only after a grant ([`taken_over`](crate::postgres::handover::taken_over)).
///
/// Setting the bounds in the granting statement matters: if the answer is lost (a partition
/// right after the grant), the server still ends the silent session after 4·I.
pub(super) const TRY_LOCK: &str = "SELECT answer, \
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
            AND objsubid = 2) THEN 'in_transaction' \
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
/// transaction ends: [`TRY_LOCK`] then answers `in_transaction`, and
/// [`try_acquire`](super::try_acquire) closes the connection (which ends the transaction). Its last column, as [`TRY_LOCK`]'s, is the answering backend
/// (see [`send`](crate::postgres::prepared::send)).
pub(super) const ASK: &str = "SELECT CASE \
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
/// the answering backend (see [`send`](crate::postgres::prepared::send)).
///
/// It reads `pg_locks` alone and takes no lock of the server's shared lock table (a shared
/// catalog such as `pg_database` would take one), so a leader keeps passing its check when
/// that table is full. The session's own advisory locks are all in its own database.
pub(super) const CHECK: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
     WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 \
     AND granted AND pid = pg_catalog.pg_backend_pid()), ",
    ours_alone!("$3"),
    ", pg_catalog.to_regclass('pg_elector_candidates') IS NOT NULL, pg_catalog.pg_backend_pid()"
);
