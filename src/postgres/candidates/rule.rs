//! What a leader does with what it read of the candidates, and when a standby says it is
//! alive: plain state, no I/O.

use std::time::Duration;

use tokio::time::Instant;

/// What a leader's look at the candidates table found (its own row left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Look {
    /// The highest preference among the live standbys that registered.
    pub(crate) best: Option<u64>,
    /// A handover asked from outside, to a live standby.
    pub(crate) requested: Option<Request>,
    /// This leader's own row carried a handover asked to it: it took the lead on request.
    pub(crate) asked_for_me: bool,
    /// A live row with this leader's identity was there (and is gone now).
    pub(crate) own_row_live: bool,
}

/// A handover asked from outside: to whom, and how long the leader then stays away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) target: String,
    pub(crate) stay_away: Duration,
}

/// Why a leader gives up its term to another replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Yield {
    /// A live standby prefers to lead more than this leader does.
    ToPreferred {
        /// Its preference.
        best: u64,
    },
    /// A handover was asked from outside; this replica stays away (see [`StayAway`]).
    OnRequest(Request),
}

/// A replica that handed over on request stands by without trying for the time asked, but
/// no longer than its target may still take or keep the lead: it stands by again as soon as
/// the target is neither live nor leading (killed, frozen or cut off before it led), or has
/// led and no longer does (it lost its term). A look that got no answer changes nothing.
/// Plain state; the standby looks at the target every interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StayAway {
    target: String,
    until: Instant,
    target_led: bool,
}

/// What a staying-away replica saw of its handover's target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TargetSeen {
    /// It holds the lock.
    pub(crate) leads: bool,
    /// Its row says it is a live standby.
    pub(crate) live: bool,
}

impl StayAway {
    /// Staying away from `now` for the request's time.
    pub(crate) fn new(request: Request, now: Instant) -> Self {
        Self {
            until: crate::lease::instant_after(now, request.stay_away),
            target: request.target,
            target_led: false,
        }
    }

    /// The identity of the replica the lead was handed to.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Whether this replica still stays away at `now`, after `seen` (`None`: no answer).
    pub(crate) fn still(&mut self, now: Instant, seen: Option<TargetSeen>) -> bool {
        if now >= self.until {
            return false;
        }
        let Some(seen) = seen else {
            return true;
        };
        if seen.leads {
            self.target_led = true;
            return true;
        }
        // It led, and no longer does: its term is over. Or it never led and is gone.
        !self.target_led && seen.live
    }
}

/// What a leader knows of its term across its looks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Standing {
    /// The term began with a handover asked to this replica: preferences do not move it
    /// again (a request to a named standby would otherwise last one check whenever a more
    /// preferred one is live); only another request, or the term's end, does.
    pub(crate) on_request: bool,
    /// The lock session's lock waits are bounded (see `bound_lock_waits`).
    pub(crate) waits_bounded: bool,
    /// Looks taken in this term.
    pub(crate) looks: u32,
}

impl Standing {
    /// Counts `look` and says whether it shows another live replica of this key with this
    /// leader's identity: a live row of that identity after the term's first look (which
    /// drops the row this replica wrote as a standby) was written by another replica, which
    /// a leader does not do. (One exception, rare: an upsert this replica sent as a standby,
    /// dropped when its waiting session was granted the lock, that the server ran only after
    /// the first look, queued behind a lock of the table.)
    pub(crate) fn duplicate(&mut self, look: &Look) -> bool {
        self.looks = self.looks.saturating_add(1);
        self.looks > 1 && look.own_row_live
    }

    /// Whether a leader of preference `own` hands over after `look`: on a request, whatever
    /// the preferences; otherwise only to a strictly more preferred live standby, so that
    /// equal preferences never move the lead, and never in a term taken on request.
    pub(crate) fn after(&mut self, look: &Look, own: u64) -> Option<Yield> {
        self.on_request |= look.asked_for_me;
        if let Some(request) = &look.requested {
            return Some(Yield::OnRequest(request.clone()));
        }
        match look.best {
            Some(best) if best > own && !self.on_request => Some(Yield::ToPreferred { best }),
            _ => None,
        }
    }
}

