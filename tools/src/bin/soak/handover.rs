//! The handover faults (`--preferences`): `pg_elector::request_handover` from the soak's own
//! process, on a pool of its own, to a live standby (`handover-live`), to a live standby
//! SIGKILLed right after the request (`handover-dying`, respawned as after `kill`), and to an
//! identity no live standby has (`handover-missing`). Around each request to a live or a
//! missing target the soak counts what it cost: the logins through the replicas' proxies, and
//! the replicas' backends in `pg_stat_activity` before and after, with those born meanwhile.

use std::sync::Arc;
use std::time::Duration;

use pg_elector::{HandoverError, HandoverTo, request_handover};
use rustix::process::Signal;

use crate::check::Violation;
use crate::child::unix_us;
use crate::ctx::Ctx;
use crate::db;
use crate::faults::{Fault, Kind, Plan};
use crate::inject::{record, update};

/// How long an old leader is asked to stay away: long against the run, so that a request
/// whose target dies would strand the key for all of it if the library waited it out.
pub(crate) const STAY_AWAY: Duration = Duration::from_secs(60);
/// The bound of each `request_handover` call.
const CALL_BOUND: Duration = Duration::from_secs(2);

/// How a request was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Made: the leader will hand over to the identity returned.
    Made,
    /// `HandoverError::NoSuchStandby`.
    NoSuchStandby,
    /// `HandoverError::NoLeader`.
    NoLeader,
    /// `HandoverError::Timeout` (it may or may not have asked).
    Timeout,
    /// Any other error.
    Other(String),
}

/// One request.
#[derive(Clone, Debug)]
pub(crate) struct Asked {
    /// The identity named (`None`: the most preferred live standby).
    pub(crate) named: Option<String>,
    /// The replica process the request went to (the answer's identity).
    pub(crate) target: Option<usize>,
    /// Whether that replica runs fast takeover.
    pub(crate) target_fast: bool,
    /// The answer.
    pub(crate) answer: Answer,
    /// The target was SIGKILLed right after the request (`handover-dying`).
    pub(crate) killed: bool,
}

impl Asked {
    /// Whether the request may have been made: made, or timed out (then it may or may not
    /// have asked).
    pub(crate) fn maybe_made(&self) -> bool {
        matches!(self.answer, Answer::Made | Answer::Timeout) && self.target.is_some()
    }
}

/// What a request to a live or a missing target cost, counted from just before it until the
/// target led (or its bound passed) and one interval more.
#[derive(Clone, Debug)]
pub(crate) struct Cost {
    /// The fault.
    pub(crate) fault: usize,
    /// No other fault was in effect or injected meanwhile.
    pub(crate) clean: bool,
    /// Connections the replicas' proxies accepted meanwhile (logins).
    pub(crate) logins: u64,
    /// Pool connections (`replica-<n>/pool`, `/app`) of replicas other than the old leader
    /// and the target that were replaced meanwhile: there before, gone after, with one of the
    /// same name born meanwhile.
    pub(crate) pool_logins: i64,
    /// Lock and waiting sessions (`replica-<n>`) born meanwhile, still there at the end.
    pub(crate) session_logins: i64,
    /// The replicas' backends before and after.
    pub(crate) backends: (i64, i64),
    /// Per `application_name`, the backends born and gone meanwhile.
    pub(crate) born: Vec<String>,
}

/// The soak's pool for the requests: one connection, named as the checker's.
pub(crate) fn pool(config: &tokio_postgres::Config) -> deadpool_postgres::Pool {
    let mut config = config.clone();
    config
        .application_name(db::CHECKER)
        .connect_timeout(Duration::from_secs(2));
    pg_elector_testkit::server::config::pool_from_config(config, 1)
}

/// Injects one handover fault; `None` when it has no target now (no leader, no live standby).
pub(crate) async fn inject(ctx: &Arc<Ctx>, plan: Plan, mut fault: Fault) -> Option<usize> {
    let pool = ctx.handover_pool.clone()?;
    let leader = *ctx.board.leaders(0).first()?;
    fault.replica = Some(leader);
    fault.on_leader = true;
    fault.epoch = ctx.board.state(leader).epoch;
    match plan.kind {
        Kind::HandoverLive => live(ctx, plan, fault, &pool, leader).await,
        Kind::HandoverDying => dying(ctx, plan, fault, &pool, leader).await,
        _ => missing(ctx, plan, fault, &pool, leader).await,
    }
}

