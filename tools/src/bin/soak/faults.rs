//! The faults: their kinds, the bounds the docs documents for each, and what the injector
//! draws for one.

use std::time::Duration;

use pg_elector_tools::rng::Rng;

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
    /// Key mode: blackhole the leader's proxy for longer than the schedule's stale threshold,
    /// most often while a long run of its job goes on.
    LongPartition,
    /// Shard mode: a replica restarted, its proxy blackholed right after its member lock (or
    /// its live mark) shows granted in `pg_locks` (a join cut off at its grant).
    JoinPartition,
    /// `synchronous_standby_names` naming a standby that never connects, for a while: every
    /// COMMIT waits until it is cleared.
    SyncStandby,
    /// With `--cluster`: the primary crashed (`-m immediate`) or switched over (`-m fast`), the
    /// standby promoted, the old primary back as the new standby.
    Failover,
    /// With `--preferences` (key mode): `request_handover` to a live standby, named by identity
    /// (or, half of the time, the most preferred one).
    HandoverLive,
    /// With `--preferences`: `request_handover` to a live standby, SIGKILLed right after the
    /// request, respawned as after `kill`.
    HandoverDying,
    /// With `--preferences`: `request_handover` to an identity no live standby has (one never
    /// spawned, or one that ended long ago): must return `HandoverError::NoSuchStandby`.
    HandoverMissing,
}

/// The stale threshold of the soak's schedules (three heartbeat periods of I, at least 3 s):
/// a long partition lasts from this + 500 ms ...
pub(crate) const STALE: Duration = Duration::from_secs(3);
/// ... to this.
pub(crate) const LONG_PARTITION_MAX: Duration = Duration::from_millis(4_500);

/// When a leader must be back, and how long two may lead, after one fault (docs, "Guarantees,
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

/// How long after a terminate or a reset of a leader that hears it two replicas may both
/// lead: the old leader steps down within 1 ms of reading its closed connection and the next
/// term waits 5 ms after its grant, so an overlap needs the old leader's process kept from the
/// CPU for longer than that, which the docs allow on an overloaded machine ("a few
/// milliseconds of overlap"). Counted from the injection, without the slack. The zero
/// tolerance for this overlap is `tests/no_overlap.rs` (200 terminates, sampled every 50 µs).
pub(crate) const SCHEDULING: Duration = Duration::from_millis(20);

impl Kind {
    /// Every kind, in the report's order.
    pub(crate) const ALL: [Kind; 18] = [
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
        Kind::LongPartition,
        Kind::JoinPartition,
        Kind::SyncStandby,
        Kind::Failover,
        Kind::HandoverLive,
        Kind::HandoverDying,
        Kind::HandoverMissing,
    ];

    /// The kinds of a run with `shards` shards (0: key mode): shards have no resign and no
    /// schedule; a join is shard mode's.
    pub(crate) fn of_mode(self, shards: usize) -> bool {
        match self {
            Kind::Resign | Kind::LongPartition => shards == 0,
            k if k.handover() => shards == 0,
            Kind::JoinPartition => shards > 0,
            _ => true,
        }
    }

    /// Whether it blackholes a replica's proxy for a while.
    pub(crate) fn partitions(self) -> bool {
        matches!(
            self,
            Kind::Partition | Kind::LongPartition | Kind::JoinPartition
        )
    }

    /// Whether it is a handover request (a fault of `--preferences` only).
    pub(crate) fn handover(self) -> bool {
        matches!(
            self,
            Kind::HandoverLive | Kind::HandoverDying | Kind::HandoverMissing
        )
    }

