//! The faults: their kinds, the bounds the README documents for each, and their injection.

use std::sync::Arc;
use std::time::Duration;

use pg_elector_harness::ShutdownMode;
use pg_elector_tools::rng::Rng;
use rustix::process::Signal;

use crate::Ctx;
use crate::check::Violation;
use crate::child::unix_us;
use crate::db;

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// SIGKILL a replica, respawn it after a random delay.
    Kill,
    /// SIGSTOP a replica for a random time, then SIGCONT.
    Stop,
    /// `pg_terminate_backend` of the lock session.
    TerminateLock,
    /// `pg_terminate_backend` of a random backend of a replica.
    TerminateRandom,
    /// Blackhole one replica's proxy for a random time, then pass again.
    Partition,
    /// Reset every connection of one replica's proxy.
    Reset,
    /// `pg_ctl restart -m fast`.
    RestartFast,
    /// `pg_ctl restart -m immediate` (a crash and recovery).
    RestartImmediate,
    /// Dummy borrowers hold every connection of a replica's elector pool for a random time.
    Exhaust,
    /// Graceful shutdown of a replica (`stop` on its stdin), respawned after a random delay.
    Graceful,
    /// `Elector::resign` with a random cooldown.
    Resign,
}

/// When a leader must be back, and how long two may lead, after one fault (README, "Guarantees,
/// in multiples of I"). Every time gets the run's slack on top.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    /// A leader again by `inject + from_inject` …
    pub(crate) from_inject: Duration,
    /// … or `heal + after_heal`, whichever is later.
    pub(crate) after_heal: Duration,
    /// Two leaders at once allowed within this of the injection; zero: never.
    pub(crate) overlap: Duration,
    /// The leader it hit demotes within this of the injection.
    pub(crate) demote: Option<Duration>,
}

/// The demotion allowed when the server ends a live leader's session (1 ms + scheduling in the
/// README), as 100 ms (plus the slack); and how long a leader that could not hear it (frozen,
/// partitioned) may go on leading once it can.
pub(crate) const SESSION_ENDED: Duration = Duration::from_millis(100);

impl Kind {
    /// Every kind, in the report's order.
    pub(crate) const ALL: [Kind; 11] = [
        Kind::Kill,
        Kind::Stop,
        Kind::TerminateLock,
        Kind::TerminateRandom,
        Kind::Partition,
        Kind::Reset,
        Kind::RestartFast,
        Kind::RestartImmediate,
        Kind::Exhaust,
        Kind::Graceful,
        Kind::Resign,
    ];

    /// The kinds a name on the command line stands for.
    pub(crate) fn by_name(name: &str) -> Result<Vec<Kind>, String> {
        Ok(match name {
            "all" => Kind::ALL.to_vec(),
            "terminate" => vec![Kind::TerminateLock, Kind::TerminateRandom],
            "restart" => vec![Kind::RestartFast, Kind::RestartImmediate],
            "sigkill" => vec![Kind::Kill],
            "sigstop" | "freeze" => vec![Kind::Stop],
            "blackhole" => vec![Kind::Partition],
            other => vec![
                *Kind::ALL
                    .iter()
                    .find(|k| k.name() == other)
                    .ok_or_else(|| format!("unknown fault {other:?}"))?,
            ],
        })
    }

