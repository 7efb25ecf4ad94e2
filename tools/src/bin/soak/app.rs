//! The application side of a replica: a leader schedule on the application's own pool (the
//! pool the ticker borrows from too), whose one job runs long when the parent asks (`long
//! <ms>`: the runs that start within that time), and the probe of that pool's connections the
//! parent asks for after each fault.
//!
//! Lines on stdout (see `soak/child.rs`): `run <t> <due_ms> <attempt>` when a run of the job
//! starts, `ran <t> <due_ms>` when it ends, however it ends (its future dropped included);
//! `pool <t> <probe> <answered> <stuck> <failed> <unborrowed>` for a probe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use pg_elector::Elector;
use pg_elector::schedule::{Job, JobRun, Schedule};

use crate::child::unix_us;

/// The job every replica's schedule runs.
pub(crate) const JOB: &str = "soak-long";
/// How often it is due.
pub(crate) const JOB_PERIOD: Duration = Duration::from_secs(2);
/// A long run: longer than the schedule's stale threshold (3 heartbeat periods, at least 3 s),
/// from this ...
pub(crate) const LONG_RUN_MIN: Duration = Duration::from_millis(5_000);
/// ... to this.
pub(crate) const LONG_RUN_MAX: Duration = Duration::from_millis(6_500);
/// A short run.
pub(crate) const SHORT_RUN: Duration = Duration::from_millis(50);
/// The elector's drain timeout with a schedule: above the longest run, as the docs ask.
pub(crate) const DRAIN: Duration = Duration::from_secs(7);
/// How long each connection of the pool has to answer `SELECT 1` in a probe, and to be
/// borrowed.
pub(crate) const PROBE_BOUND: Duration = Duration::from_secs(1);

/// Until when (µs) the runs that start are long (the parent's `long` command).
static LONG_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Makes the runs that start within `window` long.
pub(crate) fn long_runs(window: Duration) {
    LONG_UNTIL.store(unix_us() + window.as_micros() as u64, Ordering::Relaxed);
}

/// How long a run of the due at `due_ms` lasts: short, or when `long`, from
/// [`LONG_RUN_MIN`] to [`LONG_RUN_MAX`] as the run's seed and the due fix it.
pub(crate) fn run_length(seed: u64, due_ms: u64, long: bool) -> Duration {
    if !long {
        return SHORT_RUN;
    }
    let mut x = seed ^ due_ms.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    let span = (LONG_RUN_MAX - LONG_RUN_MIN).as_millis() as u64;
    LONG_RUN_MIN + Duration::from_millis((x >> 8) % (span + 1))
}

/// Says `ran` when dropped: when the run returns, or when the schedule cuts it off.
struct Running {
    due_ms: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        crate::child::say(&format!("ran {} {}", unix_us(), self.due_ms));
    }
}

/// The schedule of `elector`'s leader on `pool`, its one job running long when asked.
pub(crate) fn schedule(elector: &Elector, pool: &deadpool_postgres::Pool, seed: u64) -> Schedule {
    let job = Job::every(JOB, JOB_PERIOD).rerun_abandoned(true);
    Schedule::new(elector, pool.clone())
        .namespace("soak")
        .job(job, move |run: JobRun| async move {
            let due_ms = run
                .due
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            crate::child::say(&format!("run {} {due_ms} {}", unix_us(), run.attempt));
            let _running = Running { due_ms };
            let long = unix_us() < LONG_UNTIL.load(Ordering::Relaxed);
            tokio::time::sleep(run_length(seed, due_ms, long)).await;
            Ok::<_, std::convert::Infallible>(())
        })
}

