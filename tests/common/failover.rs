//! A primary with a streaming standby (the harness's [`Cluster`]), started for a test.

pub use pg_elector_testkit::{Cluster, Follow};

use super::init_tracing;

/// A primary with a fresh database and a standby copied from it, followed as `follow` says;
/// with `synchronous`, commits on the primary wait for the standby.
pub async fn cluster(follow: Follow, synchronous: bool) -> Cluster {
    init_tracing();
    Cluster::start(follow, synchronous)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
