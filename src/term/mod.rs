//! Leadership terms.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio_util::sync::CancellationToken;

use crate::error::Fenced;
use crate::fence::FenceTarget;
use crate::lease::Lease;
use crate::sync::lock;

mod end;
#[cfg(test)]
mod tests;

pub use end::{LossCause, TermEnd};

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
    /// Why the last term was lost, when it ended with [`TermEnd::LeadershipLost`]; `None`
    /// otherwise.
    pub loss_cause: Option<LossCause>,
    /// The epoch of the current term, while leading with fencing (and in the local electors).
    pub epoch: Option<u64>,
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
/// follows within about a millisecond. Code that must never act after that instant checks
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
    /// Why the term was lost; set before `end`, and only with [`TermEnd::LeadershipLost`].
    loss: OnceLock<LossCause>,
    /// What the term was born with; shared by its handles and linked terms.
    born: Arc<Born>,
    /// Terms made by `term_with` from this one; they end when this one does.
    linked: Mutex<Vec<Weak<TermInner>>>,
    /// For a handle on a leadership term: that term, whose end is this one's.
    of: Option<Arc<TermInner>>,
}

/// What a term is born with.
#[derive(Debug, Default)]
pub(crate) struct Born {
    /// Whether this term was born leading; a standby's term is not.
    pub(crate) leader: bool,
    /// The replica's lease, which expires on its own clock.
    pub(crate) lease: Option<Arc<Lease>>,
    /// The term's fencing epoch, with fencing on (and in the local modes).
    pub(crate) epoch: Option<u64>,
    /// Where fenced writes check the epoch; `None` in the local modes and without fencing.
    pub(crate) fence: Option<FenceTarget>,
    /// The term ended gracefully and its lock is still held while its work drains: its
    /// fenced writes still pass (the epoch row is what fences them). See [`DrainGrace`].
    pub(crate) draining: std::sync::atomic::AtomicBool,
}

/// Held while a gracefully ended term's work drains, before its lock is given up: the
/// term's [`fence`](Term::fence) still passes meanwhile. Dropped (the drain over, the lock
/// lost, or the drain itself dropped), the fence fails again.
#[derive(Debug)]
pub(crate) struct DrainGrace(Option<Arc<Born>>);

impl DrainGrace {
    /// No grace (no term was ending).
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// The grace of `term`'s drain, when it led.
    pub(crate) fn of(term: &Term) -> Self {
        let born = &term.inner.born;
        if !born.leader {
            return Self(None);
        }
        born.draining
            .store(true, std::sync::atomic::Ordering::Release);
        Self(Some(born.clone()))
    }
}

