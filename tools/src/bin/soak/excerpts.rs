//! What the stderr shows around a violation, for the replay: the events, faults, lock holders,
//! stalls and replica logs from 3 s before it to 1 s after.

use crate::Collected;
use crate::check::Violation;
use crate::fleet::Board;
use crate::report::offset_text;

/// Before and after a violation, the excerpt's span (µs).
const BEFORE_US: u64 = 3_000_000;
const AFTER_US: u64 = 1_000_000;

/// What the excerpts are cut from.
pub(crate) struct Excerpts<'a> {
    pub(crate) collected: &'a Collected,
    pub(crate) board: &'a Board,
    /// The server's clock minus this machine's (µs).
    pub(crate) offset: i64,
    /// When the injection started (µs), for the offsets.
    pub(crate) injection_start: u64,
}

impl Excerpts<'_> {
    /// Prints the excerpt around `v` on stderr.
    pub(crate) fn print(&self, v: &Violation) {
        let t = |at: u64| offset_text(at, self.injection_start);
        let c = self.collected;
        eprintln!("--- around {}: {}", t(v.at), v.what);
        for e in c
            .events
            .iter()
            .filter(|e| e.at + BEFORE_US >= v.at && e.at <= v.at + AFTER_US)
        {
            if e.lane == v.lane || e.what.of_process() {
                eprintln!("  event {} replica-{} {:?}", t(e.at), e.replica, e.what);
            }
        }
        let window = (v.at.saturating_sub(BEFORE_US), v.at + AFTER_US);
        let inside = |at: u64| window.0 <= at && at <= window.1;
        for f in c.faults.iter().filter(|f| {
            inside(f.inject) || inside(f.heal) || (f.inject < window.0 && window.1 < f.heal)
        }) {
            eprintln!(
                "  fault {} #{} {} replica-{} leader={} until {} {}",
                t(f.inject),
                f.id,
                f.kind.name(),
                f.replica.map_or_else(|| "-".to_owned(), |r| r.to_string()),
                f.on_leader,
                t(f.heal),
                f.note
            );
        }
        self.holders(v.lane, window);
        for &(s, e) in c.stalls.iter().filter(|&&(s, e)| inside(s) || inside(e)) {
            let whose = if c.runtime_stalls.contains(&(s, e)) {
                "runtime"
            } else {
                "machine"
            };
            eprintln!("  stall ({whose}) {} for {} ms", t(s), (e - s) / 1_000);
        }
        for &r in &v.replicas {
            for (at, line) in self.board.log_excerpt(r, window.0, window.1) {
                eprintln!("  log {} replica-{r}: {line}", t(at));
            }
        }
    }

    /// The holder of `lane`'s lock as the sampler saw it within `window` (this machine's
    /// clock).
    fn holders(&self, lane: usize, window: (u64, u64)) {
        let local = |server: u64| (server as i64 - self.offset) as u64;
        for run in self
            .collected
            .runs
            .get(lane)
            .into_iter()
            .flatten()
            .filter(|r| local(r.last) >= window.0 && local(r.first) <= window.1)
        {
            eprintln!(
                "  pg_locks {} .. {} holder {:?} epoch {:?}",
                offset_text(local(run.first), self.injection_start),
                offset_text(local(run.last), self.injection_start),
                run.holder,
                run.epoch
            );
        }
    }
}
