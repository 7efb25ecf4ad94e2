//! Gates (B4): leader-only switches that stay open when there is no election.

use std::future::Future;
use tokio_util::sync::CancellationToken;

use crate::{Elector, Term};

/// Whether leader-only work may run here: open on the leader, shut on a standby, and always
/// open when built with no elector (B4).
///
/// A gate lets the same code serve a fleet and a single process: wire the elector in when the
/// deployment has a database, and `None` when it has not, and everything the gate guards still
/// runs. The launchers ([`LeaderTicker`](super::LeaderTicker), [`WhileLeader`](super::WhileLeader))
/// take a gate (or anything that converts into one, such as an [`Elector`]).
///
/// A gate with no elector behaves as a private [`Elector::always_leader`]: its terms never
/// end, and [`do_work`](Gate::do_work) always runs the work.
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
/// ```
#[derive(Clone, Debug)]
pub struct Gate {
    elector: Option<Elector>,
    /// Leads forever: nothing runs or shuts it down. Used when there is no elector.
    open: Elector,
}

impl Gate {
    /// A gate on `elector`, or an always-open gate for `None`.
    pub fn new(elector: Option<Elector>) -> Self {
        Self {
            elector,
            open: Elector::always_leader(),
        }
    }

    /// A gate that is always open.
    pub fn open() -> Self {
        Self::new(None)
    }

    /// The elector this gate follows; `None` for an always-open gate.
    pub fn elector(&self) -> Option<&Elector> {
        self.elector.as_ref()
    }

    fn effective(&self) -> &Elector {
        self.elector.as_ref().unwrap_or(&self.open)
    }

    /// Whether leader-only work may run now: the elector leads, or there is none.
    pub fn is_open(&self) -> bool {
        self.effective().is_leader()
    }

    /// The current term, as [`Elector::term`]; a term that never ends for an always-open gate.
    pub fn term(&self) -> Term {
        self.effective().term()
    }

    /// The current term linked to `parent`, as [`Elector::term_with`].
    pub fn term_with(&self, parent: &CancellationToken) -> Term {
        self.effective().term_with(parent)
    }

    /// Runs `f` if the gate is open, as [`Elector::do_work`].
    ///
    /// # Errors
    ///
    /// `f`'s error, when `f` fails while the gate is still open.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `f`'s future; nothing else is affected.
    pub async fn do_work<T, E, F, Fut>(&self, f: F) -> Result<Option<T>, E>
    where
        F: FnOnce(Term) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.effective().do_work(f).await
    }

    /// Waits until the gate opens and returns the live term, linked to `shutdown`; `None` once
    /// `shutdown` is cancelled. Woken by the elector's own notification of a new term
    /// ([`Elector::wait_for_leadership`]), so it does not poll.
    pub(crate) async fn next_term(&self, shutdown: &CancellationToken) -> Option<Term> {
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let term = self.term_with(shutdown);
            if term.is_leader() {
                return Some(term);
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                _ = self.effective().wait_for_leadership() => {}
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