    /// The kinds a name on the command line stands for.
    pub(crate) fn by_name(name: &str) -> Result<Vec<Kind>, String> {
        Ok(match name {
            "all" => Kind::ALL.to_vec(),
            "terminate" => vec![Kind::TerminateLock, Kind::TerminateRandom],
            "restart" => vec![Kind::RestartFast, Kind::RestartImmediate],
            "sigkill" => vec![Kind::Kill],
            "sigstop" | "freeze" => vec![Kind::Stop],
            "blackhole" => vec![Kind::Partition],
            "handover" => vec![
                Kind::HandoverLive,
                Kind::HandoverDying,
                Kind::HandoverMissing,
            ],
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
            Kind::LongPartition => "long-partition",
            Kind::JoinPartition => "join-partition",
            Kind::SyncStandby => "sync-standby",
            Kind::Failover => "failover",
            Kind::HandoverLive => "handover-live",
            Kind::HandoverDying => "handover-dying",
            Kind::HandoverMissing => "handover-missing",
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
            Kind::LongPartition => "partition > stale, long runs",
            Kind::JoinPartition => "partition at a join's grant",
            Kind::SyncStandby => "sync standby silent",
            Kind::Failover => "database failover",
            Kind::HandoverLive => "handover request, live target",
            Kind::HandoverDying => "handover request, target killed",
            Kind::HandoverMissing => "handover request, missing target",
        }
    }

    /// How often it is drawn, relative to the others (a server restart or a synchronous standby
    /// hits every replica and takes a while, a long partition takes 5 to 9 s: half as often; a
    /// failover, the point of a run with `--cluster`, twice as often, so that a 10-minute run
    /// has more than 100 of them).
    pub(crate) fn weight(self) -> u64 {
        match self {
            Kind::Failover => 4,
            Kind::RestartFast
            | Kind::RestartImmediate
            | Kind::SyncStandby
            | Kind::LongPartition
            | Kind::HandoverMissing => 1,
            _ => 2,
        }
    }

    /// Whether it hits the whole fleet rather than one replica.
    pub(crate) fn server_wide(self) -> bool {
        matches!(
            self,
            Kind::RestartFast | Kind::RestartImmediate | Kind::Failover
        )
    }

    /// Whether it needs a private server (it restarts it).
    pub(crate) fn needs_private(self) -> bool {
        self.server_wide() || self == Kind::SyncStandby
    }

    /// Whether it ends the process, so that it cannot hit the slot kept alive.
    pub(crate) fn ends_process(self) -> bool {
        matches!(
            self,
            Kind::Kill | Kind::Graceful | Kind::JoinPartition | Kind::HandoverDying
        )
    }

    /// Whether it hits one replica's slot (and so claims it while it lasts).
    pub(crate) fn per_slot(self) -> bool {
        !matches!(
            self,
            Kind::TerminateLock
                | Kind::TerminateRandom
                | Kind::RestartFast
                | Kind::RestartImmediate
                | Kind::SyncStandby
                | Kind::Failover
                | Kind::HandoverLive
                | Kind::HandoverMissing
        )
    }

    /// The bound at check interval `i` (docs, "Guarantees, in multiples of I").
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
            Kind::Partition | Kind::LongPartition => b(i * 5, i, zero, Some(i * 2)),
            // Nobody left: the joiner's partition may cost a shard 1·I, no more (checked apart:
            // a gap that begins during it is not allowed a move's 2·I).
            Kind::JoinPartition => b(i, zero, zero, None),
            // The lock sessions go on; a new term's epoch waits for its COMMIT: a leader
            // within I of the end.
            Kind::SyncStandby => b(zero, i, zero, None),
            // All demote at once; a new leader ≤ 1·I after the server accepts again; never two.
            Kind::RestartFast | Kind::RestartImmediate => b(zero, i, zero, Some(SESSION_ENDED)),
            // The old primary's sessions end with it: all demote at once; nobody leads until
            // the promoted server accepts writes (its heal), a new leader ≤ 1·I after; never two.
            Kind::Failover => b(zero, i, zero, Some(SESSION_ENDED)),
            // A standby that cannot borrow does not try: only a leader within I of the end.
            Kind::Exhaust => b(zero, i, zero, None),
            // Demoted at once; drain ≤ I (the drain timeout), unlock, new leader ≤ 1·I after.
            Kind::Graceful | Kind::Resign => b(i * 2, zero, zero, graceful),
            // README ("A handover on request"): the leader sees the request at its next check
            // (≤ 1·I) and demotes, drains (≤ I, the drain timeout), unlocks; the target takes
            // the lock at its next try (≤ 1·I); never two.
            Kind::HandoverLive => b(i * 3, zero, zero, Some(i)),
            // README ("A request never strands the key"): a target that dies leaves the key
            // without a leader for at most 3·I and one try.
            Kind::HandoverDying => b(i * 3 + try_bound(i), zero, zero, Some(i)),
            // Refused: nothing changes, so nothing is excused.
            Kind::HandoverMissing => b(zero, zero, zero, None),
        }
    }

    /// The bound as the report's table shows it.
    pub(crate) fn bound_text(self) -> &'static str {
        match self {
            Kind::Kill => "≤ 1·I / never",
            Kind::Stop => "≤ 5·I, SIGCONT + 1·I / never",
            Kind::TerminateLock | Kind::TerminateRandom | Kind::Reset => {
                "≤ 1·I / scheduling (≤ 20 ms)"
            }
            Kind::Partition | Kind::LongPartition => "≤ 5·I, heal + 1·I / never",
            Kind::JoinPartition => "≤ 1·I / never",
            Kind::SyncStandby => "end + 1·I / never",
            Kind::RestartFast | Kind::RestartImmediate => "accepting + 1·I / never",
            Kind::Failover => "writable + 1·I / never",
            Kind::Exhaust => "end + 1·I / never",
            Kind::Graceful | Kind::Resign => "≤ 2·I (drain + 1·I) / never",
            Kind::HandoverLive => "≤ 3·I (check + drain + 1·I) / never",
            Kind::HandoverDying => "≤ 3·I + one try / never",
            Kind::HandoverMissing => "refused, nothing changes / never",
        }
    }
}

