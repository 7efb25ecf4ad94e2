//! Readiness probes: what a loop's last tick on this replica says about readiness.

use std::fmt;
use std::sync::{Arc, Mutex};

/// The outcome of one tick of a loop, as a [`Probe`] records it.
///
/// The launchers record these themselves; record them by hand only for a loop of your own.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickOutcome {
    /// This replica led and the tick succeeded.
    Succeeded,
    /// This replica led and the tick failed (or panicked), with this error.
    Failed(String),
    /// This replica did not lead, so the tick ran no work; also a tick during which this
    /// replica was demoted, whose outcome is dropped.
    Standby,
}

/// Whether a probe passes, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeStatus {
    /// Ready.
    Pass,
    /// Not ready, with the error to report.
    Fail(String),
}

impl ProbeStatus {
    /// Whether this is [`ProbeStatus::Pass`].
    pub fn is_pass(&self) -> bool {
        matches!(self, ProbeStatus::Pass)
    }
}

/// A readiness probe reporting the last tick of one loop on this replica.
///
/// | replica state | status |
/// |---|---|
/// | no tick yet | the boot state the application sets ([`set_boot`](Probe::set_boot)); pass by default |
/// | leader, last tick succeeded | pass |
/// | leader, last tick failed | that tick's error, until a later tick succeeds |
/// | standby | pass: a standby runs no work, so it has no outcome of its own |
///
/// A demoted leader's probe clears on its first standby tick, so a replica that stops leading
/// does not keep reporting the error of the last tick it ran. A probe runs nothing itself:
/// hand it to a [`LeaderTicker`](super::LeaderTicker) or a [`WhileLeader`](super::WhileLeader),
/// and add it to a [`Readiness`](super::Readiness) set for `/readyz`.
///
/// A probe sees ticks, so it cannot see a loop that stopped ticking altogether; the
/// [`Supervisor`](super::Supervisor)'s probe reports workers that stopped for good.
///
/// Clones share one state.
///
/// ```
/// use pg_elector::background::{Probe, ProbeStatus, TickOutcome};
///
/// let probe = Probe::new("invitations-expire");
/// probe.set_boot(Err("boot sweep not done"));
/// assert!(!probe.status().is_pass());
/// probe.record(TickOutcome::Failed("connection refused".into()));
/// assert_eq!(probe.status(), ProbeStatus::Fail("connection refused".into()));
/// probe.record(TickOutcome::Standby); // demoted: cleared on the first standby tick
/// assert_eq!(probe.status(), ProbeStatus::Pass);
/// ```
#[derive(Clone)]
pub struct Probe {
    inner: Arc<ProbeInner>,
}

struct ProbeInner {
    state: Mutex<State>,
}

#[derive(Clone, Debug)]
struct State {
    /// The loop's name; a supervisor's probe may be renamed after clones were handed out.
    name: String,
    /// What the application said about boot; reported until the first tick.
    boot: ProbeStatus,
    /// The last tick's outcome; `None` before the first tick.
    last: Option<ProbeStatus>,
}

impl Probe {
    /// A probe for the loop `name`, passing until told otherwise (boot state: pass).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(ProbeInner {
                state: Mutex::new(State {
                    name: name.into(),
                    boot: ProbeStatus::Pass,
                    last: None,
                }),
            }),
        }
    }

    /// The loop's name, as readiness reports it.
    pub fn name(&self) -> String {
        self.lock().name.clone()
    }

    /// Renames this probe and every clone of it.
    pub(crate) fn rename(&self, name: String) {
        self.lock().name = name;
    }

    /// Sets the boot state: what the probe reports before the loop's first tick, typically
    /// the outcome of a boot-time pass. Has no visible effect once a tick was recorded.
    pub fn set_boot<E: fmt::Display>(&self, outcome: Result<(), E>) {
        self.lock().boot = to_status(outcome);
    }

    /// Records the outcome of one tick.
    pub fn record(&self, outcome: TickOutcome) {
        let status = match outcome {
            TickOutcome::Succeeded | TickOutcome::Standby => ProbeStatus::Pass,
            TickOutcome::Failed(error) => ProbeStatus::Fail(error),
        };
        self.lock().last = Some(status);
    }

    /// What the probe reports now.
    pub fn status(&self) -> ProbeStatus {
        let state = self.lock();
        state.last.clone().unwrap_or_else(|| state.boot.clone())
    }

    /// Whether a tick was recorded since the probe was made.
    pub fn has_ticked(&self) -> bool {
        self.lock().last.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.inner.state)
    }
}

fn to_status<E: fmt::Display>(outcome: Result<(), E>) -> ProbeStatus {
    match outcome {
        Ok(()) => ProbeStatus::Pass,
        Err(e) => ProbeStatus::Fail(e.to_string()),
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("name", &self.name())
            .field("status", &self.status())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b3_the_state_table() {
        let probe = Probe::new("sweep");
        assert_eq!(probe.status(), ProbeStatus::Pass, "default boot state");
        probe.set_boot(Err("boot pass failed"));
        assert_eq!(probe.status(), ProbeStatus::Fail("boot pass failed".into()));
        assert!(!probe.has_ticked());

        probe.record(TickOutcome::Succeeded);
        assert_eq!(probe.status(), ProbeStatus::Pass, "leader, last tick ok");
        probe.set_boot(Err("late"));
        assert_eq!(
            probe.status(),
            ProbeStatus::Pass,
            "boot state unseen after a tick"
        );

        probe.record(TickOutcome::Failed("db down".into()));
        assert_eq!(probe.status(), ProbeStatus::Fail("db down".into()));
        probe.record(TickOutcome::Failed("db still down".into()));
        assert_eq!(probe.status(), ProbeStatus::Fail("db still down".into()));
        probe.record(TickOutcome::Succeeded);
        assert_eq!(probe.status(), ProbeStatus::Pass, "a later success clears");

        probe.record(TickOutcome::Failed("db down".into()));
        probe.record(TickOutcome::Standby);
        assert_eq!(
            probe.status(),
            ProbeStatus::Pass,
            "the first standby tick clears"
        );
    }

    #[test]
    fn a_standby_at_boot_passes_after_its_first_tick() {
        let probe = Probe::new("sweep");
        probe.set_boot(Err("booting"));
        probe.record(TickOutcome::Standby);
        assert!(probe.status().is_pass());
    }
}
