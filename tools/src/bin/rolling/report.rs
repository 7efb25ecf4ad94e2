//! The header (command line, commit, load) and one markdown table per part.

use std::collections::BTreeMap;
use std::process::Command;

use pg_elector_testkit::PgServer;
use pg_elector_tools::stats::{percentile, sorted, summary};

use crate::options::{Config, Options};
use crate::{deploy, shards};

pub(crate) async fn print_header(o: &Options, server: &PgServer) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("## Rolling deploys");
    println!();
    println!(
        "- command: `cargo run --release -p pg-elector-tools --bin rolling -- {}`",
        args.join(" ")
    );
    println!("- commit: {}", commit());
    println!(
        "- load at start (1, 5, 15 min): {} on {cpus} CPUs",
        load.join(" ")
    );
    println!("- server: PostgreSQL {}", server_version(server).await);
    println!(
        "- {} replicas, I = {:?}, {} deploys per part, pause after a new replica stands by: {}",
        o.replicas,
        o.interval,
        o.deploys,
        if o.pause.is_zero() {
            "none".to_owned()
        } else {
            format!("{:?}", o.pause)
        }
    );
}

/// `git rev-parse --short HEAD` of this checkout, and whether tracked files differ from it.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "unknown (no git)".into(),
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if changes.is_empty() => head,
            _ => format!("{head} + uncommitted changes"),
        },
    }
}

async fn server_version(server: &PgServer) -> String {
    let Ok((client, connection)) = server.config().connect(tokio_postgres::NoTls).await else {
        return "?".into();
    };
    tokio::spawn(connection);
    match client.query_one("SHOW server_version", &[]).await {
        Ok(row) => row.get(0),
        Err(_) => "?".into(),
    }
}

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1e3)
}

/// `p50 / max` of `values`, each shown by `show`; `-` when there are none.
fn p50_max(values: Vec<u64>, show: fn(u64) -> String) -> String {
    let v = sorted(values);
    match (percentile(&v, 0.5), percentile(&v, 1.0)) {
        (Some(a), Some(b)) => format!("{} / {}", show(a), show(b)),
        _ => "-".into(),
    }
}

/// How many deploys had each count: `1: 18, 2: 2`.
fn histogram(values: impl Iterator<Item = usize>) -> String {
    let mut counts = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_insert(0) += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    parts.join(", ")
}

fn failed(failed: &Option<String>) -> String {
    failed
        .as_ref()
        .map_or(String::new(), |e| format!(" (**stopped**: {e})"))
}

pub(crate) fn print_electors(o: &Options, rows: &[(Config, deploy::Outcome)]) {
    println!();
    println!(
        "### Electors: {} replicas on one key, I = {:?}, {} rolling deploys each",
        o.replicas, o.interval, o.deploys
    );
    println!();
    println!(
        "| configuration | deploys | lead moves per deploy: p50 / max (deploys with k moves) \
         | lock holder changes per deploy (server): p50 / max | leaderless per move, ms: \
         p50 / p99 / max | no holder per deploy (server), ms: p50 / max | two leaders, ms \
         (all deploys) | new version leads at the end | deploy, s: p50 / max |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (config, out) in rows {
        electors_row(*config, out);
    }
    println!();
    println!(
        "Lead moves and leaderless time from the replicas' own reports (`is_leader()` read every \
         ms, wall clock); holder changes and no-holder time from `pg_locks`, read every ms \
         by the bench. A standby that is granted the lock and gives it back at once for a more \
         preferred one counts as a holder change, not as a lead move. p99 of fewer than 100 \
         moves is their max."
    );
    for (config, out) in rows {
        let (reads, period) = out.sampler;
        println!(
            "- {}: the sampler read `pg_locks` {reads} times, once per {period:.2} ms",
            config.name()
        );
    }
}

fn electors_row(config: Config, out: &deploy::Outcome) {
    let d = &out.deploys;
    let all_moves = d.iter().flat_map(|x| x.moves.iter().map(|m| m.gap_us));
    let new_leads = d.iter().filter(|x| x.new_leads).count();
    let new_holds = d.iter().filter(|x| x.new_holds).count();
    println!(
        "| {}{} | {} | {} ({}) | {} | {} | {} | {} | {}/{}{} | {} |",
        config.name(),
        failed(&out.failed),
        d.len(),
        p50_max(d.iter().map(|x| x.moves.len() as u64).collect(), |v| v
            .to_string()),
        histogram(d.iter().map(|x| x.moves.len())),
        p50_max(d.iter().map(|x| x.holder_changes as u64).collect(), |v| v
            .to_string()),
        summary(all_moves.collect(), ms),
        p50_max(d.iter().map(|x| x.no_holder_us).collect(), ms),
        ms(d.iter().map(|x| x.two_leaders_us).sum()),
        new_leads,
        d.len(),
        if new_holds == new_leads {
            String::new()
        } else {
            format!(" (server: {new_holds})")
        },
        p50_max(d.iter().map(|x| x.took.as_millis() as u64).collect(), secs),
    );
}

fn secs(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1e3)
}

pub(crate) fn print_shards(o: &Options, out: &shards::Outcome) {
    let d = &out.deploys;
    let per_deploy = |f: fn(&[u64]) -> u64| -> Vec<u64> {
        d.iter().map(|x| f(&sorted(x.per_shard.clone()))).collect()
    };
    println!();
    println!(
        "### Shards: {} shards on {} members, I = {:?}, {} rolling deploys",
        o.shard_count, o.replicas, o.interval, o.deploys
    );
    println!();
    println!(
        "| group | deploys | shard moves per deploy, all shards: p50 / max | one shard's moves \
         per deploy, median over shards: p50 / max | one shard's moves per deploy, max over \
         shards: p50 / max | two owners, ms (all shards, all deploys) | deploy, s: p50 / max |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} × {}{} | {} | {} | {} | {} | {} | {} |",
        o.shard_count,
        o.replicas,
        failed(&out.failed),
        d.len(),
        p50_max(per_deploy(|v| v.iter().sum()), |v| v.to_string()),
        p50_max(per_deploy(|v| percentile(v, 0.5).unwrap_or(0)), |v| v
            .to_string()),
        p50_max(per_deploy(|v| percentile(v, 1.0).unwrap_or(0)), |v| v
            .to_string()),
        ms(d.iter().map(|x| x.two_owners_us).sum()),
        p50_max(d.iter().map(|x| x.took.as_millis() as u64).collect(), secs),
    );
    println!();
    println!(
        "A move: a shard's owner changes (`is_owner` per member, read every ms), an ownerless \
         gap in between not counted apart. A deploy adds a member and removes one {} times.",
        o.replicas
    );
}
