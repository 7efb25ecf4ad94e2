//! The advisory lock key.

/// The two-`int4` key of the advisory lock the replicas compete for.
///
/// The election calls `pg_try_advisory_lock(class, object)`, the two-`int4` form. PostgreSQL
/// keeps this key space apart from the single-`bigint` form: in `pg_locks` the lock shows as
/// `locktype = 'advisory'`, `classid = class`, `objid = object`, `objsubid = 2`, while a
/// `bigint` key shows with `objsubid = 1`. A `pg_advisory_xact_lock(bigint)` taken elsewhere in
/// the application therefore never collides with the election, not even the `bigint` whose two
/// halves equal `(class, object)`.
///
/// Advisory locks are scoped to one database: replicas that connect to different databases of
/// one server elect different leaders.
///
/// `pg_locks.classid` and `objid` are `oid` columns, so a negative `class` or `object` shows
/// there as its unsigned 32-bit value (`-1` shows as `4294967295`).
///
/// ```
/// use pg_elector::LockKey;
///
/// // "swep" in ASCII, and the first job of that service.
/// const SWEEPER: LockKey = LockKey::new(0x7377_6570, 1);
/// assert_eq!(SWEEPER.class(), 0x7377_6570);
/// assert_eq!(SWEEPER.object(), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    class: i32,
    object: i32,
}

impl LockKey {
    /// A key from its two halves.
    pub const fn new(class: i32, object: i32) -> Self {
        Self { class, object }
    }

    /// The first half: `classid` in `pg_locks`.
    pub fn class(&self) -> i32 {
        self.class
    }

    /// The second half: `objid` in `pg_locks`.
    pub fn object(&self) -> i32 {
        self.object
    }

    /// `classid` as `pg_locks` shows it (an `oid`, so the bits of `class` read unsigned).
    pub(crate) fn class_oid(&self) -> u32 {
        self.class as u32
    }

    /// `objid` as `pg_locks` shows it.
    pub(crate) fn object_oid(&self) -> u32 {
        self.object as u32
    }
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.class, self.object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_halves_read_unsigned_as_in_pg_locks() {
        let key = LockKey::new(-1, i32::MIN);
        assert_eq!(key.class_oid(), u32::MAX);
        assert_eq!(key.object_oid(), 0x8000_0000);
        assert_eq!(key.to_string(), "(-1, -2147483648)");
    }
}
