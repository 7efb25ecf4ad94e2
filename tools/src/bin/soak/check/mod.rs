//! The checks, run once the faults are over, on what was seen from outside the replicas:
//! their reports, the `pg_locks` samples and the rows written.

use std::time::Duration;

mod excuses;
pub(crate) mod failover;
mod intervals;
mod lanes;
mod lead;
mod leaders;
pub(crate) mod pool;
pub(crate) mod prefs;
mod resources;
mod rows;
mod runs;

pub(crate) use runs::runs as job_runs;

use crate::db::{Row, Run};
use crate::faults::{Fault, Kind};
use crate::fleet::{Event, What};
use crate::options::Options;

use excuses::Excuses;
pub(crate) use intervals::Iv;
use intervals::within;
pub(crate) use lanes::analyse_shards;
use lead::{Lead, leadership};
use rows::rows;

/// Something the docs say cannot happen, or a bound missed.
#[derive(Clone, Debug)]
pub(crate) struct Violation {
    /// When (µs, this machine's clock).
    pub(crate) at: u64,
    /// What happened.
    pub(crate) what: String,
    /// The lane (the shard in shard mode; 0 in key mode).
    pub(crate) lane: usize,
    /// The fault it is attributed to.
    pub(crate) fault: Option<usize>,
    /// The replica processes involved (for the log excerpts).
    pub(crate) replicas: Vec<usize>,
}

/// A replica process as the checks need it.
#[derive(Clone, Debug)]
pub(crate) struct ProcInfo {
    /// Its slot.
    pub(crate) slot: usize,
    /// When it was spawned.
    pub(crate) spawned: u64,
    /// When it was killed or exited.
    pub(crate) ended: Option<u64>,
    /// RSS samples (µs, kB).
    pub(crate) rss: Vec<(u64, u64)>,
    /// Fast takeover.
    pub(crate) fast: bool,
    /// Its preference (`--preferences`).
    pub(crate) preference: Option<u64>,
}

/// The backends seen at a quiet moment.
#[derive(Clone, Debug)]
pub(crate) struct Checkpoint {
    /// When.
    pub(crate) at: u64,
    /// Per `application_name`, the checker's excluded.
    pub(crate) backends: Vec<(String, i64)>,
    /// The live replica processes then.
    pub(crate) live: Vec<usize>,
    /// With `--cluster`: the replicas' backends on the standby then.
    pub(crate) standby: Option<i64>,
}

/// Everything the checks read.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    /// The run's options.
    pub(crate) options: &'a Options,
    /// When the fleet started (µs, this machine).
    pub(crate) start: u64,
    /// When the checks end (after the last fault healed and the fleet settled).
    pub(crate) end: u64,
    /// Every event, in any order.
    pub(crate) events: &'a [Event],
    /// Every replica process, by index.
    pub(crate) procs: &'a [ProcInfo],
    /// Every fault, by id (in injection order).
    pub(crate) faults: &'a [Fault],
    /// The `pg_locks` and epoch samples of the key (server clock).
    pub(crate) runs: &'a [Run],
    /// The rows, ordered by `at`, then epoch (server clock).
    pub(crate) rows: &'a [Row],
    /// The server's clock minus this machine's (µs).
    pub(crate) offset: i64,
    /// The backends at quiet moments.
    pub(crate) checkpoints: &'a [Checkpoint],
    /// When the soak's own 1 ms sleeper ran more than 20 ms late (the machine stalled).
    pub(crate) stalls: &'a [Iv],
    /// The probes of the application pools.
    pub(crate) probes: &'a [crate::probes::Sent],
    /// Dues (and attempts) whose two runs may overlap, and until when the first may last: an
    /// asynchronous crash lost the claim ([`failover::overlaps_allowed`]).
    pub(crate) due_overlaps_allowed: &'a [(u64, u32, u64)],
    /// With `--preferences`: the reads of the live rows of the candidates table.
    pub(crate) candidates: &'a [crate::prefs::Sample],
    /// With `--preferences`: what the handover requests cost.
    pub(crate) handovers: &'a [crate::handover::Cost],
}