/// Borrows every connection of `pool` (within [`PROBE_BOUND`]; with `idle`, only those idle in
/// the pool now, without waiting) and asks each `SELECT 1` (within [`PROBE_BOUND`]); one that
/// does not answer in time is stuck, and taken out of the pool (closed) so that it does not
/// count again. Says `pool …`.
pub(crate) async fn probe(pool: deadpool_postgres::Pool, id: u64, idle: bool) {
    let status = pool.status();
    let (max, bound) = if idle {
        (status.available, Duration::ZERO)
    } else {
        (status.max_size, PROBE_BOUND)
    };
    let deadline = tokio::time::Instant::now() + bound;
    let mut held = Vec::new();
    for _ in 0..max {
        let get = async {
            if idle {
                let now = deadpool_postgres::Timeouts::wait_millis(0);
                pool.timeout_get(&now).await
            } else {
                pool.get().await
            }
        };
        match tokio::time::timeout_at(deadline.max(tokio::time::Instant::now()), get).await {
            Ok(Ok(object)) => held.push(object),
            _ => break,
        }
    }
    let unborrowed = max - held.len();
    let mut asks = tokio::task::JoinSet::new();
    for object in held {
        asks.spawn(async move {
            match tokio::time::timeout(PROBE_BOUND, object.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => Answer::Answered,
                Ok(Err(_)) => {
                    let _ = deadpool_postgres::Object::take(object);
                    Answer::Failed
                }
                Err(_) => {
                    let _ = deadpool_postgres::Object::take(object);
                    Answer::Stuck
                }
            }
        });
    }
    let (mut answered, mut stuck, mut failed) = (0, 0, 0);
    while let Some(answer) = asks.join_next().await {
        match answer {
            Ok(Answer::Answered) => answered += 1,
            Ok(Answer::Failed) => failed += 1,
            Ok(Answer::Stuck) | Err(_) => stuck += 1,
        }
    }
    crate::child::say(&format!(
        "pool {} {id} {answered} {stuck} {failed} {unborrowed}",
        unix_us()
    ));
}

enum Answer {
    Answered,
    Stuck,
    Failed,
}

/// The runs that start within this of a `long` command run long.
pub(crate) const LONG_WINDOW: Duration = Duration::from_millis(3_500);

/// Before a long partition of `replica` (the parent's side): every live replica's next runs
/// are made long, and this waits (at most a period and a second) for `replica` to start one,
/// then a second into it. Notes in `fault` what it found; returns the fleet, locked again.
pub(crate) async fn long_run_begun<'a>(
    ctx: &'a crate::ctx::Ctx,
    mut fleet: tokio::sync::MutexGuard<'a, crate::fleet::Fleet>,
    replica: usize,
    fault: &mut crate::faults::Fault,
) -> tokio::sync::MutexGuard<'a, crate::fleet::Fleet> {
    let before = ctx.board.state(replica).runs;
    for r in fleet.live.clone() {
        fleet
            .command(r, &format!("long {}", LONG_WINDOW.as_millis()))
            .await;
    }
    drop(fleet);
    let began = ctx
        .board
        .wait(JOB_PERIOD + Duration::from_secs(1), |b| {
            b.state(replica).runs > before
        })
        .await;
    if began {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let state = ctx.board.state(replica);
    fault.on_leader = state.leading != 0 && !state.stopped;
    fault.epoch = state.epoch.filter(|_| fault.on_leader);
    fault.note = if began && state.running > 0 {
        "a second into a long run".into()
    } else {
        "no run began".into()
    };
    ctx.fleet.lock().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_long_run_outlasts_the_stale_threshold_and_not_the_drain_timeout() {
        let lengths: Vec<Duration> = (0..1000).map(|k| run_length(42, k * 2000, true)).collect();
        for l in &lengths {
            assert!(*l >= LONG_RUN_MIN && *l <= LONG_RUN_MAX && *l > Duration::from_secs(3));
            assert!(*l < DRAIN, "the drain timeout is above every run");
        }
        let distinct: std::collections::BTreeSet<_> = lengths.iter().collect();
        assert!(distinct.len() > 100, "lengths vary with the due");
        assert_eq!(run_length(42, 4000, false), SHORT_RUN);
    }
}
