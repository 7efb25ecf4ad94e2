//! Gates: leader-only switches that stay open when there is no election.

use tokio_util::sync::CancellationToken;

use crate::{Elector, Term};

/// Whether leader-only work may run here: open on the leader, shut on a standby, and always
/// open when built with no elector.
///
/// A gate lets the same code serve a fleet and a single process: wire the elector in when the
/// deployment has a database, and `None` when it has not, and everything the gate guards still
/// runs. It is a thin wrapper over an [`Elector`]: with `None` it holds an
/// [`Elector::always_leader`], whose terms never end; [`elector`](Gate::elector) hands it out
/// for [`do_work`](Elector::do_work), [`term`](Elector::term) and the rest. The launchers
/// ([`LeaderTicker`](super::LeaderTicker), [`WhileLeader`](super::WhileLeader)) take a gate (or
/// anything that converts into one, such as an [`Elector`]).
///
/// ```
/// use pg_elector::Elector;
/// use pg_elector::background::Gate;
///
/// let (elector, control) = Elector::manual();
/// let gate = Gate::new(Some(elector));
/// assert!(!gate.is_open());
/// control.promote();
/// assert!(gate.is_open());
///
/// let no_database = Gate::new(None);
/// assert!(no_database.is_open());
/// assert!(no_database.elector().term().is_leader());
/// ```
#[derive(Clone, Debug)]
pub struct Gate {
    elector: Elector,
}

impl Gate {
    /// A gate on `elector`, or an always-open gate for `None`.
    pub fn new(elector: Option<Elector>) -> Self {
        Self {
            elector: elector.unwrap_or_else(Elector::always_leader),
        }
    }

    /// A gate that is always open: it follows no elector, as [`Gate::new(None)`](Self::new).
    pub fn always_open() -> Self {
        Self::new(None)
    }

    /// The elector this gate follows: the one it was given, or its always-leader one.
    pub fn elector(&self) -> &Elector {
        &self.elector
    }

    /// Whether leader-only work may run now: the elector leads, or there is none.
    pub fn is_open(&self) -> bool {
        self.elector.is_leader()
    }

    /// Waits until the gate opens and returns the live term, linked to `shutdown`; `None` once
    /// `shutdown` is cancelled. Woken by the elector's own notification of a new term
    /// ([`Elector::wait_for_leadership`]), so it does not poll.
    pub(crate) async fn next_term(&self, shutdown: &CancellationToken) -> Option<Term> {
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let term = self.elector.term_with(shutdown);
            if term.is_leader() {
                return Some(term);
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                _ = self.elector.wait_for_leadership() => {}
            }
        }
    }
}

impl From<Elector> for Gate {
    fn from(elector: Elector) -> Self {
        Self::new(Some(elector))
    }
}

impl From<&Elector> for Gate {
    fn from(elector: &Elector) -> Self {
        Self::new(Some(elector.clone()))
    }
}

impl From<Option<Elector>> for Gate {
    fn from(elector: Option<Elector>) -> Self {
        Self::new(elector)
    }
}
