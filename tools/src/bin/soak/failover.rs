//! The database failover (`--cluster`): the primary crashed (`pg_ctl stop -m immediate`; first
//! the standby is cut off from its WAL for a drawn time, up to 1.5 s, so that it lags) or
//! switched over (`-m fast`), the replicas' moving addresses re-pointed at the standby, the
//! standby promoted, the claims of the schedule that survived read on the promoted server, and
//! the old primary made the new standby (a fresh base backup). And the watch on both servers
//! that nobody holds a lock of the soak's keys on a server in recovery.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_testkit::server::config::config_with_addr;
use pg_elector_testkit::server::failover::Cluster;
use tokio_postgres::config::TargetSessionAttrs;
use tokio_util::sync::CancellationToken;

use crate::check::Violation;
use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::db;
use crate::faults::{Fault, Plan};
use crate::inject::{record, update};

/// What one failover did, for the checks.
#[derive(Clone, Debug)]
pub(crate) struct Failover {
    /// The fault.
    pub(crate) id: usize,
    /// A crash (`immediate`), else a switchover (`fast`).
    pub(crate) crash: bool,
    /// How long before the crash the standby's link to the WAL was cut.
    pub(crate) cut: Duration,
    /// When the old primary's stop began (µs), after the cut.
    pub(crate) inject: u64,
    /// When the old primary had stopped (µs).
    pub(crate) stopped: Option<u64>,
    /// When a connection first reached the promoted server out of recovery (µs).
    pub(crate) writable: Option<u64>,
    /// Key mode: the claims of the schedule's job (due in ms, attempt) on the promoted server,
    /// read right after the promotion.
    pub(crate) claims: Option<BTreeSet<(u64, u32)>>,
    /// When the old primary streamed from the new one (µs).
    pub(crate) rejoined: Option<u64>,
}

/// Starts a failover in a task of its own; the server is claimed until the old primary runs
/// as the new standby.
pub(crate) async fn inject(ctx: &Arc<Ctx>, plan: Plan, mut fault: Fault) -> Option<usize> {
    ctx.servers.cluster()?;
    {
        let mut claims = ctx.claims.lock().unwrap();
        if claims.server || ctx.failover_broken() {
            return None;
        }
        claims.server = true;
    }
    let crash = (plan.pick >> 8) & 1 == 1;
    let leader = ctx.board.leaders(0).first().copied();
    fault.replica = leader;
    fault.epoch = leader.and_then(|r| ctx.board.state(r).epoch);
    // A switchover's fast stop waits for the standby to have everything: only a crash comes
    // after a cut.
    fault.param = if crash { plan.param } else { Duration::ZERO };
    fault.note = if crash {
        format!(
            "crash, the standby's WAL cut {} ms before",
            fault.param.as_millis()
        )
    } else {
        "switchover".to_owned()
    };
    fault.inject = unix_us();
    fault.heal = fault.inject;
    let id = record(ctx, fault.clone());
    let mut facts = Failover {
        id,
        crash,
        cut: fault.param,
        inject: fault.inject,
        stopped: None,
        writable: None,
        claims: None,
        rejoined: None,
    };
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let result = fail_over(&ctx, &mut facts).await;
        let heal = facts.writable.unwrap_or_else(unix_us);
        update(&ctx, id, |f| {
            f.heal = heal;
            f.done = true;
            if let Err(e) = &result {
                f.note = format!("{}; the harness's failover failed: {e}", f.note);
            }
        });
        if let Err(e) = result {
            // The cluster is left part-way: no more failovers in this run, and the run fails.
            ctx.runtime_violations.lock().unwrap().push(Violation {
                at: unix_us(),
                what: format!("the harness could not complete failover #{id}: {e}"),
                lane: 0,
                fault: Some(id),
                replicas: Vec::new(),
            });
        }
        ctx.failovers.lock().unwrap().push(facts);
        ctx.claims.lock().unwrap().server = false;
        crate::probes::after(&ctx, id, heal);
    });
    Some(id)
}

/// The steps, under the cluster's lock.
async fn fail_over(ctx: &Ctx, facts: &mut Failover) -> Result<(), String> {
    let mut cluster = ctx
        .servers
        .cluster()
        .expect("a failover needs the cluster")
        .lock()
        .await;
    let mode = if facts.crash {
        ShutdownMode::Immediate
    } else {
        ShutdownMode::Fast
    };
    if !facts.cut.is_zero() {
        let cut_at = unix_us();
        cluster.wal.blackhole();
        tokio::time::sleep(facts.cut).await;
        // The fault's bounds count from the crash; its parameter is the cut as it was.
        facts.inject = unix_us();
        facts.cut = Duration::from_micros(facts.inject - cut_at);
        let (at, cut) = (facts.inject, facts.cut);
        update(ctx, facts.id, |f| {
            f.inject = at;
            f.heal = at;
            f.param = cut;
        });
    }
    let stopped = cluster.stop_primary(mode).await;
    if let Err(e) = stopped {
        cluster.wal.pass();
        return Err(e.to_string());
    }
    facts.stopped = Some(unix_us());
    point_links_at(ctx, cluster.standby.addr()).await;
    let writable = cluster.promote().await.map_err(|e| e.to_string())?;
    facts.writable = Some(unix_us().saturating_sub(writable.elapsed().as_micros() as u64));
    // The claims are read before the rejoin, and a failed read still lets the rejoin happen.
    let claims = if ctx.options.shards == 0 {
        let before = facts.stopped.unwrap_or(facts.inject);
        let read = tokio::time::timeout(Duration::from_secs(10), claims_on(&cluster, before));
        Some(match read.await {
            Ok(claims) => claims,
            Err(_) => Err("reading the claims on the promoted server took over 10 s".to_owned()),
        })
    } else {
        None
    };
    let rejoined = cluster.rejoin_after_promotion().await;
    rejoined.map_err(|e| e.to_string())?;
    facts.rejoined = Some(unix_us());
    match claims {
        Some(Ok(claims)) => {
            facts.claims = Some(claims);
            Ok(())
        }
        Some(Err(e)) => Err(e),
        None => Ok(()),
    }
}

