//! Prometheus metrics: the leader gauge, leadership changes by cause, and how long leader
//! checks take. Behind the default-on `prometheus` feature; without it, [`Metrics`] records
//! nothing.

/// The leader gauge's default name.
pub const DEFAULT_GAUGE_NAME: &str = "pg_elector_leader";

/// The counter of leadership changes, labelled by `key` and `cause`.
pub const CHANGES_NAME: &str = "pg_elector_leadership_changes_total";

/// The histogram of leader check durations, labelled by `key`.
pub const CHECK_DURATION_NAME: &str = "pg_elector_check_duration_seconds";

/// The gauge of the current term's fencing epoch, labelled by `key`.
pub const EPOCH_NAME: &str = "pg_elector_epoch";

/// The gauge of the shards this replica owns, labelled by `group`.
pub const SHARDS_OWNED_NAME: &str = "pg_elector_shards_owned";

/// The gauge of the shards this replica holds locked but does not own (their terms could not
/// start, most often because an older term's open fenced transaction holds their epoch rows),
/// labelled by `group`.
pub const SHARDS_HELD_UNOWNED_NAME: &str = "pg_elector_shards_held_unowned";

/// The counter of shards gained and given up, labelled by `group` and `cause`.
pub const SHARD_MOVES_NAME: &str = "pg_elector_shard_moves_total";

use crate::term::LossCause;

/// Why leadership changed, as the `cause` label of the changes counter says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// This replica started leading.
    Acquired,
    /// It gave the lock up at shutdown.
    Released,
    /// It gave the lock up through a resign.
    Resigned,
    /// It handed the lead over to a preferred standby, or on request.
    HandedOver,
    /// A shard's term ended to move the shard to another member of its group.
    Moved,
    /// The term was lost, for this cause.
    Lost(LossCause),
}

impl Change {
    /// The public cause of a lost term; `None` for the changes that do not lose one.
    pub(crate) fn loss_cause(self) -> Option<LossCause> {
        match self {
            Self::Lost(cause) => Some(cause),
            Self::Acquired | Self::Released | Self::Resigned | Self::HandedOver | Self::Moved => {
                None
            }
        }
    }

    /// The counter's `cause` label: a lost term's is its [`LossCause::as_str`].
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Released => "released",
            Self::Resigned => "resigned",
            Self::HandedOver => "handed_over",
            Self::Moved => "moved",
            Self::Lost(cause) => cause.as_str(),
        }
    }
}

#[cfg(all(feature = "prometheus", feature = "schedule"))]
pub(crate) use enabled::register_shared;
#[cfg(feature = "prometheus")]
pub(crate) use enabled::{Metrics, MetricsSpec, ShardMetrics};

#[cfg(not(feature = "prometheus"))]
pub(crate) use disabled::{Metrics, MetricsSpec, ShardMetrics};

#[cfg(not(feature = "prometheus"))]
mod disabled;

#[cfg(feature = "prometheus")]
mod enabled;

#[cfg(test)]
mod cause_tests {
    use super::Change;
    use crate::LossCause;

    #[test]
    fn the_counter_labels_each_change_once() {
        let causes = [
            LossCause::ConnectionClosed,
            LossCause::LockGone,
            LossCause::Pooler,
            LossCause::CheckTimeout,
            LossCause::CheckFailed,
            LossCause::LeaseExpired,
            LossCause::Abandoned,
            LossCause::Demoted,
        ];
        let mut labels: Vec<&str> = [
            Change::Acquired,
            Change::Released,
            Change::Resigned,
            Change::HandedOver,
            Change::Moved,
        ]
        .into_iter()
        .chain(causes.into_iter().map(Change::Lost))
        .map(Change::label)
        .collect();
        assert_eq!(
            &labels[..6],
            [
                "acquired",
                "released",
                "resigned",
                "handed_over",
                "moved",
                "connection_closed"
            ]
        );
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), 5 + causes.len(), "{labels:?}");
        for cause in causes {
            assert_eq!(Change::Lost(cause).loss_cause(), Some(cause));
        }
    }
}