/// One try of a standby, the docs' "one bounded try": at most I for a pool connection and
/// I, at least 1 s, for its statement (`src/postgres/session.rs`, `MIN_TRY_BOUND`).
pub(crate) fn try_bound(i: Duration) -> Duration {
    i + i.max(Duration::from_secs(1))
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
    /// start; for a proxy fault, when the proxy acted (see `inject::proxy_acted`).
    pub(crate) inject: u64,
    /// How much later than asked a proxy fault took effect (the soak's own process starved).
    pub(crate) lag: u64,
    /// When it was over (SIGCONT, pass, the server accepting again, the promoted server accepting
    /// writes, the borrowers gone); the
    /// injection for the instantaneous ones.
    pub(crate) heal: u64,
    /// Its task is over (the slot respawned, the claim released).
    pub(crate) done: bool,
    /// Earlier faults were still in effect when it started.
    pub(crate) overlapped: bool,
    /// What else is worth saying (the terminated backend, a failed restart).
    pub(crate) note: String,
    /// A handover request: the target it named (the replica process), and its answer.
    pub(crate) handover: Option<crate::handover::Asked>,
}

#[cfg(test)]
impl Fault {
    /// A fault of the checks' unit tests: instantaneous (healed at `inject`), over, alone.
    pub(crate) fn instant(
        kind: Kind,
        replica: Option<usize>,
        on_leader: bool,
        inject: u64,
    ) -> Self {
        Fault {
            id: 0,
            kind,
            replica,
            on_leader,
            epoch: None,
            param: std::time::Duration::ZERO,
            inject,
            lag: 0,
            heal: inject,
            done: true,
            overlapped: false,
            note: String::new(),
            handover: None,
        }
    }
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
        Kind::Kill | Kind::Graceful | Kind::HandoverDying => between(rng, Duration::ZERO, i),
        // From short (the old leader still leads on resume) to well past 3·I (it must not).
        Kind::Stop => between(rng, (i / 2).max(Duration::from_millis(150)), i * 6),
        // From shorter than the old leader's 2·I to longer than the server's 4·I.
        Kind::Partition => between(rng, i / 2, i * 8),
        // Past the server's 4·I, so that a joiner taken for live would leave shards unowned.
        Kind::JoinPartition => between(rng, i * 4, i * 8),
        Kind::LongPartition => between(rng, STALE + Duration::from_millis(500), LONG_PARTITION_MAX),
        // Longer than a claim's bound (2 s) and a due's period (2 s), so that a claim's
        // COMMIT outlives its bound before the probe just before the heal.
        Kind::SyncStandby => between(rng, Duration::from_secs(4), Duration::from_millis(5_500)),
        Kind::Exhaust => between(rng, i, i * 4),
        Kind::Resign => between(rng, Duration::ZERO, i * 4),
        // A crash comes after the standby was cut off from the primary's WAL this long: up to
        // 1.5 s of commits the standby never gets (with a synchronous one: commits waiting).
        Kind::Failover => between(rng, Duration::ZERO, Duration::from_millis(1_500)),
        _ => {
            // Keep the number of draws the same for every kind.
            rng.next_u64();
            Duration::ZERO
        }
    }
}
