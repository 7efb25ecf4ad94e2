//! Who led when: every replica's `is_leader()` read on a thread of its own, and who the
//! server said held the lock, read from `pg_locks`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::{Elector, LockKey};

use tokio_util::sync::CancellationToken;

use crate::locks;

/// How often the sampler reads every replica's `is_leader()`: an overlap shorter than this can
/// be missed, one longer cannot.
pub const SAMPLE_EVERY: Duration = Duration::from_micros(100);

/// How often the server's view (`pg_locks`) is read.
pub const SERVER_EVERY: Duration = Duration::from_millis(10);

/// One stretch of time in which one replica said it led (or the server said it held the lock),
/// in time since the timeline started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Span {
    /// The replica's index.
    pub replica: usize,
    /// Which key: the shard's index for shard members, 0 for one elector per replica.
    pub lane: usize,
    /// When it began.
    pub from: Duration,
    /// When it ended; `None` while it lasts.
    pub to: Option<Duration>,
}

impl Span {
    fn end_or(&self, now: Duration) -> Duration {
        self.to.unwrap_or(now)
    }
}

/// A stretch of time in which two replicas both said they led (owned) one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overlap {
    /// Which key (see [`Span::lane`]).
    pub lane: usize,
    /// The replica that led first.
    pub first: usize,
    /// The one that also led.
    pub second: usize,
    /// When both led, since the timeline started.
    pub from: Duration,
    /// For how long, to the sample (two leaders in one sample count one sample's length).
    pub length: Duration,
}

/// What a [`Timeline`] saw so far.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Seen {
    /// Every stretch of leadership (ownership) as `is_leader()` said it, in order of start.
    pub leaders: Vec<Span>,
    /// Every stretch in which the server showed a replica's lock session holding the key, read
    /// every [`SERVER_EVERY`] (a holder the replicas do not name is left out).
    pub holders: Vec<Span>,
    /// How long the timeline ran.
    pub elapsed: Duration,
    /// How many times every replica's `is_leader()` was read.
    pub samples: u64,
}

impl Seen {
    /// Every stretch in which two replicas both said they led, with its length.
    pub fn overlaps(&self) -> Vec<Overlap> {
        let mut found = Vec::new();
        for (i, a) in self.leaders.iter().enumerate() {
            for b in &self.leaders[i + 1..] {
                if a.replica == b.replica || a.lane != b.lane {
                    continue;
                }
                let from = a.from.max(b.from);
                let to = a.end_or(self.elapsed).min(b.end_or(self.elapsed));
                if to > from {
                    let length = to - from;
                    found.push(Overlap {
                        lane: a.lane,
                        first: a.replica,
                        second: b.replica,
                        from,
                        length,
                    });
                }
            }
        }
        found
    }

    /// The longest overlap, or zero when there was none.
    pub fn longest_overlap(&self) -> Duration {
        self.overlaps()
            .iter()
            .map(|o| o.length)
            .max()
            .unwrap_or_default()
    }

    /// The replicas in the order they began to lead, one entry per term.
    pub fn leader_order(&self) -> Vec<usize> {
        self.leaders.iter().map(|s| s.replica).collect()
    }

    /// Panics when two replicas ever both said they led (owned) one key at once (see
    /// [`overlaps`](Self::overlaps)), saying which replicas, when (since the timeline
    /// started) and for how long. The kit's promise in one call:
    ///
    /// ```no_run
    /// # async fn demo(replicas: pg_elector_testkit::Replicas) {
    /// let seen = replicas.finish().await;
    /// seen.assert_no_two_leaders();
    /// # }
    /// ```
    #[track_caller]
    pub fn assert_no_two_leaders(&self) {
        let overlaps = self.overlaps();
        if overlaps.is_empty() {
            return;
        }
        let mut message = format!(
            "two leaders at once, {} time(s) in the {:?} the timeline ran:",
            overlaps.len(),
            self.elapsed
        );
        for o in &overlaps {
            message.push_str(&format!(
                "\n  replicas {} and {} both led lane {} from {:?} to {:?} after the timeline \
                 started ({:?})",
                o.first,
                o.second,
                o.lane,
                o.from,
                o.from + o.length,
                o.length
            ));
        }
        panic!("{message}");
    }
}

/// Records who leads, from every replica's `is_leader()` (read every [`SAMPLE_EVERY`] on a
/// thread of its own) and from the server's `pg_locks` (every [`SERVER_EVERY`]), until
/// dropped or [`finish`](Self::finish)ed.
#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    server: CancellationToken,
}

/// Builds a [`Timeline`]; from [`Timeline::builder`].
#[must_use = "a builder does nothing until `start` is called"]
#[derive(Debug)]
pub struct TimelineBuilder {
    lanes: Vec<Vec<Elector>>,
    server: Option<ServerView>,
    every: Duration,
}

impl TimelineBuilder {
    /// With `server` (an admin connection's settings to the electors' database, the keys and
    /// every replica's identity), the server's view is recorded as well; the timeline then
    /// needs a tokio runtime to start.
    pub fn server(mut self, view: ServerView) -> Self {
        self.server = Some(view);
        self
    }

    /// Reads `is_leader()` every `every` (default [`SAMPLE_EVERY`]): a shorter period finds
    /// shorter overlaps and costs a core more of its time.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// Starts recording.
    pub fn start(self) -> Timeline {
        Timeline::start_lanes(&self.lanes, self.server, self.every)
    }
}

impl Timeline {
    /// Starts recording `electors` (a replica's index is its place in the slice). With `server`
    /// (an admin connection's settings to the electors' database, the key and every replica's
    /// identity), the server's view is recorded as well; it needs a tokio runtime. The
    /// [`builder`](Self::builder) with those and nothing else.
    pub fn start(electors: &[Elector], server: Option<ServerView>) -> Self {
        let builder = Self::builder(electors);
        match server {
            Some(view) => builder.server(view).start(),
            None => builder.start(),
        }
    }