/// The live standbys of the latest read of the candidates table that no running fault holds
/// (their process up, their slot free), and their slots.
fn standbys(ctx: &Ctx, leader: usize) -> Vec<(usize, usize)> {
    let Some(latest) = ctx.candidates.latest(unix_us(), 500_000) else {
        return Vec::new();
    };
    let live = ctx.live.lock().unwrap().clone();
    let claims = ctx.claims.lock().unwrap();
    latest
        .live
        .iter()
        .filter(|&&(p, _)| p != leader)
        .filter_map(|&(p, _)| {
            let slot = live.iter().position(|&q| q == p)?;
            let s = ctx.board.state(p);
            (!claims.slots[slot] && s.started && !s.stopped && !s.ended).then_some((p, slot))
        })
        .collect()
}

/// Asks; when, and the answer as recorded.
async fn ask(ctx: &Ctx, pool: &deadpool_postgres::Pool, named: Option<String>) -> (u64, Asked) {
    let to = match &named {
        Some(name) => HandoverTo::Identity(name.clone()),
        None => HandoverTo::MostPreferred,
    };
    let at = unix_us();
    let result = request_handover(pool, ctx.keys[0], to, STAY_AWAY, CALL_BOUND).await;
    let (answer, target) = match result {
        Ok(identity) => (Answer::Made, db::replica_of(&identity)),
        Err(HandoverError::NoSuchStandby { .. }) => (Answer::NoSuchStandby, None),
        Err(HandoverError::NoLeader) => (Answer::NoLeader, None),
        // It may have asked: the target is the one named, if any.
        Err(HandoverError::Timeout(_)) => {
            (Answer::Timeout, named.as_deref().and_then(db::replica_of))
        }
        Err(e) => (Answer::Other(e.to_string()), None),
    };
    let target_fast = match target {
        Some(t) => ctx.fleet.lock().await.procs.get(t).is_some_and(|p| p.fast),
        None => false,
    };
    let asked = Asked {
        named,
        target,
        target_fast,
        answer,
        killed: false,
    };
    (at, asked)
}

fn note(asked: &Asked) -> String {
    let named = asked.named.as_deref().unwrap_or("the most preferred");
    match (&asked.answer, asked.target) {
        (Answer::Made, Some(t)) => format!("to {named}: made, replica-{t}"),
        (answer, _) => format!("to {named}: {answer:?}"),
    }
}

/// To a live standby, by its identity, or (half of the time) to the most preferred one.
async fn live(
    ctx: &Arc<Ctx>,
    plan: Plan,
    mut fault: Fault,
    pool: &deadpool_postgres::Pool,
    leader: usize,
) -> Option<usize> {
    let standbys = standbys(ctx, leader);
    if standbys.is_empty() {
        return None;
    }
    let named = (plan.pick & 1 == 0).then(|| {
        let (p, _) = standbys[((plan.pick >> 1) % standbys.len() as u64) as usize];
        format!("replica-{p}")
    });
    let before = Snapshot::take(ctx).await;
    let (at, asked) = ask(ctx, pool, named).await;
    if let (Answer::Made, Some(t)) = (&asked.answer, asked.target) {
        *ctx.requested.lock().unwrap() = Some(t);
    }
    answered(&mut fault, at, &asked);
    let target = asked.target;
    fault.handover = Some(asked);
    let id = record(ctx, fault);
    tokio::spawn(count(ctx.clone(), id, before, leader, target));
    Some(id)
}

/// `fault` as request `asked`, answered at `at`, left it: instantaneous, noted, and on the
/// leader only if made (only a request made is sure to reach it). Whether it was made.
fn answered(fault: &mut Fault, at: u64, asked: &Asked) -> bool {
    let made = asked.answer == Answer::Made;
    fault.inject = at;
    fault.heal = at;
    fault.note = note(asked);
    fault.on_leader = made;
    made
}

