//! The checks of what the replicas hold: memory flat over a long life, and backends.

use std::collections::BTreeMap;

use super::{Analysis, Checker, Violation};
use crate::child::{APP_POOL_SIZE, POOL_SIZE};

impl Checker<'_> {
    /// Memory: flat over each long life.
    pub(super) fn memory(&self, a: &mut Analysis) {
        let input = self.input;
        for (p, proc) in input.procs.iter().enumerate() {
            let life = proc.ended.unwrap_or(input.end).saturating_sub(proc.spawned);
            if life < 30_000_000 {
                continue;
            }
            let Some(&(_, first)) = proc
                .rss
                .iter()
                .find(|(t, _)| *t >= proc.spawned + 10_000_000)
            else {
                continue;
            };
            let Some(&(at, last)) = proc.rss.last() else {
                continue;
            };
            a.rss.push((p, life, first, last));
            if last > first + 16 * 1024 && last > first + first / 2 {
                a.violations.push(Violation {
                    at,
                    what: format!(
                        "replica-{p}'s RSS grew from {first} kB to {last} kB over {} s (allowed: \
                         16 MiB and 50 %)",
                        life / 1_000_000
                    ),
                    lane: 0,
                    fault: None,
                    replicas: vec![p],
                });
            }
        }
    }

    /// Backends at the checkpoints.
    pub(super) fn backends(&self, a: &mut Analysis) {
        let input = self.input;
        let lead = &self.lead;
        let latest_fault = |t: u64| self.latest_fault(t);
        // Backends at the checkpoints: none of a dead process, at most the pools and one lock or
        // waiting session per live one.
        let per_replica = (POOL_SIZE + APP_POOL_SIZE + 1) as i64;
        for c in input.checkpoints {
            a.backends.push(c.backends.iter().map(|(_, n)| n).sum());
            let mut per: BTreeMap<usize, i64> = BTreeMap::new();
            for (name, n) in &c.backends {
                match crate::db::replica_of(name) {
                    Some(p) => *per.entry(p).or_default() += n,
                    None => a.violations.push(Violation {
                        at: c.at,
                        what: format!("{n} backend(s) named {name:?}, not a replica's"),
                        lane: 0,
                        fault: None,
                        replicas: Vec::new(),
                    }),
                }
            }
            for (&p, &n) in &per {
                if !c.live.contains(&p) {
                    a.violations.push(Violation {
                        at: c.at,
                        what: format!(
                            "leaked backends: {n} of replica-{p}, which ended {} s before",
                            lead.ended
                                .get(p)
                                .copied()
                                .flatten()
                                .map_or("?".into(), |e| format!(
                                    "{:.1}",
                                    c.at.saturating_sub(e) as f64 / 1e6
                                ))
                        ),
                        lane: 0,
                        fault: latest_fault(c.at),
                        replicas: vec![p],
                    });
                } else {
                    a.backends_per_replica_max = a.backends_per_replica_max.max(n);
                    if n > per_replica {
                        a.violations.push(Violation {
                            at: c.at,
                            what: format!(
                                "leaked backends: replica-{p} has {n}, more than its pools and one \
                                 lock or waiting session ({per_replica})"
                            ),
                            lane: 0,
                            fault: latest_fault(c.at),
                            replicas: vec![p],
                        });
                    }
                }
            }
        }
    }
}
