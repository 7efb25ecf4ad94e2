//! The injection of one fault: its target, its instantaneous part, and a task for the rest.

use std::sync::Arc;
use std::time::Duration;

use pg_elector_testkit::server::ShutdownMode;
use rustix::process::Signal;
use tokio::sync::MutexGuard;

use pg_elector::LockKey;

use crate::Ctx;
use crate::check::Violation;
use crate::child::unix_us;
use crate::db::{self, objects};
use crate::faults::{Fault, Kind, Plan};
use crate::fleet::Fleet;

/// Injects one fault as planned: picks its target, does the instantaneous part, and spawns a
/// task for the rest (the wait, the heal, the respawn). Returns `None` when it has no target
/// now (no leader's lock session to terminate, every slot busy, the server unreachable).
pub(crate) async fn inject(ctx: &Arc<Ctx>, mut plan: Plan, overlapped: bool) -> Option<usize> {
    let kind = plan.kind;
    // A long partition is the leader's: its runs must not go on beside the next leader's.
    plan.at_leader |= kind == Kind::LongPartition;
    let fault = Fault {
        id: 0,
        kind,
        replica: None,
        on_leader: kind.server_wide(),
        epoch: None,
        param: plan.param,
        inject: 0,
        lag: 0,
        heal: 0,
        done: false,
        overlapped,
        note: String::new(),
        handover: None,
    };
    if kind.handover() {
        return crate::handover::inject(ctx, plan, fault).await;
    }
    if kind == Kind::JoinPartition {
        return crate::join::inject(ctx, plan, fault).await;
    }
    if kind.per_slot() {
        return inject_slot(ctx, plan, fault).await;
    }
    match kind {
        Kind::TerminateLock | Kind::TerminateRandom => inject_terminate(ctx, plan, fault).await,
        Kind::RestartFast | Kind::RestartImmediate => inject_restart(ctx, kind, fault).await,
        Kind::SyncStandby => crate::sync::inject(ctx, fault).await,
        Kind::Failover => crate::failover::inject(ctx, plan, fault).await,
        _ => unreachable!("per-slot faults are handled above"),
    }
}

/// A fault on one slot's process or proxy; the rest (the wait, the heal, the respawn) in a
/// task of its own.
async fn inject_slot(ctx: &Arc<Ctx>, plan: Plan, mut fault: Fault) -> Option<usize> {
    let kind = plan.kind;
    let slot = claim_slot(ctx, kind, plan)?;
    let fleet = ctx.fleet.lock().await;
    let replica = fleet.live[slot];
    let state = ctx.board.state(replica);
    fault.replica = Some(replica);
    fault.on_leader = state.leading != 0 && !state.stopped;
    fault.epoch = state.epoch.filter(|_| fault.on_leader);
    let (at, fleet) = act(ctx, fleet, slot, replica, plan, &mut fault).await;
    drop(fleet);
    fault.inject = at;
    fault.heal = at;
    let id = record(ctx, fault);
    tokio::spawn(finish_slot(ctx.clone(), id, slot, replica, plan));
    Some(id)
}

/// The instantaneous part of a per-slot fault on `replica` in `slot`: when it took effect, and
/// the fleet, locked again.
async fn act<'a>(
    ctx: &'a Ctx,
    mut fleet: MutexGuard<'a, Fleet>,
    slot: usize,
    replica: usize,
    plan: Plan,
    fault: &mut Fault,
) -> (u64, MutexGuard<'a, Fleet>) {
    match plan.kind {
        Kind::Kill => (fleet.signal(replica, Signal::KILL), fleet),
        Kind::Stop => (fleet.signal(replica, Signal::STOP), fleet),
        Kind::Partition | Kind::LongPartition => {
            let proxy = fleet.links[slot].clone();
            if plan.kind == Kind::LongPartition {
                fleet = crate::app::long_run_begun(ctx, fleet, replica, fault).await;
            }
            drop(fleet);
            let asked = unix_us();
            proxy.blackhole();
            let at = proxy_acted().await;
            fault.lag = at - asked;
            (at, ctx.fleet.lock().await)
        }
        Kind::Reset => {
            let proxy = fleet.links[slot].clone();
            drop(fleet);
            let before = proxy.accepted();
            let asked = unix_us();
            proxy.reset();
            let at = reset_done(&proxy, before).await;
            fault.lag = at - asked;
            (at, ctx.fleet.lock().await)
        }
        Kind::Exhaust => {
            let at = fleet
                .command(replica, &format!("exhaust {}", plan.param.as_millis()))
                .await;
            (at, fleet)
        }
        Kind::Graceful => (fleet.command(replica, "stop").await, fleet),
        Kind::Resign => {
            let at = fleet
                .command(replica, &format!("resign {}", plan.param.as_millis()))
                .await;
            (at, fleet)
        }
        _ => unreachable!("not a per-slot fault"),
    }
}

