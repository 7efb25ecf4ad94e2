//! The faults [`Replicas`] put in place, one call each, on one replica or on whoever leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Timeouts};

use crate::database::connect_config;
use crate::locks::{lock_sessions, terminate};
use crate::members::{Member, Members, server_name};
use crate::server::ShutdownMode;
use crate::{KitError, PgServer};

/// Which replica a fault acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Who {
    /// The one replica that leads when the fault is put in place (an error when none does, or
    /// more than one). Of [`Replicas`](crate::Replicas) only: shard members have one owner per
    /// shard ([`Who::Owner`]).
    Leader,
    /// The replica (member) of this index.
    Replica(usize),
    /// The one member that owns this shard (of [`ShardMembers`](crate::ShardMembers)).
    Owner(u32),
}

impl From<usize> for Who {
    fn from(index: usize) -> Self {
        Who::Replica(index)
    }
}

/// Connections borrowed from a member's pool by [`Members::exhaust_pool`]; they go back when
/// this is dropped.
#[must_use = "the pool gets its connections back as soon as this is dropped"]
#[derive(Debug)]
pub struct PoolHold {
    /// The replica whose pool it is.
    pub replica: usize,
    held: Vec<Object>,
}

impl PoolHold {
    /// How many connections are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is (the pool had nothing to lend).
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// How long a fault waits for the server or a proxy to show it in place.
const IN_PLACE_WITHIN: Duration = Duration::from_secs(5);

impl<C: Member> Members<C> {
    /// The replica `who` names.
    ///
    /// # Errors
    ///
    /// [`KitError::Fault`] for [`Who::Leader`] when not exactly one replica leads, or an index
    /// out of range.
    pub fn resolve(&self, who: impl Into<Who>) -> Result<usize, KitError> {
        match who.into() {
            Who::Replica(index) if index < self.len() => Ok(index),
            Who::Replica(index) => Err(KitError::Fault(format!(
                "there is no replica {index} (there are {})",
                self.len()
            ))),
            Who::Leader if self.keys.len() == 1 => self.lane_leader(0).ok_or_else(|| {
                KitError::Fault(format!(
                    "no single leader to act on (leading now: {:?})",
                    self.lane_leaders(0)
                ))
            }),
            Who::Leader => Err(KitError::Fault(
                "shard members have no one leader: name a shard's owner (Who::Owner)".into(),
            )),
            Who::Owner(shard) if (shard as usize) < self.keys.len() - 1 => {
                self.lane_leader(shard as usize).ok_or_else(|| {
                    KitError::Fault(format!(
                        "shard {shard} has no single owner (owners now: {:?})",
                        self.lane_leaders(shard as usize)
                    ))
                })
            }
            Who::Owner(shard) => Err(KitError::Fault(format!(
                "there is no shard {shard} (there are {})",
                self.keys.len().saturating_sub(1)
            ))),
        }
    }

    /// Ends the replica's lock session on the server (`pg_terminate_backend`), as an operator, a
    /// failover or an idle timeout would: the lock it holds (or waits for, with fast takeover)
    /// is gone. Returns the replica's index once the backend is gone.
    ///
    /// # Errors
    ///
    /// [`KitError::Fault`] when the replica has no lock session on the server (a standby in
    /// poll mode between tries has none).
    pub async fn kill_session(&self, who: impl Into<Who>) -> Result<usize, KitError> {
        let index = self.resolve(who)?;
        self.fault_begins();
        let admin = connect_config(&self.admin, "connecting to kill a lock session").await?;
        let name = server_name(&self.members[index].role);
        let mut sessions = Vec::new();
        for key in &self.keys {
            let on_key = lock_sessions(&admin, *key)
                .await
                .map_err(|e| KitError::pg("reading pg_locks", e))?;
            sessions.extend(on_key);
        }
        let mut pids: Vec<i32> = sessions
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return Err(KitError::Fault(format!(
                "replica {index} has no lock session on the server (sessions on the key: {sessions:?})"
            )));
        }
        for pid in pids {
            let gone = terminate(&admin, pid)
                .await
                .map_err(|e| KitError::pg("terminating a lock session", e))?;
            if !gone {
                return Err(KitError::Fault(format!(
                    "backend {pid} of replica {index} was still there {IN_PLACE_WITHIN:?} after pg_terminate_backend"
                )));
            }
        }
        Ok(index)
    }

