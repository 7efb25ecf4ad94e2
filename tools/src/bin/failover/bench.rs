//! One (mode, I) part's server, database and fleet, and one run of each fault against them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_elector_testkit::replica::{leaders, unix_us, us};
use pg_elector_testkit::replicas::processes::{Event, What};
use pg_elector_testkit::server::ShutdownMode;
use pg_elector_testkit::{PgServer, TestDb};
use pg_elector_tools::Mode;
use pg_elector_tools::rng::xorshift;
use rustix::process::Signal;

use crate::KEY;
use crate::fleet::{Fleet, integrate};
use crate::scenario::{Sample, Scenario};

/// A restart's tasks: when the server accepts connections again, and the restart itself.
type Restart = (
    tokio::task::JoinHandle<u64>,
    tokio::task::JoinHandle<Result<(), pg_elector_testkit::KitError>>,
);

pub(crate) struct Bench {
    pub(crate) server: Arc<PgServer>,
    pub(crate) db: TestDb,
    pub(crate) admin: tokio_postgres::Client,
    pub(crate) fleet: Fleet,
    pub(crate) seed: u64,
    pub(crate) interval: Duration,
    pub(crate) mode: Mode,
}

pub(crate) async fn connect(db: &TestDb) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = db
        .config()
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok(client)
}

impl Bench {
    pub(crate) async fn new(server: Arc<PgServer>, interval: Duration, mode: Mode) -> Self {
        let db = server.create_database().await.expect("a database");
        let admin = connect(&db).await.expect("an admin connection");
        admin
            .batch_execute(&format!(
                "CREATE TABLE replica_writes (replica text NOT NULL, epoch bigint NOT NULL, \
                 at timestamptz NOT NULL DEFAULT clock_timestamp()); \
                 ALTER DATABASE \"{}\" SET idle_in_transaction_session_timeout = '{}ms'",
                db.name(),
                (2 * interval).as_millis()
            ))
            .await
            .expect("the writes table and the database's settings");
        let fleet = Fleet::start(&db, &server, interval, mode).await;
        Bench {
            server,
            db,
            admin,
            fleet,
            seed: unix_us() | 1,
            interval,
            mode,
        }
    }

    /// A fresh fleet after a failed run, whatever state the old one was left in.
    pub(crate) async fn restart_fleet(&mut self) {
        let fleet = Fleet::start(&self.db, &self.server, self.interval, self.mode).await;
        drop(std::mem::replace(&mut self.fleet, fleet));
        if let Ok(admin) = connect(&self.db).await {
            self.admin = admin;
        }
    }

    pub(crate) fn random_phase(&mut self) -> Duration {
        Duration::from_micros(xorshift(&mut self.seed) % us(self.interval))
    }