    /// A timeline of `electors`, one key each (a replica's index is its place in the slice).
    pub fn builder(electors: &[Elector]) -> TimelineBuilder {
        Self::builder_lanes(electors.iter().map(|e| vec![e.clone()]).collect())
    }

    /// A timeline of several keys at once: `electors[replica][lane]` is replica `replica`'s
    /// elector of key `lane` (a shard's, from `Shards::elector`); an overlap is two replicas
    /// leading one lane. With a [`server`](TimelineBuilder::server), its `keys` are the lanes'
    /// keys.
    pub fn builder_lanes(electors: Vec<Vec<Elector>>) -> TimelineBuilder {
        TimelineBuilder {
            lanes: electors,
            server: None,
            every: SAMPLE_EVERY,
        }
    }

    fn start_lanes(electors: &[Vec<Elector>], server: Option<ServerView>, every: Duration) -> Self {
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let electors = electors.to_vec();
        std::thread::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            move || sample_leaders(&electors, start, every, &seen, &stop)
        });
        let token = CancellationToken::new();
        if let Some(view) = server {
            tokio::spawn(sample_server(view, start, seen.clone(), token.clone()));
        }
        Self {
            start,
            seen,
            stop,
            server: token,
        }
    }

    /// What was seen until now (the timeline goes on).
    pub fn seen(&self) -> Seen {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        seen.elapsed = self.start.elapsed();
        seen
    }

    /// Stops recording and returns what was seen.
    pub fn finish(self) -> Seen {
        self.seen()
    }

    /// Panics when two electors have led one key at once so far (see
    /// [`Seen::assert_no_two_leaders`], which says which, when and for how long).
    #[track_caller]
    pub fn assert_no_two_leaders(&self) {
        self.seen().assert_no_two_leaders();
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.server.cancel();
    }
}

/// What the [`Timeline`] needs to read the server's view of a key.
#[derive(Clone, Debug)]
pub struct ServerView {
    /// Settings of a direct connection to the electors' database.
    pub config: tokio_postgres::Config,
    /// The key of each lane (one, for replicas electing on one key).
    pub keys: Vec<LockKey>,
    /// Each replica's identity (its lock session's `application_name`), by index.
    pub identities: Vec<String>,
}

fn sample_leaders(
    electors: &[Vec<Elector>],
    start: Instant,
    every: Duration,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) {
    let mut open: Vec<Vec<Option<usize>>> = electors.iter().map(|l| vec![None; l.len()]).collect();
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed();
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        for (replica, lanes) in electors.iter().enumerate() {
            for (lane, elector) in lanes.iter().enumerate() {
                let at = (replica, lane);
                record(
                    &mut seen.leaders,
                    &mut open[replica][lane],
                    at,
                    elector.is_leader(),
                    now,
                );
            }
        }
        seen.samples += 1;
        drop(seen);
        std::thread::sleep(every);
    }
}

/// Opens a span for `(replica, lane)` when `on` and none is open, closes the open one when
/// not.
fn record(
    spans: &mut Vec<Span>,
    open: &mut Option<usize>,
    (replica, lane): (usize, usize),
    on: bool,
    now: Duration,
) {
    match (on, *open) {
        (true, None) => {
            spans.push(Span {
                replica,
                lane,
                from: now,
                to: None,
            });
            *open = Some(spans.len() - 1);
        }
        (false, Some(at)) => {
            spans[at].to = Some(now);
            *open = None;
        }
        _ => {}
    }
}

async fn sample_server(
    view: ServerView,
    start: Instant,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) {
    let mut open: Vec<Vec<Option<usize>>> =
        vec![vec![None; view.keys.len()]; view.identities.len()];
    let mut client = None;
    while !stop.is_cancelled() {
        if client.is_none() {
            client = crate::database::connect_config(&view.config, "reading pg_locks")
                .await
                .ok();
        }
        if let Some(c) = &client {
            match locks::advisory_holders(c).await {
                Ok(held) => {
                    let now = start.elapsed();
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    for (replica, name) in view.identities.iter().enumerate() {
                        for (lane, key) in view.keys.iter().enumerate() {
                            let holds = held.iter().any(|(k, n)| k == key && n == name);
                            let at = (replica, lane);
                            record(&mut seen.holders, &mut open[replica][lane], at, holds, now);
                        }
                    }
                }
                Err(_) => client = None,
            }
        }
        tokio::select! {
            () = tokio::time::sleep(SERVER_EVERY) => {}
            () = stop.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(replica: usize, from_ms: u64, to_ms: u64) -> Span {
        Span {
            replica,
            lane: 0,
            from: Duration::from_millis(from_ms),
            to: Some(Duration::from_millis(to_ms)),
        }
    }

    #[test]
    fn one_leader_after_another_passes() {
        let seen = Seen {
            leaders: vec![span(0, 1000, 2000), span(1, 2000, 3000)],
            elapsed: Duration::from_secs(4),
            ..Seen::default()
        };
        seen.assert_no_two_leaders();
    }

    #[test]
    #[should_panic(
        expected = "two leaders at once, 1 time(s) in the 4s the timeline ran:\n  \
                               replicas 0 and 1 both led lane 0 from 1.5s to 2s after the \
                               timeline started (500ms)"
    )]
    fn two_leaders_at_once_say_who_when_and_how_long() {
        let seen = Seen {
            leaders: vec![span(0, 1000, 2000), span(1, 1500, 3000)],
            elapsed: Duration::from_secs(4),
            ..Seen::default()
        };
        seen.assert_no_two_leaders();
    }
}