impl Drop for DrainGrace {
    fn drop(&mut self) {
        if let Some(born) = &self.0 {
            born.draining
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

impl Term {
    /// A new live leadership term.
    pub(crate) fn leading(born: Born) -> Self {
        Self::new(
            CancellationToken::new(),
            Arc::new(Born {
                leader: true,
                ..born
            }),
        )
    }

    /// A term that was never a leader's: born ended with [`TermEnd::NotLeader`].
    pub(crate) fn not_leader() -> Self {
        let term = Self::new(CancellationToken::new(), Arc::default());
        term.finish(TermEnd::NotLeader);
        term
    }

    fn new(token: CancellationToken, born: Arc<Born>) -> Self {
        Self {
            inner: Arc::new(TermInner {
                token,
                end: OnceLock::new(),
                loss: OnceLock::new(),
                born,
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
                loss: OnceLock::new(),
                born: term.born.clone(),
                linked: Mutex::new(Vec::new()),
                of: Some(term.clone()),
            }),
        }
    }

    /// A term that ends when this one does or when `parent` is cancelled, whichever is first.
    pub(crate) fn linked_to(&self, parent: &CancellationToken) -> Self {
        let child = Self::new(parent.child_token(), self.inner.born.clone());
        let mut linked = lock(&self.inner.linked);
        match self.inner.end.get() {
            // Ended while we were linking: the child is born ended with the same cause.
            Some(end) => finish(&child.inner, *end, self.inner.loss.get().copied()),
            None => {
                linked.retain(|weak| weak.strong_count() > 0);
                linked.push(Arc::downgrade(&child.inner));
            }
        }
        child
    }

    /// Ends the term and every term linked to it, with `end` unless it already ended.
    pub(crate) fn finish(&self, end: TermEnd) {
        finish(&self.inner, end, None);
    }

    /// Ends the term and every term linked to it with [`TermEnd::LeadershipLost`] and `cause`,
    /// unless it already ended.
    pub(crate) fn finish_lost(&self, cause: Option<LossCause>) {
        finish(&self.inner, TermEnd::LeadershipLost, cause);
    }

    /// Whether this replica still leads in this term: the term is live, and the replica's
    /// local lease has not expired.
    ///
    /// Once false, it stays false for this term; a later term is a new `Term`.
    #[inline]
    pub fn is_leader(&self) -> bool {
        let born = &*self.inner.born;
        born.leader
            && !self.inner.token.is_cancelled()
            && born.lease.as_ref().is_none_or(|lease| lease.is_live())
    }

    /// This term's fencing epoch: a number that grows with every new term of this key, across
    /// replicas, server restarts and database failovers. `Some` on the leader of an elector
    /// built with [`fencing(true)`](crate::ElectorBuilder::fencing), and in the local electors
    /// (which count their own terms, 1, 2, 3…, so fenced code can be unit-tested without a
    /// database); `None` otherwise and on a standby.
    ///
    /// From the database, an epoch is at least the server's clock when the term began, in
    /// milliseconds since 1970: the larger of that and the previous epoch + 1. So epochs are
    /// large numbers (13 digits, such as `1796305008180`), always increasing but with gaps,
    /// never 1, 2, 3: compare them, do not count them.
    ///
    /// The clock is what keeps them increasing across a failover to a standby that had not
    /// received the latest epochs (asynchronous replication): the promoted server's first term
    /// reads its own clock, later than the old primary's clock at the last term it began, as
    /// long as the promoted server's clock is behind the old primary's by less than the time
    /// between those two terms (at least the failover's duration, typically seconds). Keep
    /// the servers' clocks synchronized (NTP).
    pub fn epoch(&self) -> Option<u64> {
        self.inner.born.epoch
    }

    /// Checks, inside the caller's transaction, that this term is still the current one, so
    /// that the transaction's writes cannot commit after a later term has begun.
    ///
    /// Call it in the same transaction as the writes, before them, and commit after. It locks
    /// the key's epoch row `FOR SHARE` until the transaction ends, which makes the next
    /// leader's term wait for this transaction before it starts: fenced writes of two terms
    /// never interleave. So keep fenced transactions short, and give the application's pool an
    /// `idle_in_transaction_session_timeout`, or an abandoned transaction of a deposed leader
    /// holds the next term back (its bump waits at most one check interval, then the lock is
    /// given back and tried again).
    ///
    /// A graceful handover (shutdown, [`resign`](crate::Elector::resign), a handover to a
    /// preferred standby, a shard moving)
    /// ends the term first and then waits for its work; while that work drains, the lock is
    /// still held and no later term can have begun, so `fence` still passes for it and a
    /// fenced job cut by a deploy can finish its writes. Once the lock is given up (or lost,
    /// or the drain timeout reached) it fails.
    ///
    /// In the local electors it only checks that the term is live (there is no epoch row).
    ///
    /// ```no_run
    /// # async fn sweep(elector: pg_elector::Elector, pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
    /// elector
    ///     .do_work(|term| async move {
    ///         let mut client = pool.get().await?;
    ///         let tx = client.transaction().await?;
    ///         term.fence(&tx).await?; // fails once another term has begun
    ///         tx.execute("DELETE FROM invitations WHERE expires < now()", &[]).await?;
    ///         tx.commit().await?;
    ///         Ok::<_, Box<dyn std::error::Error>>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Fenced`] when the term has ended (and is not draining gracefully), a later term's
    /// epoch is in the row, the elector has
    /// no fencing, or the check query failed. Roll the transaction back (dropping it does).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction in an unknown state: roll it back.
    pub async fn fence(&self, tx: &tokio_postgres::Transaction<'_>) -> Result<(), Fenced> {
        let born = &*self.inner.born;
        let ours = born.epoch;
        if !self.may_write() {
            return Err(Fenced::term_ended(ours));
        }
        let Some(ours) = ours else {
            return Err(Fenced::not_fenced());
        };
        if let Some(target) = &born.fence {
            target.check(tx, ours).await?;
        }
        // The row was current; the term must still be live (or draining) too: the lock may
        // have gone while the check ran, before any new term could bump the row.
        if !self.may_write() {
            return Err(Fenced::term_ended(Some(ours)));
        }
        Ok(())
    }

    /// Whether the term's fenced writes may go on: it leads, or it ended gracefully and its
    /// lock is still held while its work drains.
    fn may_write(&self) -> bool {
        self.is_leader()
            || self
                .inner
                .born
                .draining
                .load(std::sync::atomic::Ordering::Acquire)
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

    /// Why the leadership of this term was lost: `Some` when [`end`](Self::end) is
    /// [`TermEnd::LeadershipLost`], `None` otherwise (live, shut down, resigned, ...).
    pub fn loss_cause(&self) -> Option<LossCause> {
        if self.end() != Some(TermEnd::LeadershipLost) {
            return None;
        }
        self.inner
            .loss
            .get()
            .or_else(|| self.inner.of.as_ref().and_then(|term| term.loss.get()))
            .copied()
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

fn finish(inner: &TermInner, end: TermEnd, cause: Option<LossCause>) {
    // The loss cause is set before `end`, and `end` before the token is cancelled, so whoever
    // reads the end, or wakes on the token, reads the cause too. A token cancelled already
    // was cancelled by a parent.
    if let Some(cause) = cause.filter(|_| {
        end == TermEnd::LeadershipLost && inner.end.get().is_none() && !inner.token.is_cancelled()
    }) {
        let _ = inner.loss.set(cause);
    }
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
        finish(&child, end, cause);
    }
    inner.token.cancel();
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("is_leader", &self.is_leader())
            .field("end", &self.end())
            .finish()
    }
}
