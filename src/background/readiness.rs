//! A set of probes rendered for a `/readyz` endpoint.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::probe::{Probe, ProbeStatus};

/// The probes whose verdict makes up this replica's readiness.
///
/// Add every loop's [`Probe`] (and the [`Supervisor`](super::Supervisor)'s) and serve
/// [`check`](Readiness::check) on `/readyz`: HTTP 200 while every probe passes, 503 with the
/// failing loops named otherwise. Clones share one set.
///
/// ```
/// use pg_elector::background::{Probe, Readiness, TickOutcome};
///
/// let readiness = Readiness::new();
/// let sweep = readiness.probe("sweep");
/// readiness.add(&Probe::new("expire"));
/// assert_eq!(readiness.check().status_code(), 200);
///
/// sweep.record(TickOutcome::Failed("relation \"jobs\" does not exist".into()));
/// let report = readiness.check();
/// assert_eq!(report.status_code(), 503);
/// assert_eq!(report.body(), "not ready\nsweep: relation \"jobs\" does not exist\n");
/// ```
#[derive(Clone, Default)]
pub struct Readiness {
    probes: Arc<Mutex<Vec<Probe>>>,
}

impl Readiness {
    /// An empty set, which is ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a probe (a clone of it: the set sees every later record).
    pub fn add(&self, probe: &Probe) {
        crate::sync::lock(&self.probes).push(probe.clone());
    }

    /// Makes a probe named `name`, adds it and returns it.
    pub fn probe(&self, name: impl Into<String>) -> Probe {
        let probe = Probe::new(name);
        self.add(&probe);
        probe
    }

    /// Asks every probe, in the order they were added.
    pub fn check(&self) -> ReadinessReport {
        let probes = crate::sync::lock(&self.probes).clone();
        let mut failing = Vec::new();
        for probe in &probes {
            if let ProbeStatus::Fail(error) = probe.status() {
                failing.push(FailingProbe {
                    name: probe.name().to_owned(),
                    error,
                });
            }
        }
        ReadinessReport {
            probes: probes.len(),
            failing,
        }
    }
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("probes", &*crate::sync::lock(&self.probes))
            .finish()
    }
}

/// A probe that failed in a [`ReadinessReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailingProbe {
    /// The probe's (loop's) name.
    pub name: String,
    /// What it reports.
    pub error: String,
}

/// The verdict of a [`Readiness`] set at one moment, ready to be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessReport {
    probes: usize,
    failing: Vec<FailingProbe>,
}

impl ReadinessReport {
    /// Whether every probe passed.
    pub fn is_ready(&self) -> bool {
        self.failing.is_empty()
    }

    /// The HTTP status to answer with: 200 when ready, 503 otherwise.
    pub fn status_code(&self) -> u16 {
        if self.is_ready() { 200 } else { 503 }
    }

    /// The probes that failed, in the order they were added.
    pub fn failing(&self) -> &[FailingProbe] {
        &self.failing
    }

    /// How many probes were asked.
    pub fn probe_count(&self) -> usize {
        self.probes
    }

    /// A plain-text body: `ok` when ready, else `not ready` and one `name: error` line per
    /// failing probe (line breaks in errors are replaced by spaces).
    pub fn body(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ReadinessReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ready() {
            return writeln!(f, "ok");
        }
        writeln!(f, "not ready")?;
        for probe in &self.failing {
            let error = probe.error.replace(['\r', '\n'], " ");
            writeln!(f, "{}: {error}", probe.name)?;
        }
        Ok(())
    }
}
