//! What a leader does with what it read of the candidates: plain state, no I/O.

use std::time::Duration;

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
