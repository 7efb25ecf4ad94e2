//! The tables: one per (mode, I) part, then poll against fast.

use std::time::Duration;

use pg_elector_tools::Mode;
use pg_elector_tools::stats::{percentile, sorted, summary};

use crate::part::{Outcome, Part};
use crate::scenario::{Sample, Scenario};

pub(crate) fn p99_label(reps: usize) -> String {
    if reps < 100 {
        format!("p99 (= max of {reps})")
    } else {
        "p99".into()
    }
}

pub(crate) fn print_part(part: &Part, reps: usize) {
    let i_ms = part.interval.as_millis();
    println!();
    println!(
        "### {} mode, I = {:?} ({reps} runs per fault, {})",
        part.mode.name(),
        part.interval,
        minutes(part.took)
    );
    println!();
    println!(
        "ms, p50 / {} / max (nearest rank). Takeover: fault → new leader; two leaders: time two replicas both said they led.",
        p99_label(reps)
    );
    println!();
    println!(
        "| scenario | runs | takeover | two leaders | old leader demoted | no leader | last old write → first new write | time |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for o in &part.outcomes {
        print_row(o);
    }
    println!();
    println!(
        "¹ from the server accepting connections again. ² includes the server's own downtime. \
         ³ the old leader's term counts as ending at the SIGSTOP unless it led or ticked after the \
         SIGCONT; \"old leader demoted\" is SIGCONT → its standby report."
    );
    // The targets of design §6 and what the design allows.
    let mut checks = Vec::new();
    for o in &part.outcomes {
        push_checks(&mut checks, o, part.mode, i_ms);
    }
    if !checks.is_empty() {
        println!();
        println!("Against design §6 (I = {} ms):", i_ms);
        println!();
        for line in checks {
            println!("{line}");
        }
    }
}

/// One scenario's row of the part's table.
fn print_row(o: &Outcome) {
    let samples = &o.samples;
    let demoted: Vec<u64> = samples.iter().filter_map(|s| s.demoted).collect();
    let resumed: Vec<u64> = samples.iter().filter_map(|s| s.resumed).collect();
    let gaps: Vec<i64> = samples.iter().filter_map(|s| s.write_gap).collect();
    let interleaved = gaps.iter().filter(|&&g| g < 0).count();
    let wrong = samples.iter().filter(|s| s.wrong.is_some()).count();
    let restart = matches!(o.scenario, Scenario::Restart(_));
    println!(
        "| {}{} | {}{}{} | {}{} | {} | {} | {}{} | {}{} | {} |",
        o.scenario.name(),
        if o.scenario == Scenario::Freeze {
            " ³"
        } else {
            ""
        },
        samples.len(),
        if o.failed > 0 {
            format!(" ({} failed)", o.failed)
        } else {
            String::new()
        },
        if wrong > 0 {
            format!(" ({wrong} WRONG)")
        } else {
            String::new()
        },
        summary(samples.iter().map(|s| s.takeover).collect(), ms),
        if restart { " ¹" } else { "" },
        summary(samples.iter().map(|s| s.both).collect(), ms),
        if !demoted.is_empty() {
            summary(demoted, ms)
        } else if !resumed.is_empty() {
            format!("after SIGCONT: {}", summary(resumed, ms))
        } else {
            "(process gone)".into()
        },
        summary(samples.iter().map(|s| s.none).collect(), ms),
        if restart { " ²" } else { "" },
        summary(gaps.iter().map(|&g| g.max(0) as u64).collect(), ms),
        if interleaved > 0 {
            format!(" ({interleaved} INTERLEAVED)")
        } else {
            String::new()
        },
        minutes(o.took),
    );
}

