//! The faults, drawn from the seed one after another until the run's duration is over.

use std::time::{Duration, Instant};

use pg_elector_tools::rng::Rng;

use crate::CHECKPOINT_EVERY;
use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::faults::{self, Kind, Plan};
use crate::inject;

/// One draw: the pause before the fault, whether it may overlap a running one, and the fault.
struct Draw {
    gap: Duration,
    overlap: bool,
    plan: Plan,
}

/// The next draw. Every draw comes from the seed, in the same order whatever happens.
fn draw(rng: &mut Rng, ctx: &Ctx, total_weight: u64) -> Draw {
    let options = &ctx.options;
    let i = options.interval;
    let i_ms = i.as_millis() as u64;
    let gap = Duration::from_millis(rng.between(i_ms / 4, 2 * i_ms));
    let overlap = rng.chance(options.overlap);
    let mut w = rng.below(total_weight);
    let kind: Kind = *options
        .faults
        .iter()
        .find(|k| {
            if w < k.weight() {
                true
            } else {
                w -= k.weight();
                false
            }
        })
        .expect("a kind");
    let plan = Plan {
        kind,
        at_leader: rng.chance(0.6),
        pick: rng.next_u64(),
        param: faults::draw_param(kind, i, rng),
        fast: rng.chance(0.5),
    };
    Draw { gap, overlap, plan }
}

/// Injects faults for the run's duration; when it started (µs) and how long it took.
pub(crate) async fn run(ctx: &std::sync::Arc<Ctx>, rng: &mut Rng) -> (u64, Duration) {
    let options = &ctx.options;
    let injecting = Instant::now();
    let injection_start = unix_us();
    let until = injecting + options.duration;
    let total_weight: u64 = options.faults.iter().map(|k| k.weight()).sum();
    let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
    let quiet_limit = options.interval * 10 + Duration::from_secs(10);
    while Instant::now() < until {
        let Draw { gap, overlap, plan } = draw(rng, ctx, total_weight);
        let wait = !(overlap && ctx.any_active());
        if wait && !ctx.quiet(quiet_limit).await {
            eprintln!(
                "soak: +{:.1} s: no steady single leader within {} s",
                injecting.elapsed().as_secs_f64(),
                quiet_limit.as_secs()
            );
        }
        if Instant::now() >= next_checkpoint {
            ctx.checkpoint().await;
            next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
        }
        tokio::time::sleep(gap).await;
        if Instant::now() >= until {
            break;
        }
        let plan = at_least_one_failover(ctx, plan, injecting.elapsed() * 2 >= options.duration);
        let overlapped = ctx.any_active();
        let injected = inject::inject(ctx, plan, overlapped).await;
        if options.verbose {
            say(ctx, plan.kind, injected, overlapped, injection_start);
        }
    }
    (injection_start, injecting.elapsed())
}

/// With `--cluster`, a run with no failover by half its duration gets one at the next draw
/// (its kind replaced, every draw unchanged), so that every run, CI's 60 s among them, fails
/// the database over at least once.
fn at_least_one_failover(ctx: &Ctx, mut plan: Plan, half_over: bool) -> Plan {
    let wanted = ctx.options.faults.contains(&Kind::Failover);
    if wanted && half_over && ctx.failovers_injected() == 0 && plan.kind != Kind::Failover {
        plan.kind = Kind::Failover;
        // The parameter was drawn for another kind: the cut's range is [0, 1.5 s].
        plan.param = plan.param.min(Duration::from_millis(1_500));
    }
    plan
}

/// `--verbose`: the fault just injected, or that it had no target.
fn say(ctx: &Ctx, kind: Kind, injected: Option<usize>, overlapped: bool, injection_start: u64) {
    let Some(id) = injected else {
        eprintln!("soak: {} had no target now", kind.name());
        return;
    };
    let f = ctx.faults.lock().unwrap()[id].clone();
    eprintln!(
        "soak: +{:.3} s #{id} {}{} {}{}{}{}",
        (f.inject.saturating_sub(injection_start)) as f64 / 1e6,
        kind.name(),
        f.replica.map_or(String::new(), |r| format!(" replica-{r}")),
        if f.on_leader { "(leader)" } else { "" },
        if f.param.is_zero() {
            String::new()
        } else {
            format!(" {} ms", f.param.as_millis())
        },
        if overlapped { " overlapping" } else { "" },
        if f.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", f.note)
        },
    );
}
