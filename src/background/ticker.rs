//! The leader ticker: a named tick on a fixed period, on the leader only.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::gate::Gate;
use super::panic::{CaughtIn, catch_panic};
use super::probe::{Probe, TickOutcome};
use crate::Term;

/// Runs a named tick every period on the leader.
///
/// Before each tick the ticker asks the gate's [`do_work`](crate::Elector::do_work): on a
/// standby the tick is not called; on the leader it gets the term, so it can stop early when
/// leadership ends. Then, per tick:
///
/// | outcome | log | probe |
/// |---|---|---|
/// | standby (tick not called) | none | [`TickOutcome::Standby`] |
/// | leader, `Ok(())` | DEBUG | [`TickOutcome::Succeeded`] |
/// | leader, `Err(e)` | WARN `tick failed`, fields `loop_name`, `error` | [`TickOutcome::Failed`] |
/// | demoted while the tick ran | INFO (by `do_work`) | [`TickOutcome::Standby`] |
/// | tick panicked | ERROR `tick panicked`, fields `loop_name`, `panic`, `location`, `backtrace` | [`TickOutcome::Failed`] `tick panicked: <message>` |
///
/// Either way the ticker goes on ticking. A panic is caught at the tick (see
/// [`install_panic_hook`](super::install_panic_hook) for how its backtrace is captured).
///
/// **Cadence.** The first tick runs at once (unless [`tick_at_start(false)`](Self::tick_at_start)),
/// then ticks run on a fixed grid of one period, one at a time. A tick that overruns its
/// period makes the ticker skip the grid points it covered: the next tick starts at the next
/// grid point, so missed ticks never run in a burst and ticks start at least one period apart.
///
/// ```
/// use std::time::Duration;
/// use pg_elector::Elector;
/// use pg_elector::background::{LeaderTicker, Probe};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let (elector, control) = Elector::manual();
/// control.promote();
/// let probe = Probe::new("invitations-expire");
/// let ticker = LeaderTicker::new("invitations-expire", &elector, Duration::from_millis(10))
///     .probe(&probe);
///
/// let shutdown = CancellationToken::new();
/// let mut ticks = 0;
/// ticker
///     .run(shutdown.clone(), |_term| {
///         ticks += 1;
///         if ticks == 3 {
///             shutdown.cancel();
///         }
///         async { Ok::<_, std::io::Error>(()) }
///     })
///     .await;
/// assert_eq!(ticks, 3);
/// assert!(probe.status().is_pass());
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a ticker does nothing until it is run"]
pub struct LeaderTicker {
    name: Arc<str>,
    gate: Gate,
    period: Duration,
    probe: Option<Probe>,
    tick_at_start: bool,
}

/// The shortest period a [`LeaderTicker`] keeps.
pub const MIN_TICK_PERIOD: Duration = Duration::from_millis(1);

/// The longest period a [`LeaderTicker`] keeps: 366 days.
pub const MAX_TICK_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

impl LeaderTicker {
    /// A ticker named `name` (the `loop_name` of its log lines) that ticks every `period`
    /// while `gate` is open.
    ///
    /// The period is kept between [`MIN_TICK_PERIOD`] and [`MAX_TICK_PERIOD`]: a zero period (a
    /// configuration slip) ticks every millisecond rather than spinning, and one beyond a year
    /// ticks yearly rather than overflowing the clock; either is logged at WARN.
    pub fn new(name: impl Into<String>, gate: impl Into<Gate>, period: Duration) -> Self {
        let name: String = name.into();
        let kept = period.clamp(MIN_TICK_PERIOD, MAX_TICK_PERIOD);
        if kept != period {
            tracing::warn!(loop_name = %name, asked = ?period, period = ?kept, "leader ticker period out of range; clamped");
        }
        let period = kept;
        Self {
            name: name.into(),
            gate: gate.into(),
            period,
            probe: None,
            tick_at_start: true,
        }
    }

    /// Reports every tick's outcome to `probe` (a clone of it). Default: no probe.
    pub fn probe(mut self, probe: &Probe) -> Self {
        self.probe = Some(probe.clone());
        self
    }