/// How long a standby with a preference stays quiet (says nothing of itself, so no leader
/// hands over to it) after it could not keep the lead it was handed: a grant it had to give
/// back, a try that failed once the lock was free and left to it, or a term lost soon after
/// it began (behind a transaction pooler, a fencing table it may not write, a server that
/// drops it). Without it such a replica would take the lead from a healthy leader, lose it,
/// and take it again, every couple of intervals. It doubles at each failure, from four
/// intervals to 256; a term that lasted starts the record over, and every
/// [`GOOD_TRIES_PER_FAILURE`] good tries after the quiet time take one failure off it. A try
/// that failed before it came near the lock (no pool connection, a refused connection, a
/// question that got no answer) is no such failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    failures: u32,
    quiet_until: Option<Instant>,
    /// Good tries since the quiet time ended (or since the last failure).
    good_tries: u32,
}

/// The most doublings of the quiet time (4·I · 2⁶ = 256·I).
const MAX_DOUBLINGS: u32 = 6;

/// A term lost sooner than this many intervals after it began counts as a failure.
pub(crate) const SHORT_TERM_INTERVALS: u32 = 10;

/// Good tries, once the quiet time is over, that take one failure off the record: a replica
/// that could not keep the lead a few times and then answers well for a while is back to a
/// short quiet time after a few minutes at most, not after its next lasting term.
const GOOD_TRIES_PER_FAILURE: u32 = 10;

impl Backoff {
    /// A lead this replica could not keep, at `now`.
    pub(crate) fn failed(&mut self, now: Instant, interval: Duration) {
        let quiet = 4 * interval * 2u32.pow(self.failures.min(MAX_DOUBLINGS));
        self.failures = self.failures.saturating_add(1);
        self.quiet_until = Some(crate::lease::instant_after(now, quiet));
        self.good_tries = 0;
    }

    /// A try that got an answer a replica able to lead gets, at `now`: once the quiet time is
    /// over, every [`GOOD_TRIES_PER_FAILURE`] of them take one failure off the record.
    pub(crate) fn tried_well(&mut self, now: Instant) {
        if self.failures == 0 || self.quiet(now) {
            return;
        }
        self.good_tries += 1;
        if self.good_tries >= GOOD_TRIES_PER_FAILURE {
            self.failures -= 1;
            self.good_tries = 0;
        }
    }

    /// A term that lasted: the record starts over.
    pub(crate) fn held(&mut self) {
        *self = Self::default();
    }

