//! A running run's heartbeat: what it says, what it waits for, and when it cuts the run off.
//!
//! A beat has two parts on one borrowed connection. The beat itself (`heartbeat_at` in the
//! run's row) commits without waiting for a synchronous standby, so that it is seen at once
//! by every term on this server and holds the run's row only for the update: a slow standby
//! neither makes it late nor queues the next beat behind it. Its confirmation, sent right
//! after it, is an empty transactional WAL message whose commit waits for the synchronous
//! standby as a claim does: once it is answered, the beat before it is on the standby too.
//!
//! The runner cuts the run off two thirds of the stale threshold after the send time of its
//! last *confirmed* beat: a term on a standby promoted later (or on the old primary after a
//! crash) has at least that beat, and takes the run for dead only a whole threshold after it.
//! A dead synchronous standby, or a primary cut off from it (another primary may be promoted
//! behind it), confirms nothing, and the run ends as the claim's durability promised.
//!
//! A slow but live standby delays every confirmation by its lag. While a confirmation is
//! outstanding, the next beat goes out an eighth of the cut-off after the last one instead of
//! a poll after it, up to [`IN_FLIGHT`] at once, each on its own connection: the silence the
//! runner sees is the lag plus that spacing and a round trip, so a standby that turns slow
//! while a run goes on cuts it off only when more than about six sevenths of the cut-off late,
//! less a round trip (1.7 s of the 2 s cut-off at the 3 s floor; with a 1.5 s lag the runner
//! sees 1.76 s). A beat's send time is taken once it has its connection, so a borrow slowed by
//! a login is no silence (except for the first beat after a slow claim, whose silence counts
//! from when the heartbeat began). A standby already slow when the run is claimed delays the
//! claim, and the job starts on the first confirmed beat after it; from then on the same
//! holds.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use super::ScheduleError;
use super::context::Context;
use super::stale_after;
use super::store::RunRef;

/// At most this many beats (each with its confirmation) are in flight at once: while a slow
/// synchronous standby delays the confirmations, a running run holds up to this many
/// connections of the schedule's pool.
const IN_FLIGHT: usize = 6;

/// Runs `job` to its end, beating every poll that its `run` is alive; cut off (the job's
/// future dropped at its current `.await`) when no beat has been confirmed for the cut-off,
/// before another term may take the run for dead, or when another term has already called it
/// abandoned. `claimed_at`: when the claim was sent (its commit waited for the standby), the
/// run's last confirmed sign of life until a beat is confirmed.
///
/// A claim that took a poll or longer (a COMMIT that waited for a standby, a claim read back)
/// leaves the run's row stale-looking to other terms soon after it finally commits: the
/// beats then start at once, as many as a slow standby calls for, and the job starts only
/// once one of them is confirmed. None confirmed within the cut-off of the first one's send,
/// or a record that is no longer `running`, ends the run before it started.
pub(super) async fn with_heartbeat<F: Future>(
    ctx: &Context,
    run: RunRef<'_>,
    claimed_at: Instant,
    job: F,
) -> Result<F::Output, CutOff> {
    let slow_claim = claimed_at.elapsed() >= ctx.poll;
    // After a slow claim the job waits for a confirmed beat, and the cut-off counts from the
    // first one's send: nothing runs until then, and a beat that lands proves that no other
    // term has taken the run over.
    let alive_at = if slow_claim {
        Instant::now()
    } else {
        claimed_at
    };
    let (confirmed, mut start) = tokio::sync::watch::channel(!slow_claim);
    let job = async move {
        // The sender lives as long as the heartbeat, which this future is raced against.
        let _ = start.wait_for(|&confirmed| confirmed).await;
        job.await
    };
    let job = std::pin::pin!(job);
    tokio::select! {
        // The cut-off first: a run already silent for the cut-off does not start.
        biased;
        cut = heartbeat(ctx, run, alive_at, slow_claim, &confirmed) => Err(cut),
        outcome = job => Ok(outcome),
    }
}

/// One beat and its confirmation, bounded together by `bound`: `Ok(Some(sent))` when the run's
/// record was still `running` and the beat is on the standby too, `sent` being when the beat's
/// statement went out on its connection (after the borrow: a borrow slowed by a login does
/// not count as silence, and the beat's `heartbeat_at` is no earlier); `Ok(None)` when the
/// record is no longer `running`.
async fn beat(
    ctx: &Context,
    run: RunRef<'_>,
    bound: Duration,
) -> Result<Option<Instant>, ScheduleError> {
    ctx.query_within(bound, async |client| {
        let sent = Instant::now();
        if !ctx.store.heartbeat(client, run).await? {
            return Ok(None);
        }
        ctx.store.confirm(client).await?;
        Ok(Some(sent))
    })
    .await
}

