//! The checks of the fenced rows.

use std::collections::BTreeMap;

use super::intervals::{Iv, within};
use super::{Analysis, Input, Violation, ms};
use crate::db::{Holder, RUN_GAP_US, Row};

/// The fenced rows: epochs never go back, one replica per epoch, no row of a term after a
/// later term began, and none while another replica held the lock beyond the allowance.
pub(super) fn rows(input: &Input<'_>, overlap_excused: &[Iv], a: &mut Analysis) {
    a.rows = input.rows.len();
    let mut check = RowCheck {
        input,
        overlap_excused,
        bumps: bumps(input),
        owner: BTreeMap::new(),
        newest: None,
        seen: BTreeMap::new(),
        found: Vec::new(),
    };
    for row in input.rows {
        check.order(row);
        check.one_owner(row);
        check.no_later_epoch(row);
        check.holder(row, a);
    }
    a.epochs = check.owner.len();
    for (kind, epoch, mut v) in check.found {
        let n = check.seen[&(kind, epoch)];
        if n > 1 {
            v.what.push_str(&format!(" ({n} such rows)"));
        }
        a.violations.push(v);
    }
}

/// Epochs as the sampler saw them become current: (first seen, epoch), epochs increasing.
fn bumps(input: &Input<'_>) -> Vec<(u64, i64)> {
    let mut bumps: Vec<(u64, i64)> = Vec::new();
    for run in input.runs {
        if let Some(e) = run.epoch {
            if bumps.last().is_none_or(|&(_, last)| e > last) {
                bumps.push((run.first, e));
            }
        }
    }
    bumps
}

/// The checks of the rows, one row at a time, in the server's order.
struct RowCheck<'a> {
    input: &'a Input<'a>,
    overlap_excused: &'a [Iv],
    bumps: Vec<(u64, i64)>,
    /// The replica of each epoch's first row.
    owner: BTreeMap<i64, Option<usize>>,
    /// The row of the newest epoch so far.
    newest: Option<Row>,
    /// One violation per (check, epoch), with a count.
    seen: BTreeMap<(u8, i64), usize>,
    found: Vec<(u8, i64, Violation)>,
}

impl RowCheck<'_> {
    /// `at` of the server's clock on this machine's.
    fn local(&self, server: u64) -> u64 {
        (server as i64 - self.input.offset) as u64
    }

    /// A violation of `row`, attributed to the latest fault before it.
    fn violation(&self, row: &Row, what: String, replicas: Vec<usize>) -> Violation {
        let at = self.local(row.at);
        Violation {
            at,
            what,
            lane: 0,
            fault: self
                .input
                .faults
                .iter()
                .rev()
                .find(|f| f.inject <= at)
                .map(|f| f.id),
            replicas,
        }
    }

    /// Counts a violation of check `kind` in `epoch`; keeps the first.
    fn flag(&mut self, kind: u8, epoch: i64, v: Violation) {
        let n = self.seen.entry((kind, epoch)).or_default();
        *n += 1;
        if *n == 1 {
            self.found.push((kind, epoch, v));
        }
    }

    /// Epochs never go back in time.
    fn order(&mut self, row: &Row) {
        match self.newest {
            Some(n) if row.epoch < n.epoch => {
                let v = self.violation(
                    row,
                    format!(
                        "a row of epoch {} (replica-{}) at {} came after a row of epoch {} \
                         (replica-{}) {} ms earlier: two terms' writes interleaved",
                        row.epoch,
                        who(row.replica),
                        row.at,
                        n.epoch,
                        who(n.replica),
                        ms(row.at - n.at)
                    ),
                    row.replica.into_iter().chain(n.replica).collect(),
                );
                self.flag(0, row.epoch, v);
            }
            Some(n) if row.epoch == n.epoch => {}
            _ => self.newest = Some(*row),
        }
    }

    /// One replica per epoch.
    fn one_owner(&mut self, row: &Row) {
        match self.owner.get(&row.epoch) {
            None => {
                self.owner.insert(row.epoch, row.replica);
            }
            Some(&first) if first != row.replica => {
                let v = self.violation(
                    row,
                    format!(
                        "epoch {} has rows of replica-{} and replica-{}",
                        row.epoch,
                        who(first),
                        who(row.replica)
                    ),
                    first.into_iter().chain(row.replica).collect(),
                );
                self.flag(1, row.epoch, v);
            }
            Some(_) => {}
        }
    }

    /// No row of a term once a later epoch was current.
    fn no_later_epoch(&mut self, row: &Row) {
        let later = self.bumps.partition_point(|&(_, e)| e <= row.epoch);
        let Some(&(seen_at, e)) = self.bumps.get(later) else {
            return;
        };
        if row.at > seen_at {
            let v = self.violation(
                row,
                format!(
                    "a row of epoch {} (replica-{}) was written {} ms after the sampler saw \
                     epoch {e} current",
                    row.epoch,
                    who(row.replica),
                    ms(row.at - seen_at)
                ),
                row.replica.into_iter().collect(),
            );
            self.flag(2, row.epoch, v);
        }
    }

    /// Who held the lock when it was written.
    fn holder(&mut self, row: &Row, a: &mut Analysis) {
        let runs = self.input.runs;
        let k = runs.partition_point(|r| r.first <= row.at);
        if k == 0 {
            return;
        }
        let run = runs[k - 1];
        if row.at > run.last {
            return;
        }
        match run.holder {
            Holder::None => a.rows_no_holder += 1,
            Holder::Replica(q) if Some(q) == row.replica => {}
            Holder::Replica(q) => {
                let held = row.at - run.first;
                let at = self.local(row.at);
                let excused = within(self.overlap_excused, (at, at + 1)) > 0;
                if held <= RUN_GAP_US || excused {
                    a.rows_other_holder += 1;
                } else {
                    let v = self.violation(
                        row,
                        format!(
                            "replica-{} wrote a row of epoch {} while pg_locks had shown \
                             replica-{q} holding the lock for {} ms",
                            who(row.replica),
                            row.epoch,
                            ms(held)
                        ),
                        row.replica.into_iter().chain([q]).collect(),
                    );
                    self.flag(3, row.epoch, v);
                }
            }
            Holder::Unknown => {
                let v = self.violation(
                    row,
                    "pg_locks showed the lock held by a session that is no replica's".into(),
                    Vec::new(),
                );
                self.flag(4, row.epoch, v);
            }
        }
    }
}

fn who(replica: Option<usize>) -> String {
    replica.map_or("?".into(), |r| r.to_string())
}