    /// The kind's name on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Stop => "stop",
            Kind::TerminateLock => "terminate-lock",
            Kind::TerminateRandom => "terminate-random",
            Kind::Partition => "partition",
            Kind::Reset => "reset",
            Kind::RestartFast => "restart-fast",
            Kind::RestartImmediate => "restart-immediate",
            Kind::Exhaust => "exhaust",
            Kind::Graceful => "graceful",
            Kind::Resign => "resign",
        }
    }

    /// The kind as the report's table names it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Kill => "SIGKILL, respawn",
            Kind::Stop => "SIGSTOP, SIGCONT",
            Kind::TerminateLock => "terminate the lock session",
            Kind::TerminateRandom => "terminate a random backend",
            Kind::Partition => "partition (blackhole), heal",
            Kind::Reset => "proxy reset",
            Kind::RestartFast => "server restart, fast",
            Kind::RestartImmediate => "server restart, immediate",
            Kind::Exhaust => "pool exhausted",
            Kind::Graceful => "graceful restart",
            Kind::Resign => "resign",
        }
    }

    /// How often it is drawn, relative to the others (a server restart hits every replica and
    /// takes a while: half as often).
    pub(crate) fn weight(self) -> u64 {
        match self {
            Kind::RestartFast | Kind::RestartImmediate => 1,
            _ => 2,
        }
    }

    /// Whether it hits the whole fleet rather than one replica.
    pub(crate) fn server_wide(self) -> bool {
        matches!(self, Kind::RestartFast | Kind::RestartImmediate)
    }

    /// Whether it needs a private server (it restarts it).
    pub(crate) fn needs_private(self) -> bool {
        self.server_wide()
    }

    /// Whether it ends the process, so that it cannot hit the slot kept alive.
    fn ends_process(self) -> bool {
        matches!(self, Kind::Kill | Kind::Graceful)
    }

    /// Whether it hits one replica's slot (and so claims it while it lasts).
    fn per_slot(self) -> bool {
        !matches!(
            self,
            Kind::TerminateLock
                | Kind::TerminateRandom
                | Kind::RestartFast
                | Kind::RestartImmediate
        )
    }

    /// The bound at check interval `i` (README, "Guarantees, in multiples of I").
    pub(crate) fn bound(self, i: Duration) -> Bound {
        let b = |from_inject, after_heal, overlap, demote| Bound {
            from_inject,
            after_heal,
            overlap,
            demote,
        };
        let zero = Duration::ZERO;
        let graceful = Some(SESSION_ENDED);
        match self {
            // New leader ≤ 1·I after the server sees the socket close; never two.
            Kind::Kill => b(i, zero, zero, None),
            // New leader ≤ 5·I; a leader frozen longer than 3·I never acts on resume (checked
            // apart); after the SIGCONT, the next try within I.
            Kind::Stop => b(i * 5, i, zero, None),
            // The old leader demotes within 1 ms + scheduling, before the new term begins (a
            // grant that was not handed over waits 5 ms): never two; a new leader ≤ 1·I. A
            // leader that cannot hear (frozen, partitioned) is judged apart.
            Kind::TerminateLock | Kind::TerminateRandom | Kind::Reset => {
                b(i, zero, zero, Some(SESSION_ENDED))
            }
            // Old demoted ≤ 2·I, new leader ≤ 5·I, never two; after the heal the old session's
            // close reaches the server, and the next try comes within I.
            Kind::Partition => b(i * 5, i, zero, Some(i * 2)),
            // All demote at once; a new leader ≤ 1·I after the server accepts again; never two.
            Kind::RestartFast | Kind::RestartImmediate => b(zero, i, zero, Some(SESSION_ENDED)),
            // A standby that cannot borrow does not try: only a leader within I of the end.
            Kind::Exhaust => b(zero, i, zero, None),
            // Demoted at once; drain ≤ I (the drain timeout), unlock, new leader ≤ 1·I after.
            Kind::Graceful | Kind::Resign => b(i * 2, zero, zero, graceful),
        }
    }

    /// The bound as the report's table shows it.
    pub(crate) fn bound_text(self) -> &'static str {
        match self {
            Kind::Kill => "≤ 1·I / never",
            Kind::Stop => "≤ 5·I, SIGCONT + 1·I / never",
            Kind::TerminateLock | Kind::TerminateRandom | Kind::Reset => "≤ 1·I / never",
            Kind::Partition => "≤ 5·I, heal + 1·I / never",
            Kind::RestartFast | Kind::RestartImmediate => "accepting + 1·I / never",
            Kind::Exhaust => "end + 1·I / never",
            Kind::Graceful | Kind::Resign => "≤ 2·I (drain + 1·I) / never",
        }
    }
}

/// One injected fault.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    /// Its number in the run (from 0).
    pub(crate) id: usize,
    /// What it was.
    pub(crate) kind: Kind,
    /// The replica process it hit (for a terminate: the backend's owner).
    pub(crate) replica: Option<usize>,
    /// Whether it hit the leader (or the lock session); always for a server restart.
    pub(crate) on_leader: bool,
    /// The epoch of the leader it hit, at the injection.
    pub(crate) epoch: Option<u64>,
    /// How long it lasted (stop, partition, exhaust), the cooldown (resign) or the respawn
    /// delay (kill, graceful).
    pub(crate) param: Duration,
    /// When it took effect (µs, this machine's clock): the signal, the query, the restart's
    /// start; for a proxy fault, when the proxy acted (see [`proxy_acted`]).
    pub(crate) inject: u64,
    /// How much later than asked a proxy fault took effect (the soak's own process starved).
    pub(crate) lag: u64,
    /// When it was over (SIGCONT, pass, the server accepting again, the borrowers gone); the
    /// injection for the instantaneous ones.
    pub(crate) heal: u64,
    /// Its task is over (the slot respawned, the claim released).
    pub(crate) done: bool,
    /// Earlier faults were still in effect when it started.
    pub(crate) overlapped: bool,
    /// What else is worth saying (the terminated backend, a failed restart).
    pub(crate) note: String,
}

