//! Leadership terms.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio_util::sync::CancellationToken;

use crate::lease::Lease;

/// Why a [`Term`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEnd {
    /// The replica stopped leading: a failed or late leader check, a lost connection, an
    /// expired local lease, or a `run` that was dropped or panicked.
    LeadershipLost,
    /// The replica gave the lock up because `run`'s shutdown token was cancelled.
    Shutdown,
    /// The parent token given to [`Elector::term_with`](crate::Elector::term_with) was
    /// cancelled first.
    ParentCancelled,
    /// The term was asked for on a standby: it never led and is born ended.
    NotLeader,
}

/// This replica's leadership, as [`Elector::subscribe`](crate::Elector::subscribe) reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leadership {
    /// Whether this replica leads.
    pub is_leader: bool,
    /// How many times leadership changed (promotions and demotions) since the elector was
    /// built.
    pub changes: u64,
    /// Why the last term ended; `None` while leading, and before the first term ended.
    pub last_end: Option<TermEnd>,
}

/// One leadership term of this replica, or a standby's empty term.
///
/// A term is what background work holds on to while it runs on the leader: its
/// [`token`](Term::token) is cancelled when leadership ends, and [`end`](Term::end) says why.
/// Terms are cheap to clone; clones share one token. Each call of
/// [`Elector::term`](crate::Elector::term) hands out its own token (a child of the term's), so
/// a holder that cancels its token ends its own handle only.
///
/// When leadership ends by a demotion, the token is cancelled at once. When it ends because the
/// local lease ran out while the process was frozen (SIGSTOP, a suspended VM), [`is_leader`]
/// and [`Elector::do_work`](crate::Elector::do_work) see it at once on resume, and the token
/// follows within 20 ms. Code that must never act after that instant checks
/// [`is_leader`](Term::is_leader) right before each side effect (or runs it through `do_work`).
///
/// [`is_leader`]: Term::is_leader
///
/// A term from [`Elector::term`](crate::Elector::term) on a standby is already ended with
/// [`TermEnd::NotLeader`], so a loop gated on it stops at once.
///
/// ```
/// # async fn example(elector: pg_elector::Elector) {
/// let term = elector.term();
/// while term.is_leader() {
///     // One batch of work; stop between batches when leadership ends.
///     tokio::select! {
///         _ = term.cancelled() => break,
///         _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
///     }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct Term {
    inner: Arc<TermInner>,
}

struct TermInner {
    token: CancellationToken,
    end: OnceLock<TermEnd>,
    /// Whether this term was born leading; a standby's term is not.
    leader: bool,
    /// The replica's lease, which expires on its own clock.
    lease: Option<Arc<Lease>>,
    /// Terms made by `term_with` from this one; they end when this one does.
    linked: Mutex<Vec<Weak<TermInner>>>,
    /// For a handle on a leadership term: that term, whose end is this one's.
    of: Option<Arc<TermInner>>,
}

impl Term {
    /// A new live leadership term.
    pub(crate) fn leading(lease: Option<Arc<Lease>>) -> Self {
        Self::new(CancellationToken::new(), true, lease)
    }

    /// A term that was never a leader's: born ended with [`TermEnd::NotLeader`].
    pub(crate) fn not_leader() -> Self {
        let term = Self::new(CancellationToken::new(), false, None);
        term.finish(TermEnd::NotLeader);
        term
    }

    fn new(token: CancellationToken, leader: bool, lease: Option<Arc<Lease>>) -> Self {
        Self {
            inner: Arc::new(TermInner {
                token,
                end: OnceLock::new(),
                leader,
                lease,
                linked: Mutex::new(Vec::new()),
                of: None,
            }),
        }
    }

    /// A handle on this term for one caller: its token is a child of this term's, so a holder
    /// that cancels its token ends its own handle, never the term for everyone else.
    ///
    /// Made from a handle, it is a handle on the same term (not on that handle), so a holder
    /// that cancels one handle never ends another.
    pub(crate) fn handle(&self) -> Self {
        let term = self.inner.of.as_ref().unwrap_or(&self.inner);
        Self {
            inner: Arc::new(TermInner {
                token: term.token.child_token(),
                end: OnceLock::new(),
                leader: term.leader,
                lease: term.lease.clone(),
                linked: Mutex::new(Vec::new()),
                of: Some(term.clone()),
            }),
        }
    }

    /// A term that ends when this one does or when `parent` is cancelled, whichever is first.
    pub(crate) fn linked_to(&self, parent: &CancellationToken) -> Self {
        let child = Self::new(
            parent.child_token(),
            self.inner.leader,
            self.inner.lease.clone(),
        );
        let mut linked = lock(&self.inner.linked);
        match self.inner.end.get() {
            // Ended while we were linking: the child is born ended with the same cause.
            Some(end) => child.finish(*end),
            None => {
                linked.retain(|weak| weak.strong_count() > 0);
                linked.push(Arc::downgrade(&child.inner));
            }
        }
        child
    }

    /// Ends the term and every term linked to it, with `end` unless it already ended.
    pub(crate) fn finish(&self, end: TermEnd) {
        finish(&self.inner, end);
    }

