//! The check of the application pools: every connection answers `SELECT 1` within 1 s when
//! the soak probes it after a fault (see `soak/probes.rs`).

use super::{Analysis, Input, Violation};
use crate::faults::{Fault, Kind};
use crate::fleet::What;
use crate::probes::Sent;

/// A replica's answer to one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The probe's number.
    pub(crate) probe: usize,
    /// Connections that answered `SELECT 1` in time.
    pub(crate) answered: u32,
    /// Connections borrowed that did not answer within 1 s (closed by the probe).
    pub(crate) stuck: u32,
    /// Connections borrowed whose `SELECT 1` failed (a broken connection).
    pub(crate) failed: u32,
    /// Connections the probe could not borrow within 1 s.
    pub(crate) unborrowed: u32,
}

/// What the probes found.
#[derive(Clone, Debug, Default)]
pub(crate) struct Probes {
    /// Probes sent, answered.
    pub(crate) sent: usize,
    pub(crate) answered: usize,
    /// Connections that answered, failed, could not be borrowed, in all.
    pub(crate) connections: u32,
    pub(crate) failed: u32,
    pub(crate) unborrowed: u32,
    /// Probes a fault injected before the answer made moot.
    pub(crate) moot: usize,
}

/// Whether a fault other than the one probed for makes the probe moot: one on this replica or
/// the whole server (or a silent synchronous standby) injected between the probe and its
/// answer (`until`, [`answer_due`]), or one still in effect when it was sent that cuts this
/// replica off (its own partition or SIGSTOP) or the whole server (a restart, a failover):
/// the connections then cannot answer, whatever the library did.
pub(crate) fn moot(sent: &Sent, until: u64, faults: &[Fault]) -> bool {
    faults.iter().any(|g| {
        let here = g.replica == Some(sent.replica) || g.kind.server_wide();
        let bears = here || g.kind == Kind::SyncStandby;
        let meanwhile = bears && g.inject > sent.at && g.inject <= until;
        let cuts_off =
            (g.kind.partitions() || g.kind == Kind::Stop) && g.replica == Some(sent.replica);
        let hits = cuts_off || g.kind.server_wide();
        let in_effect = g.id != sent.fault && hits && g.inject <= sent.at && g.heal >= sent.at;
        meanwhile || in_effect
    })
}

/// Until when a probe's answer may be awaited: its answer, or (none came) the child's own
/// bounds on the probe (a borrow and a `SELECT 1`, each
/// [`PROBE_BOUND`](crate::app::PROBE_BOUND)) and a second of slack.
pub(crate) fn answer_due(sent: &Sent, answered_at: Option<u64>) -> u64 {
    let bound = crate::app::PROBE_BOUND.as_micros() as u64;
    answered_at.unwrap_or(sent.at + 2 * bound + 1_000_000)
}

/// One probe's verdict: the stuck connections it counts (0 when `moot`, or the replica ended or
/// froze before answering).
pub(crate) fn stuck(
    answer: Option<(u64, &Answer)>,
    moot: bool,
    gone_by: Option<u64>,
) -> Option<u32> {
    if moot {
        return None;
    }
    match answer {
        Some((_, a)) => Some(a.stuck),
        // No answer: the whole pool hung, unless the process ended (or froze) first.
        None if gone_by.is_some() => None,
        None => Some(crate::child::APP_POOL_SIZE as u32),
    }
}