/// What the injector drew for one fault (all from the seed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// The kind.
    pub(crate) kind: Kind,
    /// Aim at the leader (else at a random replica).
    pub(crate) at_leader: bool,
    /// Picks among the candidates (replicas, backends).
    pub(crate) pick: u64,
    /// Its length, cooldown or respawn delay.
    pub(crate) param: Duration,
    /// With `--mode mixed`, whether a respawned replica gets fast takeover.
    pub(crate) fast: bool,
}

/// The slots and the server, while a fault holds them.
#[derive(Debug)]
pub(crate) struct Claims {
    /// Per slot.
    pub(crate) slots: Vec<bool>,
    /// A restart runs.
    pub(crate) server: bool,
}

/// Draws the parameter of a fault of `kind` at interval `i`.
pub(crate) fn draw_param(kind: Kind, i: Duration, rng: &mut Rng) -> Duration {
    let ms = |d: Duration| d.as_millis() as u64;
    let between = |rng: &mut Rng, lo: Duration, hi: Duration| {
        Duration::from_millis(rng.between(ms(lo), ms(hi)))
    };
    match kind {
        Kind::Kill | Kind::Graceful => between(rng, Duration::ZERO, i),
        // From short (the old leader still leads on resume) to well past 3·I (it must not).
        Kind::Stop => between(rng, (i / 2).max(Duration::from_millis(150)), i * 6),
        // From shorter than the old leader's 2·I to longer than the server's 4·I.
        Kind::Partition => between(rng, i / 2, i * 8),
        Kind::Exhaust => between(rng, i, i * 4),
        Kind::Resign => between(rng, Duration::ZERO, i * 4),
        _ => {
            // Keep the number of draws the same for every kind.
            rng.next_u64();
            Duration::ZERO
        }
    }
}

/// Injects one fault as planned: picks its target, does the instantaneous part, and spawns a
/// task for the rest (the wait, the heal, the respawn). Returns `None` when it has no target
/// now (no leader's lock session to terminate, every slot busy, the server unreachable).
pub(crate) async fn inject(ctx: &Arc<Ctx>, plan: Plan, overlapped: bool) -> Option<usize> {
    let kind = plan.kind;
    let mut fault = Fault {
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
    };
    if kind.per_slot() {
        let slot = claim_slot(ctx, kind, plan)?;
        let mut fleet = ctx.fleet.lock().await;
        let replica = fleet.live[slot];
        let state = ctx.board.state(replica);
        fault.replica = Some(replica);
        fault.on_leader = state.leading && !state.stopped;
        fault.epoch = state.epoch.filter(|_| fault.on_leader);
        let at = match kind {
            Kind::Kill => fleet.signal(replica, Signal::KILL),
            Kind::Stop => fleet.signal(replica, Signal::STOP),
            Kind::Partition => {
                let proxy = fleet.proxies[slot].clone();
                drop(fleet);
                let asked = unix_us();
                proxy.blackhole();
                let at = proxy_acted().await;
                fault.lag = at - asked;
                fleet = ctx.fleet.lock().await;
                at
            }
            Kind::Reset => {
                let proxy = fleet.proxies[slot].clone();
                drop(fleet);
                let before = proxy.accepted();
                let asked = unix_us();
                proxy.reset();
                let at = reset_done(&proxy, before).await;
                fault.lag = at - asked;
                fleet = ctx.fleet.lock().await;
                at
            }
            Kind::Exhaust => {
                fleet
                    .command(replica, &format!("exhaust {}", plan.param.as_millis()))
                    .await
            }
            Kind::Graceful => fleet.command(replica, "stop").await,
            Kind::Resign => {
                fleet
                    .command(replica, &format!("resign {}", plan.param.as_millis()))
                    .await
            }
            _ => unreachable!("not a per-slot fault"),
        };
        drop(fleet);
        fault.inject = at;
        fault.heal = at;
        let id = record(ctx, fault);
        tokio::spawn(finish_slot(ctx.clone(), id, slot, replica, plan));
        return Some(id);
    }
    match kind {
        Kind::TerminateLock | Kind::TerminateRandom => {
            let client = db::connect(&ctx.db).await.ok()?;
            let (at, pid, name, holder) = if kind == Kind::TerminateLock {
                let at = unix_us();
                let row = client
                    .query_opt(
                        "SELECT l.pid, coalesce(a.application_name, ''), \
                                pg_catalog.pg_terminate_backend(l.pid) \
                         FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
                         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 \
                           AND l.objid = $2 AND l.objsubid = 2 \
                           AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                                             WHERE datname = pg_catalog.current_database())",
                        &[&(ctx.key.class() as u32), &(ctx.key.object() as u32)],
                    )
                    .await
                    .ok()??;
                (at, row.get::<_, i32>(0), row.get::<_, String>(1), true)
            } else {
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
                let (pid, name) =
                    candidates[(plan.pick % candidates.len() as u64) as usize].clone();
                let at = unix_us();
                let row = client
                    .query_one(
                        "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE pid = $1 \
                           AND locktype = 'advisory' AND granted AND classid = $2 AND objid = $3 \
                           AND objsubid = 2), pg_catalog.pg_terminate_backend($1)",
                        &[&pid, &(ctx.key.class() as u32), &(ctx.key.object() as u32)],
                    )
                    .await
                    .ok()?;
                (at, pid, name, row.get::<_, bool>(0))
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
            Some(record(ctx, fault))
        }
        Kind::RestartFast | Kind::RestartImmediate => {
            {
                let mut claims = ctx.claims.lock().unwrap();
                if claims.server || !ctx.server.is_private() {
                    return None;
                }
                claims.server = true;
            }
            fault.inject = unix_us();
            fault.heal = fault.inject;
            fault.epoch = ctx
                .board
                .leaders()
                .first()
                .and_then(|&r| ctx.board.state(r).epoch);
            fault.replica = ctx.board.leaders().first().copied();
            let id = record(ctx, fault);
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let server = ctx.server.clone();
                let mode = if kind == Kind::RestartFast {
                    ShutdownMode::Fast
                } else {
                    ShutdownMode::Immediate
                };
                let result = tokio::task::spawn_blocking(move || server.restart(mode)).await;
                let heal = unix_us();
                let note = match result {
                    Ok(Ok(())) => String::new(),
                    Ok(Err(e)) => format!("the restart failed: {e}"),
                    Err(e) => format!("the restart panicked: {e}"),
                };
                update(&ctx, id, |f| {
                    f.heal = heal;
                    f.note = note;
                    f.done = true;
                });
                ctx.claims.lock().unwrap().server = false;
            });
            Some(id)
        }
        _ => unreachable!("per-slot faults are handled above"),
    }
}

