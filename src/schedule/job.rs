//! Jobs: a name and when it is due (a cron expression in a time zone, or a fixed period), and
//! what a new leader does with the dues it missed.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::error::ScheduleError;
use crate::Term;

/// What a leader does with the due instants it missed: those that passed while nobody led,
/// while another leader's run of the job was still going, or while this leader's own previous
/// run of the job overran them.
///
/// A due that came while this leader led and watched the job is never missed, whatever the
/// policy: if its claim fails at first (a row lock held for a while, a pool timeout), it is
/// claimed again at the next poll, and runs once that claim goes through, and so do the dues
/// that came meanwhile. The dues a policy drops are recorded as skipped
/// ([`SkipReason::CatchUp`](super::SkipReason::CatchUp), and
/// [`CatchUpLimit`](super::SkipReason::CatchUpLimit) past [`Job::max_catch_up`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatchUp {
    /// Runs none of them: the job waits for its next due.
    Skip,
    /// Runs the latest of them once (the default): a job that summarises "now" need not run
    /// once per missed slot.
    #[default]
    Latest,
    /// Runs each of them, oldest first, up to [`Job::max_catch_up`] (the most recent ones are
    /// kept when there are more).
    All,
}

/// When a job is due.
#[derive(Clone)]
pub(crate) enum Spec {
    Cron {
        expression: String,
        cron: Box<Cron>,
        zone: TimeZone,
        zone_name: String,
    },
    Every(Duration),
}

impl Spec {
    /// [`next_after`](Self::next_after) in the standard library's time.
    pub(crate) fn next_due_after(&self, after: SystemTime) -> Option<SystemTime> {
        let after = Timestamp::try_from(after).ok()?;
        self.next_after(after).map(SystemTime::from)
    }

    /// The first due instant strictly after `after`; `None` when there is none (a cron
    /// expression that never matches again).
    pub(crate) fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        match self {
            Spec::Every(period) => {
                let period = period.as_nanos().max(1) as i128;
                let now = after.as_nanosecond();
                let next = (now.div_euclid(period) + 1) * period;
                Timestamp::from_nanosecond(next).ok()
            }
            Spec::Cron { cron, zone, .. } => {
                let zoned = after.to_zoned(zone.clone());
                cron.find_next_occurrence(&zoned, false)
                    .ok()
                    .map(|z| z.timestamp())
            }
        }
    }

    /// The latest due instant at or before `at` (strictly before, unless `inclusive`).
    pub(crate) fn previous(&self, at: Timestamp, inclusive: bool) -> Option<Timestamp> {
        match self {
            Spec::Every(period) => {
                let period = period.as_nanos().max(1) as i128;
                let now = at.as_nanosecond();
                let mut prev = now.div_euclid(period) * period;
                if prev == now && !inclusive {
                    prev -= period;
                }
                Timestamp::from_nanosecond(prev).ok()
            }
            Spec::Cron { cron, zone, .. } => {
                let zoned = at.to_zoned(zone.clone());
                cron.find_previous_occurrence(&zoned, inclusive)
                    .ok()
                    .map(|z| z.timestamp())
            }
        }
    }

    /// How many due instants there are in `(after, until]`: exact for a fixed period; for a
    /// cron expression, counted one by one, at most [`MAX_COUNTED`] (a longer stretch counts
    /// as that many).
    pub(crate) fn count_between(&self, after: Timestamp, until: Timestamp) -> u64 {
        if until <= after {
            return 0;
        }
        match self {
            Spec::Every(period) => {
                let period = period.as_nanos().max(1) as i128;
                let dues = until.as_nanosecond().div_euclid(period)
                    - after.as_nanosecond().div_euclid(period);
                u64::try_from(dues).unwrap_or(u64::MAX)
            }
            Spec::Cron { .. } => {
                let (mut dues, mut at) = (0, after);
                while dues < MAX_COUNTED {
                    match self.next_after(at) {
                        Some(next) if next <= until => {
                            dues += 1;
                            at = next;
                        }
                        _ => break,
                    }
                }
                dues
            }
        }
    }

    /// The due instants in `(after, until]`, oldest first, at most `limit` of them (the most
    /// recent ones), and whether there were more. Walks back from `until`, so a long gap costs
    /// no more than `limit` steps.
    pub(crate) fn dues_between(
        &self,
        after: Timestamp,
        until: Timestamp,
        limit: usize,
    ) -> (Vec<Timestamp>, bool) {
        let mut dues = Vec::new();
        let mut more = false;
        let mut at = until;
        let mut inclusive = true;
        while let Some(due) = self.previous(at, inclusive) {
            if due <= after {
                break;
            }
            if dues.len() == limit {
                more = true;
                break;
            }
            dues.push(due);
            at = due;
            inclusive = false;
        }
        dues.reverse();
        (dues, more)
    }

    /// The schedule as stored in the job table: `cron <expression> <zone>` or `every <ms>ms`.
    pub(crate) fn text(&self) -> String {
        match self {
            Spec::Cron {
                expression,
                zone_name,
                ..
            } => format!("cron {expression} {zone_name}"),
            Spec::Every(period) => format!("every {}ms", period.as_millis()),
        }
    }

    /// Reads [`text`](Self::text) back.
    pub(crate) fn parse(text: &str) -> Result<Self, ScheduleError> {
        if let Some(rest) = text.strip_prefix("cron ") {
            let (expression, zone) =
                rest.rsplit_once(' ').ok_or_else(|| ScheduleError::Stored {
                    text: text.to_owned(),
                })?;
            return cron_spec(expression, zone);
        }
        if let Some(ms) = text
            .strip_prefix("every ")
            .and_then(|rest| rest.strip_suffix("ms"))
            .and_then(|ms| ms.parse::<u64>().ok())
        {
            return Ok(Spec::Every(whole_period(Duration::from_millis(ms))));
        }
        Err(ScheduleError::Stored {
            text: text.to_owned(),
        })
    }
}

