//! What the injector, the fault tasks and the checkpoints share, and the quiet moments they
//! wait for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_elector::LockKey;

use crate::check::{Checkpoint, Violation};
use crate::child::unix_us;
use crate::db;
use crate::faults::{Claims, Fault, Kind};
use crate::fleet::{self, Board, Fleet};
use crate::options::Options;
use crate::servers::Servers;

/// What the injector, the fault tasks and the checkpoints share.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The run's options.
    pub(crate) options: Options,
    /// The lock keys, one per lane: the one key, or the shards' in index order.
    pub(crate) keys: Vec<LockKey>,
    /// The replica processes.
    pub(crate) fleet: tokio::sync::Mutex<Fleet>,
    /// The live process of each slot (a copy of the fleet's, readable without waiting).
    pub(crate) live: Mutex<Vec<usize>>,
    /// What the replicas said.
    pub(crate) board: Arc<Board>,
    /// Every fault so far.
    pub(crate) faults: Mutex<Vec<Fault>>,
    /// Slots and server held by running faults.
    pub(crate) claims: Mutex<Claims>,
    /// The server, or the primary and its standby.
    pub(crate) servers: Arc<Servers>,
    /// The soak database, straight to the server (to the primary, with `--cluster`).
    pub(crate) db: tokio_postgres::Config,
    /// Violations seen while the faults ran (a graceful shutdown that hung).
    pub(crate) runtime_violations: Mutex<Vec<Violation>>,
    /// The backends at quiet moments.
    pub(crate) checkpoints: Mutex<Vec<Checkpoint>>,
    /// The probes of the application pools sent so far.
    pub(crate) probes: Mutex<Vec<crate::probes::Sent>>,
    /// The failovers over so far.
    pub(crate) failovers: Mutex<Vec<crate::failover::Failover>>,
    /// With `--preferences`: the live rows of the candidates table, read every 20 ms.
    pub(crate) candidates: Arc<crate::prefs::Candidates>,
    /// With `--preferences`: the soak's pool for `request_handover` (its connections are named
    /// as the checker's), and what each handover request cost.
    pub(crate) handover_pool: Option<deadpool_postgres::Pool>,
    pub(crate) handovers: Mutex<Vec<crate::handover::Cost>>,
    /// The target of the latest handover request that was made: its term, taken on request,
    /// keeps the lead against preferences until it ends.
    pub(crate) requested: Mutex<Option<usize>>,
}

impl Ctx {
    /// Whether some fault is still running (not healed, or its slot not respawned).
    pub(crate) fn any_active(&self) -> bool {
        self.faults.lock().unwrap().iter().any(|f| !f.done)
    }

    /// How many failovers were injected so far.
    pub(crate) fn failovers_injected(&self) -> usize {
        let faults = self.faults.lock().unwrap();
        faults.iter().filter(|f| f.kind == Kind::Failover).count()
    }

    /// Whether a failover of the harness's failed part-way (the cluster cannot fail over again).
    pub(crate) fn failover_broken(&self) -> bool {
        self.failovers
            .lock()
            .unwrap()
            .iter()
            .any(|f| f.rejoined.is_none())
    }

    /// Whether a synchronous standby that never confirms is in effect (or, in a failover of a
    /// synchronous cluster, the standby cut off from the WAL before the crash): every COMMIT
    /// waits, the replicas' fenced ticks and schedule claims among them, so a drain may take
    /// up to the drain timeout.
    pub(crate) fn commits_wait(&self) -> bool {
        let sync = self.options.cluster == Some(crate::options::Replication::Sync);
        self.faults.lock().unwrap().iter().any(|f| {
            !f.done
                && (f.kind == Kind::SyncStandby
                    || (f.kind == Kind::Failover && sync && !f.param.is_zero()))
        })
    }

