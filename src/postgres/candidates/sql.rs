//! The SQL of the candidates table, every statement in one place: the table, the statements
//! a standby sends on its pool's connections (each guarded against a transaction the
//! application left open), and the leader's on its lock session.

use std::borrow::Cow;

use crate::ident;
use crate::pooled::in_open_transaction;

/// The table's default name, found on the `search_path`; every statement below is written
/// with it.
const DEFAULT_NAME: &str = "pg_elector_candidates";

/// Where an elector's candidates table is: the default name on the `search_path`, or a name
/// (and schema) given to [`ElectorBuilder::candidates_table`](crate::ElectorBuilder::candidates_table).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CandidatesTable {
    /// The quoted, schema-qualified name; `None` for the default.
    quoted: Option<String>,
}

impl CandidatesTable {
    /// The table `table` in `schema` (the `search_path`'s first when `None`), names taken as
    /// written; the name refused when it is empty, overlong, or holds a NUL byte (the caller
    /// says which error that is).
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Result<Self, String> {
        let quoted = ident::qualified(schema, table)?;
        Ok(match (schema, table) {
            (None, DEFAULT_NAME) => Self::default(),
            _ => Self {
                quoted: Some(quoted),
            },
        })
    }

    /// `statement`, one of this module's (or the leader check), on this table: as written
    /// for the default, else with every mention of the default name replaced (the one inside
    /// a string literal, `to_regclass('…')`, by the quoted name as a literal).
    pub(crate) fn sql(&self, statement: &'static str) -> Cow<'static, str> {
        let Some(quoted) = &self.quoted else {
            return Cow::Borrowed(statement);
        };
        let as_literal = format!("'{}'", quoted.replace('\'', "''"));
        let parts: Vec<String> = statement
            .split(&format!("'{DEFAULT_NAME}'"))
            .map(|part| part.replace(DEFAULT_NAME, quoted))
            .collect();
        Cow::Owned(parts.join(&as_literal))
    }

    /// The statement that creates the table (and adds the columns of later versions).
    pub(crate) fn ddl(&self) -> Cow<'static, str> {
        self.sql(CANDIDATES_DDL)
    }
}

/// The statement that creates the table, for a migration or an administrator.
pub(crate) const CANDIDATES_DDL: &str = "CREATE TABLE IF NOT EXISTS pg_elector_candidates (\
     class int4 NOT NULL, object int4 NOT NULL, identity text NOT NULL, \
     preference numeric(20,0) NOT NULL, live_until timestamptz NOT NULL, \
     live_since timestamptz NOT NULL, waits bool NOT NULL, \
     requested_until timestamptz, stay_away_ms bigint, heard_at timestamptz, \
     PRIMARY KEY (class, object, identity)); \
     ALTER TABLE pg_elector_candidates ADD COLUMN IF NOT EXISTS heard_at timestamptz";

/// Whether the table exists, as one column of the leader's check (a catalog lookup).
pub(crate) const EXISTS: &str = "pg_catalog.to_regclass('pg_elector_candidates') IS NOT NULL";

/// The first CTE of every statement that writes the table: its commit waits for no
/// synchronous standby and no local flush (`synchronous_commit = off`, for this transaction).
/// A row says only who is alive now, and a backend waiting for a standby that stopped
/// confirming keeps its locks (the lock session's advisory lock among them) even after its
/// client has gone. Each statement reads `bound`, so that the setting is made.
macro_rules! no_wait {
    () => {
        "WITH bound AS MATERIALIZED (\
           SELECT pg_catalog.set_config('synchronous_commit', 'off', true) AS s), "
    };
}

/// The first CTEs of every statement that writes the table on a pool connection, which the
/// application may have left inside a transaction (a `BEGIN` without its `COMMIT`): `open`,
/// whether it is (see [`PROBE`](crate::pooled::PROBE)), and [`no_wait!`]'s setting, made only when it is not. The
/// statement writes nothing inside such a transaction, and the connection is closed, which
/// ends it: the crate never changes a transaction it did not open.
macro_rules! no_wait_outside_transactions {
    () => {
        concat!(
            "WITH open AS MATERIALIZED (SELECT ",
            in_open_transaction!(),
            " AS yes), \
             bound AS MATERIALIZED (SELECT CASE WHEN NOT (SELECT yes FROM open) THEN \
               pg_catalog.set_config('synchronous_commit', 'off', true) END AS s), "
        )
    };
}

