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

    /// A key computed from a name, so that a team can name its job instead of picking two
    /// numbers by hand.
    ///
    /// The key is made of the first 8 bytes of the MD5 digest of the name's UTF-8 bytes: bytes
    /// 0 to 3, read as a big-endian `i32`, are the class, and bytes 4 to 7, read the same way,
    /// are the object. MD5 is used because PostgreSQL has it too, so the server can compute the
    /// same key; it is not meant to keep anything secret (whoever knows a name knows its key).
    ///
    /// The computation is fixed: a name gives the same key on every platform, in every build
    /// and in every version of this crate, so replicas of different versions still compete for
    /// the same lock. Changing it would be a breaking change.
    ///
    /// ```
    /// use pg_elector::LockKey;
    ///
    /// let key = LockKey::from_name("billing/invoice-sweep");
    /// // md5('billing/invoice-sweep') begins with d5e07534 bdbb5c50.
    /// assert_eq!(key.class() as u32, 0xd5e0_7534);
    /// assert_eq!(key.object() as u32, 0xbdbb_5c50);
    /// assert_eq!(key, LockKey::new(-706_710_220, -1_111_794_608));
    /// ```
    ///
    /// # In SQL
    ///
    /// The same two halves, computed by the server:
    ///
    /// ```sql
    /// SELECT ('x' || substr(md5('billing/invoice-sweep'), 1, 8))::bit(32)::int4 AS class,
    ///        ('x' || substr(md5('billing/invoice-sweep'), 9, 8))::bit(32)::int4 AS object;
    /// -- class = -706710220, object = -1111794608
    /// ```
    ///
    /// `md5(text)` hashes the text in the database's encoding. That is the name's UTF-8 bytes
    /// in a `UTF8` database, and for a name in plain ASCII in any database. For a name with other
    /// characters in a database of another encoding, hash `convert_to(name, 'UTF8')` instead:
    /// `md5(convert_to('billing/invoice-sweep', 'UTF8'))`.
    ///
    /// To find the leader's backend in `pg_locks`, keep in mind that `classid` and `objid` are
    /// `oid` columns: a negative half shows there as its unsigned 32-bit value. Cast the bits
    /// to `int8` instead of `int4`, which reads them unsigned, and compare with the columns
    /// cast to `int8`:
    ///
    /// ```sql
    /// SELECT l.pid FROM pg_locks l
    /// WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' AND l.objsubid = 2
    ///   AND l.classid::int8 = ('x' || substr(md5('billing/invoice-sweep'), 1, 8))::bit(32)::int8
    ///   AND l.objid::int8 = ('x' || substr(md5('billing/invoice-sweep'), 9, 8))::bit(32)::int8
    ///   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());
    /// ```
    ///
    /// # Collisions
    ///
    /// Two names get the same key only if the first 64 bits of their MD5 digests are equal:
    /// about one chance in 2^64 for a given pair of names, and roughly n² / 2^65 among n names
    /// (under one in a billion for 100,000 names). Two jobs on the same key would share one
    /// leader, so that while one job runs the other has none.
    ///
    /// Names are not the only keys in the database, though. A name's key can equal a key that
    /// someone picked by hand with [`LockKey::new`], and every other piece of code that takes
    /// two-`int4` advisory locks in the same database draws from the same key space. So in one
    /// database, prefer names to hand-picked keys, and name every job after its service the
    /// same way, `"service/job"`, as in `"billing/invoice-sweep"`, so that the names of two
    /// teams cannot meet.
    pub fn from_name(name: &str) -> Self {
        use md5::{Digest, Md5};

        let digest = Md5::digest(name.as_bytes());
        Self {
            class: i32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]),
            object: i32::from_be_bytes([digest[4], digest[5], digest[6], digest[7]]),
        }
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

    /// The bigint advisory lock a leader takes, shared, in the statement that gives this key
    /// up gracefully, and holds until its session closes: a waiting standby granted the key
    /// while it is held knows the old leader stepped down before it let go. The key's two
    /// halves, XORed with a constant so that small keys do not meet an application's small
    /// bigint locks.
    pub(crate) fn handover_marker(&self) -> i64 {
        (self.as_u64() ^ HANDOVER_MARKER_MASK) as i64
    }

    /// The high 32 bits of the handover markers of this key: a graceful unlock marks the
    /// session it granted the key to with the bigint advisory lock of this half and that
    /// session's pid. Mixed from both halves of the key, so that keys of one class differ.
    pub(crate) fn handover_grantee_half(&self) -> u32 {
        (self.class_oid() ^ self.object_oid().rotate_left(16)) ^ HANDOVER_GRANTEE_MASK
    }

    /// The bigint advisory lock of fast takeover's waiting slot `n`: a standby's session
    /// waits for the key only while it holds one of the key's few slots, so that the server's
    /// queue for the key stays short whatever the size of the fleet.
    pub(crate) fn waiting_slot(&self, n: u8) -> i64 {
        (self.as_u64() ^ WAITING_SLOT_MASK).wrapping_add(u64::from(n)) as i64
    }

    fn as_u64(&self) -> u64 {
        ((self.class_oid() as u64) << 32) | self.object_oid() as u64
    }
}

/// See [`LockKey::handover_marker`]: `pg_elect` as bytes.
const HANDOVER_MARKER_MASK: u64 = 0x7067_5f65_6c65_6374;

/// See [`LockKey::handover_grantee_half`]: `pgho` as bytes.
const HANDOVER_GRANTEE_MASK: u32 = 0x7067_686f;

/// See [`LockKey::waiting_slot`]: `pg_waits` as bytes.
const WAITING_SLOT_MASK: u64 = 0x7067_5f77_6169_7473;

/// `class:object`, as the logs, the metrics' `key` label and a schedule's default namespace
/// all write the key.
///
/// ```
/// assert_eq!(pg_elector::LockKey::new(7, -1).to_string(), "7:-1");
/// ```
impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.class, self.object)
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
        assert_eq!(key.to_string(), "-1:-2147483648");
    }

    /// Keys computed once, outside this crate, with Python's hashlib:
    /// `struct.unpack(">ii", hashlib.md5(name.encode()).digest()[:8])`.
    ///
    /// These values must never change. Replicas of different versions of this crate must
    /// compete for the same lock, and operators compute these keys in SQL: a change here is a
    /// breaking change, not a test to update.
    #[test]
    fn from_name_gives_the_fixed_keys() {
        for (name, class, object) in [
            ("", -736_260_903, -1_895_779_836),
            ("billing/invoice-sweep", -706_710_220, -1_111_794_608),
            ("orders/expire", 1_282_728_598, -1_753_174_049),
            ("Zürich/Ablauf", 1_532_971_698, 1_286_015_392),
            ("監視/掃除", -1_866_986_942, 1_689_977_029),
        ] {
            assert_eq!(
                LockKey::from_name(name),
                LockKey::new(class, object),
                "{name:?}"
            );
        }
    }

    #[test]
    fn from_name_reads_the_first_eight_bytes_of_md5_big_endian() {
        // md5("") = d41d8cd9 8f00b204 e9800998 ecf8427e.
        let key = LockKey::from_name("");
        assert_eq!(key.class_oid(), 0xd41d_8cd9);
        assert_eq!(key.object_oid(), 0x8f00_b204);
    }
}