    /// Whether this replica still leads in this term: the term is live, and the replica's
    /// local lease has not expired.
    ///
    /// Once false, it stays false for this term; a later term is a new `Term`.
    #[inline]
    pub fn is_leader(&self) -> bool {
        self.inner.leader
            && !self.inner.token.is_cancelled()
            && self
                .inner
                .lease
                .as_ref()
                .is_none_or(|lease| lease.is_live())
    }

    /// The term's cancellation token: cancelled when the term ends. Hand it (or a child of
    /// it) to work that must stop when leadership ends. Cancelling it ends this handle (and
    /// its clones) only, never the term of other holders.
    pub fn token(&self) -> &CancellationToken {
        &self.inner.token
    }

    /// Completes when the term ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the term.
    pub async fn cancelled(&self) {
        self.inner.token.cancelled().await
    }

    /// Why the term ended, or `None` while it is live.
    pub fn end(&self) -> Option<TermEnd> {
        if let Some(end) = self.inner.end.get() {
            return Some(*end);
        }
        if let Some(end) = self.inner.of.as_ref().and_then(|term| term.end.get()) {
            return Some(*end);
        }
        // Only a parent's cancellation, or the holder's own, reaches the token without an
        // `end` set first.
        self.inner
            .token
            .is_cancelled()
            .then(|| *self.inner.end.get_or_init(|| TermEnd::ParentCancelled))
    }
}

fn finish(inner: &TermInner, end: TermEnd) {
    // `end` is set before the token is cancelled, so whoever wakes on the token reads the
    // cause. A token cancelled already was cancelled by a parent.
    inner.end.get_or_init(|| {
        if inner.token.is_cancelled() {
            TermEnd::ParentCancelled
        } else {
            end
        }
    });
    // Linked terms end first, so whoever wakes on this token finds them ended too.
    let linked = std::mem::take(&mut *lock(&inner.linked));
    for child in linked.iter().filter_map(Weak::upgrade) {
        finish(&child, end);
    }
    inner.token.cancel();
}

/// Locks a mutex that guards no invariant a panic could break.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("is_leader", &self.is_leader())
            .field("end", &self.end())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_term_is_born_ended() {
        let term = Term::not_leader();
        assert!(!term.is_leader());
        assert!(term.token().is_cancelled());
        assert_eq!(term.end(), Some(TermEnd::NotLeader));
    }

    #[test]
    fn finishing_sets_the_cause_once_and_cancels() {
        let term = Term::leading(None);
        assert!(term.is_leader());
        assert_eq!(term.end(), None);
        term.finish(TermEnd::Shutdown);
        term.finish(TermEnd::LeadershipLost);
        assert!(!term.is_leader());
        assert_eq!(term.end(), Some(TermEnd::Shutdown));
    }

    #[test]
    fn a_linked_term_ends_with_its_term_or_its_parent() {
        let term = Term::leading(None);
        let parent = CancellationToken::new();
        let child = term.linked_to(&parent);
        assert!(child.is_leader());
        parent.cancel();
        assert_eq!(child.end(), Some(TermEnd::ParentCancelled));
        assert!(term.is_leader(), "the parent does not end the term itself");

        let child = term.linked_to(&CancellationToken::new());
        term.finish(TermEnd::LeadershipLost);
        assert_eq!(child.end(), Some(TermEnd::LeadershipLost));

        let late = term.linked_to(&CancellationToken::new());
        assert_eq!(
            late.end(),
            Some(TermEnd::LeadershipLost),
            "linked after the end"
        );
    }

    #[test]
    fn a_handle_ends_with_its_term_but_cancelling_it_ends_only_the_handle() {
        let term = Term::leading(None);
        let (a, b) = (term.handle(), term.handle());
        a.token().cancel();
        assert_eq!(a.end(), Some(TermEnd::ParentCancelled));
        assert!(b.is_leader() && term.is_leader());
        term.finish(TermEnd::LeadershipLost);
        assert_eq!(b.end(), Some(TermEnd::LeadershipLost));
        assert!(b.token().is_cancelled());
    }

    #[test]
    fn a_handle_of_a_handle_is_a_handle_on_the_term() {
        let term = Term::leading(None);
        let first = term.handle();
        let second = first.handle();
        first.token().cancel();
        assert!(second.is_leader(), "cancelling one handle leaves the other");
        term.finish(TermEnd::Shutdown);
        assert_eq!(second.end(), Some(TermEnd::Shutdown));
    }

    #[test]
    fn linked_terms_that_were_dropped_are_pruned() {
        let term = Term::leading(None);
        for _ in 0..1000 {
            drop(term.linked_to(&CancellationToken::new()));
        }
        assert!(lock(&term.inner.linked).len() <= 1);
    }

    #[test]
    fn an_expired_lease_ends_leadership_in_the_term() {
        let lease = Arc::new(Lease::default());
        lease.hold_forever();
        let term = Term::leading(Some(lease.clone()));
        assert!(term.is_leader());
        lease.clear();
        assert!(!term.is_leader());
    }
}
