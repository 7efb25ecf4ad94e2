//! The replica processes of `tests/processes.rs`: the harness's `replica` module, with a
//! [`Fleet`] of this crate's own so that the tests can add methods to it.

pub(crate) use pg_elector_harness::replica::*;

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use pg_elector::LockKey;

/// The harness's fleet of replica processes.
pub(crate) struct Fleet(pg_elector_harness::replica::Fleet);

impl Fleet {
    /// See [`pg_elector_harness::replica::Fleet::new`].
    pub(crate) fn new(
        entry: &'static [&'static str],
        url: String,
        key: LockKey,
        interval: Duration,
    ) -> Self {
        Self(pg_elector_harness::replica::Fleet::new(
            entry, url, key, interval,
        ))
    }
}

impl Deref for Fleet {
    type Target = pg_elector_harness::replica::Fleet;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
