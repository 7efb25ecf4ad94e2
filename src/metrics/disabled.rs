//! Without the `prometheus` feature: the same calls, recording nothing.

use super::Change;
use crate::Error;
use std::time::Duration;

/// Nothing to configure without the `prometheus` feature.
#[derive(Debug, Clone, Default)]
pub(crate) struct MetricsSpec {
    _nothing: (),
}

impl MetricsSpec {
    pub(crate) fn register(&self, _key: &str) -> Result<Option<Metrics>, Error> {
        Ok(None)
    }
}

/// Records nothing.
#[derive(Debug)]
pub(crate) struct Metrics;

impl Metrics {
    pub(crate) fn set_leading(&self, _leading: bool) {}
    pub(crate) fn count(&self, _change: Change) {}
    pub(crate) fn observe_check(&self, _took: Duration) {}
    pub(crate) fn set_epoch(&self, _epoch: u64) {}
}

/// Without the `prometheus` feature, a group of shards records nothing.
#[derive(Debug)]
pub(crate) struct ShardMetrics;

impl ShardMetrics {
    pub(crate) fn set_owned(&self, _owned: usize) {}
    pub(crate) fn set_held_unowned(&self, _shards: usize) {}
    pub(crate) fn count_move(&self, _cause: &str, _shards: usize) {}
}
