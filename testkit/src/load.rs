//! The machine's CPU, from `/proc/stat`: what the slots of [`timing`](crate::replicas::timing) are
//! handed out by, and what the times file reports. Where there is no `/proc/stat`, nothing is
//! known and nothing is held back.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the idle CPU is judged.
const WINDOW: Duration = Duration::from_secs(1);

/// How often at most `/proc/stat` is read.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The first line of `/proc/stat`, summed: ticks spent busy and ticks in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticks {
    pub(crate) busy: u64,
    pub(crate) total: u64,
}

impl Ticks {
    /// This machine's ticks now; `None` without `/proc/stat`.
    fn now() -> Option<Ticks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Ticks::parse(stat.lines().next()?)
    }

    /// The ticks of a `/proc/stat` `cpu` line: busy is every column but idle (4th) and
    /// iowait (5th). Guest time is already counted in user time and is not added twice.
    pub(crate) fn parse(cpu_line: &str) -> Option<Ticks> {
        let mut columns = cpu_line.split_whitespace();
        if columns.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = columns.map(|c| c.parse().ok()).collect::<Option<_>>()?;
        let counted = &ticks[..ticks.len().min(8)];
        let total: u64 = counted.iter().sum();
        let idle: u64 = counted.iter().skip(3).take(2).sum();
        Some(Ticks {
            busy: total - idle,
            total,
        })
    }
}

/// The milliseconds every core of the machine has spent busy since boot; 0 without
/// `/proc/stat`. Only read when the times file is asked for.
pub(crate) fn machine_busy_ms() -> u64 {
    if std::env::var_os(crate::slots::TIMES_ENV).is_none() {
        return 0;
    }
    // USER_HZ is 100 on every Linux this runs on.
    Ticks::now().map_or(0, |t| t.busy * 10)
}

/// The machine's idle CPU over the last [`WINDOW`], from samples of `/proc/stat` taken as it
/// is asked.
#[derive(Debug, Default)]
pub(crate) struct IdleMeter {
    samples: VecDeque<(Instant, Ticks)>,
}

impl IdleMeter {
    /// The idle CPU, in cores, between the oldest sample of the last window and now: none
    /// while the samples span less than half the window (after a while without asking: a
    /// slot waits until the load is known), and `None` without `/proc/stat`.
    pub(crate) fn idle_cores(&mut self, now: Instant) -> Option<f64> {
        let fresh = self
            .samples
            .back()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= SAMPLE_EVERY);
        if fresh {
            self.record(now, Ticks::now()?);
        }
        Some(self.idle_since_window(now, cores()).unwrap_or(0.0))
    }

    pub(crate) fn record(&mut self, now: Instant, ticks: Ticks) {
        self.samples.push_back((now, ticks));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > WINDOW)
        {
            self.samples.pop_front();
        }
    }

    pub(crate) fn idle_since_window(&self, now: Instant, cores: usize) -> Option<f64> {
        let (first_at, first) = self.samples.front()?;
        let (_, last) = self.samples.back()?;
        if now.saturating_duration_since(*first_at) < WINDOW / 2 || last.total <= first.total {
            return None;
        }
        let (busy, total) = (last.busy - first.busy, last.total - first.total);
        let idle_share = 1.0 - busy as f64 / total as f64;
        Some(idle_share * cores as f64)
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_line_is_busy_and_total_ticks_without_idle_and_iowait() {
        let ticks = Ticks::parse("cpu  10 1 20 5000 7 3 2 0 4 0").unwrap();
        assert_eq!(
            ticks,
            Ticks {
                busy: 36,
                total: 5043
            }
        );
        assert_eq!(Ticks::parse("cpu0 10 1 20 5000 7 3 2 0 0 0"), None);
        assert_eq!(Ticks::parse("cpu  x"), None);
    }

    #[test]
    fn the_idle_cores_are_judged_over_the_window() {
        let start = Instant::now();
        let mut meter = IdleMeter::default();
        let at = |ms| start + Duration::from_millis(ms);
        meter.record(at(0), Ticks { busy: 0, total: 0 });
        assert_eq!(
            meter.idle_since_window(at(100), 2),
            None,
            "too short a span"
        );
        // A quarter of the ticks busy, on two cores: one and a half cores idle.
        meter.record(
            at(600),
            Ticks {
                busy: 25,
                total: 100,
            },
        );
        assert_eq!(meter.idle_since_window(at(600), 2), Some(1.5));
        // The first sample falls out of the window; from 600 to 1 500 ms all is busy.
        meter.record(
            at(1_500),
            Ticks {
                busy: 125,
                total: 200,
            },
        );
        assert_eq!(meter.idle_since_window(at(1_500), 2), Some(0.0));
    }
}