/// Claims a slot for a fault: the leader's if the plan aims at it and it is free, else a
/// random free one (never slot 0 for a fault that ends the process, when it is kept alive).
fn claim_slot(ctx: &Ctx, kind: Kind, plan: Plan) -> Option<usize> {
    let leaders = ctx.board.leaders();
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

fn record(ctx: &Ctx, mut fault: Fault) -> usize {
    let mut faults = ctx.faults.lock().unwrap();
    fault.id = faults.len();
    faults.push(fault);
    faults.len() - 1
}

fn update(ctx: &Ctx, id: usize, f: impl FnOnce(&mut Fault)) {
    f(&mut ctx.faults.lock().unwrap()[id]);
}

/// The rest of a per-slot fault: wait, heal, respawn; then the slot is free again.
async fn finish_slot(ctx: Arc<Ctx>, id: usize, slot: usize, replica: usize, plan: Plan) {
    let i = ctx.options.interval;
    let slack = ctx.options.slack();
    match plan.kind {
        Kind::Stop => {
            tokio::time::sleep(plan.param).await;
            let at = ctx.fleet.lock().await.signal(replica, Signal::CONT);
            update(&ctx, id, |f| f.heal = at);
        }
        Kind::Partition => {
            tokio::time::sleep(plan.param).await;
            let proxy = ctx.fleet.lock().await.proxies[slot].clone();
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
            // The handover is over when `resign` returns: at most the drain, two intervals
            // and the unlock's 2 s.
            board
                .wait(i * 3 + Duration::from_secs(3), |b| {
                    b.state(replica).resigned > before
                })
                .await;
        }
        Kind::Kill | Kind::Graceful => {
            // A graceful shutdown: the drain (≤ I), the unlock (≤ 2 s), the exit.
            let limit = if plan.kind == Kind::Graceful {
                i + Duration::from_secs(2) + slack + Duration::from_secs(1)
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
                                 unlock ≤ 2 s, + slack): SIGKILLed",
                                limit.as_millis()
                            ),
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
}

/// When a change of a proxy's mode has taken effect, as near as this process can tell: the
/// proxies' connection tasks run on this process's runtime, which on a starved machine runs
/// them (and so blackholes or heals) well after the call. This stamps the moment a task
/// spawned after the change runs, after the woken connection tasks had their turn.
async fn proxy_acted() -> u64 {
    tokio::task::yield_now().await;
    tokio::spawn(async {
        tokio::task::yield_now().await;
        unix_us()
    })
    .await
    .unwrap_or_else(|_| unix_us())
}

/// When every connection a proxy had before a reset has closed (each sent its RSTs), polled
/// every millisecond (at most 5 s); `before` is [`FaultProxy::accepted`] just before the reset.
///
/// [`FaultProxy::accepted`]: pg_elector_harness::FaultProxy::accepted
async fn reset_done(proxy: &pg_elector_harness::FaultProxy, before: u64) -> u64 {
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
