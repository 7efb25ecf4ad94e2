//! The report: one markdown table per run, the summary lines, and the violations.

use std::fmt::Write as _;
use std::time::Duration;

use pg_elector_tools::stats::{percentile, summary};

use pg_elector_testkit::server::failover::Follow;

use crate::check::failover::Facts as FailoverFacts;
use crate::check::{Analysis, ProcInfo};
use crate::faults::{Fault, Kind};
use crate::options::{Options, Replication};

/// What the report says about the run besides the checks.
#[derive(Debug)]
pub(crate) struct Facts {
    /// `SHOW server_version`.
    pub(crate) server_version: String,
    /// Whether the server is the harness's own (else `DATABASE_URL`).
    pub(crate) private: bool,
    /// How long faults were injected.
    pub(crate) injected_for: Duration,
    /// The whole run, settling included.
    pub(crate) wall: Duration,
    /// When the injection started (µs), for the offsets of the violations.
    pub(crate) start: u64,
    /// `pg_locks` samples taken, and the sampler's reconnections.
    pub(crate) samples: (u64, u64),
    /// The server's clock minus this machine's (µs).
    pub(crate) offset: i64,
    /// Stalls of the soak's runtime, which runs the proxies: how many, the total and the
    /// longest (µs). Counted in the stalls of the analysis too.
    pub(crate) runtime_stalls: (usize, u64, u64),
}

/// A count that must be 0, in bold when it is not.
fn bold(n: u64) -> String {
    if n == 0 {
        "0".into()
    } else {
        format!("**{n}**")
    }
}

fn ms(us: u64) -> String {
    if us == 0 {
        "0".into()
    } else {
        format!("{:.0}", us as f64 / 1e3)
    }
}

/// The report, in markdown.
pub(crate) fn render(
    options: &Options,
    facts: &Facts,
    faults: &[Fault],
    procs: &[ProcInfo],
    a: &Analysis,
    failovers: &FailoverFacts,
) -> String {
    let r = Render {
        options,
        facts,
        faults,
        procs,
        a,
    };
    let mut out = String::new();
    r.header(&mut out);
    r.table(&mut out);
    r.facts(&mut out);
    r.memory(&mut out);
    r.overlaps(&mut out);
    r.deaf(&mut out);
    if options.preferences {
        crate::prefs_report::render(&mut out, options, faults, procs, a);
    }
    if let Some(replication) = options.cluster {
        failover_facts(&mut out, options, replication, failovers);
    }
    r.violations(&mut out);
    out
}

/// With `--cluster`: the failovers' own table, and what it does not show.
fn failover_facts(
    out: &mut String,
    options: &Options,
    replication: Replication,
    f: &FailoverFacts,
) {
    let ms = |us: u64| format!("{:.0}", us as f64 / 1e3);
    let lane = if options.shards > 0 { "shard" } else { "key" };
    let c = &f.counts;
    let dues = if options.shards > 0 {
        "- (shard mode)".to_owned()
    } else {
        format!("{} / {} / {}", f.lost_claims.len(), f.repeats.len(), c.dues)
    };
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Database failovers ({} standby, replicas following through {}; times in ms):",
        replication.name(),
        if options.follow == Follow::MultiHost {
            "a multi-host URL"
        } else {
            "a moving address"
        },
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| failovers (crash / switchover) | writable → a leader of every {lane}, p50 / p99 / max | \
         terms begun with no primary | locks held on a server in recovery | epochs not above an \
         earlier term's | claims lost / dues run again / violations | replica backends left on \
         the standby | violations |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let bold = |n: usize| {
        if n == 0 {
            "0".to_owned()
        } else {
            format!("**{n}**")
        }
    };
    let _ = writeln!(
        out,
        "| {} ({} / {}) | {} ({} later than 1·I with another fault in effect) | {} | {} ({} samples) \
         | {} ({} terms) | {dues} | {} | {} |",
        f.completed,
        f.crashes,
        f.switchovers,
        summary(f.to_leader.clone(), ms),
        f.to_leader_excused,
        bold(c.no_primary),
        bold(c.in_recovery),
        f.recovery_samples,
        bold(c.epochs_back),
        f.terms,
        f.standby_backends_max,
        bold(c.all),
    );
    if options.shards == 0 {
        let listed = |v: &[(u64, u32, usize)]| {
            if v.is_empty() {
                return "none".to_owned();
            }
            let items: Vec<String> = v
                .iter()
                .map(|(due, attempt, id)| format!("{due}/{attempt} (#{id})"))
                .collect();
            items.join(", ")
        };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "- Claims missing on the promoted server (due ms/attempt, failover): {}; dues run \
             again after the crash that lost their claim (allowed with an asynchronous standby, \
             once, for claims made from the cut on): {}.",
            listed(&f.lost_claims),
            listed(&f.repeats)
        );
    }
}