/// To a live standby that is SIGKILLed right after the request; its slot is claimed, and the
/// rest is a kill's (`inject::finish_slot`: the exit, the respawn).
async fn dying(
    ctx: &Arc<Ctx>,
    plan: Plan,
    mut fault: Fault,
    pool: &deadpool_postgres::Pool,
    leader: usize,
) -> Option<usize> {
    let (target, slot) = {
        let choices: Vec<(usize, usize)> = standbys(ctx, leader)
            .into_iter()
            .filter(|&(_, slot)| !(ctx.options.keep_one && slot == 0))
            .collect();
        if choices.is_empty() {
            return None;
        }
        let chosen = choices[(plan.pick % choices.len() as u64) as usize];
        let mut claims = ctx.claims.lock().unwrap();
        if claims.slots[chosen.1] {
            return None;
        }
        claims.slots[chosen.1] = true;
        chosen
    };
    let (at, mut asked) = ask(ctx, pool, Some(format!("replica-{target}"))).await;
    let made = answered(&mut fault, at, &asked);
    asked.killed = made;
    fault.handover = Some(asked);
    if !made {
        fault.done = true;
        ctx.claims.lock().unwrap().slots[slot] = false;
        return Some(record(ctx, fault));
    }
    *ctx.requested.lock().unwrap() = Some(target);
    let killed = ctx.fleet.lock().await.signal(target, Signal::KILL);
    fault.heal = killed;
    fault.note = format!(
        "{}, SIGKILLed {} ms after the request",
        fault.note,
        (killed - at) / 1000
    );
    let id = record(ctx, fault);
    tokio::spawn(crate::inject::finish_slot(
        ctx.clone(),
        id,
        slot,
        target,
        plan,
    ));
    Some(id)
}

/// To an identity no live standby has: one never spawned, or (half of the time) one whose
/// process ended more than four intervals ago (a killed standby's row stops counting two
/// intervals after its last try). It must be refused with `HandoverError::NoSuchStandby`.
async fn missing(
    ctx: &Arc<Ctx>,
    plan: Plan,
    mut fault: Fault,
    pool: &deadpool_postgres::Pool,
    leader: usize,
) -> Option<usize> {
    let long_ago = unix_us().saturating_sub((ctx.options.interval * 4).as_micros() as u64);
    let (ended, spawned) = {
        let fleet = ctx.fleet.lock().await;
        let ended: Vec<usize> = (0..fleet.procs.len())
            .filter(|&p| fleet.procs[p].ended.is_some_and(|e| e < long_ago))
            .collect();
        (ended, fleet.procs.len())
    };
    let name = if plan.pick & 1 == 1 && !ended.is_empty() {
        format!(
            "replica-{}",
            ended[((plan.pick >> 1) % ended.len() as u64) as usize]
        )
    } else {
        format!("replica-{}", spawned + 100_000)
    };
    let before = Snapshot::take(ctx).await;
    let (at, asked) = ask(ctx, pool, Some(name)).await;
    let made = answered(&mut fault, at, &asked);
    fault.handover = Some(asked);
    let id = record(ctx, fault);
    if made {
        ctx.runtime_violations.lock().unwrap().push(Violation {
            at,
            what: "request_handover to an identity no live standby has was accepted (the docs: \
                   `HandoverError::NoSuchStandby`, nothing changed)"
                .into(),
            lane: 0,
            fault: Some(id),
            replicas: vec![leader],
        });
    }
    tokio::spawn(count(ctx.clone(), id, before, leader, None));
    Some(id)
}

/// What the soak sees of the replicas' connections at one moment.
struct Snapshot {
    /// Per slot, the connections its proxy accepted so far.
    accepted: Vec<u64>,
    /// The server's clock (µs), when it is reachable.
    server_at: Option<i64>,
    /// The replicas' backends: pid and `application_name`.
    backends: Vec<(i32, String)>,
    /// Per pid, what it was doing (for the report of one gone meanwhile).
    details: Vec<(i32, String)>,
}

/// The replicas' backends: pid, `application_name`, the server's clock (µs), and what each
/// was doing (its state, its age, and its last statement's start).
const BACKENDS: &str = "SELECT pid, application_name, \
       (extract(epoch FROM pg_catalog.statement_timestamp()) * 1e6)::int8, \
       pg_catalog.format('pid %s %s, born %s ms before, state since %s ms: %s', pid, state, \
         (extract(epoch FROM pg_catalog.statement_timestamp() - backend_start) * 1e3)::int8, \
         (extract(epoch FROM pg_catalog.statement_timestamp() - state_change) * 1e3)::int8, \
         pg_catalog.left(query, 50)) \
     FROM pg_catalog.pg_stat_activity \
     WHERE datname = pg_catalog.current_database() AND application_name LIKE 'replica-%'";

