//! The guides: the depth behind the README, one topic a page. Each page is also a file of the
//! repository's `docs/`, and its code is compiled by the crate's tests.

#[doc = include_str!("../docs/background.md")]
pub mod background {}

#[cfg(feature = "schedule")]
#[doc = include_str!("../docs/schedules.md")]
pub mod schedules {}

#[doc = include_str!("../docs/fencing.md")]
pub mod fencing {}

#[doc = include_str!("../docs/fast_takeover.md")]
pub mod fast_takeover {}

#[doc = include_str!("../docs/preferences.md")]
pub mod preferences {}

#[doc = include_str!("../docs/shards.md")]
pub mod shards {}

#[doc = include_str!("../docs/operations.md")]
pub mod operations {}

#[doc = include_str!("../docs/failover.md")]
pub mod failover {}

#[doc = include_str!("../docs/postgresql.md")]
pub mod postgresql {}

#[doc = include_str!("../docs/testing.md")]
pub mod testing {}

#[doc = include_str!("../docs/how_it_works.md")]
pub mod how_it_works {}
