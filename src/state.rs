//! The state every clone of an elector shares, and the one place it changes: promotions and
//! demotions, the lease, the work in flight, a resign's cooldown and the `run` slot.
//!
//! # Invariants
//!
//! - A term is live only between a `promote` and the next `demote`; both take the term lock,
//!   so they are atomic with respect to each other, and the gauge and the change count move
//!   with them under it.
//! - The lease is cleared before a demoted term's token is cancelled: whoever is woken by the
//!   token already reads `is_leader() == false`.
//! - Subscribers see changes in order of their count: a change published late by a racing
//!   thread never replaces a later one.
//!
//! This module imports none of the handle, the builders or the election loops: they all
//! build on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::fence::FenceTarget;
use crate::in_flight::InFlight;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics::{Change, Metrics};
use crate::sync::lock;
use crate::term::{Born, DrainGrace, Leadership, Term, TermEnd};

/// The state every clone of an elector shares.
pub(crate) struct Shared {
    metrics: Option<Metrics>,
    /// Leading and not expired.
    lease: Arc<Lease>,
    /// The current term; a standby's ended term while not leading.
    term: Mutex<Term>,
    /// The one ended term every standby call hands out.
    standby_term: Term,
    /// Bumped at every promotion and demotion, for `Elector::wait_for_leadership`.
    changes: watch::Sender<Leadership>,
    /// How many promotions and demotions there were; bumped under the term lock.
    change_count: AtomicU64,
    /// One `run` at a time.
    running: AtomicBool,
    /// The missing `idle_session_timeout` has been warned about.
    warned_no_idle_session_timeout: AtomicBool,
    /// `do_work` calls and while-leader loops running now, for the drain.
    in_flight: InFlight,
    /// The local electors' epoch counter.
    local_epoch: AtomicU64,
    /// Bumped by `Elector::resign`; the running election answers on `resigned`.
    pub(crate) resign: watch::Sender<u64>,
    /// Bumped by the running election once it has handled a resign.
    pub(crate) resigned: watch::Sender<u64>,
    /// No new term before this instant (a resign's cooldown).
    not_before: Mutex<Option<tokio::time::Instant>>,
}

impl Shared {
    /// A standby's state, counting into `metrics` if it has them.
    pub(crate) fn new(metrics: Option<Metrics>) -> Self {
        Self {
            metrics,
            lease: Arc::new(Lease::default()),
            term: Mutex::new(Term::not_leader()),
            standby_term: Term::not_leader(),
            changes: watch::Sender::new(Leadership::default()),
            change_count: AtomicU64::new(0),
            running: AtomicBool::new(false),
            warned_no_idle_session_timeout: AtomicBool::new(false),
            in_flight: InFlight::default(),
            local_epoch: AtomicU64::new(0),
            resign: watch::Sender::new(0),
            resigned: watch::Sender::new(0),
            not_before: Mutex::new(None),
        }
    }