/// Beats every poll, as the claim promised (the run's row holds the period), and more often
/// while confirmations are slow (see the module docs). Returns when the run must end: no beat
/// has been confirmed for [`cut_off_after`] (measured from when the last confirmed one was
/// sent), or a beat found the run no longer `running`. Dropped, it drops the beats in flight,
/// whose connections are closed, not given back. What it says on the way is [`Silence`]'s.
async fn heartbeat(
    ctx: &Context,
    run: RunRef<'_>,
    alive_at: Instant,
    beat_now: bool,
    confirmed: &tokio::sync::watch::Sender<bool>,
) -> CutOff {
    let cut_after = cut_off_after(stale_after(ctx.poll));
    let cadence = Cadence::new(ctx.poll, cut_after);
    let mut silence = Silence::new(run.job, stale_after(ctx.poll), alive_at);
    let mut in_flight = FuturesUnordered::new();
    // `None`: the first beat goes out at once.
    let mut last_sent = (!beat_now).then_some(alive_at);
    loop {
        let (cut_off, warn_at) = silence.deadlines();
        let next_beat = cadence.next_beat(last_sent, in_flight.len());
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(cut_off) => return CutOff::Silent(silence.silent()),
            () = tokio::time::sleep_until(warn_at), if !silence.warned => silence.warn(),
            Some(landed) = in_flight.next() => {
                let landed: Result<Option<Instant>, ScheduleError> = landed;
                match landed {
                    Ok(Some(sent)) => {
                        silence.landed(sent);
                        confirmed.send_replace(true);
                    }
                    Ok(None) => return CutOff::Settled,
                    Err(e) => silence.failed(e.to_string()),
                }
            }
            () = tokio::time::sleep_until(next_beat.unwrap_or(cut_off)), if next_beat.is_some() => {
                last_sent = Some(Instant::now());
                in_flight.push(beat(ctx, run, cut_after));
            }
        }
    }
}

/// When the next beat goes out: a poll after the last one while none is in flight; while one
/// is (its confirmation is slow), an eighth of the cut-off after the last one, up to
/// [`IN_FLIGHT`] at once. Apart from the I/O, for the unit tests.
#[derive(Clone, Copy, Debug)]
struct Cadence {
    poll: Duration,
    behind: Duration,
}

impl Cadence {
    fn new(poll: Duration, cut_after: Duration) -> Self {
        Self {
            poll,
            behind: cut_after / 8,
        }
    }

    /// When the next beat goes out, the last one having gone out at `last_sent` (`None`: at
    /// once), with `in_flight` beats not yet answered; `None`: not before one is answered.
    fn next_beat(self, last_sent: Option<Instant>, in_flight: usize) -> Option<Instant> {
        let gap = match in_flight {
            0 => self.poll,
            n if n < IN_FLIGHT => self.behind,
            _ => return None,
        };
        Some(last_sent.map_or_else(Instant::now, |at| at + gap))
    }
}

/// How long a run's beats may go unconfirmed before its runner cuts it off: two thirds of the
/// stale threshold (at least one heartbeat period short of it, as the threshold is at least
/// three), so that the run has ended before another term can call it abandoned and rerun it.
fn cut_off_after(stale_after: Duration) -> Duration {
    stale_after.saturating_mul(2) / 3
}

/// Why a run was cut off before its end.
#[derive(Debug)]
pub(super) enum CutOff {
    /// No beat was confirmed for this long.
    Silent(Duration),
    /// A beat found its record no longer `running`: another term called it abandoned, or the
    /// row is gone (a restore, the tables emptied, a failover that lost the claim, after which
    /// another term may have claimed the same due again: a beat names its own term).
    Settled,
}

impl CutOff {
    pub(super) fn log(&self, job: &str, due: jiff::Timestamp) {
        match self {
            CutOff::Silent(silent) => tracing::error!(
                job,
                due = %due,
                ?silent,
                "the run was cut off: its heartbeats did not land, and another term would soon take it for dead"
            ),
            CutOff::Settled => tracing::error!(
                job,
                due = %due,
                "the run was cut off: its record is no longer running (another term called it abandoned, or the row is gone: a failover may have lost the claim)"
            ),
        }
    }
}

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutOff::Silent(silent) => write!(
                f,
                "cut off: its heartbeats did not land for {silent:?}, and another term may take a run that silent for dead"
            ),
            CutOff::Settled => f.write_str(
                "cut off: its record is no longer running (another term called it abandoned, or the row is gone: a failover may have lost the claim)",
            ),
        }
    }
}

