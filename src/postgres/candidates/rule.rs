//! What a leader does with what it read of the candidates, and when a standby says it is
//! alive: plain state, no I/O.

use std::time::Duration;

use tokio::time::Instant;

/// What a leader's look at the candidates table found (its own row left out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Look {
    /// The highest preference among the live standbys that registered.
    pub(crate) best: Option<u64>,
    /// A handover asked from outside, to a live standby: how long this leader then stays away.
    pub(crate) requested: Option<Duration>,
    /// This leader's own row carried a handover asked to it: it took the lead on request.
    pub(crate) asked_for_me: bool,
}

/// Why a leader gives up its term to another replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Yield {
    /// A live standby prefers to lead more than this leader does.
    ToPreferred {
        /// Its preference.
        best: u64,
    },
    /// A handover was asked from outside; this replica stays a standby this long.
    OnRequest { stay_away: Duration },
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
}

impl Standing {
    /// Whether a leader of preference `own` hands over after `look`: on a request, whatever
    /// the preferences; otherwise only to a strictly more preferred live standby, so that
    /// equal preferences never move the lead, and never in a term taken on request.
    pub(crate) fn after(&mut self, look: &Look, own: u64) -> Option<Yield> {
        self.on_request |= look.asked_for_me;
        if let Some(stay_away) = look.requested {
            return Some(Yield::OnRequest { stay_away });
        }
        match look.best {
            Some(best) if best > own && !self.on_request => Some(Yield::ToPreferred { best }),
            _ => None,
        }
    }
}

/// How long a standby with a preference stays quiet (says nothing of itself, so no leader
/// hands over to it) after it could not keep the lead it was handed: a grant it had to give
/// back, or a term lost soon after it began (behind a transaction pooler, a fencing table it
/// may not write, a server that drops it). Without it such a replica would take the lead
/// from a healthy leader, lose it, and take it again, every couple of intervals. It doubles
/// at each failure, from four intervals to 256, and ends after a term that lasted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    failures: u32,
    quiet_until: Option<Instant>,
}

/// The most doublings of the quiet time (4·I · 2⁶ = 256·I).
const MAX_DOUBLINGS: u32 = 6;

/// A term lost sooner than this many intervals after it began counts as a failure.
pub(crate) const SHORT_TERM_INTERVALS: u32 = 10;

impl Backoff {
    /// A lead this replica could not keep, at `now`.
    pub(crate) fn failed(&mut self, now: Instant, interval: Duration) {
        let quiet = 4 * interval * 2u32.pow(self.failures.min(MAX_DOUBLINGS));
        self.failures = self.failures.saturating_add(1);
        self.quiet_until = Some(crate::lease::instant_after(now, quiet));
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

    #[test]
    fn a_request_moves_the_lead_whatever_the_preferences() {
        let stay_away = Duration::from_secs(3);
        let asked = Look {
            best: Some(0),
            requested: Some(stay_away),
            asked_for_me: false,
        };
        assert_eq!(asked.requested, Some(stay_away));
        let mut standing = Standing::default();
        assert_eq!(
            standing.after(&asked, u64::MAX),
            Some(Yield::OnRequest { stay_away })
        );
    }

    #[test]
    fn a_term_taken_on_request_keeps_the_lead_against_preferences_not_against_requests() {
        let mut standing = Standing::default();
        let first = Look {
            best: Some(9),
            requested: None,
            asked_for_me: true,
        };
        assert_eq!(standing.after(&first, 1), None, "taken on request");
        assert_eq!(
            standing.after(&look(Some(9)), 1),
            None,
            "the row is gone, the standing stays"
        );
        let stay_away = Duration::from_secs(1);
        let again = Look {
            requested: Some(stay_away),
            ..look(Some(9))
        };
        assert_eq!(
            standing.after(&again, 1),
            Some(Yield::OnRequest { stay_away })
        );
    }
}