    /// Claims the single `run` slot; the returned guard frees it.
    pub(crate) fn claim_run(&self) -> Result<RunSlot<'_>, Error> {
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(Error::AlreadyRunning);
        }
        Ok(RunSlot(self))
    }

    /// Whether a `run` is in progress.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// PostgreSQL 13 and older have no `idle_session_timeout`: said once per elector.
    pub(crate) fn warn_no_idle_session_timeout(&self, key: LockKey) {
        if !self
            .warned_no_idle_session_timeout
            .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                key = %key,
                "the server has no idle_session_timeout (PostgreSQL 13 or older): a leader whose host vanishes keeps the lock until the server's TCP keepalives drop its session (about 5 intervals), and a frozen leader process keeps it until the process resumes"
            );
        }
    }

    /// The elector's metrics, if it has a registry.
    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// The next epoch of a local elector.
    pub(crate) fn next_local_epoch(&self) -> u64 {
        self.local_epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The current term: a handle on the live one while leading, else the standby's ended term.
    pub(crate) fn term(&self) -> Term {
        if !self.lease.is_live() {
            return self.standby_term.clone();
        }
        lock(&self.term).handle()
    }

    /// Like [`term`](Self::term), ending also when `parent` is cancelled.
    pub(crate) fn term_with(&self, parent: &CancellationToken) -> Term {
        if !self.lease.is_live() {
            return self.standby_term.clone();
        }
        lock(&self.term).linked_to(parent)
    }

    /// A receiver of every promotion and demotion.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.changes.subscribe()
    }

    /// Keeps this replica from leading until `until` (or a later instant already set).
    pub(crate) fn cool_down_until(&self, until: tokio::time::Instant) {
        let mut not_before = lock(&self.not_before);
        *not_before = Some(not_before.map_or(until, |t| t.max(until)));
    }

    /// Whether a resign's cooldown still keeps this replica from leading.
    pub(crate) fn cooling_down(&self) -> bool {
        lock(&self.not_before).is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// When the cooldown ends, if one was set.
    pub(crate) fn cooldown_end(&self) -> Option<tokio::time::Instant> {
        *lock(&self.not_before)
    }

    /// Tells the running election (and a resign waiting for it) that a resign was asked.
    pub(crate) fn ask_resign(&self) {
        self.resign.send_modify(|n| *n += 1);
    }

    /// Tells a waiting resign that the running election has handled it.
    pub(crate) fn resign_handled(&self) {
        self.resigned.send_modify(|n| *n += 1);
    }

    fn set_gauge(&self, leading: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.set_leading(leading);
        }
    }

    /// Starts a new term holding the lease `hold` sets, with `epoch` and, for fenced writes,
    /// `fence`, unless a term is live. The term lock makes promotions and demotions atomic with
    /// respect to each other.
    pub(crate) fn promote(
        &self,
        hold: impl FnOnce(&Lease),
        epoch: Option<u64>,
        fence: Option<FenceTarget>,
    ) {
        let changes = {
            let mut current = lock(&self.term);
            if current.end().is_none() {
                return;
            }
            hold(&self.lease);
            *current = Term::leading(Born {
                lease: Some(self.lease.clone()),
                epoch,
                fence,
                ..Born::default()
            });
            // Under the term lock, so that a racing demotion cannot leave the gauge at 1.
            self.set_gauge(true);
            if let (Some(metrics), Some(epoch)) = (&self.metrics, epoch) {
                metrics.set_epoch(epoch);
            }
            self.count_change(Change::Acquired)
        };
        self.publish(Leadership {
            is_leader: true,
            changes,
            last_end: None,
            loss_cause: None,
            epoch,
        });
    }

    /// Counts a promotion or demotion and returns its number; called under the term lock.
    fn count_change(&self, change: Change) -> u64 {
        if let Some(metrics) = &self.metrics {
            metrics.count(change);
        }
        self.change_count.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Tells subscribers, unless a later change was told already (two changes racing on two
    /// threads may publish in either order; the later one stays).
    fn publish(&self, next: Leadership) {
        self.changes.send_if_modified(|current| {
            let newer = next.changes > current.changes;
            if newer {
                *current = next;
            }
            newer
        });
    }

    /// Ends the current term, if one is live, with `end`. The lease goes first, so that
    /// whoever is woken by the term's token already reads `is_leader() == false`.
    pub(crate) fn demote(&self, end: TermEnd, change: Change) {
        self.demote_with(end, change, |_| ());
    }

    /// Ends the term gracefully before its work drains (its lock still held): the term's
    /// fence passes until the returned grace is dropped, before the unlock.
    pub(crate) fn demote_to_drain(&self, end: TermEnd, change: Change) -> DrainGrace {
        let mut grace = None;
        self.demote_with(end, change, |term| grace = Some(DrainGrace::of(term)));
        grace.unwrap_or_else(DrainGrace::none)
    }

    /// Ends the current term, with `before_end` called on it just before it ends.
    fn demote_with(&self, end: TermEnd, change: Change, before_end: impl FnOnce(&Term)) {
        let (term, changes) = {
            let mut current = lock(&self.term);
            if current.end().is_some() {
                return;
            }
            self.lease.clear();
            self.set_gauge(false);
            let ended = std::mem::replace(&mut *current, self.standby_term.clone());
            (ended, self.count_change(change))
        };
        let loss_cause = (end == TermEnd::LeadershipLost)
            .then(|| change.loss_cause())
            .flatten();
        before_end(&term);
        match end {
            TermEnd::LeadershipLost => term.finish_lost(loss_cause),
            _ => term.finish(end),
        }
        self.publish(Leadership {
            is_leader: false,
            changes,
            last_end: Some(end),
            loss_cause,
            epoch: None,
        });
    }
}

/// The claim on `run`; dropping it lets `run` be called again.
pub(crate) struct RunSlot<'a>(&'a Shared);

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}