/// `pg_terminate_backend` on the lock session, or on a random backend of a replica.
async fn inject_terminate(ctx: &Arc<Ctx>, plan: Plan, mut fault: Fault) -> Option<usize> {
    let kind = plan.kind;
    let client = db::connect(&ctx.db).await.ok()?;
    let (at, pid, name, holder) = if kind == Kind::TerminateLock {
        terminate_lock(&client, ctx.keys[lane_of(ctx, plan.pick)]).await?
    } else {
        terminate_random(ctx, &client, plan.pick).await?
    };
    fault.inject = at;
    fault.heal = at;
    fault.replica = db::replica_of(&name);
    fault.on_leader = holder;
    if holder {
        fault.epoch = fault.replica.and_then(|r| ctx.board.state(r).epoch);
    }
    fault.note = format!(
        "backend {pid} ({name}{})",
        if holder { ", the lock session" } else { "" }
    );
    fault.done = true;
    let id = record(ctx, fault);
    crate::probes::after(ctx, id, at);
    Some(id)
}

/// Terminates the lock session: when, its pid and name, and that it held the lock.
async fn terminate_lock(
    client: &tokio_postgres::Client,
    key: LockKey,
) -> Option<(u64, i32, String, bool)> {
    let at = unix_us();
    let row = client
        .query_opt(
            "SELECT l.pid, coalesce(a.application_name, ''), \
                    pg_catalog.pg_terminate_backend(l.pid) \
             FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
               AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 \
               AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                 WHERE datname = pg_catalog.current_database())",
            &[&(key.class() as u32), &(key.object() as u32)],
        )
        .await
        .ok()??;
    Some((at, row.get::<_, i32>(0), row.get::<_, String>(1), true))
}

/// Terminates the backend `pick` chooses among the replicas': when, its pid and name, and
/// whether it held the lock (in shard mode: a shard's).
async fn terminate_random(
    ctx: &Ctx,
    client: &tokio_postgres::Client,
    pick: u64,
) -> Option<(u64, i32, String, bool)> {
    let candidates: Vec<(i32, String)> = client
        .query(
            "SELECT pid, application_name FROM pg_catalog.pg_stat_activity \
             WHERE datname = pg_catalog.current_database() \
               AND application_name LIKE 'replica-%' ORDER BY pid",
            &[],
        )
        .await
        .ok()?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let (pid, name) = candidates[(pick % candidates.len() as u64) as usize].clone();
    let at = unix_us();
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE pid = $1 \
               AND locktype = 'advisory' AND granted AND mode = 'ExclusiveLock' \
               AND classid = $2 AND objid = ANY($3) AND objsubid = 2), pg_catalog.pg_terminate_backend($1)",
            &[&pid, &(ctx.keys[0].class() as u32), &objects(&ctx.keys)],
        )
        .await
        .ok()?;
    Some((at, pid, name, row.get::<_, bool>(0)))
}