/// The longest period of [`Job::every`]: a century.
pub(crate) const MAX_PERIOD: Duration = crate::lease::CENTURY;

/// The most dues of a cron job counted as skipped in one stretch (a longer stretch, such as a
/// week of a job due every second, counts as this many).
pub(crate) const MAX_COUNTED: u64 = 100_000;

/// The most missed dues [`Job::max_catch_up`] lets [`CatchUp::All`] run after one gap.
pub const MAX_CATCH_UP: usize = 10_000;

/// `period` as a fixed-period job keeps it: whole milliseconds, from one millisecond to
/// [`MAX_PERIOD`] (a longer one saturates, a shorter one is one millisecond).
pub(crate) fn whole_period(period: Duration) -> Duration {
    let ms = period.as_millis().min(MAX_PERIOD.as_millis());
    Duration::from_millis(ms as u64).max(Duration::from_millis(1))
}

fn cron_spec(expression: &str, zone_name: &str) -> Result<Spec, ScheduleError> {
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expression)
        .map_err(|e| ScheduleError::InvalidCron {
            expression: expression.to_owned(),
            reason: e.to_string(),
        })?;
    let zone = TimeZone::get(zone_name).map_err(|e| ScheduleError::UnknownZone {
        zone: zone_name.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(Spec::Cron {
        expression: expression.split_whitespace().collect::<Vec<_>>().join(" "),
        cron: Box::new(cron),
        zone,
        zone_name: zone_name.to_owned(),
    })
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// A scheduled job: its name (unique within a [`Schedule`](super::Schedule)) and when it is due.
///
/// ```
/// use std::time::Duration;
/// use pg_elector::schedule::{CatchUp, Job};
///
/// let cleanup = Job::cron("retention-cleanup", "0 2 * * *")?; // 02:00 UTC every day
/// let snapshot = Job::cron("position-snapshot", "0 0 * * *")?.in_zone("Europe/Berlin")?;
/// let health = Job::every("indexer-health", Duration::from_secs(300)).catch_up(CatchUp::Skip);
/// assert!(Job::cron("typo", "0 25 * * *").is_err(), "hour 25 is refused at once");
/// # Ok::<(), pg_elector::schedule::ScheduleError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Job {
    pub(crate) name: String,
    pub(crate) spec: Spec,
    pub(crate) catch_up: CatchUp,
    pub(crate) max_catch_up: usize,
    pub(crate) rerun_abandoned: bool,
}

impl Job {
    /// A job due whenever the cron expression matches, in UTC (see
    /// [`in_zone`](Self::in_zone)). Five fields (minute to weekday), or six with seconds first
    /// (`*/10 * * * * *`: every ten seconds).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::InvalidCron`] for an expression that does not parse.
    pub fn cron(name: impl Into<String>, expression: &str) -> Result<Job, ScheduleError> {
        Ok(Self::new(name.into(), cron_spec(expression, "UTC")?))
    }

    /// A job due every `period`, on a grid anchored at the UNIX epoch, so that every replica
    /// computes the same due instants (`every(1 h)` is due on the hour, UTC). The period is
    /// kept in whole milliseconds, from one millisecond to a century: a shorter period
    /// (`Duration::ZERO`) is one millisecond, a longer one (`Duration::MAX`) a century.
    pub fn every(name: impl Into<String>, period: Duration) -> Job {
        Self::new(name.into(), Spec::Every(whole_period(period)))
    }

    fn new(name: String, spec: Spec) -> Self {
        Self {
            name,
            spec,
            catch_up: CatchUp::default(),
            max_catch_up: 100,
            rerun_abandoned: false,
        }
    }

    /// Evaluates the cron expression in the IANA time zone `zone` (`Europe/Berlin`), daylight
    /// saving time included: a local time skipped by a spring-forward runs when the clock
    /// jumps (02:30 in Berlin runs at 03:00 that night), and one repeated by a fall-back runs
    /// once.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::UnknownZone`] for a zone the bundled database does not know;
    /// [`ScheduleError::NotCron`] for a job made with [`every`](Self::every).
    pub fn in_zone(self, zone: &str) -> Result<Job, ScheduleError> {
        let Spec::Cron { expression, .. } = &self.spec else {
            return Err(ScheduleError::NotCron { job: self.name });
        };
        let spec = cron_spec(expression, zone)?;
        Ok(Job { spec, ..self })
    }

    /// What a new leader does with the dues it missed (default [`CatchUp::Latest`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Job {
        self.catch_up = catch_up;
        self
    }

    /// The most missed dues [`CatchUp::All`] runs (default 100), from 1 to [`MAX_CATCH_UP`]
    /// (10 000): a larger number is taken as that, and 0 as 1.
    pub fn max_catch_up(mut self, most: usize) -> Job {
        self.max_catch_up = most.clamp(1, MAX_CATCH_UP);
        self
    }

    /// Whether a run claimed by a leader that lost leadership before it finished is run again
    /// by the next leader (at-least-once), or only reported as abandoned (at-most-once, the
    /// default). The rerun starts once the cut-off run is called abandoned (see the [module
    /// docs](super)), for the same due, with `attempt` 2. Whether to rerun is decided, and
    /// stored in the job's row, when the run is called abandoned: a leader whose job asks for
    /// no reruns still runs one that an earlier leader stored.
    pub fn rerun_abandoned(mut self, again: bool) -> Job {
        self.rerun_abandoned = again;
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schedule as stored: `cron <expression> <zone>` or `every <ms>ms`.
    pub fn schedule(&self) -> String {
        self.spec.text()
    }

    /// The first due instant after `after` (for a look at the schedule; the leader uses the
    /// same computation).
    pub fn next_due_after(&self, after: SystemTime) -> Option<SystemTime> {
        self.spec.next_due_after(after)
    }
}

impl FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(CatchUp::Skip),
            "latest" => Ok(CatchUp::Latest),
            "all" => Ok(CatchUp::All),
            other => Err(format!("unknown catch-up {other:?}: skip, latest or all")),
        }
    }
}

/// Why a job runs: at its due instant, or by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunKind {
    /// At a due instant of its schedule (a missed one included).
    Scheduled,
    /// Again, after the leader that claimed this due lost leadership before it finished.
    Rerun,
    /// Asked for with [`ScheduleHandle::trigger`](super::ScheduleHandle::trigger).
    Triggered,
}

impl RunKind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            RunKind::Scheduled => "scheduled",
            RunKind::Rerun => "rerun",
            RunKind::Triggered => "triggered",
        }
    }
}

/// What one run of a job is handed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobRun {
    /// The job's name.
    pub job: String,
    /// The due instant this run is for (for a triggered run: when it was claimed).
    pub due: SystemTime,
    /// Why it runs.
    pub kind: RunKind,
    /// The leadership term it runs in: fence its writes with [`Term::fence`], stop early when
    /// its token is cancelled.
    pub term: Term,
    /// The term's fencing epoch, with fencing on.
    pub epoch: Option<u64>,
    /// 1 for the first run of this due, 2 for a rerun after an abandoned one.
    pub attempt: u32,
}

#[cfg(test)]
mod tests;