/// Re-points every slot's moving address (nothing with multi-host links).
async fn point_links_at(ctx: &Ctx, target: SocketAddr) {
    let fleet = ctx.fleet.lock().await;
    for link in &fleet.links {
        link.point_at(target);
    }
}

/// The schedule's claims on the promoted server that were made before `before` (µs, this
/// machine's clock, which is the servers'), on the old primary: (due in ms, attempt). The
/// replicas lead on the promoted server by the time this reads it, and claim there too.
async fn claims_on(cluster: &Cluster, before: u64) -> Result<BTreeSet<(u64, u32)>, String> {
    let config = cluster.db.config_via(cluster.standby.addr());
    let client = db::connect(&config)
        .await
        .map_err(|e| format!("reading the claims on the promoted server: {e}"))?;
    let rows = client
        .query(
            "SELECT floor(extract(epoch FROM due) * 1000)::int8, attempt \
             FROM pg_elector_job_runs WHERE namespace = 'soak' AND job = $1 \
               AND started_at < to_timestamp($2::int8 / 1e6)",
            &[&crate::app::JOB, &(before as i64)],
        )
        .await
        .map_err(|e| format!("reading the claims on the promoted server: {e}"))?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i32>(1) as u32))
        .collect())
}

/// Waits (at most 30 s, polling every 10 ms) until the primary `checker` reaches has a standby
/// streaming from it: how long that took, or an error saying it did not.
pub(crate) async fn standby_streaming(checker: &tokio_postgres::Config) -> Result<u64, String> {
    let start = unix_us();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let query = "SELECT count(*) FROM pg_catalog.pg_stat_replication WHERE state = 'streaming'";
    let mut client = None;
    while tokio::time::Instant::now() < deadline {
        if client.is_none() {
            client = db::connect(checker).await.ok();
        }
        if let Some(c) = &client {
            match c.query_one(query, &[]).await {
                Ok(row) if row.get::<_, i64>(0) > 0 => return Ok(unix_us() - start),
                Ok(_) => {}
                Err(_) => client = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("no standby streamed from the primary within 30 s".to_owned())
}

/// A lock of the soak's keys that a replica held on a server in recovery.
#[derive(Clone, Debug)]
pub(crate) struct RecoveryHold {
    /// When it was seen (µs, this machine's clock).
    pub(crate) at: u64,
    /// The server.
    pub(crate) server: SocketAddr,
    /// The session's `application_name`.
    pub(crate) holder: String,
}

/// What the watch on both servers saw.
#[derive(Debug, Default)]
pub(crate) struct RecoveryWatch {
    /// Samples taken of a server in recovery.
    pub(crate) samples: Mutex<u64>,
    /// Every lock held there.
    pub(crate) holds: Mutex<Vec<RecoveryHold>>,
}

/// Every `every`, on each server (straight, whatever its role), whether it is in recovery and
/// who holds a lock of `keys` there; until `stop`.
pub(crate) async fn watch_recovery(
    checker: tokio_postgres::Config,
    servers: Vec<SocketAddr>,
    keys: Vec<LockKey>,
    every: Duration,
    seen: Arc<RecoveryWatch>,
    stop: CancellationToken,
) {
    let watches: Vec<_> = servers
        .into_iter()
        .map(|addr| {
            let mut config = config_with_addr(&checker, addr);
            config
                .target_session_attrs(TargetSessionAttrs::Any)
                .connect_timeout(Duration::from_secs(1));
            tokio::spawn(watch_one(
                config,
                addr,
                keys.clone(),
                every,
                seen.clone(),
                stop.clone(),
            ))
        })
        .collect();
    for watch in watches {
        let _ = watch.await;
    }
}

async fn watch_one(
    config: tokio_postgres::Config,
    addr: SocketAddr,
    keys: Vec<LockKey>,
    every: Duration,
    seen: Arc<RecoveryWatch>,
    stop: CancellationToken,
) {
    let query = "SELECT pg_catalog.pg_is_in_recovery(), \
         ARRAY(SELECT coalesce(a.application_name, '') FROM pg_catalog.pg_locks l \
                 JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
               WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
                 AND l.classid = $1 AND l.objid = ANY($2) AND l.objsubid = 2), \
         pg_catalog.pg_is_in_recovery()";
    let class = keys[0].class() as u32;
    let objects = db::objects(&keys);
    while !stop.is_cancelled() {
        let Ok(client) = db::connect(&config).await else {
            tokio::time::sleep(every).await;
            continue;
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            let Ok(row) = client.query_one(query, &[&class, &objects]).await else {
                break;
            };
            // In recovery before and after the locks were read: a promotion in between
            // would let a lock taken on the new primary pass for one taken in recovery.
            if !(row.get::<_, bool>(0) && row.get::<_, bool>(2)) {
                continue;
            }
            *seen.samples.lock().unwrap() += 1;
            let at = unix_us();
            for holder in row.get::<_, Vec<String>>(1) {
                seen.holds.lock().unwrap().push(RecoveryHold {
                    at,
                    server: addr,
                    holder,
                });
            }
        }
    }
}
