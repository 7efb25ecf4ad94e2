//! The join cut off at its grant (shard mode): a replica is killed (a fault of its own, `kill`)
//! and, once the others own every shard again, respawned, and its proxy is blackholed as soon as
//! `pg_locks` shows the new process's member lock granted, or (drawn half of the time) its live
//! mark; the partition lasts as drawn, then heals.

use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;

use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::db;
use crate::faults::{Fault, Kind, Plan};
use crate::inject::{claim_slot, proxy_acted, record, update};

/// The object of a group's member key (the shared lock every member holds).
const MEMBER_OBJECT: i32 = -1;

/// Kills the replica in a slot, respawns it, and blackholes its proxy right after its member
/// lock or its live mark is granted; the heal in a task of its own.
pub(crate) async fn inject(ctx: &Arc<Ctx>, plan: Plan, mut fault: Fault) -> Option<usize> {
    let slot = claim_slot(ctx, Kind::JoinPartition, plan)?;
    let release = |ctx: &Ctx| ctx.claims.lock().unwrap().slots[slot] = false;
    let Ok(client) = db::connect(&ctx.db).await else {
        release(ctx);
        return None;
    };
    let mut fleet = ctx.fleet.lock().await;
    let old = fleet.live[slot];
    let state = ctx.board.state(old);
    let kill = Fault {
        kind: Kind::Kill,
        replica: Some(old),
        on_leader: state.leading != 0 && !state.stopped,
        inject: fleet.signal(old, Signal::KILL),
        note: "before a join-partition".into(),
        ..fault.clone()
    };
    let kill = record(
        ctx,
        Fault {
            heal: kill.inject,
            ..kill
        },
    );
    let deadline = unix_us() + 5_000_000;
    while !fleet.exited(old) && unix_us() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The others own every shard again before the joiner comes, so that a join moves shards
    // they hold.
    drop(fleet);
    let lanes = ctx.keys.len();
    ctx.board
        .wait(Duration::from_secs(3), |b| {
            (0..lanes).all(|lane| b.leaders(lane).len() == 1)
        })
        .await;
    let mut fleet = ctx.fleet.lock().await;
    let joiner = fleet.spawn(slot, false);
    ctx.live.lock().unwrap()[slot] = joiner;
    let proxy = fleet.links[slot].clone();
    drop(fleet);
    update(ctx, kill, |f| f.done = true);
    // The live mark's object tells the member's shard count: one key per shard.
    let (object, what) = if (plan.pick >> 40) & 1 == 1 {
        (-1 - ctx.keys.len() as i32, "its live mark")
    } else {
        (MEMBER_OBJECT, "the member lock")
    };
    let granted = lock_granted(&client, ctx, joiner, object).await;
    let asked = unix_us();
    proxy.blackhole();
    let at = proxy_acted().await;
    fault.replica = Some(joiner);
    fault.inject = at;
    fault.heal = at;
    fault.lag = at - asked;
    fault.note = match granted {
        Some(t) => format!("{} µs after {what} showed granted", at.saturating_sub(t)),
        None => format!("{what} never showed granted within 10 s"),
    };
    let id = record(ctx, fault);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(plan.param).await;
        proxy.pass();
        let heal = proxy_acted().await;
        update(&ctx, id, |f| {
            f.heal = heal;
            f.done = true;
        });
        ctx.claims.lock().unwrap().slots[slot] = false;
        crate::probes::after(&ctx, id, heal);
    });
    Some(id)
}

/// Polls `pg_locks` every millisecond (at most 10 s) until process `replica`'s shared lock of
/// the group's `object` (its member lock or its live mark) shows granted; when it did.
async fn lock_granted(
    client: &tokio_postgres::Client,
    ctx: &Ctx,
    replica: usize,
    object: i32,
) -> Option<u64> {
    let class = ctx.keys.first()?.class() as u32;
    let name = format!("replica-{replica}");
    let deadline = unix_us() + 10_000_000;
    while unix_us() < deadline {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks l \
                   JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 \
                   AND l.objid = $2 AND l.objsubid = 2 \
                   AND split_part(a.application_name, '/', 1) = $3)",
                &[&class, &(object as u32), &name],
            )
            .await
            .ok()?;
        if row.get::<_, bool>(0) {
            return Some(unix_us());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}