    pub(crate) async fn holder_pid(&self) -> Option<i32> {
        self.admin
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND mode = 'ExclusiveLock' AND classid = $1 AND objid = $2 AND objsubid = 2 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&(KEY.class() as u32), &(KEY.object() as u32)],
            )
            .await
            .ok()
            .flatten()
            .map(|row| row.get(0))
    }

    pub(crate) async fn run_once(&mut self, scenario: Scenario) -> Result<Sample, String> {
        if scenario == Scenario::Freeze {
            return self.run_freeze().await;
        }
        let old = self.fleet.steady().await?;
        let slot = self.fleet.slots[old];
        let epoch = self.newest_epoch().await;
        let phase = self.random_phase();
        tokio::time::sleep(phase).await;
        let (t0, restart) = self.strike(scenario, old, slot).await?;
        // Before the undo, which may start a fresh replica.
        let n = self.fleet.replicas.len();
        let settled = self.settle(scenario, old, t0).await;
        let accepting = self.undo(scenario, old, slot, restart).await?;
        let (old_end, new) = settled.ok_or_else(|| {
            format!(
                "{}: no new single leader within {:?} of the fault",
                scenario.name(),
                scenario.limit(self.interval)
            )
        })?;
        let events = self.fleet.replicas.events();
        let (none, both) = integrate(&events, n, t0, old_end.at.max(new.at));
        Ok(Sample {
            none,
            both,
            demoted: (old_end.what != What::Killed).then(|| old_end.at.saturating_sub(t0)),
            resumed: None,
            takeover: new.at.saturating_sub(accepting.unwrap_or(t0)),
            write_gap: self.write_gap(epoch).await,
            wrong: None,
        })
    }

    /// The fault `scenario` on replica `old` in `slot`: when it struck, and a restart's tasks.
    async fn strike(
        &mut self,
        scenario: Scenario,
        old: usize,
        slot: usize,
    ) -> Result<(u64, Option<Restart>), String> {
        let mut restart = None;
        let t0 = match scenario {
            Scenario::Graceful => {
                let at = unix_us();
                self.fleet
                    .replicas
                    .try_stop(old)
                    .await
                    .map_err(|e| e.to_string())?;
                at
            }
            Scenario::Sigkill => self
                .fleet
                .replicas
                .try_sigkill(old)
                .map_err(|e| e.to_string())?,
            Scenario::Terminate => {
                let pid = self.holder_pid().await.ok_or("no lock holder")?;
                let at = unix_us();
                self.admin
                    .execute("SELECT pg_terminate_backend($1)", &[&pid])
                    .await
                    .map_err(|e| e.to_string())?;
                at
            }
            Scenario::Reset => {
                let at = unix_us();
                self.fleet.proxies[slot].reset();
                at
            }
            Scenario::Partition => {
                let at = unix_us();
                self.fleet.proxies[slot].blackhole();
                at
            }
            Scenario::Restart(mode) => {
                let (at, tasks) = self.restart(mode).await?;
                restart = Some(tasks);
                at
            }
            Scenario::Freeze => unreachable!("run_freeze"),
        };
        Ok((t0, restart))
    }

    /// Restarts the server in `mode`: when, and the tasks that end when the server accepts
    /// connections again (an observer connection ends when the server closes it; then a
    /// prober connects every 2 ms until the server answers again) and when the restart is over.
    async fn restart(&self, mode: ShutdownMode) -> Result<(u64, Restart), String> {
        let (observer, connection) = self
            .db
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| e.to_string())?;
        let config = self.db.config();
        let back = tokio::spawn(async move {
            let _ = connection.await;
            drop(observer);
            loop {
                if let Ok((client, connection)) = config.connect(tokio_postgres::NoTls).await {
                    tokio::spawn(connection);
                    if client.simple_query("SELECT 1").await.is_ok() {
                        return unix_us();
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        let at = unix_us();
        let server = self.server.clone();
        let restarting = tokio::task::spawn_blocking(move || server.restart(mode));
        Ok((at, (back, restarting)))
    }

    /// Waits for the old leader's end and a new single leader after a fault at `t0`.
    async fn settle(&self, scenario: Scenario, old: usize, t0: u64) -> Option<(Event, Event)> {
        let n = self.fleet.replicas.len();
        self.fleet
            .replicas
            .wait(scenario.limit(self.interval), |events| {
                let old_end = events
                    .iter()
                    .find(|e| {
                        e.replica == old
                            && e.at >= t0
                            && matches!(e.what, What::Standby | What::Killed)
                    })
                    .copied()?;
                let new = events
                    .iter()
                    .filter(|e| {
                        e.what == What::Leader
                            && e.at > t0
                            && (e.replica != old || e.at > old_end.at)
                    })
                    .min_by_key(|e| e.at)
                    .copied()?;
                (leaders(events, n).len() == 1).then_some((old_end, new))
            })
            .await
    }

    /// Undoes the fault `scenario` on replica `old` in `slot`, so that the next run starts
    /// clean; for a restart, when the server accepted connections again.
    async fn undo(
        &mut self,
        scenario: Scenario,
        old: usize,
        slot: usize,
        restart: Option<Restart>,
    ) -> Result<Option<u64>, String> {
        match scenario {
            Scenario::Graceful | Scenario::Sigkill => {
                self.fleet.replicas.reap(old).await;
                self.fleet.spawn(slot);
            }
            Scenario::Partition => self.fleet.proxies[slot].pass(),
            Scenario::Terminate | Scenario::Reset | Scenario::Freeze => {}
            Scenario::Restart(_) => {
                let (back, restarting) = restart.expect("a restart runs");
                restarting
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                let accepting = back.await.map_err(|e| e.to_string())?;
                self.admin = connect(&self.db).await?;
                return Ok(Some(accepting));
            }
        }
        Ok(None)
    }

    /// The frozen leader: SIGSTOP, wait for another leader, SIGCONT, watch one more I. See the
    /// header comment for how its term is counted.
    pub(crate) async fn run_freeze(&mut self) -> Result<Sample, String> {
        let interval = self.interval;
        let old = self.fleet.steady().await?;
        let epoch = self.newest_epoch().await;
        let phase = self.random_phase();
        tokio::time::sleep(phase).await;
        let replicas = &self.fleet.replicas;
        let stopped = replicas
            .try_signal(old, Signal::STOP)
            .map_err(|e| e.to_string())?;
        let new = replicas
            .wait(Scenario::Freeze.limit(interval), |events| {
                events
                    .iter()
                    .find(|e| e.replica != old && e.what == What::Leader && e.at > stopped)
                    .copied()
            })
            .await;
        // Whatever happened, the old leader runs again. The process is stopped, so every event
        // it sends from here on arrives after this index.
        let index = replicas.board().events.lock().unwrap().len();
        let resumed = replicas
            .try_signal(old, Signal::CONT)
            .map_err(|e| e.to_string())?;
        let new = new.ok_or_else(|| {
            format!(
                "no other replica led within {:?} of the SIGSTOP",
                Scenario::Freeze.limit(interval)
            )
        })?;
        let standby = replicas
            .wait(interval.max(Duration::from_secs(1)) * 2, |events| {
                events[index.min(events.len())..]
                    .iter()
                    .find(|e| e.replica == old && e.what == What::Standby)
                    .copied()
            })
            .await;
        // Watch it for one more I: its next try must be refused, and it must not tick.
        tokio::time::sleep(interval).await;
        let until = unix_us();
        let events = replicas.events();
        let n = self.fleet.replicas.len();
        let freeze = Freeze {
            old,
            index,
            stopped,
            resumed,
            new,
            standby,
        };
        let (led_again, wrong) = freeze.judge(&events, n);
        let effective = freeze.effective(&events, led_again);
        let (none, both) = integrate(&effective, n, stopped, until);
        Ok(Sample {
            none,
            both,
            demoted: None,
            resumed: standby.map(|s| s.at.saturating_sub(resumed)),
            takeover: new.at.saturating_sub(stopped),
            write_gap: self.write_gap(epoch).await,
            wrong: (!wrong.is_empty()).then(|| wrong.join("; ")),
        })
    }

    /// The newest epoch that has written so far (the steady leader's, before a fault).
    pub(crate) async fn newest_epoch(&self) -> Option<i64> {
        self.admin
            .query_one("SELECT max(epoch) FROM replica_writes", &[])
            .await
            .ok()
            .and_then(|row| row.get(0))
    }

    /// The gap (µs) between the last fenced write of epoch `old` (the leader's before the
    /// fault) and the first write of any later epoch, once a later epoch has written (a leader
    /// ticks every I/10); `None` if none has within 2 s + I/5. Negative: the two terms' writes
    /// interleaved. A term that began and wrote nothing in between does not count.
    pub(crate) async fn write_gap(&self, old: Option<i64>) -> Option<i64> {
        let old = old?;
        let query = "SELECT (extract(epoch FROM \
                       (SELECT min(at) FROM replica_writes WHERE epoch > $1) \
                     - (SELECT max(at) FROM replica_writes WHERE epoch = $1)) * 1e6)::int8 \
             WHERE EXISTS (SELECT FROM replica_writes WHERE epoch > $1)";
        let deadline = Instant::now() + Duration::from_secs(2) + self.interval / 5;
        while Instant::now() < deadline {
            if let Ok(Some(row)) = self.admin.query_opt(query, &[&old]).await {
                return row.get(0);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }
}

/// What a freeze run saw of the old leader.
#[derive(Clone, Copy, Debug)]
struct Freeze {
    old: usize,
    /// The index of the first event after the SIGCONT.
    index: usize,
    /// When it was SIGSTOPped.
    stopped: u64,
    /// When it was SIGCONTed.
    resumed: u64,
    /// The new leader's first report.
    new: Event,
    /// Its standby report after the SIGCONT.
    standby: Option<Event>,
}

impl Freeze {
    /// From when the old leader counts as leading again after the SIGCONT, if at all, and
    /// what went wrong.
    fn judge(&self, events: &[Event], n: usize) -> (Option<u64>, Vec<String>) {
        let Freeze {
            old,
            index,
            resumed,
            new,
            standby,
            ..
        } = *self;
        let after: Vec<Event> = events[index..]
            .iter()
            .filter(|e| e.replica == old)
            .copied()
            .collect();
        let woke = after
            .iter()
            .find(|e| matches!(e.what, What::Woke { .. }))
            .copied();
        let acted: Vec<Event> = after
            .iter()
            .filter(|e| matches!(e.what, What::Tick | What::Leader))
            .copied()
            .collect();
        // From when it counts as leading again after the SIGCONT, if at all.
        let led_again = match woke {
            Some(Event {
                at,
                what: What::Woke { leading: true },
                ..
            }) => Some(at),
            Some(_) if acted.is_empty() => None,
            _ => Some(resumed),
        };
        let mut wrong = Vec::new();
        if let Some(at) = led_again {
            wrong.push(format!(
                "the old leader counted as leading again {:.1} ms after SIGCONT (woke: {:?})",
                at.saturating_sub(resumed) as f64 / 1e3,
                woke.map(|e| e.what)
            ));
        }
        if !acted.is_empty() {
            wrong.push(format!("it acted after SIGCONT: {acted:?}"));
        }
        if standby.is_none() {
            wrong.push("it never said standby after SIGCONT".into());
        }
        let now_leading = leaders(events, n);
        if now_leading != vec![new.replica] {
            wrong.push(format!(
                "after the watch the leaders are {now_leading:?}, not [{}]",
                new.replica
            ));
        }
        (led_again, wrong)
    }

    /// The effective transitions: the old leader's term ends at the SIGSTOP; what it reported
    /// after the SIGCONT counts only if it led again (from `led_again`).
    fn effective(&self, events: &[Event], led_again: Option<u64>) -> Vec<Event> {
        let Freeze {
            old,
            index,
            stopped,
            ..
        } = *self;
        let mut effective: Vec<Event> = Vec::with_capacity(events.len() + 2);
        for (i, e) in events.iter().enumerate() {
            if i >= index && e.replica == old && led_again.is_none() {
                continue;
            }
            effective.push(*e);
        }
        effective.push(Event {
            replica: old,
            at: stopped,
            what: What::Standby,
        });
        if let Some(at) = led_again {
            effective.push(Event {
                replica: old,
                at,
                what: What::Leader,
            });
        }
        effective
    }
}