/// A running run's silence: since when its beats have not been confirmed (the send time of
/// the last one that was), and what was said of it. A failed beat is said at DEBUG; once the
/// run has been silent for a third of the stale threshold, at WARN (once while the beats keep
/// failing); at INFO when a beat is confirmed again.
struct Silence<'a> {
    job: &'a str,
    stale_after: Duration,
    alive_at: Instant,
    warned: bool,
    last_error: Option<String>,
}

impl<'a> Silence<'a> {
    fn new(job: &'a str, stale_after: Duration, alive_at: Instant) -> Self {
        Self {
            job,
            stale_after,
            alive_at,
            warned: false,
            last_error: None,
        }
    }

    fn silent(&self) -> Duration {
        self.alive_at.elapsed()
    }

    /// When the run is cut off, and when its silence is said at WARN.
    fn deadlines(&self) -> (Instant, Instant) {
        (
            self.alive_at + cut_off_after(self.stale_after),
            self.alive_at + self.stale_after / 3,
        )
    }

    fn warn(&mut self) {
        tracing::warn!(
            job = self.job,
            silent = ?self.silent(),
            stale_after = ?self.stale_after,
            cut_after = ?cut_off_after(self.stale_after),
            error = self.last_error.as_deref().unwrap_or("no beat answered yet"),
            "heartbeats of the running run keep failing; the run is cut off once silent for cut_after, before another term takes it as abandoned (and runs it again if rerun_abandoned)"
        );
        self.warned = true;
    }

    /// A beat sent at `sent` was confirmed (beats in flight together may land out of order).
    fn landed(&mut self, sent: Instant) {
        if sent <= self.alive_at {
            return;
        }
        if self.warned {
            tracing::info!(job = self.job, silent = ?self.silent(), "heartbeats of the running run land again");
        }
        self.alive_at = sent;
        self.warned = false;
        self.last_error = None;
    }

    fn failed(&mut self, error: String) {
        tracing::debug!(job = self.job, %error, "heartbeat failed");
        self.last_error = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn beats_go_out_every_poll_while_none_is_in_flight() {
        // A 5 s poll (the default check interval): a 10 s cut-off, 1.25 s while behind.
        let cadence = Cadence::new(5000 * MS, 10_000 * MS);
        let last = Instant::now();
        assert_eq!(cadence.next_beat(Some(last), 0), Some(last + 5000 * MS));
        assert_eq!(cadence.next_beat(Some(last), 1), Some(last + 1250 * MS));
        // The first beat of a slow claim goes at once.
        let first = cadence.next_beat(None, 0).unwrap();
        assert!(first >= last && first <= Instant::now());
    }

    #[test]
    fn slow_confirmations_bring_beats_closer_up_to_the_cap() {
        // A 50 ms poll under the 3 s floor: a 2 s cut-off, a beat every 250 ms while behind.
        let cadence = Cadence::new(50 * MS, 2000 * MS);
        let last = Instant::now();
        assert_eq!(cadence.next_beat(Some(last), 0), Some(last + 50 * MS));
        assert_eq!(cadence.next_beat(Some(last), 1), Some(last + 250 * MS));
        assert_eq!(
            cadence.next_beat(Some(last), IN_FLIGHT - 1),
            Some(last + 250 * MS)
        );
        assert_eq!(cadence.next_beat(Some(last), IN_FLIGHT), None);
    }

    #[test]
    fn a_late_confirmation_of_an_older_beat_does_not_move_the_silence_back() {
        let start = Instant::now();
        let mut silence = Silence::new("j", 3000 * MS, start);
        silence.landed(start + 500 * MS);
        silence.landed(start + 200 * MS);
        assert_eq!(silence.alive_at, start + 500 * MS);
        assert_eq!(silence.deadlines(), (start + 2500 * MS, start + 1500 * MS));
    }

    #[test]
    fn the_cut_off_is_two_thirds_of_the_stale_threshold() {
        assert_eq!(cut_off_after(Duration::from_secs(3)), 2000 * MS);
        assert_eq!(cut_off_after(Duration::from_secs(30)), 20_000 * MS);
    }
}
