//! The local electors' front door: `Elector::always_leader`, `Elector::manual` and
//! `Elector::local_builder`, the builder, and the control of a manual elector. (What they run
//! on is `local.rs`.)

#[cfg(feature = "prometheus")]
use prometheus::Registry;

use crate::elector::{Elector, Mode};
use crate::error::Error;
use crate::local::{LocalKind, promote};
use crate::metrics::{Change, MetricsSpec};
use crate::term::{LossCause, Term, TermEnd};

impl Elector {
    /// An elector that leads from the start, with no database: for a deployment of one
    /// process. Its term ends (with [`TermEnd::Shutdown`]) only when its `run`, if started,
    /// is shut down; `run` started again leads again at once, in a new term.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let elector = pg_elector::Elector::always_leader();
    /// assert!(elector.is_leader());
    /// let out = elector.do_work(|_term| async { Ok::<_, ()>(1) }).await;
    /// assert_eq!(out, Ok(Some(1)));
    /// # }
    /// ```
    pub fn always_leader() -> Elector {
        LocalBuilder::default().always_leader()
    }

    /// A standby elector with no database, promoted and demoted by hand through the returned
    /// [`ManualControl`]: for unit tests of code that takes an `Elector`.
    ///
    /// ```
    /// use pg_elector::{Elector, TermEnd};
    ///
    /// let (elector, control) = Elector::manual();
    /// assert!(!elector.is_leader());
    /// let term = control.promote();
    /// assert!(elector.is_leader() && term.is_leader());
    /// control.demote();
    /// assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
    /// ```
    pub fn manual() -> (Elector, ManualControl) {
        LocalBuilder::default().manual()
    }

    /// Configures a local elector (for example with a registry for its gauge).
    pub fn local_builder() -> LocalBuilder {
        LocalBuilder::default()
    }
}

/// Configures a local elector; made by [`Elector::local_builder`].
///
/// A registry that refuses the gauge (a clash with a metric of the same name) is handled one
/// way by every local elector: [`always_leader`](Self::always_leader) and
/// [`manual`](Self::manual) log it at ERROR and build the elector without metrics, as
/// [`Elector::always_leader`] and [`Elector::manual`] do, since a test or a one-process
/// deployment should not stop over a gauge; [`try_always_leader`](Self::try_always_leader) and
/// [`try_manual`](Self::try_manual) return the error instead.
#[must_use = "a builder does nothing until it builds"]
#[derive(Debug, Default)]
pub struct LocalBuilder {
    metrics: MetricsSpec,
}

impl LocalBuilder {
    /// Registers the elector's metrics in `registry`, as
    /// [`ElectorBuilder::registry`](crate::ElectorBuilder::registry) does, with the `key` label
    /// `local`. Default: no metrics.
    #[cfg(feature = "prometheus")]
    pub fn registry(mut self, registry: &Registry) -> Self {
        self.metrics.registry = Some(registry.clone());
        self
    }

    /// The leader gauge's name (default `pg_elector_leader`).
    #[cfg(feature = "prometheus")]
    pub fn gauge_name(mut self, name: impl Into<String>) -> Self {
        self.metrics.gauge_name = name.into();
        self
    }

    /// An elector that leads from the start; see [`Elector::always_leader`].
    ///
    /// # Panics
    ///
    /// Never; use [`try_always_leader`](Self::try_always_leader) to see a registry's refusal,
    /// which this method logs and ignores (the elector then has no metrics).
    pub fn always_leader(self) -> Elector {
        let elector = self.build_or_log(LocalKind::AlwaysLeader);
        promote(&elector.shared);
        elector
    }

    /// Like [`always_leader`](Self::always_leader), with the registry's refusal as an error.
    ///
    /// # Errors
    ///
    /// [`BuildError::MetricClash`](crate::BuildError::MetricClash) or [`BuildError::Metric`](crate::BuildError::Metric) when the registry refuses the gauge.
    pub fn try_always_leader(self) -> Result<Elector, Error> {
        let elector = self.build(LocalKind::AlwaysLeader)?;
        promote(&elector.shared);
        Ok(elector)
    }

    /// A standby elector with a [`ManualControl`]; see [`Elector::manual`].
    ///
    /// # Panics
    ///
    /// Never; use [`try_manual`](Self::try_manual) to see a registry's refusal, which this
    /// method logs and ignores (the elector then has no metrics).
    pub fn manual(self) -> (Elector, ManualControl) {
        let elector = self.build_or_log(LocalKind::Manual);
        let control = ManualControl {
            elector: elector.clone(),
        };
        (elector, control)
    }

    /// Like [`manual`](Self::manual), with the registry's refusal as an error.
    ///
    /// # Errors
    ///
    /// [`BuildError::MetricClash`](crate::BuildError::MetricClash) or [`BuildError::Metric`](crate::BuildError::Metric) when the registry refuses the gauge.
    pub fn try_manual(self) -> Result<(Elector, ManualControl), Error> {
        let elector = self.build(LocalKind::Manual)?;
        let control = ManualControl {
            elector: elector.clone(),
        };
        Ok((elector, control))
    }

    fn build(self, kind: LocalKind) -> Result<Elector, Error> {
        let metrics = self.metrics.register("local")?;
        Ok(Elector::from_mode(Mode::Local(kind), metrics))
    }

    fn build_or_log(self, kind: LocalKind) -> Elector {
        self.build(kind).unwrap_or_else(|e| {
            tracing::error!(error = %e, "local elector built without its metrics");
            Elector::from_mode(Mode::Local(kind), None)
        })
    }
}

/// Promotes and demotes a manual elector by hand; made by [`Elector::manual`](crate::Elector::manual).
#[derive(Clone, Debug)]
pub struct ManualControl {
    pub(crate) elector: Elector,
}

impl ManualControl {
    /// The elector this controls.
    pub fn elector(&self) -> &Elector {
        &self.elector
    }

    /// Makes the elector lead, starting a new term unless one is live; returns the term.
    pub fn promote(&self) -> Term {
        promote(&self.elector.shared);
        self.elector.term()
    }

    /// Ends the live term, if any, with [`TermEnd::LeadershipLost`], as a lost lock would.
    pub fn demote(&self) {
        self.elector
            .shared
            .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Demoted));
    }
}