/// A server restart, in a task of its own; the server is claimed until it is over.
async fn inject_restart(ctx: &Arc<Ctx>, kind: Kind, mut fault: Fault) -> Option<usize> {
    {
        let mut claims = ctx.claims.lock().unwrap();
        if claims.server || !ctx.servers.private {
            return None;
        }
        claims.server = true;
    }
    fault.inject = unix_us();
    fault.heal = fault.inject;
    fault.epoch = ctx
        .board
        .leaders(0)
        .first()
        .and_then(|&r| ctx.board.state(r).epoch);
    fault.replica = ctx.board.leaders(0).first().copied();
    let id = record(ctx, fault);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let server = ctx.servers.primary().await;
        let mode = if kind == Kind::RestartFast {
            ShutdownMode::Fast
        } else {
            ShutdownMode::Immediate
        };
        let result = tokio::task::spawn_blocking(move || server.restart(mode)).await;
        let mut heal = unix_us();
        let mut note = match result {
            Ok(Ok(())) => String::new(),
            Ok(Err(e)) => format!("the restart failed: {e}"),
            Err(e) => format!("the restart panicked: {e}"),
        };
        if let Some(replication) = ctx.options.cluster {
            // The standby reconnects on its own time (`wal_retrieve_retry_interval`, 5 s):
            // until it streams, a synchronous primary's commits wait, as in `sync-standby`, so
            // the restart is over then. An asynchronous one's are not held back, but the
            // server stays claimed until then, so that no failover promotes a standby that
            // has stopped streaming.
            match crate::failover::standby_streaming(&ctx.db).await {
                Ok(after) => {
                    let streaming = format!("the standby streamed again {} ms after", after / 1000);
                    note = [note, streaming]
                        .join("; ")
                        .trim_start_matches("; ")
                        .to_owned();
                }
                Err(e) => ctx.runtime_violations.lock().unwrap().push(Violation {
                    at: unix_us(),
                    what: format!("after restart #{id}: {e}"),
                    lane: 0,
                    fault: Some(id),
                    replicas: Vec::new(),
                }),
            }
            if replication == crate::options::Replication::Sync {
                heal = unix_us();
            }
        }
        update(&ctx, id, |f| {
            f.heal = heal;
            f.note = note;
            f.done = true;
        });
        ctx.claims.lock().unwrap().server = false;
        crate::probes::after(&ctx, id, heal);
    });
    Some(id)
}

/// Claims a slot for a fault: the leader's if the plan aims at it and it is free, else a
/// random free one (never slot 0 for a fault that ends the process, when it is kept alive).
pub(crate) fn claim_slot(ctx: &Ctx, kind: Kind, plan: Plan) -> Option<usize> {
    let leaders = ctx.board.leaders(lane_of(ctx, plan.pick));
    let live = ctx.live.lock().unwrap().clone();
    let mut claims = ctx.claims.lock().unwrap();
    let allowed = |slot: usize| !(ctx.options.keep_one && slot == 0 && kind.ends_process());
    let free: Vec<usize> = (0..claims.slots.len())
        .filter(|&s| !claims.slots[s] && allowed(s))
        .collect();
    let leader_slot = leaders
        .first()
        .and_then(|&r| live.iter().position(|&p| p == r))
        .filter(|s| free.contains(s));
    let slot = match leader_slot {
        Some(s) if plan.at_leader => s,
        _ => *free.get((plan.pick % free.len().max(1) as u64) as usize)?,
    };
    claims.slots[slot] = true;
    Some(slot)
}

/// The lane a fault aimed at a leader aims at: the one key, or a shard `pick` chooses.
pub(crate) fn lane_of(ctx: &Ctx, pick: u64) -> usize {
    (pick % ctx.keys.len() as u64) as usize
}

pub(crate) fn record(ctx: &Ctx, mut fault: Fault) -> usize {
    let mut faults = ctx.faults.lock().unwrap();
    fault.id = faults.len();
    faults.push(fault);
    faults.len() - 1
}

pub(crate) fn update(ctx: &Ctx, id: usize, f: impl FnOnce(&mut Fault)) {
    f(&mut ctx.faults.lock().unwrap()[id]);
}