/// The targets of design §6 for one scenario's outcome in `mode` at I = `i_ms`, and what the
/// design allows, as lines added to `checks`.
fn push_checks(checks: &mut Vec<String>, o: &Outcome, mode: Mode, i_ms: u128) {
    let i = |k: u64| k * i_ms as u64 * 1000;
    if o.samples.is_empty() {
        return;
    }
    let max = |f: &dyn Fn(&Sample) -> Option<u64>| o.samples.iter().filter_map(f).max();
    let takeover_max = max(&|s| Some(s.takeover)).unwrap_or(0);
    let both_max = max(&|s| Some(s.both)).unwrap_or(0);
    let name = o.scenario.name();
    let check = |what: &str, value: u64, bound: u64| {
        format!(
            "- {name}: {what} {} ms ≤ {} ms: {}",
            ms(value),
            ms(bound),
            if value <= bound { "met" } else { "**missed**" }
        )
    };
    match (o.scenario, mode) {
        (
            Scenario::Graceful | Scenario::Sigkill | Scenario::Terminate | Scenario::Reset,
            Mode::Poll,
        ) => {
            // A try finds the lock free within I; a grant that was not handed over (every
            // try's, in a fleet without waiting standbys) starts its term 5 ms later.
            checks.push(check(
                "takeover p99 (1·I + the 5 ms wait)",
                p99(&o.samples, |s| s.takeover),
                i(1) + 5_000,
            ));
        }
        (
            Scenario::Graceful | Scenario::Sigkill | Scenario::Terminate | Scenario::Reset,
            Mode::Fast,
        ) => {
            checks.push(check(
                "takeover p99 (F1)",
                p99(&o.samples, |s| s.takeover),
                20_000,
            ));
        }
        (Scenario::Partition, _) => {
            checks.push(check(
                "old leader demoted, max",
                max(&|s| s.demoted).unwrap_or(0),
                i(2),
            ));
            checks.push(check("new leader, max", takeover_max, i(5)));
        }
        (Scenario::Freeze, _) => {
            checks.push(check("new leader, max (E13)", takeover_max, i(5)));
            checks.push(check(
                "SIGCONT → standby, max (E18)",
                max(&|s| s.resumed).unwrap_or(0),
                100_000,
            ));
        }
        _ => {}
    }
    // Every fault here hits a leader that can hear the server: never two leaders, a
    // terminate and a reset included (the new term waits out the old leader's notice).
    checks.push(check("two leaders, max", both_max, 0));
    for s in &o.samples {
        if let Some(w) = &s.wrong {
            checks.push(format!("- {}: **WRONG**: {w}", o.scenario.name()));
        }
    }
    if o.failed > 0 {
        checks.push(format!(
            "- {}: **{} of {} runs failed** (see stderr)",
            o.scenario.name(),
            o.failed,
            o.failed + o.samples.len()
        ));
    }
}

/// Poll against fast, per I, when both modes ran.
pub(crate) fn print_comparison(parts: &[Part], reps: usize) {
    let mut intervals: Vec<Duration> = parts.iter().map(|p| p.interval).collect();
    intervals.dedup();
    for interval in intervals {
        let find = |mode| {
            parts
                .iter()
                .find(|p| p.interval == interval && p.mode == mode)
        };
        let (Some(poll), Some(fast)) = (find(Mode::Poll), find(Mode::Fast)) else {
            continue;
        };
        println!();
        println!(
            "### poll vs fast, I = {interval:?} ({reps} runs each; ms, p50 / {} / max)",
            p99_label(reps)
        );
        println!();
        println!(
            "| scenario | takeover, poll | takeover, fast | two leaders, poll | two leaders, fast |"
        );
        println!("|---|---|---|---|---|");
        for p in &poll.outcomes {
            let Some(f) = fast.outcomes.iter().find(|f| f.scenario == p.scenario) else {
                continue;
            };
            let stat =
                |o: &Outcome, v: fn(&Sample) -> u64| summary(o.samples.iter().map(v).collect(), ms);
            println!(
                "| {} | {} | {} | {} | {} |",
                p.scenario.name(),
                stat(p, |s| s.takeover),
                stat(f, |s| s.takeover),
                stat(p, |s| s.both),
                stat(f, |s| s.both),
            );
        }
    }
}

pub(crate) fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e3)
}

pub(crate) fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

pub(crate) fn p99(samples: &[Sample], value: fn(&Sample) -> u64) -> u64 {
    let values: Vec<u64> = samples.iter().map(value).collect();
    percentile(&sorted(values), 0.99).unwrap_or(0)
}
