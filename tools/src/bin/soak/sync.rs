//! The synchronous standby that stops confirming: `synchronous_standby_names = '*'` with no
//! standby streaming and `synchronous_commit = on` (the harness runs with it off), set with
//! `ALTER SYSTEM` and `pg_reload_conf()`, so that every COMMIT that wrote waits, for a while;
//! then both are set back. The connections idle in the application pools are probed every
//! interval from past a claim's bound (2 s) until a second before the heal (one given back with
//! its COMMIT still waiting is stuck), and every connection after the heal. With `--cluster`
//! the standby's link to the primary's WAL is cut instead, for as long.

use std::sync::Arc;
use std::time::Duration;

use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::faults::Fault;
use crate::inject::{record, update};

/// When the idle connections are first probed: past a claim's bound (2 s).
const FIRST_PROBE: Duration = Duration::from_millis(2_200);

/// Sets the standby, and clears it in a task of its own; the server is claimed until then.
pub(crate) async fn inject(ctx: &Arc<Ctx>, mut fault: Fault) -> Option<usize> {
    {
        let mut claims = ctx.claims.lock().unwrap();
        if claims.server || !ctx.servers.private {
            return None;
        }
        claims.server = true;
    }
    let release = |ctx: &Ctx| ctx.claims.lock().unwrap().server = false;
    let at = unix_us();
    if let Err(e) = set(ctx, true).await {
        eprintln!("soak: sync-standby: {e}");
        // Not left cut off: a later fast stop would wait for it.
        let _ = set(ctx, false).await;
        release(ctx);
        return None;
    }
    fault.inject = at;
    fault.heal = at;
    fault.on_leader = true;
    fault.replica = ctx.board.leaders(0).first().copied();
    let id = record(ctx, fault.clone());
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let every = ctx.options.interval;
        let heal_at = tokio::time::Instant::now() + fault.param;
        tokio::time::sleep(FIRST_PROBE).await;
        // Each probe holds what it borrowed for up to 1 s: none in the last second.
        while tokio::time::Instant::now() + Duration::from_secs(1) < heal_at {
            crate::probes::probe_all(&ctx, id, true).await;
            tokio::time::sleep(every).await;
        }
        tokio::time::sleep_until(heal_at).await;
        let result = set(&ctx, false).await;
        let heal = unix_us();
        update(&ctx, id, |f| {
            f.heal = heal;
            f.done = true;
            if let Err(e) = &result {
                f.note = format!("clearing it failed: {e}");
            }
        });
        ctx.claims.lock().unwrap().server = false;
        crate::probes::after(&ctx, id, heal);
    });
    Some(id)
}

/// Makes every COMMIT wait for a standby that never streams, or (`false`) asynchronous again.
/// With `--cluster`, the standby is there: its WAL link is blackholed (passed again), and the
/// primary made synchronous only when the cluster is not already.
async fn set(ctx: &Ctx, on: bool) -> Result<(), String> {
    let server = ctx.servers.primary().await;
    if let Some(cluster) = ctx.servers.cluster() {
        let cluster = cluster.lock().await;
        if on {
            cluster.wal.blackhole();
        } else {
            cluster.wal.pass();
        }
        if cluster.is_synchronous() {
            return Ok(());
        }
    }
    tokio::task::spawn_blocking(move || server.set_synchronous_standby(on))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}
