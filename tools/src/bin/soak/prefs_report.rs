//! The report's part on preferences (`--preferences`): the bounds of the column "heal → most
//! preferred leads" as the docs state them (or as its words give them), the preferences the
//! replicas had, the handover requests and what they cost.

use std::fmt::Write as _;

use pg_elector_tools::stats::summary;

use crate::check::{Analysis, ProcInfo};
use crate::faults::{Fault, Kind};
use crate::handover::Answer;
use crate::options::Options;

fn ms(us: u64) -> String {
    format!("{:.0}", us as f64 / 1e3)
}

/// The bound of the column "heal → most preferred leads" for `kind` (docs/preferences.md;
/// each gets the slack and the machine's stalls; the drain is the rest of a run of the
/// schedule's in progress).
pub(crate) fn bound_text(kind: Kind) -> &'static str {
    match kind {
        Kind::HandoverLive => "request → target: 2·I + drain, fast 3·I + drain",
        Kind::HandoverDying => "3·I + one try + drain, then a move",
        Kind::HandoverMissing => "nothing changes",
        Kind::Partition | Kind::LongPartition => "heal + 4·I + drain + 2 tries",
        Kind::Resign => "cooldown's end + 4·I + drain",
        _ => "heal + 4·I + drain",
    }
}

/// Appends the part on preferences.
pub(crate) fn render(
    out: &mut String,
    options: &Options,
    faults: &[Fault],
    procs: &[ProcInfo],
    a: &Analysis,
) {
    let p = &a.prefs;
    let i = options.interval.as_millis();
    let (stay_away, every) = crate::check::prefs::asked();
    let try_ms = crate::faults::try_bound(options.interval).as_millis();
    let prefs: Vec<u64> = procs.iter().filter_map(|q| q.preference).collect();
    let _ = writeln!(
        out,
        "- Preferences (docs/preferences.md): the first {} replicas drew theirs from 1 to 3; every \
         replica a fault started again came as a pod of the latest release, one in three of a new \
         one (a rolling deploy): {} processes, preferences {} to {}. Who is live is the library's \
         own `pg_elector_candidates` row, read every {} ms ({} reads). Bounds of the column *heal → \
         most preferred leads* (I = {i} ms; one try = I + max(I, 1 s) = {try_ms} ms, \
         `MIN_TRY_BOUND`): after a fault heals, **4·I plus the leader's drain**, plus one try per \
         connection of the elector's pool (2) after a cut link (docs: \"the most preferred live \
         replica has the lead within 4·I plus the leader's drain (plus one bounded try for each \
         pool connection that the cut left dead)\"), or the fault's leaderless bound if later; a \
         more preferred standby turning live moves the lead within **2·I plus the drain** (3·I \
         with fast takeover: \"counted from the standby's first try, the move takes at most two \
         intervals plus the drain\"); a request to a live target: the target leads within **2·I \
         plus the drain** (3·I when it runs fast takeover: the leader \"sees the request at its \
         next check and hands over as above\"); a request to a target killed right after it: \
         no leader for at most **3·I and one try** (\"a target that dies leaves the key without \
         a leader for at most 3·I and one try\", from the request; then a move, 2·I plus the \
         drain, as the docs state for any handover). The drain is the rest of a run of the \
         schedule's in progress (a tick's takes milliseconds). A term taken on request keeps the \
         lead against preferences until it ends (a term of the target a request named, or one \
         begun while the candidates table showed a request pending for its replica). Stretches of reads where the most preferred \
         live replica did not lead: {}, the longest {} ms; each must fall within these bounds \
         (+ slack and stalls), which covered {:.0} % of the run.",
        options.replicas,
        prefs.len(),
        prefs.iter().min().copied().unwrap_or(0),
        prefs.iter().max().copied().unwrap_or(0),
        every.as_millis(),
        p.reads,
        p.stretches.0,
        ms(p.stretches.1),
        p.allowed_share * 100.0,
    );
    let count = |kind: Kind, answer: &Answer| {
        p.answers
            .iter()
            .filter(|(k, a)| *k == kind && a == answer)
            .count()
    };
    let others = |kind: Kind| {
        p.answers
            .iter()
            .filter(|(k, a)| *k == kind && matches!(a, Answer::Other(_)))
            .count()
    };
    let requests = |kind: Kind| faults.iter().filter(|f| f.kind == kind).count();
    let dying_leaderless: Vec<u64> = faults
        .iter()
        .filter(|f| {
            f.kind == Kind::HandoverDying
                && f.handover
                    .as_ref()
                    .is_some_and(|h| h.answer == Answer::Made)
        })
        .filter_map(|f| a.leaderless.get(f.id).copied())
        .collect();
    let _ = writeln!(
        out,
        "- Handover requests (`request_handover`, stay-away {} s, on the soak's own pool): to a \
         live target {} (made {}, refused as no such standby {}, no leader {}, timed out {}, \
         other errors {}), its target leading after p50 / p99 / max {} ms (bound 2·I + drain, 3·I \
         + drain with fast takeover, + slack; {} cut short by another fault); to a target killed \
         right after the request {} (made {}), leaderless p50 / p99 / max {} ms (bound 3·I + one \
         try + drain = {} ms + drain, + slack); to a missing identity {}: refused with \
         `HandoverError::NoSuchStandby` {}, no leader {}, timed out {}, other errors {}, accepted {} \
         (a violation).",
        stay_away.as_secs(),
        requests(Kind::HandoverLive),
        count(Kind::HandoverLive, &Answer::Made),
        count(Kind::HandoverLive, &Answer::NoSuchStandby),
        count(Kind::HandoverLive, &Answer::NoLeader),
        count(Kind::HandoverLive, &Answer::Timeout),
        others(Kind::HandoverLive),
        summary(p.target_led.clone(), ms),
        p.target_cut,
        requests(Kind::HandoverDying),
        count(Kind::HandoverDying, &Answer::Made),
        summary(dying_leaderless, ms),
        3 * i + try_ms,
        requests(Kind::HandoverMissing),
        count(Kind::HandoverMissing, &Answer::NoSuchStandby),
        count(Kind::HandoverMissing, &Answer::NoLeader),
        count(Kind::HandoverMissing, &Answer::Timeout),
        others(Kind::HandoverMissing),
        count(Kind::HandoverMissing, &Answer::Made),
    );
    let _ = writeln!(
        out,
        "- What a handover request cost (live and missing targets, from just before the request to \
         one interval after the target led; {} of {} with no other fault meanwhile, which are \
         judged): logins through the replicas' proxies per request p50 / p99 / max {}; pool \
         connections of other standbys replaced meanwhile (there before, gone after, one born), \
         max {} (bound 0: \"a handover costs the other standbys no logins\"; a connection born \
         with none gone replaces one an earlier fault ended, found dead when borrowed); lock or waiting sessions born meanwhile, max {} (bound 4: \
         the target's lock session and the key's three waiting slots); replicas' backends gained \
         over a request, max {}.",
        p.costs.0,
        p.costs.1,
        summary(p.logins.clone(), |n| n.to_string()),
        p.pool_logins_max,
        p.session_logins_max,
        p.backends_gained_max,
    );
}
