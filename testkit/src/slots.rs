//! [`timing`] and [`serial`]: how many timing-sensitive tests of one test process run at once.
//!
//! A test that asserts a bound in check intervals needs the machine's attention while it runs,
//! but most of its time is spent waiting for intervals to pass, not computing. So a few of them
//! may share the machine: each takes one of a fixed number of *slots* ([`timing`]); a test
//! that needs the machine (or the shared server) to itself takes every slot ([`serial`]).
//!
//! A slot beyond the first is also handed out only while the machine has CPU to spare (as
//! `make -l` starts no job on a loaded machine): on a busy machine the timing tests run fewer
//! at a time, down to one, rather than starve each other.
//!
//! # Invariants
//!
//! - `used` is the number of live timing guards; `alone` is true while a serial guard lives.
//! - `alone` implies `used == 0`, and `used <= slots`.
//! - While a serial guard waits (`waiting_alone > 0`), no new timing guard is handed out, so a
//!   serial test is never starved by a stream of timing tests.
//! - A timing guard is always handed out when no guard lives, whatever the load: the suite
//!   makes progress on a saturated machine.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::load::{IdleMeter, machine_busy_ms};

/// The environment variable that sets the number of slots (a positive integer).
pub(crate) const SLOTS_ENV: &str = "PG_ELECTOR_TEST_SLOTS";

/// The environment variable naming a file to which every guard, as it is dropped, appends one
/// line: the test (its thread's name), `timing` or `serial`, the milliseconds it waited for
/// its slots, the milliseconds it held them, the CPU the whole machine spent meanwhile
/// (milliseconds of all cores, from `/proc/stat`; 0 elsewhere), which is the test's own cost
/// when it ran alone (`PG_ELECTOR_TEST_SLOTS=1`), and when it got its slots (milliseconds
/// since 1970: sorted by it, the lines of every test binary of a `cargo test` are one
/// timeline). For finding where a suite's time goes.
pub(crate) const TIMES_ENV: &str = "PG_ELECTOR_TEST_TIMES";

/// Slots per core when [`SLOTS_ENV`] is unset: timing tests wait far more than they compute.
/// Not three: on two cores that ran the suite in 184 s instead of 211 s, but beside the
/// CPU-heavy terminated-session tests (over a core each) the machine ran saturated and a
/// preference test missed its bound of two intervals and 150 ms.
const SLOTS_PER_CORE: usize = 2;

/// A slot beyond the first is handed out only while at least this many cores' worth of the
/// machine's CPU was idle over the last second (`/proc/stat` counts the whole host, scaled here
/// by the cores this process may use: in a container limited to fewer cores than its host, the
/// load of the host shows diluted, and the most slots is then what holds tests back): what one more timing test uses at its busiest
/// (a server of its own starting, a fleet of processes). On two cores, one busy loop beside
/// the suite leaves one or two slots; `PG_ELECTOR_TEST_SLOTS=1` runs one at a time whatever the
/// load.
const SPARE_CORES: f64 = 0.6;

/// How long after handing out a slot the next one waits, so that the idle CPU it is judged by
/// shows the load of the test just started. Also after a slot was given back: letting a test
/// take the place of one just ended without the ramp made the suite about 7 % faster, but each
/// of five CI runs in a row then ended on a different timing test missing its bound.
const RAMP: Duration = Duration::from_millis(500);

/// How often a waiting test looks at the load again.
const RECHECK: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct State {
    used: usize,
    alone: bool,
    waiting_alone: usize,
    last_grant: Option<Instant>,
    meter: IdleMeter,
}

impl State {
    /// Whether a timing guard may be handed out now, with `slots` in all; `idle` reads the
    /// machine's idle cores from the meter (only asked when it matters).
    fn may_take_one(
        &mut self,
        slots: usize,
        now: Instant,
        idle: impl FnOnce(&mut IdleMeter, Instant) -> Option<f64>,
    ) -> bool {
        if self.alone || self.waiting_alone > 0 || self.used >= slots {
            return false;
        }
        if self.used == 0 {
            return true;
        }
        let ramped = self
            .last_grant
            .is_none_or(|at| now.saturating_duration_since(at) >= RAMP);
        ramped && idle(&mut self.meter, now).is_none_or(|idle| idle >= SPARE_CORES)
    }

    /// Hands out one timing slot at `now`.
    fn take_one(&mut self, now: Instant) {
        self.used += 1;
        self.last_grant = Some(now);
    }

    /// Takes a timing slot back.
    fn give_one_back(&mut self) {
        self.used -= 1;
    }
}

