//! The checks of the fenced rows.

use std::collections::BTreeMap;

use super::intervals::{Iv, within};
use super::{Analysis, Input, Violation, ms};
use crate::db::{Holder, RUN_GAP_US, Row};

/// The fenced rows: epochs never go back, one replica per epoch, no row of a term after a
/// later term began, and none while another replica held the lock beyond the allowance.
pub(super) fn rows(input: &Input<'_>, overlap_excused: &[Iv], a: &mut Analysis) {
    let offset = input.offset;
    let local = |server: u64| (server as i64 - offset) as u64;
    let faults = input.faults;
    let latest_fault = |t: u64| faults.iter().rev().find(|f| f.inject <= t).map(|f| f.id);
    a.rows = input.rows.len();
    // Epochs as the sampler saw them become current: (first seen, epoch), epochs increasing.
    let mut bumps: Vec<(u64, i64)> = Vec::new();
    for run in input.runs {
        if let Some(e) = run.epoch {
            if bumps.last().is_none_or(|&(_, last)| e > last) {
                bumps.push((run.first, e));
            }
        }
    }
    let mut owner: BTreeMap<i64, Option<usize>> = BTreeMap::new();
    let mut newest: Option<Row> = None;
    // One violation per (check, epoch), with a count.
    let mut seen: BTreeMap<(u8, i64), usize> = BTreeMap::new();
    let mut found: Vec<(u8, i64, Violation)> = Vec::new();
    let mut flag = |check: u8, epoch: i64, v: Violation| {
        let n = seen.entry((check, epoch)).or_default();
        *n += 1;
        if *n == 1 {
            found.push((check, epoch, v));
        }
    };
    for row in input.rows {
        // Epochs never go back in time.
        match newest {
            Some(n) if row.epoch < n.epoch => flag(
                0,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: format!(
                        "a row of epoch {} (replica-{}) at {} came after a row of epoch {} \
                         (replica-{}) {} ms earlier: two terms' writes interleaved",
                        row.epoch,
                        who(row.replica),
                        row.at,
                        n.epoch,
                        who(n.replica),
                        ms(row.at - n.at)
                    ),
                    fault: latest_fault(local(row.at)),
                    replicas: row.replica.into_iter().chain(n.replica).collect(),
                },
            ),
            Some(n) if row.epoch == n.epoch => {}
            _ => newest = Some(*row),
        }
        // One replica per epoch.
        match owner.get(&row.epoch) {
            None => {
                owner.insert(row.epoch, row.replica);
            }
            Some(&first) if first != row.replica => flag(
                1,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: format!(
                        "epoch {} has rows of replica-{} and replica-{}",
                        row.epoch,
                        who(first),
                        who(row.replica)
                    ),
                    fault: latest_fault(local(row.at)),
                    replicas: first.into_iter().chain(row.replica).collect(),
                },
            ),
            Some(_) => {}
        }
        // No row of a term once a later epoch was current.
        let later = bumps.partition_point(|&(_, e)| e <= row.epoch);
        if let Some(&(seen_at, e)) = bumps.get(later) {
            if row.at > seen_at {
                flag(
                    2,
                    row.epoch,
                    Violation {
                        at: local(row.at),
                        what: format!(
                            "a row of epoch {} (replica-{}) was written {} ms after the sampler \
                             saw epoch {e} current",
                            row.epoch,
                            who(row.replica),
                            ms(row.at - seen_at)
                        ),
                        fault: latest_fault(local(row.at)),
                        replicas: row.replica.into_iter().collect(),
                    },
                );
            }
        }
        // Who held the lock when it was written.
        let k = input.runs.partition_point(|r| r.first <= row.at);
        if k == 0 {
            continue;
        }
        let run = input.runs[k - 1];
        if row.at > run.last {
            continue;
        }
        match run.holder {
            Holder::None => a.rows_no_holder += 1,
            Holder::Replica(q) if Some(q) == row.replica => {}
            Holder::Replica(q) => {
                let held = row.at - run.first;
                let excused = within(overlap_excused, (local(row.at), local(row.at) + 1)) > 0;
                if held <= RUN_GAP_US || excused {
                    a.rows_other_holder += 1;
                } else {
                    flag(
                        3,
                        row.epoch,
                        Violation {
                            at: local(row.at),
                            what: format!(
                                "replica-{} wrote a row of epoch {} while pg_locks had shown \
                                 replica-{q} holding the lock for {} ms",
                                who(row.replica),
                                row.epoch,
                                ms(held)
                            ),
                            fault: latest_fault(local(row.at)),
                            replicas: row.replica.into_iter().chain([q]).collect(),
                        },
                    );
                }
            }
            Holder::Unknown => flag(
                4,
                row.epoch,
                Violation {
                    at: local(row.at),
                    what: "pg_locks showed the lock held by a session that is no replica's".into(),
                    fault: latest_fault(local(row.at)),
                    replicas: Vec::new(),
                },
            ),
        }
    }
    a.epochs = owner.len();
    for (check, epoch, mut v) in found {
        let n = seen[&(check, epoch)];
        if n > 1 {
            v.what.push_str(&format!(" ({n} such rows)"));
        }
        a.violations.push(v);
    }
}

fn who(replica: Option<usize>) -> String {
    replica.map_or("?".into(), |r| r.to_string())
}