impl Snapshot {
    async fn take(ctx: &Ctx) -> Self {
        let accepted = ctx
            .fleet
            .lock()
            .await
            .links
            .iter()
            .map(|l| l.accepted())
            .collect();
        let (server_at, rows) = backends(ctx).await.unwrap_or_default();
        let backends = rows.iter().map(|(p, n, _)| (*p, n.clone())).collect();
        let details = rows.into_iter().map(|(p, _, d)| (p, d)).collect();
        Snapshot {
            accepted,
            server_at,
            backends,
            details,
        }
    }
}

/// The replicas' backends (pid, `application_name`, what it is doing) and the server's clock.
type Backends = (Option<i64>, Vec<(i32, String, String)>);

async fn backends(ctx: &Ctx) -> Option<Backends> {
    let client = db::connect(&ctx.db).await.ok()?;
    let rows = client.query(BACKENDS, &[]).await.ok()?;
    let at = rows.first().map(|r| r.get::<_, i64>(2));
    let rows = rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get::<_, Option<String>>(3).unwrap_or_default(),
            )
        })
        .collect();
    Some((at, rows))
}

/// After a request: waits until the target leads (at most its bound) and one interval more,
/// then counts what it cost; then the fault is over. A pool connection of another standby
/// that was there before and is gone after, with one born meanwhile, was replaced (a login
/// the handover cost); one born with none gone replaced a connection an earlier fault had
/// already ended (found dead only when borrowed), or grew a pool within its size.
async fn count(ctx: Arc<Ctx>, id: usize, before: Snapshot, leader: usize, target: Option<usize>) {
    let i = ctx.options.interval;
    if let Some(t) = target {
        let bound = i * 3 + crate::app::DRAIN + ctx.options.slack();
        ctx.board.wait(bound, |b| b.state(t).leads(0)).await;
    }
    tokio::time::sleep(i).await;
    let logins: u64 = {
        let fleet = ctx.fleet.lock().await;
        fleet
            .links
            .iter()
            .zip(&before.accepted)
            .map(|(l, &b)| l.accepted().saturating_sub(b))
            .sum()
    };
    let after = match before.server_at {
        Some(_) => backends(&ctx)
            .await
            .map(|(_, b)| b.into_iter().map(|(p, n, _)| (p, n)).collect::<Vec<_>>()),
        None => None,
    };
    let (mut pool_logins, mut session_logins) = (0, 0);
    let mut born = Vec::new();
    let other = |name: &str| {
        let replica = db::replica_of(name);
        name.contains('/') && replica != Some(leader) && replica != target
    };
    if let Some(after) = &after {
        let had = |pid: &i32| before.backends.iter().any(|(p, _)| p == pid);
        let has = |pid: &i32| after.iter().any(|(p, _)| p == pid);
        let mut names: Vec<&String> = after.iter().map(|(_, n)| n).collect();
        names.extend(before.backends.iter().map(|(_, n)| n));
        names.sort();
        names.dedup();
        for name in names {
            let new = after.iter().filter(|(p, n)| n == name && !had(p)).count() as i64;
            let gone = before
                .backends
                .iter()
                .filter(|(p, n)| n == name && !has(p))
                .count() as i64;
            if new == 0 && gone == 0 {
                continue;
            }
            let was: Vec<&str> = before
                .backends
                .iter()
                .filter(|(p, n)| n == name && !has(p))
                .filter_map(|(p, _)| before.details.iter().find(|(d, _)| d == p))
                .map(|(_, d)| d.as_str())
                .collect();
            born.push(if was.is_empty() {
                format!("{name}: {new} born, {gone} gone")
            } else {
                format!("{name}: {new} born, {gone} gone ({})", was.join("; "))
            });
            if !name.contains('/') {
                session_logins += new;
            } else if other(name) {
                pool_logins += new.min(gone);
            }
        }
    }
    let clean = {
        let faults = ctx.faults.lock().unwrap();
        !faults[id].overlapped && faults.len() == id + 1
    };
    ctx.handovers.lock().unwrap().push(Cost {
        fault: id,
        clean: clean && after.is_some(),
        logins,
        pool_logins,
        session_logins,
        backends: (
            before.backends.len() as i64,
            after.as_ref().map_or(0, |a| a.len() as i64),
        ),
        born,
    });
    let heal = ctx.faults.lock().unwrap()[id].heal;
    update(&ctx, id, |f| f.done = true);
    crate::probes::after(&ctx, id, heal);
}