#[derive(Debug)]
struct Slots {
    slots: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Slots {
    fn global() -> &'static Slots {
        static SLOTS: OnceLock<Slots> = OnceLock::new();
        SLOTS.get_or_init(|| Slots {
            slots: slot_count(std::env::var(SLOTS_ENV).ok().as_deref(), cores()),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(state)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take_one(&'static self) -> SerialGuard {
        let asked = Instant::now();
        let mut state = self.lock();
        while !state.may_take_one(self.slots, Instant::now(), IdleMeter::idle_cores) {
            state = self.wait_a_while(state);
        }
        state.take_one(Instant::now());
        SerialGuard {
            slots: self,
            alone: false,
            asked,
            got: Instant::now(),
            busy_at_start: machine_busy_ms(),
        }
    }

    /// [`wait`](Self::wait), at most [`RECHECK`]: the load changes without a notification.
    fn wait_a_while<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(state, RECHECK)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
    }

    fn take_all(&'static self) -> SerialGuard {
        let asked = Instant::now();
        let mut state = self.lock();
        state.waiting_alone += 1;
        while state.alone || state.used > 0 {
            state = self.wait(state);
        }
        state.waiting_alone -= 1;
        state.alone = true;
        SerialGuard {
            slots: self,
            alone: true,
            asked,
            got: Instant::now(),
            busy_at_start: machine_busy_ms(),
        }
    }

    fn give_back(&self, alone: bool) {
        let mut state = self.lock();
        if alone {
            state.alone = false;
        } else {
            state.give_one_back();
        }
        drop(state);
        self.changed.notify_all();
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The number of slots: `setting` when it is a positive integer, else [`SLOTS_PER_CORE`] per
/// core.
fn slot_count(setting: Option<&str>, cores: usize) -> usize {
    match setting.map(str::trim).map(str::parse::<usize>) {
        Some(Ok(n)) if n > 0 => n,
        Some(_) => panic!("{SLOTS_ENV} must be a positive integer, got {setting:?}"),
        None => SLOTS_PER_CORE * cores.max(1),
    }
}

/// Held by a test for as long as it runs: one slot ([`timing`]) or all of them ([`serial`]).
#[must_use = "the slot is given back as soon as the guard is dropped"]
#[derive(Debug)]
pub struct SerialGuard {
    slots: &'static Slots,
    alone: bool,
    asked: Instant,
    got: Instant,
    busy_at_start: u64,
}

impl Drop for SerialGuard {
    fn drop(&mut self) {
        self.slots.give_back(self.alone);
        if let Some(path) = std::env::var_os(TIMES_ENV).filter(|p| !p.is_empty()) {
            let line = times_line(
                std::thread::current().name().unwrap_or("?"),
                self.alone,
                [self.got - self.asked, self.got.elapsed()],
                machine_busy_ms().saturating_sub(self.busy_at_start),
                since_epoch(self.got),
            );
            // Best effort: a line that cannot be written only leaves a gap in the figures.
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut file| file.write_all(line.as_bytes()));
        }
    }
}

/// `at` as milliseconds since 1970 (the wall clock), so that the lines of every test binary
/// of one `cargo test` share one timeline.
fn since_epoch(at: Instant) -> Duration {
    let ago = at.elapsed();
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(ago)
}

/// One line of the [`TIMES_ENV`] file: `[waited, held]`, the machine's CPU meanwhile, and
/// when the slots were got (milliseconds since 1970).
fn times_line(
    test: &str,
    alone: bool,
    [waited, held]: [Duration; 2],
    cpu_ms: u64,
    got_at: Duration,
) -> String {
    let kind = if alone { "serial" } else { "timing" };
    format!(
        "{test} {kind} {} {} {cpu_ms} {}\n",
        waited.as_millis(),
        held.as_millis(),
        got_at.as_millis()
    )
}

/// Takes one of the few slots of this test process for a timing-sensitive test: at most
/// `PG_ELECTOR_TEST_SLOTS` such tests run at once (default: two per core), none while a
/// [`serial`] test runs, and a second or later one only while the machine has CPU to spare
/// (as `make -l` does): on a loaded machine they run fewer at a time, down to one.
///
/// Call it first thing in the test and keep the guard for the whole test:
///
/// ```no_run
/// #[tokio::test]
/// async fn failover_is_fast() {
///     let _timing = pg_elector_testkit::replicas::timing();
///     // ...
/// }
/// ```
///
/// Blocks the calling thread until a slot is free; the test runner needs more threads than
/// slots for the slots to fill (`RUST_TEST_THREADS`, or a `[env]` entry in
/// `.cargo/config.toml`). A test that panicked gives its slot back as it unwinds. It only
/// orders tests within one process (a runner that starts a process per test, like
/// cargo-nextest, is not covered).
pub fn timing() -> SerialGuard {
    Slots::global().take_one()
}

/// Takes every slot of this test process: no other [`timing`] or `serial` test runs meanwhile.
/// For a test that loads the machine or the shared server (thousands of statements, a fleet
/// of processes), or reads something of the server's that other tests change.
///
/// Call it first thing in the test and keep the guard for the whole test:
///
/// ```no_run
/// #[tokio::test]
/// async fn ten_thousand_tries() {
///     let _serial = pg_elector_testkit::replicas::serial();
///     // ...
/// }
/// ```
///
/// A serial test that waits is served before any timing test that comes after it. See
/// [`timing`] for the rest.
pub fn serial() -> SerialGuard {
    Slots::global().take_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn leaked(slots: usize) -> &'static Slots {
        Box::leak(Box::new(Slots {
            slots,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }))
    }

    #[test]
    fn the_slot_count_comes_from_the_setting_or_the_cores() {
        assert_eq!(slot_count(None, 2), 4);
        assert_eq!(slot_count(None, 0), 2);
        assert_eq!(slot_count(Some(" 3 "), 2), 3);
        assert!(std::panic::catch_unwind(|| slot_count(Some("0"), 2)).is_err());
        assert!(std::panic::catch_unwind(|| slot_count(Some("many"), 2)).is_err());
    }

    #[test]
    fn at_most_the_slots_run_at_once_and_a_serial_test_runs_alone() {
        let slots = leaked(3);
        let timing_now = Arc::new(AtomicUsize::new(0));
        let alone_now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..12)
            .map(|n| {
                let (timing_now, alone_now, most) =
                    (timing_now.clone(), alone_now.clone(), most.clone());
                std::thread::spawn(move || {
                    if n % 4 == 0 {
                        let _all = slots.take_all();
                        assert_eq!(alone_now.fetch_add(1, Ordering::SeqCst), 0);
                        assert_eq!(timing_now.load(Ordering::SeqCst), 0);
                        std::thread::sleep(Duration::from_millis(5));
                        alone_now.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        let _one = slots.take_one();
                        let now = timing_now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        assert_eq!(alone_now.load(Ordering::SeqCst), 0);
                        std::thread::sleep(Duration::from_millis(5));
                        timing_now.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
        let state = slots.lock();
        assert_eq!(
            (state.used, state.alone, state.waiting_alone),
            (0, false, 0)
        );
    }

    #[test]
    fn a_times_line_names_the_test_its_kind_and_both_durations() {
        let line = times_line(
            "standby::e3::a_try",
            true,
            [Duration::from_millis(12), Duration::from_millis(3400)],
            910,
            Duration::from_millis(61_250),
        );
        assert_eq!(line, "standby::e3::a_try serial 12 3400 910 61250\n");
    }

    #[test]
    fn a_second_slot_waits_for_the_ramp_and_for_spare_cpu_the_first_never_does() {
        use crate::load::Ticks;
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let two_cores = |meter: &mut IdleMeter, now| meter.idle_since_window(now, 2);
        let mut state = State::default();
        // The machine is saturated: every tick busy.
        state.meter.record(at(0), Ticks { busy: 0, total: 0 });
        state.meter.record(
            at(900),
            Ticks {
                busy: 180,
                total: 180,
            },
        );
        assert!(
            state.may_take_one(4, at(900), two_cores),
            "the first slot, whatever the load"
        );
        state.used = 1;
        state.last_grant = Some(at(900));
        assert!(
            !state.may_take_one(4, at(1_000), two_cores),
            "within the ramp"
        );
        assert!(
            !state.may_take_one(4, at(1_400), two_cores),
            "no CPU to spare"
        );
        // The same stretch, but nearly idle.
        let mut idle = State {
            used: 1,
            last_grant: Some(at(0)),
            ..State::default()
        };
        idle.meter.record(at(0), Ticks { busy: 0, total: 0 });
        idle.meter.record(
            at(900),
            Ticks {
                busy: 10,
                total: 180,
            },
        );
        assert!(idle.may_take_one(4, at(900), two_cores));
        idle.used = 4;
        assert!(
            !idle.may_take_one(4, at(900), two_cores),
            "every slot taken"
        );
        idle.used = 1;
        idle.waiting_alone = 1;
        assert!(
            !idle.may_take_one(4, at(900), two_cores),
            "a serial test waits first"
        );
    }

    #[test]
    fn a_panicking_holder_gives_its_slot_back() {
        let slots = leaked(1);
        let _ = std::thread::spawn(move || {
            let _one = slots.take_one();
            panic!("a failing test");
        })
        .join();
        let _all = slots.take_all();
    }
}
