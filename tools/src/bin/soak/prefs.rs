//! Preferences (`--preferences`, on by default in key mode): every replica is built with
//! `ElectorBuilder::preference`, the numbers as in a rolling deploy, and the soak samples who
//! the library takes for live.
//!
//! **The numbers.** The first fleet draws each slot's preference from {1, 2, 3} (five
//! replicas: some equal, some higher); the latest release is 3. Every process that a fault
//! starts again (`kill`, `graceful`, `handover-dying`) is a new pod of the latest release, and
//! one in three starts a new release first, one higher (the docs' recipe: "a higher number
//! for every deploy"): so the newest replicas share the highest number, older ones keep lower
//! ones, and the slot kept alive (slot 0) ends up least preferred. A replica that exited by
//! itself comes back with its own number.
//!
//! **Live.** The README's "most preferred live standby" is the library's own notion: a standby
//! that tried within its last two intervals and got an answer, which it says in a row of
//! `pg_elector_candidates` (a leader drops its own). The soak reads the live rows of its key
//! every 20 ms, with the library's own predicate (`live_until` and `heard_at` against
//! `statement_timestamp()`), on a connection of its own.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_tools::rng::Rng;
use tokio_util::sync::CancellationToken;

use crate::db;
use crate::fleet::Fleet;

/// How often the live rows are read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The releases the first fleet's preferences are drawn from: 1 to this.
const FIRST_RELEASES: u64 = 3;

/// One read of the live rows.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    /// When (µs, this machine's clock: the server's `statement_timestamp()` less the offset).
    pub(crate) at: u64,
    /// The live rows: the replica process and its preference.
    pub(crate) live: Vec<(usize, u64)>,
    /// The live rows a pending handover request names (`requested_until` not past): the
    /// library's own record of whom a request went to, which the soak cannot know for a
    /// request that timed out ("it may or may not have asked").
    pub(crate) requested: Vec<usize>,
}

/// Every read of the live rows, and the latest.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    /// In time order.
    pub(crate) samples: Mutex<Vec<Sample>>,
    /// Times the sampler had to reconnect (a restart, a failover, the table not there yet).
    pub(crate) reconnects: AtomicU64,
}

impl Candidates {
    /// The latest read, if it is recent (within `fresh` µs of `now`).
    pub(crate) fn latest(&self, now: u64, fresh: u64) -> Option<Sample> {
        let samples = self.samples.lock().unwrap();
        samples.last().filter(|s| s.at + fresh >= now).cloned()
    }
}

/// The first fleet's preferences, one per slot (drawn only with `--preferences`, so that a
/// run without draws as before); and the latest release.
pub(crate) fn first(slots: usize, rng: &mut Rng) -> (Vec<u64>, u64) {
    let preferences = (0..slots).map(|_| 1 + rng.below(FIRST_RELEASES)).collect();
    (preferences, FIRST_RELEASES)
}

/// Before a fault starts a new process in `slot`: it is a pod of the latest release, and one
/// in three (from `pick`, a draw of the fault's) starts a new release first.
pub(crate) fn roll(fleet: &mut Fleet, slot: usize, pick: u64) {
    if fleet.preferences.is_empty() {
        return;
    }
    if (pick >> 40) % 3 == 0 {
        fleet.release += 1;
    }
    fleet.preferences[slot] = fleet.release;
}

/// Reads the live rows of `key` every [`SAMPLE_EVERY`] until `stop`; `offset` is the server's
/// clock minus this machine's (µs).
pub(crate) async fn sample(
    config: tokio_postgres::Config,
    key: LockKey,
    offset: i64,
    candidates: &Candidates,
    stop: CancellationToken,
) {
    let query = "SELECT (extract(epoch FROM pg_catalog.statement_timestamp()) * 1e6)::int8, \
         coalesce((SELECT array_agg(c.identity || ' ' || c.preference::text || ' ' || \
              coalesce(c.requested_until > pg_catalog.statement_timestamp(), false)::text) \
            FROM pg_elector_candidates c WHERE c.class = $1 AND c.object = $2 \
             AND c.live_until > pg_catalog.statement_timestamp() \
             AND c.heard_at <= pg_catalog.statement_timestamp()), '{}')";
    while !stop.is_cancelled() {
        let client = match db::connect(&config).await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The table comes with the first standby's first try.
        let Ok(statement) = client.prepare(query).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = stop.cancelled() => return,
            }
            let row = match client
                .query_one(&statement, &[&key.class(), &key.object()])
                .await
            {
                Ok(row) => row,
                Err(_) => break,
            };
            let at: i64 = row.get(0);
            let rows: Vec<(usize, u64, bool)> = row
                .get::<_, Vec<String>>(1)
                .iter()
                .filter_map(|text| {
                    let mut words = text.rsplitn(3, ' ');
                    let requested = words.next()? == "true";
                    let preference = words.next()?.parse().ok()?;
                    Some((db::replica_of(words.next()?)?, preference, requested))
                })
                .collect();
            candidates.samples.lock().unwrap().push(Sample {
                at: (at - offset).max(0) as u64,
                live: rows.iter().map(|&(p, pref, _)| (p, pref)).collect(),
                requested: rows.iter().filter(|r| r.2).map(|r| r.0).collect(),
            });
        }
        candidates.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether `leader` (of `preference`) is outranked by a live row of the latest read: a
/// standby of a strictly higher preference (`latest` `None`: not known, not outranked).
pub(crate) fn outranked(latest: Option<&Sample>, leader: usize, preference: u64) -> bool {
    latest.is_some_and(|s| {
        s.live
            .iter()
            .any(|&(p, pref)| p != leader && pref > preference)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_outranked_only_by_another_strictly_higher_live_row() {
        let s = Sample {
            at: 0,
            live: vec![(1, 3), (2, 5), (3, 5)],
            requested: Vec::new(),
        };
        assert!(outranked(Some(&s), 1, 3));
        assert!(!outranked(Some(&s), 2, 5), "equal never moves the lead");
        let own = Sample {
            at: 0,
            live: vec![(4, 9)],
            requested: Vec::new(),
        };
        assert!(!outranked(Some(&own), 4, 1), "its own row");
        assert!(!outranked(None, 1, 0), "nothing read");
    }

    #[test]
    fn the_first_fleet_has_equal_and_higher_preferences() {
        let (prefs, release) = first(5, &mut Rng::new(7));
        assert_eq!(release, FIRST_RELEASES);
        assert!(prefs.iter().all(|p| (1..=FIRST_RELEASES).contains(p)));
    }
}
