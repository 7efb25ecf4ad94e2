//! The shards part: a group of `--shards` shards on `--replicas` member processes, then the
//! same rolling deploys; how many times each shard changes owner per deploy.

use std::time::{Duration, Instant};

use pg_elector_testkit::PgServer;
use pg_elector_testkit::replica::unix_us;
use pg_elector_tools::stats::{percentile, sorted};

use crate::deploy::trace;
use crate::lanes::{moves, overlap_us, spans};
use crate::options::Options;
use crate::procs::{Event, Procs, Spec, What};

/// One deploy's figures.
#[derive(Debug)]
pub(crate) struct Deploy {
    /// How many times each shard changed owner.
    pub(crate) per_shard: Vec<u64>,
    /// Summed over the shards: the time two members said they owned one.
    pub(crate) two_owners_us: u64,
    pub(crate) took: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) deploys: Vec<Deploy>,
    pub(crate) failed: Option<String>,
}

pub(crate) async fn run_part(server: &PgServer, o: &Options) -> Outcome {
    let db = server.create_database().await.expect("a database");
    let mut procs = Procs::new(Spec {
        url: db.url(),
        interval: o.interval,
        pref: false,
        fast: false,
        shards: Some(o.shard_count),
    });
    let mut outcome = Outcome::default();
    let run = async {
        for _ in 0..o.replicas {
            let index = procs.spawn(1);
            joined(&procs, index, o.interval).await?;
        }
        balanced(&procs, o).await?;
        for d in 1..=o.deploys {
            let deploy = one_deploy(&mut procs, o, d as u64 + 1).await?;
            say(d, o.deploys, &deploy);
            outcome.deploys.push(deploy);
        }
        Ok::<(), String>(())
    };
    if let Err(e) = run.await {
        eprintln!("[shards] stopped: {e}");
        outcome.failed = Some(e);
    }
    procs.stop_all().await;
    outcome
}

/// Each member, oldest first, replaced by a new one that is a member before the old one is
/// stopped; the deploy ends when the shards are balanced, plus I.
async fn one_deploy(procs: &mut Procs, o: &Options, version: u64) -> Result<Deploy, String> {
    let (from, started) = (unix_us(), Instant::now());
    for _ in 0..o.replicas {
        let index = procs.spawn(version);
        let t = Instant::now();
        joined(procs, index, o.interval).await?;
        trace(format_args!(
            "{} a member in {:?}",
            procs.names[index],
            t.elapsed()
        ));
        tokio::time::sleep(o.pause).await;
        let t = Instant::now();
        let old = procs.stop_oldest().await?;
        trace(format_args!(
            "{} stopped in {:?}",
            procs.names[old],
            t.elapsed()
        ));
    }
    balanced(procs, o).await?;
    tokio::time::sleep(o.interval).await;
    let to = unix_us();
    let spans = spans(&procs.events());
    let lanes = 0..o.shard_count;
    Ok(Deploy {
        per_shard: lanes
            .clone()
            .map(|s| moves(&spans, s, from, to).len() as u64)
            .collect(),
        two_owners_us: lanes
            .map(|s| overlap_us(spans.iter().filter(|x| x.lane == s), from, to))
            .sum(),
        took: started.elapsed(),
    })
}

/// Waits until member `index` says `is_member()`.
async fn joined(procs: &Procs, index: usize, interval: Duration) -> Result<(), String> {
    let limit = 10 * interval + Duration::from_secs(30);
    procs
        .until(limit, |events| {
            let member = |e: &Event| e.child == index && e.what == What::Member;
            events.iter().any(member).then_some(())
        })
        .await
        .ok_or_else(|| format!("{} not a member within {limit:?}", procs.names[index]))
}

/// Waits until every shard has one owner, a live member, and every live member owns ⌊S/N⌋ or
/// ⌈S/N⌉ of them.
async fn balanced(procs: &Procs, o: &Options) -> Result<(), String> {
    let live = procs.live();
    let (count, n) = (o.shard_count as usize, live.len());
    let limit = 20 * o.interval + Duration::from_secs(30);
    let fair = count / n..=count.div_ceil(n);
    procs
        .until(limit, |events| {
            let owners = owners_now(events, count);
            let single = owners.iter().all(|o| o.len() == 1 && live.contains(&o[0]));
            let share = |m: &usize| owners.iter().filter(|o| o.contains(m)).count();
            (single && live.iter().all(|m| fair.contains(&share(m)))).then_some(())
        })
        .await
        .ok_or_else(|| format!("not balanced within {limit:?}"))
}

/// The owners of each shard, as the members last said it (each member's lines arrive in order).
fn owners_now(events: &[Event], count: usize) -> Vec<Vec<usize>> {
    let children = events.iter().map(|e| e.child + 1).max().unwrap_or(0);
    let mut owns = vec![vec![false; count]; children];
    for e in events {
        match e.what {
            What::Gain(s) => owns[e.child][s as usize] = true,
            What::Lose(s) => owns[e.child][s as usize] = false,
            What::Exited => owns[e.child].fill(false),
            _ => {}
        }
    }
    (0..count)
        .map(|s| (0..children).filter(|&c| owns[c][s]).collect())
        .collect()
}

fn say(d: usize, n: usize, deploy: &Deploy) {
    let v = sorted(deploy.per_shard.clone());
    eprintln!(
        "[shards] deploy {d}/{n}: {} moves, per shard median {} max {}; two owners {} µs; {:.1} s",
        v.iter().sum::<u64>(),
        percentile(&v, 0.5).unwrap_or(0),
        percentile(&v, 1.0).unwrap_or(0),
        deploy.two_owners_us,
        deploy.took.as_secs_f64(),
    );
}