/// The rest of a per-slot fault: wait, heal, respawn; then the slot is free again.
/// A handover to a dying target ends as a kill of that target does.
pub(crate) async fn finish_slot(ctx: Arc<Ctx>, id: usize, slot: usize, replica: usize, plan: Plan) {
    let i = ctx.options.interval;
    let slack = ctx.options.slack();
    match plan.kind {
        Kind::Stop => {
            tokio::time::sleep(plan.param).await;
            let at = ctx.fleet.lock().await.signal(replica, Signal::CONT);
            update(&ctx, id, |f| f.heal = at);
        }
        Kind::Partition | Kind::LongPartition => {
            tokio::time::sleep(plan.param).await;
            let proxy = ctx.fleet.lock().await.links[slot].clone();
            proxy.pass();
            let at = proxy_acted().await;
            update(&ctx, id, |f| f.heal = at);
        }
        Kind::Exhaust => {
            tokio::time::sleep(plan.param).await;
            let at = unix_us();
            update(&ctx, id, |f| f.heal = at);
        }
        Kind::Resign => {
            let before = ctx.board.state(replica).resigned;
            let board = ctx.board.clone();
            // The handover is over when `resign` returns: at most the drain (a run of the
            // schedule's, up to the drain timeout), two intervals and the unlock's 2 s.
            board
                .wait(i * 3 + crate::app::DRAIN + Duration::from_secs(3), |b| {
                    b.state(replica).resigned > before
                })
                .await;
        }
        Kind::Kill | Kind::Graceful | Kind::HandoverDying => {
            // A graceful shutdown: the drain (≤ I; with a run of the schedule's in progress,
            // or while every COMMIT waits for a silent synchronous standby, so that a tick's
            // or a claim's may hold it, ≤ the drain timeout), the unlock (≤ 2 s), the exit.
            let drain = if ctx.board.state(replica).running > 0 || ctx.commits_wait() {
                crate::app::DRAIN
            } else {
                i
            };
            let limit = if plan.kind == Kind::Graceful {
                drain + Duration::from_secs(2) + slack + Duration::from_secs(1)
            } else {
                Duration::from_secs(5)
            };
            let deadline = tokio::time::Instant::now() + limit;
            loop {
                if ctx.fleet.lock().await.exited(replica) {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    let at = ctx.fleet.lock().await.signal(replica, Signal::KILL);
                    if plan.kind == Kind::Graceful {
                        ctx.runtime_violations.lock().unwrap().push(Violation {
                            at,
                            what: format!(
                                "replica-{replica} had not exited {} ms after `stop` (drain ≤ I, \
                                 or the drain timeout with a run in progress or commits \
                                 waiting, unlock ≤ 2 s, + slack): SIGKILLed",
                                limit.as_millis()
                            ),
                            lane: 0,
                            fault: Some(id),
                            replicas: vec![replica],
                        });
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(plan.param).await;
            let fast = match ctx.options.mode {
                crate::options::Mode::Poll => false,
                crate::options::Mode::Fast => true,
                crate::options::Mode::Mixed => plan.fast,
            };
            let index = {
                let mut fleet = ctx.fleet.lock().await;
                // With `--preferences`, a new pod of the latest release (or of a new one).
                crate::prefs::roll(&mut fleet, slot, plan.pick);
                let index = fleet.spawn(slot, fast);
                ctx.live.lock().unwrap()[slot] = index;
                index
            };
            let board = ctx.board.clone();
            board
                .wait(Duration::from_secs(10), |b| b.state(index).started)
                .await;
        }
        Kind::Reset => {}
        _ => unreachable!("not a per-slot fault"),
    }
    update(&ctx, id, |f| f.done = true);
    ctx.claims.lock().unwrap().slots[slot] = false;
    let heal = ctx.faults.lock().unwrap()[id].heal;
    crate::probes::after(&ctx, id, heal);
}

/// When a change of a proxy's mode has taken effect, as near as this process can tell: the
/// proxies' connection tasks run on this process's runtime, which on a starved machine runs
/// them (and so blackholes or heals) well after the call. This stamps the moment a task
/// spawned after the change runs, after the woken connection tasks had their turn.
pub(crate) async fn proxy_acted() -> u64 {
    tokio::task::yield_now().await;
    tokio::spawn(async {
        tokio::task::yield_now().await;
        unix_us()
    })
    .await
    .unwrap_or_else(|_| unix_us())
}

/// When every connection a proxy had before a reset has closed (each sent its RSTs), polled
/// every millisecond (at most 5 s); `before` is [`Link::accepted`] just before the reset.
///
/// [`Link::accepted`]: crate::link::Link::accepted
async fn reset_done(proxy: &crate::link::Link, before: u64) -> u64 {
    let deadline = unix_us() + 5_000_000;
    loop {
        let fresh = proxy.accepted().saturating_sub(before) as usize;
        let now = unix_us();
        if proxy.open() <= fresh || now > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
