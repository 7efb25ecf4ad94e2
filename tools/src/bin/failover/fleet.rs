//! The replica processes as the parent sees them: one live per slot, each behind its proxy.

use std::time::Duration;

use pg_elector_testkit::replica::{leaders, transitions, unix_us, us};
use pg_elector_testkit::replicas::processes::{self, Event, What};
use pg_elector_testkit::{FaultProxy, PgServer, TestDb};
use pg_elector_tools::Mode;
use pg_elector_tools::rng::xorshift;

use crate::{CHILD, KEY, SLOTS};

/// The replica processes (see `pg_elector_testkit::replicas::processes`), one live per slot.
pub(crate) struct Fleet {
    pub(crate) replicas: processes::Fleet,
    /// The slot of each replica.
    pub(crate) slots: Vec<usize>,
    /// The live replica of each slot.
    pub(crate) live: [usize; SLOTS],
    /// One proxy per slot.
    pub(crate) proxies: Vec<FaultProxy>,
    pub(crate) interval: Duration,
}

impl Fleet {
    pub(crate) async fn start(
        db: &TestDb,
        server: &PgServer,
        interval: Duration,
        mode: Mode,
    ) -> Self {
        let mut proxies = Vec::new();
        for _ in 0..SLOTS {
            proxies.push(FaultProxy::start(server.addr()).await.expect("a proxy"));
        }
        // FAILOVER_NO_FENCING=1: the replicas neither fence nor write, so a takeover has no
        // epoch bump (whose commit waits for a WAL flush) in it.
        let replicas = processes::Fleet::builder(CHILD, db.url(), KEY, interval)
            .fenced(std::env::var_os("FAILOVER_NO_FENCING").is_none())
            .fast_takeover(mode == Mode::Fast)
            .build();
        let mut fleet = Fleet {
            replicas,
            slots: Vec::new(),
            live: [0; SLOTS],
            proxies,
            interval,
        };
        // Staggered starts, so that the replicas' check ticks do not share one phase.
        let mut seed = unix_us() | 1;
        for slot in 0..SLOTS {
            fleet.spawn(slot);
            tokio::time::sleep(Duration::from_micros(xorshift(&mut seed) % us(interval))).await;
        }
        fleet
    }

    pub(crate) fn spawn(&mut self, slot: usize) -> usize {
        let index = self.replicas.spawn(Some(self.proxies[slot].addr()));
        self.slots.push(slot);
        self.live[slot] = index;
        index
    }

    /// Waits until every live replica has started, exactly one leads, and it has ticked one I
    /// after the last start (every standby is on its periodic tries). Returns the leader.
    pub(crate) async fn steady(&self) -> Result<usize, String> {
        let live = self.live;
        let n = self.replicas.len();
        let interval = self.interval;
        self.replicas
            .wait(Duration::from_secs(60) + 4 * interval, |events| {
                let started = live
                    .iter()
                    .map(|&r| {
                        events
                            .iter()
                            .find(|e| e.replica == r && e.what == What::Started)
                            .map(|e| e.at)
                    })
                    .collect::<Option<Vec<u64>>>()?;
                let last_start = started.into_iter().max()?;
                let leading = leaders(events, n);
                if leading.len() != 1 {
                    return None;
                }
                let leader = leading[0];
                events
                    .iter()
                    .any(|e| {
                        e.replica == leader
                            && e.what == What::Tick
                            && e.at > last_start + us(interval)
                    })
                    .then_some(leader)
            })
            .await
            .ok_or_else(|| "no steady single leader within 60 s + 4·I".to_owned())
    }
}

/// Over `[from, to]` (µs): how long no replica said it led, and how long two or more did.
pub(crate) fn integrate(events: &[Event], n: usize, from: u64, to: u64) -> (u64, u64) {
    let transitions = transitions(events);
    let mut leading = vec![false; n];
    let count = |leading: &[bool]| leading.iter().filter(|&&l| l).count();
    let (mut none, mut many) = (0, 0);
    let mut last = from;
    for e in transitions {
        if e.at > from {
            let until = e.at.min(to);
            if until > last {
                match count(&leading) {
                    0 => none += until - last,
                    1 => {}
                    _ => many += until - last,
                }
                last = until;
            }
        }
        if e.at > to {
            break;
        }
        leading[e.replica] = e.what == What::Leader;
    }
    if to > last {
        match count(&leading) {
            0 => none += to - last,
            1 => {}
            _ => many += to - last,
        }
    }
    (none, many)
}