/// What the report is made of.
#[derive(Clone, Copy)]
struct Render<'a> {
    options: &'a Options,
    facts: &'a Facts,
    faults: &'a [Fault],
    procs: &'a [ProcInfo],
    a: &'a Analysis,
}

impl Render<'_> {
    /// The title, the command that replays the run, and how to read the table.
    fn header(&self, out: &mut String) {
        let Render {
            options,
            facts,
            faults,
            procs,
            ..
        } = *self;
        let i_ms = options.interval.as_millis();
        let slack = options.slack();
        let fast = procs.iter().filter(|p| p.fast).count();
        let _ = writeln!(
            out,
            "### Chaos soak: seed {}, {} of faults, {} replicas, {}, I = {i_ms} ms",
            options.seed,
            duration_text(facts.injected_for),
            options.replicas,
            match options.shards {
                0 => format!("{} mode", options.mode.name()),
                n => format!("{n} shards (poll mode)"),
            }
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "`cargo run --release -p pg-elector-tools --bin soak -- {}` · PostgreSQL {} ({}) · {} replica processes over the run \
             ({fast} with fast takeover) · {} faults · wall time {}.",
            options.replay_args(facts.injected_for),
            facts.server_version,
            if facts.private {
                "private server"
            } else {
                "DATABASE_URL"
            },
            procs.len(),
            faults.len(),
            duration_text(facts.wall),
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Times in ms. Every bound gets a slack of I/2 + 250 ms = {} ms for a loaded machine. \
             *Leaderless*: from the fault to the next one, no replica may have led (read on both \
             sides of each `is_leader()` read; a SIGSTOPped replica does not lead), p50 / p99 / max \
             over the faults that hit the leader (its lock session; a restart hits all). *Two \
             leaders*: two replicas certainly leading and running at once, any fault.",
            slack.as_millis()
        );
        if options.shards > 0 {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "Shard mode: every replica runs one group of {} shards, and each check above runs \
                 per shard on that shard's owners, rows and `pg_locks` samples; *leader* reads \
                 *owner of the shard*, a fault hits the shards its replica owned, and the table \
                 shows the worst shard per fault.",
                options.shards
            );
        }
        let _ = writeln!(out);
    }

    /// One row per fault kind, then all.
    fn table(&self, out: &mut String) {
        let Render {
            options, faults, a, ..
        } = *self;
        // With preferences, one more column: from each fault's heal to the most preferred live
        // replica leading (`check/prefs.rs`).
        let prefs = options.preferences;
        let _ = writeln!(
            out,
            "| fault | injected | hit the leader | overlapping | leaderless p50 / p99 / max | two leaders, max | runs of one due at once | pool connections stuck | bound: new leader / two leaders |{} violations |",
            if prefs {
                " heal → most preferred leads, p50 / p99 / max (bound) |"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|{}---|",
            if prefs { "---|" } else { "" }
        );
        let preferred = |kind: Kind, of: &[&Fault]| -> String {
            if !prefs {
                return String::new();
            }
            let times: Vec<u64> = of
                .iter()
                .filter_map(|f| a.prefs.to_preferred.get(f.id).copied().flatten())
                .collect();
            let bound = crate::prefs_report::bound_text(kind);
            format!(" {} ({bound}) |", summary(times, ms))
        };
        let mut all_leaderless = Vec::new();
        let mut all_two = 0;
        for kind in Kind::ALL {
            let of: Vec<&Fault> = faults.iter().filter(|f| f.kind == kind).collect();
            if of.is_empty() && !options.faults.contains(&kind) {
                continue;
            }
            let hit: Vec<&&Fault> = of.iter().filter(|f| f.on_leader).collect();
            let leaderless: Vec<u64> = hit.iter().map(|f| a.leaderless[f.id]).collect();
            all_leaderless.extend(leaderless.iter().copied());
            let two = of.iter().map(|f| a.two_leaders[f.id]).max().unwrap_or(0);
            all_two = all_two.max(two);
            let violations = a
                .violations
                .iter()
                .filter(|v| v.fault.is_some_and(|id| faults[id].kind == kind))
                .count();
            let sum = |per: &[u64]| of.iter().map(|f| per.get(f.id).copied().unwrap_or(0)).sum();
            let (due, stuck): (u64, u64) = (sum(&a.due_overlaps), sum(&a.pool_stuck));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |{} {} |",
                kind.label(),
                of.len(),
                hit.len(),
                of.iter().filter(|f| f.overlapped).count(),
                summary(leaderless, ms),
                ms(two),
                bold(due),
                bold(stuck),
                kind.bound_text(),
                preferred(kind, &of),
                if violations > 0 {
                    format!("**{violations}**")
                } else {
                    "0".into()
                }
            );
        }
        let all: Vec<&Fault> = faults.iter().collect();
        let _ = writeln!(
            out,
            "| **all** | {} | {} | {} | {} | {} | {} | {} | |{} {} |",
            faults.len(),
            faults.iter().filter(|f| f.on_leader).count(),
            faults.iter().filter(|f| f.overlapped).count(),
            summary(all_leaderless, ms),
            ms(all_two),
            bold(a.due_overlaps.iter().sum()),
            bold(a.pool_stuck.iter().sum()),
            if prefs {
                let times: Vec<u64> = all
                    .iter()
                    .filter_map(|f| a.prefs.to_preferred.get(f.id).copied().flatten())
                    .collect();
                format!(" {} |", summary(times, ms))
            } else {
                String::new()
            },
            if a.violations.is_empty() {
                "0".into()
            } else {
                format!("**{}**", a.violations.len())
            }
        );
        let _ = writeln!(out);
    }

    /// The stalls, the rows, the samples, the unprovoked gaps, the backends.
    fn facts(&self, out: &mut String) {
        let Render {
            facts, faults, a, ..
        } = *self;
        let mut lags: Vec<u64> = faults
            .iter()
            .filter(|f| f.kind.partitions() || f.kind == Kind::Reset)
            .map(|f| f.lag)
            .collect();
        lags.sort_unstable();
        let _ = writeln!(
            out,
            "- Machine stalls (the soak's own 1 ms sleepers, a thread and a task on the runtime \
             that runs the proxies, late by more than 20 ms): {}, {} ms in all, the longest {} ms \
             (on the runtime: {}, {} ms in all, the longest {} ms); each bound is extended by the \
             stall time within it (and by the replica's own watcher gaps, for its demotion). Proxy \
             faults took effect p50 {} ms, max {} ms after the call.",
            a.stalls.0,
            ms(a.stalls.1),
            ms(a.stalls.2),
            facts.runtime_stalls.0,
            ms(facts.runtime_stalls.1),
            ms(facts.runtime_stalls.2),
            ms(percentile(&lags, 0.5).unwrap_or(0)),
            ms(lags.last().copied().unwrap_or(0)),
        );
        let unprovoked_max = a.unprovoked.iter().map(|iv| iv.1 - iv.0).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "- Fenced rows: {} of {} epochs, ordered by the server's clock: epochs never went back, \
             each epoch one replica's, none after a later epoch was current; {} written while \
             `pg_locks` showed another replica holding the lock (within 30 ms of its grant, or of a \
             terminated session), {} while it showed nobody; {} ticks refused by `Term::fence`.",
            a.rows, a.epochs, a.rows_other_holder, a.rows_no_holder, a.fence_refusals
        );
        let _ = writeln!(
            out,
            "- `pg_locks` and the epoch row sampled {} times (every 5 ms, {} reconnections); server \
             clock − this machine's: {} µs.",
            facts.samples.0, facts.samples.1, facts.offset
        );
        let _ = if self.options.shards > 0 {
            writeln!(
                out,
                "- Shards unowned beyond every fault's own bound: {} gaps, max {} ms (a shard \
                 moving when the members changed: drain, unlock, the new owner's next try; allowed \
                 up to 2·I + slack from the gap's start).",
                a.unprovoked.len(),
                ms(unprovoked_max)
            )
        } else {
            writeln!(
                out,
                "- Leaderless with no fault to explain it: {} gaps, max {} ms (a leader that \
                 stepped down by itself; allowed up to 1·I + slack).",
                a.unprovoked.len(),
                ms(unprovoked_max)
            )
        };
        if self.options.shards == 0 {
            let _ = writeln!(
                out,
                "- The schedule (job `{}` due every {} s; before a long partition its runs are \
                 made {}–{} s long, past the 3 s after which a silent run is taken for \
                 abandoned; the drain timeout {} s; reruns of abandoned dues): {} runs, {} of \
                 them longer than 3 s, {} reruns; runs of one due at once (from the replicas' \
                 own reports of each run's start and end): {}, and {} more where a runner had \
                 frozen (the docs' exception), {} more after an asynchronous crash lost the \
                 claim, the old run cut off within its heartbeats' two thirds of the 3 s (the \
                 README's asynchronous caveat).",
                crate::app::JOB,
                crate::app::JOB_PERIOD.as_secs(),
                crate::app::LONG_RUN_MIN.as_secs_f64(),
                crate::app::LONG_RUN_MAX.as_secs_f64(),
                crate::app::DRAIN.as_secs(),
                a.job_runs,
                a.long_runs,
                a.reruns,
                a.due_overlaps.iter().sum::<u64>(),
                a.due_overlaps_frozen,
                a.due_overlaps_lost_claim,
            );
        }
        let p = &a.probes;
        let _ = writeln!(
            out,
            "- Application pools (each replica's ticker pool{}) probed after the faults: {} \
             probes, {} answered ({} made moot by another fault injected meanwhile, or cutting that replica or the server off when sent); connections that \
             answered SELECT 1 within 1 s: {}, stuck: {}, broken (an error): {}, not borrowed \
             within 1 s: {}.",
            if self.options.shards == 0 {
                ", which the schedule shares"
            } else {
                ""
            },
            p.sent,
            p.answered,
            p.moot,
            p.connections,
            a.pool_stuck.iter().sum::<u64>(),
            p.failed,
            p.unborrowed,
        );
        let backends = &a.backends;
        let _ = writeln!(
            out,
            "- Backends at {} quiet checkpoints: baseline {}, max {}, final {} (bound: {} per live \
             replica, its elector's pool of {}, its application's pool of {} and one lock or \
             waiting session; max seen {}); none of a dead replica.",
            backends.len(),
            backends.first().map_or("-".into(), |b| b.to_string()),
            backends.iter().max().map_or("-".into(), |b| b.to_string()),
            backends.last().map_or("-".into(), |b| b.to_string()),
            crate::child::POOL_SIZE + crate::child::APP_POOL_SIZE + 1,
            crate::child::POOL_SIZE,
            crate::child::APP_POOL_SIZE,
            a.backends_per_replica_max,
        );
    }

    /// The memory of the longest-lived replica, and the growth.
    fn memory(&self, out: &mut String) {
        let Render { procs, a, .. } = *self;
        if a.rss.is_empty() {
            let _ = writeln!(out, "- Memory: no replica lived 30 s.");
        } else {
            let longest = a.rss.iter().max_by_key(|r| r.1).expect("not empty");
            let growth: Vec<i64> = a
                .rss
                .iter()
                .map(|&(_, _, first, last)| last as i64 - first as i64)
                .collect();
            let _ = writeln!(
                out,
                "- Memory (RSS from 10 s of age to the end, replicas that lived ≥ 30 s): \
                 replica-{} (slot {}) over {} s: {} → {} kB; growth over {} replicas: max {} kB (violation: \
                 more than 16 MiB and 50 %).",
                longest.0,
                procs[longest.0].slot,
                longest.1 / 1_000_000,
                longest.2,
                longest.3,
                a.rss.len(),
                growth.iter().max().copied().unwrap_or(0)
            );
        }
    }

    /// The overlaps a fault excused, the longest ten.
    fn overlaps(&self, out: &mut String) {
        let Render {
            facts,
            faults,
            procs,
            a,
            ..
        } = *self;
        if !a.excused_overlaps.is_empty() {
            let _ = writeln!(
                out,
                "- Two replicas led at once within a fault's allowance {} times; the longest ten:",
                a.excused_overlaps.len()
            );
            let mut longest: Vec<_> = a.excused_overlaps.iter().collect();
            longest.sort_by_key(|((s, e), _, _)| std::cmp::Reverse(e - s));
            for ((s, e), who, fault) in longest.into_iter().take(10) {
                let names: Vec<String> = who
                    .iter()
                    .map(|&r| {
                        let mode = if procs.get(r).is_some_and(|p| p.fast) {
                            "fast"
                        } else {
                            "poll"
                        };
                        format!("replica-{r} ({mode})")
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "  - {} at {}: {} ms, {}",
                    names.join(" and "),
                    offset_text(*s, facts.start),
                    format_args!("{:.1}", (e - s) as f64 / 1e3),
                    fault.map_or(String::new(), |id| format!(
                        "{} ms after fault #{id} ({}{})",
                        format_args!("{:.1}", s.saturating_sub(faults[id].inject) as f64 / 1e3),
                        faults[id].kind.name(),
                        // Which allowance: a session ended under a leader that could not hear it.
                        a.deaf.iter().find(|&&(g, _)| g == id).map_or(
                            String::new(),
                            |&(_, f)| format!(
                                ", its leader deaf during #{f} {}",
                                faults[f].kind.name()
                            )
                        )
                    )),
                );
            }
        }
    }

    /// The sessions ended while their leader could not hear.
    fn deaf(&self, out: &mut String) {
        let Render { faults, a, .. } = *self;
        if !a.deaf.is_empty() {
            let list: Vec<String> = a
                .deaf
                .iter()
                .map(|&(g, f)| {
                    format!(
                        "#{g} {} during #{f} {}",
                        faults[g].kind.name(),
                        faults[f].kind.name()
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "- Sessions the server ended while their leader could not hear it (allowed to overlap \
                 until that leader can: its partition's 2·I, or 100 ms after the SIGCONT): {}.",
                list.join(", ")
            );
        }
    }

    /// Every violation, with the command that replays it.
    fn violations(&self, out: &mut String) {
        let Render {
            options,
            facts,
            faults,
            a,
            ..
        } = *self;
        let unattributed = a.violations.iter().filter(|v| v.fault.is_none()).count();
        let _ = writeln!(out);
        if a.violations.is_empty() {
            let _ = writeln!(out, "No violations.");
        } else {
            let _ = writeln!(out, "#### Violations ({})", a.violations.len());
            let _ = writeln!(out);
            for v in &a.violations {
                let offset = (v.at as i64 - facts.start as i64) as f64 / 1e6;
                let fault = v.fault.map_or(String::new(), |id| {
                    format!(" [fault #{id}, {}]", faults[id].kind.name())
                });
                let replay = Duration::from_secs_f64(offset.max(0.0) + 5.0);
                let _ = writeln!(
                    out,
                    "- at {offset:+.3} s{fault}: {} — replay: `cargo run --release -p pg-elector-tools --bin soak -- {}`",
                    v.what,
                    options.replay_args(replay)
                );
            }
            if unattributed > 0 {
                let _ = writeln!(out);
                let _ = writeln!(out, "({unattributed} not attributed to a fault.)");
            }
        }
    }
}

/// A time as an offset from the start of the injection, in s.
pub(crate) fn offset_text(at: u64, start: u64) -> String {
    format!("{:+.3} s", (at as i64 - start as i64) as f64 / 1e6)
}

fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{} h {} min", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{:.0} s", d.as_secs_f64())
    }
}
