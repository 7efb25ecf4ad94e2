//! The probes of the replicas' application pools (the pool each replica's schedule shares with
//! its ticker): after each fault, once it has healed and one interval more has passed with no
//! fault in effect, every live replica is asked to borrow every connection of that pool and
//! ask each `SELECT 1` (see `soak/app.rs`); a connection that does not answer within 1 s is
//! stuck. While a fault makes every COMMIT wait, the connections idle in the pools are probed
//! every interval too: only a connection given back to the pool with its statement still
//! running can be stuck then.

use std::sync::Arc;
use std::time::Duration;

use crate::child::unix_us;
use crate::ctx::Ctx;

/// One probe sent to one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Its number (the replica's answer carries it).
    pub(crate) id: usize,
    /// The fault it follows.
    pub(crate) fault: usize,
    /// The replica process asked.
    pub(crate) replica: usize,
    /// When it was sent (µs).
    pub(crate) at: u64,
    /// Sent while its fault was still in effect: only the connections idle in the pool then
    /// are asked.
    pub(crate) during: bool,
}

/// After fault `fault` has healed (at `heal`): waits one interval, then probes every live
/// replica, unless another fault is in effect by then.
pub(crate) fn after(ctx: &Arc<Ctx>, fault: usize, heal: u64) {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let at = heal + ctx.options.interval.as_micros() as u64;
        let now = unix_us();
        if at > now {
            tokio::time::sleep(Duration::from_micros(at - now)).await;
        }
        if ctx.any_active() {
            return;
        }
        probe_all(&ctx, fault, false).await;
    });
}

/// Probes every live, running replica now, after (or, `during`, within) fault `fault`.
pub(crate) async fn probe_all(ctx: &Ctx, fault: usize, during: bool) {
    let live = ctx.live.lock().unwrap().clone();
    let mut fleet = ctx.fleet.lock().await;
    for replica in live {
        let state = ctx.board.state(replica);
        if !state.started || state.stopped || state.ended {
            continue;
        }
        let id = {
            let mut sent = ctx.probes.lock().unwrap();
            let id = sent.len();
            sent.push(Sent {
                id,
                fault,
                replica,
                at: unix_us(),
                during,
            });
            id
        };
        let idle = if during { " idle" } else { "" };
        fleet.command(replica, &format!("probe {id}{idle}")).await;
    }
}