/// Every probe: a stuck connection is a violation, attributed to the fault it follows.
pub(crate) fn check(input: &Input<'_>, a: &mut Analysis) {
    a.pool_stuck = vec![0; input.faults.len()];
    let mut p = Probes {
        sent: input.probes.len(),
        ..Probes::default()
    };
    for sent in input.probes {
        let answer = input.events.iter().find_map(|e| match e.what {
            What::Pool(ans) if e.replica == sent.replica && ans.probe == sent.id => {
                Some((e.at, ans))
            }
            _ => None,
        });
        let gone_by = input.events.iter().find_map(|e| {
            let gone = matches!(e.what, What::Killed | What::Exited | What::Stopped);
            (gone && e.replica == sent.replica && e.at >= sent.at).then_some(e.at)
        });
        if let Some((_, ans)) = &answer {
            p.answered += 1;
            p.connections += ans.answered;
            p.failed += ans.failed;
            p.unborrowed += ans.unborrowed;
        }
        let until = answer_due(sent, answer.as_ref().map(|(at, _)| *at));
        let moot = moot(sent, until, input.faults);
        let Some(n) = stuck(answer.as_ref().map(|(t, a)| (*t, a)), moot, gone_by) else {
            p.moot += 1;
            continue;
        };
        if n == 0 {
            continue;
        }
        a.pool_stuck[sent.fault] += u64::from(n);
        let f = &input.faults[sent.fault];
        a.violations.push(Violation {
            at: sent.at,
            what: format!(
                "{n} connection(s) of replica-{}'s application pool did not answer SELECT 1 \
                 within 1 s, {} fault #{} ({}){}",
                sent.replica,
                if sent.during {
                    "idle in the pool during"
                } else {
                    "one interval after the heal of"
                },
                f.id,
                f.kind.name(),
                if answer.is_none() {
                    ": the probe got no answer at all"
                } else {
                    ""
                }
            ),
            lane: 0,
            fault: Some(sent.fault),
            replicas: vec![sent.replica],
        });
    }
    a.probes = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(at: u64) -> Sent {
        Sent {
            id: 0,
            fault: 0,
            replica: 1,
            at,
            during: false,
        }
    }

    fn answer(stuck: u32) -> Answer {
        Answer {
            probe: 0,
            answered: 2 - stuck,
            stuck,
            failed: 0,
            unborrowed: 0,
        }
    }

    fn fault(id: usize, replica: Option<usize>, inject: u64, heal: u64) -> Fault {
        let kind = if replica.is_some() {
            Kind::Partition
        } else {
            Kind::RestartFast
        };
        let mut f = Fault::instant(kind, replica, false, inject);
        f.id = id;
        f.heal = heal;
        f
    }

    #[test]
    fn a_stuck_connection_counts_unless_another_fault_explains_it() {
        let a = answer(1);
        let own = fault(0, Some(1), 50, 2_000);
        assert!(
            !moot(&sent(100), 900, std::slice::from_ref(&own)),
            "the fault probed for"
        );
        assert_eq!(stuck(Some((900, &a)), false, None), Some(1));
        assert!(
            moot(&sent(100), 900, &[own.clone(), fault(1, Some(1), 500, 500)]),
            "a fault on this replica injected while the probe ran"
        );
        assert!(
            !moot(&sent(100), 900, &[own.clone(), fault(1, Some(2), 500, 500)]),
            "a fault on another replica injected while the probe ran"
        );
        assert_eq!(
            answer_due(&sent(100), None),
            3_000_100,
            "no answer: the probe's bounds"
        );
        assert!(
            moot(
                &sent(100),
                900,
                &[own.clone(), fault(1, Some(1), 90, 3_000)]
            ),
            "this replica partitioned just before the probe"
        );
        assert!(
            moot(&sent(100), 900, &[own.clone(), fault(1, None, 90, 3_000)]),
            "the server restarting"
        );
        assert!(
            !moot(
                &sent(100),
                900,
                &[own.clone(), fault(1, Some(2), 90, 3_000)]
            ),
            "another replica partitioned"
        );
        assert!(
            !moot(&sent(100), 900, &[own, fault(1, Some(1), 10, 60)]),
            "healed before the probe"
        );
        assert_eq!(stuck(Some((900, &answer(0))), false, None), Some(0));
        assert_eq!(stuck(Some((900, &a)), true, None), None);
    }

    #[test]
    fn no_answer_is_the_whole_pool_stuck_unless_the_replica_went_first() {
        assert_eq!(
            stuck(None, false, None),
            Some(crate::child::APP_POOL_SIZE as u32)
        );
        assert_eq!(stuck(None, false, Some(300)), None);
    }
}