/// Whether the lock of `$1, $2`, free or just granted to identity `$3` of preference `$4`,
/// should go to another live standby: the live target of the newest handover asked (one
/// target at a time, however many requests raced), or else (no live target) a more preferred
/// one.
///
/// Time is the statement's (`statement_timestamp`), not its transaction's: a pool connection
/// the application left inside a transaction would otherwise read the time it began.
macro_rules! defer {
    () => {
        "SELECT EXISTS (SELECT 1 FROM pg_elector_candidates c \
         WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity <> $3::text \
         AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp() \
         AND coalesce(c.identity = (SELECT r.identity FROM pg_elector_candidates r \
                WHERE r.class = $1::int4 AND r.object = $2::int4 \
                AND r.live_until > pg_catalog.statement_timestamp() AND r.heard_at <= pg_catalog.statement_timestamp() \
                AND r.requested_until > pg_catalog.statement_timestamp() \
                ORDER BY r.requested_until DESC, r.identity DESC LIMIT 1), \
              c.preference > $4::text::numeric))"
    };
}

/// A standby's row: its preference, live for `$5` ms more, whether it keeps a session waiting
/// for the lock (`$6`, fast takeover), and since when it has been live without a break. A
/// handover asked of it stays. Answers whether another live standby outranks it (see
/// [`defer!`]): such a standby keeps no waiting session, which would only take a waiting slot
/// from the one it would leave the lock to.
///
/// `$7` is the `live_until` this replica wrote at its last upsert (in microseconds since 1970;
/// NULL when it knows none): a live row whose `live_until` is another was written since by
/// another replica of the same key and identity, whose rows overwrite each other's (the last
/// column says so).
pub(super) const REGISTER: &str = concat!(
    no_wait_outside_transactions!(),
    "prev AS (SELECT live_until, heard_at FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text), \
     up AS (INSERT INTO pg_elector_candidates AS c \
       (class, object, identity, preference, live_until, live_since, waits, heard_at) \
       SELECT $1::int4, $2::int4, $3::text, $4::text::numeric, \
               pg_catalog.statement_timestamp() + $5::int8 * interval '1 millisecond', pg_catalog.statement_timestamp(), $6::bool, \
               pg_catalog.statement_timestamp() \
       WHERE NOT (SELECT yes FROM open) \
       ON CONFLICT (class, object, identity) DO UPDATE \
       SET preference = EXCLUDED.preference, live_until = EXCLUDED.live_until, \
           waits = EXCLUDED.waits, heard_at = EXCLUDED.heard_at, \
           live_since = CASE WHEN c.live_until < pg_catalog.statement_timestamp() \
                                  OR c.heard_at IS NULL OR c.heard_at > pg_catalog.statement_timestamp() \
                             THEN pg_catalog.statement_timestamp() \
                             ELSE c.live_since END \
       RETURNING (extract(epoch FROM live_until) * 1000000)::int8 AS written) \
     SELECT d.yes, (SELECT yes FROM open), (SELECT written FROM up), \
       coalesce($7::int8 <> (SELECT (extract(epoch FROM live_until) * 1000000)::int8 FROM prev) \
                AND (SELECT live_until > pg_catalog.statement_timestamp() \
                     AND heard_at <= pg_catalog.statement_timestamp() FROM prev), false) \
     FROM (",
    defer!(),
    ") AS d(yes), bound"
);

/// [`defer!`] on a free lock, before a try would take it; and whether this session still
/// holds the key's shared lock of the question the try asked first (see the try's `ASK`): it
/// does only inside a transaction the application left open on the pool connection, where
/// that hold lasts until the transaction ends.
pub(super) const DEFER: &str = concat!(
    defer!(),
    ", EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
       AND pid = pg_catalog.pg_backend_pid() AND mode = 'ShareLock' \
       AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2), ",
    in_open_transaction!()
);