/// What the checks found.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    /// Every violation.
    pub(crate) violations: Vec<Violation>,
    /// Per fault: the time nobody led, from its injection to the next fault's.
    pub(crate) leaderless: Vec<u64>,
    /// Per fault: the time two replicas led at once, over the same span.
    pub(crate) two_leaders: Vec<u64>,
    /// Leaderless gaps no fault explains (a leader that stepped down by itself, within the
    /// allowance of 1·I + slack).
    pub(crate) unprovoked: Vec<Iv>,
    /// The first moment a replica may have led.
    pub(crate) first_leader: Option<u64>,
    /// Per fault: connections of an application pool stuck when probed after it.
    pub(crate) pool_stuck: Vec<u64>,
    /// The probes of the application pools.
    pub(crate) probes: pool::Probes,
    /// Per fault: two runs of one due at once attributed to it.
    pub(crate) due_overlaps: Vec<u64>,
    /// Two runs of one due at once where a runner had frozen (the docs' exception).
    pub(crate) due_overlaps_frozen: usize,
    /// Two runs of one due at once after an asynchronous crash lost its claim, the old run
    /// ending within its heartbeats' cut-off (the docs' asynchronous caveat).
    pub(crate) due_overlaps_lost_claim: usize,
    /// The schedule's runs, reruns among them, and runs longer than 3 s.
    pub(crate) job_runs: usize,
    pub(crate) reruns: usize,
    pub(crate) long_runs: usize,
    /// Rows checked, epochs seen, rows written while the sampled holder was another
    /// replica (within an allowance) or nobody.
    pub(crate) rows: usize,
    /// Distinct epochs in the rows.
    pub(crate) epochs: usize,
    /// Rows written while `pg_locks` showed another replica holding the lock, within the
    /// allowance.
    pub(crate) rows_other_holder: usize,
    /// Rows written while `pg_locks` showed nobody holding it.
    pub(crate) rows_no_holder: usize,
    /// Ticks refused by `Term::fence`.
    pub(crate) fence_refusals: usize,
    /// Per process living ≥ 30 s: (index, life, RSS after 10 s, last RSS) in µs and kB.
    pub(crate) rss: Vec<(usize, u64, u64, u64)>,
    /// Backends (total) at each checkpoint.
    pub(crate) backends: Vec<i64>,
    /// The most backends a live replica had at a checkpoint.
    pub(crate) backends_per_replica_max: i64,
    /// Two replicas leading at once within a fault's allowance: when, how long, who, and
    /// the fault.
    pub(crate) excused_overlaps: Vec<(Iv, Vec<usize>, Option<usize>)>,
    /// Sessions ended while their leader could not hear (fault id, and the freeze's or the
    /// partition's).
    pub(crate) deaf: Vec<(usize, usize)>,
    /// The machine's stalls: how many, their total and the longest (µs).
    pub(crate) stalls: (usize, u64, u64),
    /// With `--preferences`: who led against the preferences, and the handovers.
    pub(crate) prefs: prefs::Facts,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e3)
}

/// What every check reads.
#[derive(Debug)]
pub(super) struct Checker<'a> {
    input: &'a Input<'a>,
    /// The check interval I.
    i: Duration,
    /// The slack every bound gets (µs).
    slack: u64,
    lead: Lead,
    ex: Excuses,
}

impl Checker<'_> {
    /// The latest fault injected by `t`.
    fn latest_fault(&self, t: u64) -> Option<usize> {
        self.input
            .faults
            .iter()
            .rev()
            .find(|f| f.inject <= t)
            .map(|f| f.id)
    }

    /// Whether replica `p` could not hear the server at `t` (frozen or partitioned).
    fn deaf(&self, p: usize, t: u64) -> bool {
        self.input.faults.iter().any(|g| {
            (g.kind == Kind::Stop || g.kind.partitions())
                && g.replica == Some(p)
                && (g.inject..=g.heal).contains(&t)
        })
    }
}

/// Runs every check (key mode).
pub(crate) fn analyse(input: &Input<'_>) -> Analysis {
    analyse_lane(input, true)
}

/// Runs every check of one key; the resources' too when `resources`.
fn analyse_lane(input: &Input<'_>, resources: bool) -> Analysis {
    let i = input.options.interval;
    let slack = us(input.options.slack());
    let mut a = Analysis::default();
    let ex = Excuses::new(input, i, slack);
    let machine = &ex.machine;
    a.stalls = (
        machine.len(),
        within(machine, (0, u64::MAX)),
        machine.iter().map(|iv| iv.1 - iv.0).max().unwrap_or(0),
    );
    a.deaf = ex.deaf.clone();
    let checker = Checker {
        input,
        i,
        slack,
        lead: leadership(input),
        ex,
    };
    let leaderless = checker.nobody_led(&mut a);
    let two_ivs = checker.two_led(&mut a);
    checker.per_fault(&mut a, &leaderless, &two_ivs);
    checker.demotions(&mut a);
    checker.frozen(&mut a);
    if input.options.preferences {
        checker.preferences(&mut a);
    }
    rows(input, &checker.ex.overlap_excused, &mut a);
    a.fence_refusals = input
        .events
        .iter()
        .filter(|e| matches!(e.what, What::Fenced { .. }))
        .count();
    if resources {
        checker.memory(&mut a);
        checker.backends(&mut a);
        pool::check(input, &mut a);
        runs::check(input, &mut a);
    }
    a.violations.sort_by_key(|v| v.at);
    a
}

fn names(replicas: &[usize]) -> String {
    let names: Vec<String> = replicas.iter().map(|r| format!("replica-{r}")).collect();
    names.join(" and ")
}