    /// Whether this replica stays quiet at `now`.
    pub(crate) fn quiet(&self, now: Instant) -> bool {
        self.quiet_until.is_some_and(|until| now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(best: Option<u64>) -> Look {
        Look {
            best,
            ..Look::default()
        }
    }

    #[test]
    fn a_replica_that_cannot_keep_the_lead_stays_quiet_longer_each_time() {
        let interval = Duration::from_secs(1);
        let start = Instant::now();
        let mut backoff = Backoff::default();
        assert!(!backoff.quiet(start));
        let mut quiet = Vec::new();
        for _ in 0..9 {
            backoff.failed(start, interval);
            let secs = (1..=300)
                .find(|&s| !backoff.quiet(start + Duration::from_secs(s)))
                .unwrap();
            quiet.push(secs);
        }
        assert_eq!(quiet, vec![4, 8, 16, 32, 64, 128, 256, 256, 256]);
        backoff.held();
        assert!(!backoff.quiet(start));
        backoff.failed(start, interval);
        assert!(backoff.quiet(start + Duration::from_secs(3)));
        assert!(!backoff.quiet(start + Duration::from_secs(4)));
    }

    /// The quiet time `backoff` would start with a failure at `at`, in whole seconds of I = 1 s.
    fn next_quiet(mut backoff: Backoff, at: Instant) -> u64 {
        backoff.failed(at, Duration::from_secs(1));
        (1..=300)
            .find(|&s| !backoff.quiet(at + Duration::from_secs(s)))
            .unwrap()
    }

    #[test]
    fn good_tries_after_the_quiet_time_bring_the_count_back_down() {
        let interval = Duration::from_secs(1);
        let start = Instant::now();
        let mut backoff = Backoff::default();
        for _ in 0..4 {
            backoff.failed(start, interval);
        }
        assert_eq!(
            next_quiet(backoff, start),
            64,
            "four failures: the fifth is 64·I"
        );
        // Good tries while still quiet count for nothing.
        let quiet_end = start + Duration::from_secs(32);
        for _ in 0..50 {
            backoff.tried_well(start + Duration::from_secs(1));
        }
        assert_eq!(next_quiet(backoff, quiet_end), 64);
        // Ten good tries after it take one failure off; forty, all four.
        for n in 1..=40u32 {
            backoff.tried_well(quiet_end + Duration::from_secs(n.into()));
            if n == 10 {
                assert_eq!(next_quiet(backoff, quiet_end), 32, "one failure off");
            }
        }
        assert_eq!(
            next_quiet(backoff, quiet_end),
            4,
            "the record is clean again"
        );
        // A failure in between starts the count of good tries over.
        let mut again = Backoff::default();
        again.failed(start, interval);
        let later = start + Duration::from_secs(4);
        for n in 0..9 {
            again.tried_well(later + Duration::from_secs(n));
        }
        again.failed(later + Duration::from_secs(9), interval);
        let after = later + Duration::from_secs(9 + 8);
        for n in 0..9 {
            again.tried_well(after + Duration::from_secs(n));
        }
        assert_eq!(
            next_quiet(again, after),
            16,
            "two failures on record, none taken off"
        );
    }

    #[test]
    fn a_live_row_of_the_leaders_identity_after_its_first_look_is_a_duplicate() {
        let mut standing = Standing::default();
        let own = Look {
            own_row_live: true,
            ..Look::default()
        };
        assert!(
            !standing.duplicate(&own),
            "its own row from its standby days"
        );
        assert!(!standing.duplicate(&Look::default()));
        assert!(standing.duplicate(&own), "written by another replica since");
    }

    #[test]
    fn only_a_strictly_higher_preference_moves_the_lead() {
        let verdict = |best, own| Standing::default().after(&look(best), own);
        assert_eq!(verdict(None, 0), None);
        assert_eq!(verdict(Some(0), 0), None, "equal: no move");
        assert_eq!(verdict(Some(7), 7), None, "equal: no move");
        assert_eq!(verdict(Some(6), 7), None, "lower: no move");
        assert_eq!(verdict(Some(8), 7), Some(Yield::ToPreferred { best: 8 }));
        assert_eq!(
            verdict(Some(u64::MAX), u64::MAX - 1),
            Some(Yield::ToPreferred { best: u64::MAX })
        );
    }

    fn request(stay_away: Duration) -> Request {
        Request {
            target: "b".into(),
            stay_away,
        }
    }

    #[test]
    fn a_request_moves_the_lead_whatever_the_preferences() {
        let asked = Look {
            best: Some(0),
            requested: Some(request(Duration::from_secs(3))),
            ..Look::default()
        };
        let mut standing = Standing::default();
        assert_eq!(
            standing.after(&asked, u64::MAX),
            Some(Yield::OnRequest(request(Duration::from_secs(3))))
        );
    }

    #[test]
    fn a_stay_away_ends_when_the_target_is_gone_or_has_lost_its_term() {
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        let seen = |leads, live| Some(TargetSeen { leads, live });
        let away = || StayAway::new(request(Duration::from_secs(60)), start);
        // Killed, frozen or cut off before it led: not live, not leading.
        let mut before = away();
        assert!(
            before.still(at(1), seen(false, true)),
            "live: it may still take it"
        );
        assert!(before.still(at(2), None), "no answer: nothing changes");
        assert!(
            !before.still(at(3), seen(false, false)),
            "gone before it led"
        );
        // It led, then lost its term, live again or not.
        let mut after = away();
        assert!(after.still(at(1), seen(true, false)));
        assert!(after.still(at(30), seen(true, false)), "it keeps leading");
        assert!(!after.still(at(31), seen(false, true)), "its term is over");
        // The time asked is over, whatever the target does.
        let mut over = away();
        assert!(over.still(at(59), seen(true, false)));
        assert!(!over.still(at(60), seen(true, false)));
        assert_eq!(over.target(), "b");
    }

    #[test]
    fn a_term_taken_on_request_keeps_the_lead_against_preferences_not_against_requests() {
        let mut standing = Standing::default();
        let first = Look {
            best: Some(9),
            asked_for_me: true,
            ..Look::default()
        };
        assert_eq!(standing.after(&first, 1), None, "taken on request");
        assert_eq!(
            standing.after(&look(Some(9)), 1),
            None,
            "the row is gone, the standing stays"
        );
        let again = Look {
            requested: Some(request(Duration::from_secs(1))),
            ..look(Some(9))
        };
        assert_eq!(
            standing.after(&again, 1),
            Some(Yield::OnRequest(request(Duration::from_secs(1))))
        );
    }
}