/// [`defer!`] after a grant, and whether the grantee's own row carries a handover asked to it.
/// Its row stays until its first look ([`LOOK`]), after its term's first check, or until it
/// unlocks, whichever comes first ([`drop_own_row`]): until the target of a handover has begun
/// a term that held, its request stands, so that the replica that handed over stays away
/// only while the target may still lead.
pub(super) const CLAIM: &str = concat!(
    "SELECT (",
    defer!(),
    "), coalesce((SELECT requested_until > pg_catalog.statement_timestamp() \
       FROM pg_elector_candidates WHERE class = $1::int4 AND object = $2::int4 \
       AND identity = $3::text), false)"
);

/// A standby's row, when it stops: nobody waits for it any more.
pub(super) const WITHDRAW: &str = concat!(
    no_wait_outside_transactions!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text \
       AND NOT (SELECT yes FROM open) RETURNING 1) \
     SELECT (SELECT s FROM bound), (SELECT count(*) FROM gone), (SELECT yes FROM open)"
);

/// The leader's look: its own row dropped (it is no standby), rows dead for ten minutes
/// (replicas gone for good), and rows heard at a time the server's clock has not reached
/// (written before a step of that clock backwards: they would come back to life when the
/// clock catches up; live standbys write theirs again within an interval, and a request on
/// such a row is lost); then the most preferred live standby that is ready to take the
/// lock, the stay-away and the target of the newest handover asked to a live standby (none if
/// that is this leader, whose own row the snapshot still shows), and whether its own row
/// carried a handover asked to it, and whether a live row of its identity was there (after a
/// term's first look, only another replica of that identity writes one). A leader that took
/// the lead on request withdraws, at its first look, every other request of the key, which
/// raced it and lost: it is done.
///
/// A standby with fast takeover is ready once its session waits for the lock (the server
/// hands the lock to it at the unlock, in milliseconds), or after it has been live for `$4`
/// ms (one of the leader's intervals: every waiting slot may be taken, and its tries get the
/// lock within its interval all the same); one without is ready at once.
pub(super) const LOOK: &str = concat!(
    no_wait!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 \
       AND (identity = $3::text OR live_until < pg_catalog.statement_timestamp() - interval '10 minutes' \
            OR heard_at IS NULL OR heard_at > pg_catalog.statement_timestamp()) \
       RETURNING identity = $3::text AND requested_until > pg_catalog.statement_timestamp() AS asked, \
         identity = $3::text AND live_until > pg_catalog.statement_timestamp() AND heard_at <= pg_catalog.statement_timestamp() AS live_own), \
     done AS (UPDATE pg_elector_candidates SET requested_until = NULL, stay_away_ms = NULL \
       WHERE class = $1::int4 AND object = $2::int4 AND identity <> $3::text \
       AND requested_until IS NOT NULL AND coalesce((SELECT bool_or(asked) FROM gone), false) \
       RETURNING 1) \
     SELECT (SELECT max(c.preference)::text FROM pg_elector_candidates c \
               WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity <> $3::text \
               AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp() \
               AND (NOT c.waits \
                    OR c.live_since <= pg_catalog.statement_timestamp() - $4::int8 * interval '1 millisecond' \
                    OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
                       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                       WHERE l.locktype = 'advisory' AND NOT l.granted \
                       AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid \
                       AND l.objsubid = 2 AND a.application_name = c.identity))), \
            n.stay_away, n.target, \
            coalesce((SELECT bool_or(asked) FROM gone), false), (SELECT s FROM bound), \
            coalesce((SELECT bool_or(live_own) FROM gone), false) \
     FROM (SELECT 1) AS one LEFT JOIN ( \
       SELECT coalesce(r.stay_away_ms, 0) AS stay_away, r.identity AS target \
       FROM pg_elector_candidates r \
       WHERE r.class = $1::int4 AND r.object = $2::int4 \
       AND r.live_until > pg_catalog.statement_timestamp() AND r.heard_at <= pg_catalog.statement_timestamp() \
       AND r.requested_until > pg_catalog.statement_timestamp() \
       ORDER BY r.requested_until DESC, r.identity DESC LIMIT 1) AS n ON n.target <> $3::text"
);