    /// When the latest fault healed.
    pub(crate) fn last_heal(&self) -> u64 {
        self.faults
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.heal)
            .max()
            .unwrap_or(0)
    }

    /// Every slot's process has started, none is stopped, exactly one leads each key (any
    /// number under `--sabotage split-key`, where they all lead).
    pub(crate) fn steady(&self) -> bool {
        let live = self.live.lock().unwrap().clone();
        live.iter().all(|&p| {
            let s = self.board.state(p);
            s.started && !s.stopped && !s.ended
        }) && (self.options.split_key
            || (0..self.keys.len()).all(|lane| self.board.leaders(lane).len() == 1))
            && self.preferred_leads()
    }

    /// With `--preferences`: the leader is not outranked by a live standby (a term taken on
    /// request is not: it keeps the lead until it ends), as the latest read of the live rows
    /// tells; true when that read is older than a second.
    fn preferred_leads(&self) -> bool {
        if !self.options.preferences {
            return true;
        }
        let Some(&leader) = self.board.leaders(0).first() else {
            return false;
        };
        if *self.requested.lock().unwrap() == Some(leader) {
            return true;
        }
        let latest = self.candidates.latest(unix_us(), 1_000_000);
        let preference = self.board.preference(leader).unwrap_or(0);
        !crate::prefs::outranked(latest.as_ref(), leader, preference)
    }

    /// Waits (at most `limit`) until no fault runs and the fleet is steady.
    pub(crate) async fn quiet(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if !self.any_active() && self.steady() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    /// A quiet moment long after the last heal: counts the backends, samples the memory.
    pub(crate) async fn checkpoint(&self) {
        let settle = Duration::from_secs(2) + self.options.interval * 2;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let since = unix_us().saturating_sub(self.last_heal());
            if self.quiet(Duration::from_secs(30)).await && since >= settle.as_micros() as u64 {
                break;
            }
            if Instant::now() >= deadline {
                eprintln!("soak: no quiet moment for a checkpoint within 60 s; counting anyway");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Ok(client) = db::connect(&self.db).await else {
            eprintln!("soak: checkpoint: cannot connect");
            return;
        };
        let Ok(backends) = db::backends(&client).await else {
            eprintln!("soak: checkpoint: cannot count the backends");
            return;
        };
        let standby = self.standby_backends().await;
        let live = self.live.lock().unwrap().clone();
        self.fleet.lock().await.sample_rss();
        self.checkpoints.lock().unwrap().push(Checkpoint {
            at: unix_us(),
            backends,
            live,
            standby,
        });
    }

    /// With `--cluster`: the replicas' backends on the standby (straight to it), asked again
    /// every 100 ms for a second while there are some, since a multi-host connect passes
    /// through it on its way to the primary; a backend left there stays.
    async fn standby_backends(&self) -> Option<i64> {
        let standby = self.servers.cluster()?.lock().await.standby.addr();
        let mut config = pg_elector_testkit::server::config::config_with_addr(&self.db, standby);
        config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::Any);
        let client = db::connect(&config).await.ok()?;
        let mut count = 0;
        for _ in 0..10 {
            count = db::backends(&client)
                .await
                .ok()?
                .iter()
                .filter(|(name, _)| db::replica_of(name).is_some())
                .map(|(_, n)| n)
                .sum();
            if count == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(count)
    }

    /// A replica that exited with no fault of the soak's ending it (a panic, `run` failing)
    /// is a violation; its slot gets a new process so that the run goes on.
    pub(crate) async fn respawn_the_dead(&self) {
        let slots = self.claims.lock().unwrap().slots.clone();
        let mut fleet = self.fleet.lock().await;
        for (slot, &claimed) in slots.iter().enumerate() {
            let replica = fleet.live[slot];
            if claimed || !fleet.exited(replica) {
                continue;
            }
            let at = fleet.procs[replica].ended.unwrap_or_else(unix_us);
            self.runtime_violations.lock().unwrap().push(Violation {
                at,
                what: format!("replica-{replica} exited with no fault ending it"),
                lane: 0,
                fault: None,
                replicas: vec![replica],
            });
            // Ends its term and its state, as a kill would.
            self.board
                .push(fleet::Event::of_process(replica, at, fleet::What::Killed));
            let fast = fleet.procs[replica].fast;
            let index = fleet.spawn(slot, fast);
            self.live.lock().unwrap()[slot] = index;
        }
    }
}