    /// Whether the first tick runs as soon as the ticker starts (`true`, the default) or one
    /// period later.
    pub fn tick_at_start(mut self, yes: bool) -> Self {
        self.tick_at_start = yes;
        self
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How long this ticker may take to stop once its shutdown is cancelled: a tick in flight
    /// runs on for the elector's drain timeout, which the elector's own graceful stop covers.
    pub(super) fn stop_bound(&self) -> Duration {
        self.gate.elector().graceful_stop_bound()
    }

    /// Ticks until `shutdown` is cancelled.
    ///
    /// `tick` is called once per tick, on the leader only, with the term; its future need
    /// not be `'static` or `Send` unless the caller spawns this future.
    ///
    /// # Shutdown
    ///
    /// When `shutdown` is cancelled, no new tick starts, and a tick in flight runs on to its end
    /// for at most the elector's [drain timeout](crate::Elector::drain_timeout): the elector's
    /// own shutdown (the same token, under a [`Supervisor`](super::Supervisor)) ends the term
    /// first, which the tick sees on its token, and waits for the tick before it unlocks, so the
    /// next leader starts after the tick's statements have finished. A tick still running at
    /// the limit is dropped at its current `.await` (logged at WARN), as the elector gives the
    /// lock up then anyway.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future drops a tick in flight at its current `.await` (a tick that must
    /// finish a step should make that step cancel safe, for example by running it in one
    /// transaction). Nothing outlives the future.
    pub async fn run<F, Fut, E>(&self, shutdown: CancellationToken, mut tick: F)
    where
        F: FnMut(Term) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let mut due = Instant::now();
        if !self.tick_at_start {
            due += self.period;
        }
        tracing::debug!(loop_name = %self.name, period = ?self.period, "leader ticker started");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            let work = self.gate.elector().do_work_named(&self.name, &mut tick);
            let span = tracing::debug_span!("tick", loop_name = %self.name);
            let drain = self.gate.elector().drain_timeout();
            let Some(outcome) = finish(catch_panic(work).instrument(span), &shutdown, drain).await
            else {
                tracing::warn!(loop_name = %self.name, drain_timeout = ?drain, "tick still running at the drain timeout after shutdown; dropped");
                break;
            };
            let recorded = match outcome {
                Ok(Ok(Some(()))) => {
                    tracing::debug!(loop_name = %self.name, "tick done");
                    TickOutcome::Succeeded
                }
                Ok(Ok(None)) => TickOutcome::Standby,
                Ok(Err(error)) => {
                    tracing::warn!(loop_name = %self.name, error = %error, "tick failed");
                    TickOutcome::Failed(error.to_string())
                }
                Err(panic) => {
                    panic.log(CaughtIn::Tick(&self.name));
                    TickOutcome::Failed(format!(
                        "background loop {:?}: tick panicked: {}",
                        &*self.name, panic.message
                    ))
                }
            };
            if let Some(probe) = &self.probe {
                probe.record(recorded);
            }
            if shutdown.is_cancelled() {
                break;
            }
            due = next_due(due, self.period, Instant::now());
        }
        tracing::debug!(loop_name = %self.name, "leader ticker stopped");
    }
}

/// Runs `work` to its end; once `shutdown` is cancelled, for at most `drain` more (`None` past
/// that, when `work` is dropped).
async fn finish<F: Future>(
    work: F,
    shutdown: &CancellationToken,
    drain: Duration,
) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        biased;
        outcome = &mut work => return Some(outcome),
        () = shutdown.cancelled() => {}
    }
    tokio::time::timeout(drain, work).await.ok()
}

/// The first grid point (`due + k·period`, k ≥ 1) that is not in the past: grid points a tick
/// overran are skipped, never run late in a row.
///
/// Not `tokio::time::interval_at` with `MissedTickBehavior::Skip`: that fires the overdue tick
/// at once and only then realigns, so a tick that overruns 2.5 periods is followed at once by
/// the next (measured on paused time: starts at 0, 2.5, 5, 7.5 periods, against 0, 3, 6, 9
/// here), which is the burst this ticker promises not to make.
fn next_due(due: Instant, period: Duration, now: Instant) -> Instant {
    let next = due + period;
    if next >= now {
        return next;
    }
    let behind = now.duration_since(next).as_nanos();
    let periods = behind.div_ceil(period.as_nanos());
    let periods = u32::try_from(periods).unwrap_or(u32::MAX);
    next + period.saturating_mul(periods)
}

impl fmt::Debug for LeaderTicker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderTicker")
            .field("name", &self.name)
            .field("period", &self.period)
            .field("gate", &self.gate)
            .field("probe", &self.probe.as_ref().map(Probe::name))
            .field("tick_at_start", &self.tick_at_start)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_out_of_range_is_clamped_not_a_panic() {
        let gate = Gate::always_open();
        assert_eq!(
            LeaderTicker::new("zero", gate.clone(), Duration::ZERO).period(),
            MIN_TICK_PERIOD
        );
        assert_eq!(
            LeaderTicker::new("huge", gate, Duration::MAX).period(),
            MAX_TICK_PERIOD
        );
    }

    #[test]
    fn b1_the_next_tick_is_the_next_grid_point_not_in_the_past() {
        let t0 = Instant::now();
        let p = Duration::from_millis(100);
        let ms = |d: u64| Duration::from_millis(d);
        assert_eq!(next_due(t0, p, t0 + ms(10)), t0 + ms(100), "on time");
        assert_eq!(next_due(t0, p, t0 + ms(100)), t0 + ms(100), "just in time");
        assert_eq!(next_due(t0, p, t0 + ms(101)), t0 + ms(200), "one skipped");
        assert_eq!(next_due(t0, p, t0 + ms(250)), t0 + ms(300));
        assert_eq!(next_due(t0, p, t0 + ms(300)), t0 + ms(300));
    }
}