/// A handover asked of `$1, $2`'s leader (identity `$3`): to the live standby named `$4`, or
/// with `$4` NULL to the most preferred live one; valid for a minute, or until that standby
/// leads. Any other standby's request is withdrawn. Answers the target, or no row. Its commit
/// waits for no synchronous standby ([`no_wait!`]): the leader it asks reads it on this
/// server, and a failover ends that leader's term anyway; a standby that stops confirming
/// would otherwise hold the request past the caller's bound and let it land seconds later.
pub(super) const REQUEST: &str = concat!(
    no_wait!(),
    "target AS (SELECT identity FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity <> $3::text \
       AND live_until > pg_catalog.statement_timestamp() AND heard_at <= pg_catalog.statement_timestamp() AND ($4::text IS NULL OR identity = $4::text) \
       ORDER BY preference DESC, live_until DESC, identity LIMIT 1) \
     UPDATE pg_elector_candidates c SET \
       requested_until = CASE WHEN c.identity = t.identity \
         THEN pg_catalog.statement_timestamp() + interval '1 minute' END, \
       stay_away_ms = CASE WHEN c.identity = t.identity THEN $5::int8 END \
     FROM target t, bound WHERE c.class = $1::int4 AND c.object = $2::int4 \
       AND (c.identity = t.identity OR c.requested_until IS NOT NULL) \
     RETURNING c.identity, c.identity = t.identity"
);

/// A leader's own row, dropped on its lock session before it unlocks: the row it wrote as a
/// standby stays until its term's first look, and a term that ends before (a shutdown, a
/// resign, a grant given back) would otherwise leave it live for two intervals, during which
/// every other standby leaves the free lock to a replica that no longer wants it.
pub(super) const DROP_OWN_ROW: &str = concat!(
    no_wait!(),
    "gone AS (DELETE FROM pg_elector_candidates \
       WHERE class = $1::int4 AND object = $2::int4 AND identity = $3::text RETURNING 1) \
     SELECT (SELECT s FROM bound), (SELECT count(*) FROM gone)"
);

/// What a replica that handed over on request sees of the target ([`StayAway`]): whether a
/// session named as the target holds the key's lock in this database, and whether the
/// target's row says it is a live standby.
pub(super) const TARGET: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
       WHERE l.locktype = 'advisory' AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid \
       AND l.objsubid = 2 AND l.mode = 'ExclusiveLock' AND l.granted \
       AND a.application_name = $3::text \
       AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                         WHERE datname = pg_catalog.current_database())), \
     EXISTS (SELECT 1 FROM pg_elector_candidates c \
       WHERE c.class = $1::int4 AND c.object = $2::int4 AND c.identity = $3::text \
       AND c.live_until > pg_catalog.statement_timestamp() AND c.heard_at <= pg_catalog.statement_timestamp()), ",
    in_open_transaction!()
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_keeps_the_statements_as_written() {
        let table = CandidatesTable::new(None, DEFAULT_NAME).unwrap();
        assert_eq!(table, CandidatesTable::default());
        assert!(matches!(table.sql(LOOK), Cow::Borrowed(s) if s == LOOK));
    }

    #[test]
    fn a_named_table_is_quoted_everywhere_and_a_literal_in_to_regclass() {
        let table = CandidatesTable::new(Some("Ops"), "it's").unwrap();
        let exists = table.sql(EXISTS);
        assert_eq!(
            exists,
            "pg_catalog.to_regclass('\"Ops\".\"it''s\"') IS NOT NULL"
        );
        let ddl = table.ddl();
        assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS \"Ops\".\"it's\" ("));
        assert!(ddl.contains("ALTER TABLE \"Ops\".\"it's\" ADD COLUMN"));
        for statement in [
            REGISTER,
            DEFER,
            CLAIM,
            WITHDRAW,
            LOOK,
            REQUEST,
            DROP_OWN_ROW,
            TARGET,
        ] {
            assert!(!table.sql(statement).contains(DEFAULT_NAME), "{statement}");
        }
        // A table of the default name in another schema.
        let table = CandidatesTable::new(Some("ops"), DEFAULT_NAME).unwrap();
        assert_eq!(
            table.sql(EXISTS),
            "pg_catalog.to_regclass('\"ops\".\"pg_elector_candidates\"') IS NOT NULL"
        );
    }

    #[test]
    fn names_postgresql_would_cut_or_refuse_are_an_error() {
        for (schema, table) in [(None, ""), (Some(""), "t"), (None, "a\0b")] {
            assert!(CandidatesTable::new(schema, table).is_err());
        }
        let long = "x".repeat(64);
        assert!(CandidatesTable::new(None, &long).is_err());
    }
}