    /// Partitions the replica from the server: its proxy stops moving bytes either way and
    /// closes nothing (a cut cable, a dead switch). In place at once; [`heal`](Self::heal)
    /// ends it.
    pub fn partition(&self, who: impl Into<Who>) -> Result<usize, KitError> {
        let index = self.resolve(who)?;
        self.fault_begins();
        self.proxy(index).blackhole();
        Ok(index)
    }

    /// Ends a partition of the replica: its proxy forwards again.
    pub fn heal(&self, index: usize) {
        self.proxy(index).pass();
    }

    /// Resets every connection of the replica (TCP RST to both ends, as a firewall, a NAT
    /// timeout or a restarted pooler does); new connections pass. Returns once the proxy has
    /// closed them, or the replica has connected again.
    ///
    /// # Errors
    ///
    /// [`KitError::Fault`] when its connections were still open after 5 s.
    pub async fn reset_connections(&self, who: impl Into<Who>) -> Result<usize, KitError> {
        let index = self.resolve(who)?;
        self.fault_begins();
        let proxy = self.proxy(index);
        let accepted = proxy.accepted();
        proxy.reset();
        let start = Instant::now();
        while proxy.open() > 0 && proxy.accepted() == accepted {
            if start.elapsed() > IN_PLACE_WITHIN {
                return Err(KitError::Fault(format!(
                    "replica {index}'s {} connections were still open {IN_PLACE_WITHIN:?} after the reset",
                    proxy.open()
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(index)
    }

    /// Makes the server slow as the replica sees it: every answer reaches it `delay` late
    /// (`Duration::ZERO` ends it). In place at once, for current and new connections.
    pub fn slow(&self, who: impl Into<Who>, delay: Duration) -> Result<usize, KitError> {
        let index = self.resolve(who)?;
        self.fault_begins();
        self.proxy(index).delay(delay);
        Ok(index)
    }

    /// Makes the server slow for every replica (see [`slow`](Self::slow)).
    pub fn slow_server(&self, delay: Duration) {
        self.fault_begins();
        for index in 0..self.len() {
            self.proxy(index).delay(delay);
        }
    }

    /// Borrows every connection the replica's pool can lend, so that the elector and the
    /// service find none (a burst of requests, a leak); returns once the pool has nothing left.
    /// The connections go back when the [`PoolHold`] is dropped.
    ///
    /// # Errors
    ///
    /// [`KitError::Fault`] when a new connection could not be opened (the server or the
    /// replica's proxy is down).
    pub async fn exhaust_pool(&self, who: impl Into<Who>) -> Result<PoolHold, KitError> {
        let index = self.resolve(who)?;
        self.fault_begins();
        let pool = self.members[index].role.pool();
        let mut held = Vec::new();
        let quick = Timeouts {
            wait: Some(Duration::from_millis(20)),
            ..Timeouts::default()
        };
        loop {
            let status = pool.status();
            if status.size >= status.max_size && status.available == 0 {
                break;
            }
            match pool.timeout_get(&quick).await {
                Ok(object) => held.push(object),
                Err(deadpool_postgres::PoolError::Timeout(_)) => continue,
                Err(e) => {
                    return Err(KitError::Fault(format!(
                        "replica {index}'s pool could not lend a connection: {e}"
                    )));
                }
            }
        }
        Ok(PoolHold {
            replica: index,
            held,
        })
    }

    /// Restarts the server (a fast shutdown, then a start), as a minor upgrade or a crashed
    /// server's restart does: every session ends, every lock with it. Returns once the server
    /// accepts connections again.
    ///
    /// # Errors
    ///
    /// [`KitError::NotPrivate`] for the server of `DATABASE_URL`, or what the restart said.
    pub async fn restart_server(&self, server: &Arc<PgServer>) -> Result<(), KitError> {
        let server = server.clone();
        self.fault_begins();
        tokio::task::spawn_blocking(move || server.restart(ShutdownMode::Fast))
            .await
            .map_err(|e| KitError::Fault(format!("the restart's thread failed: {e}")))?
    }
}
