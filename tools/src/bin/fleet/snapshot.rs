//! What one run plans, and what it reads from the fleet and the server.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pg_elector_tools::Mode;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use crate::options::Shape;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) shape: Shape,
    pub(crate) mode: Mode,
    pub(crate) electors: usize,
    pub(crate) per_proc: usize,
    /// `--bare-try`: the standbys are bare prepared tries on the same pools (see
    /// [`crate::BARE_TRY`]); the leaders are electors.
    pub(crate) bare: bool,
}

impl Plan {
    /// The mode as the tables name it: `poll`, `fast`, or `bare-try`.
    pub(crate) fn mode_name(&self) -> &'static str {
        if self.bare {
            "bare-try"
        } else {
            self.mode.name()
        }
    }

    pub(crate) fn procs(&self) -> usize {
        self.electors.div_ceil(self.per_proc)
    }

    pub(crate) fn keys(&self) -> usize {
        match self.shape {
            Shape::Keys => self.per_proc.min(self.electors),
            Shape::OneKey => 1,
        }
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{} ({} × {})",
            self.electors,
            self.procs(),
            self.per_proc.min(self.electors)
        )
    }
}

pub(crate) struct Proc {
    pub(crate) child: Child,
    /// Kept open: the child exits when it closes.
    pub(crate) stdin: ChildStdin,
    pub(crate) pid: i32,
    pub(crate) lines: mpsc::UnboundedReceiver<String>,
}

/// The merged metrics of the fleet.
#[derive(Clone, Debug, Default)]
pub(crate) struct FleetSnap {
    pub(crate) leaders: f64,
    pub(crate) acquired: f64,
    pub(crate) lost: f64,
    pub(crate) count: u64,
    pub(crate) sum: f64,
    /// Upper bound (bits of the f64) → cumulative count.
    pub(crate) buckets: BTreeMap<u64, u64>,
}

impl FleetSnap {
    pub(crate) fn add(&mut self, line: &str) -> Option<()> {
        let mut words = line.split_whitespace();
        self.leaders += words.next()?.parse::<f64>().ok()?;
        self.acquired += words.next()?.parse::<f64>().ok()?;
        self.lost += words.next()?.parse::<f64>().ok()?;
        self.count += words.next()?.parse::<u64>().ok()?;
        self.sum += words.next()?.parse::<f64>().ok()?;
        for pair in words
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let (bound, count) = pair.split_once(':')?;
            *self
                .buckets
                .entry(bound.parse::<f64>().ok()?.to_bits())
                .or_default() += count.parse::<u64>().ok()?;
        }
        Some(())
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Statements {
    pub(crate) try_calls: i64,
    /// Execution plus planning time, ms.
    pub(crate) try_ms: f64,
    pub(crate) check_calls: i64,
    pub(crate) check_ms: f64,
    /// Calls of every other statement of the fleet (not the bench's own).
    pub(crate) other_calls: i64,
}

pub(crate) struct Snapshot {
    /// When every process had answered with its metrics.
    pub(crate) at: Instant,
    /// When /proc was read (for the CPU rates: under overload the parts of a snapshot can be
    /// seconds apart).
    pub(crate) proc_at: Instant,
    /// When `pg_stat_statements` was read (for the statement rates).
    pub(crate) stmts_at: Instant,
    pub(crate) server: u64,
    /// The bench's own backends.
    pub(crate) own: u64,
    pub(crate) clients: u64,
    pub(crate) machine: u64,
    pub(crate) sessions: Option<i64>,
    pub(crate) statements: Option<Statements>,
    pub(crate) fleet: FleetSnap,
    /// The fleet's backends.
    pub(crate) backends: i64,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) backends: i64,
    pub(crate) waiting: i64,
    pub(crate) server_children: usize,
    pub(crate) rss_kb: u64,
}

/// A run's row, or why it failed (with what was seen of the fleet's logs).
pub(crate) type Outcome = Result<Row, (String, Row)>;

/// The probe's latencies (µs), each with when it was sent.
pub(crate) type Probes = Arc<Mutex<Vec<(Instant, u64)>>>;

/// The outcome of one run.
#[derive(Debug, Default)]
pub(crate) struct Row {
    pub(crate) max_connections: usize,
    pub(crate) window: f64,
    pub(crate) leaders: f64,
    pub(crate) server_cores: f64,
    pub(crate) backends_mean: f64,
    pub(crate) backends_max: i64,
    pub(crate) waiting_max: i64,
    pub(crate) server_children_max: usize,
    pub(crate) sessions: Option<i64>,
    /// The fleet's backends at the start and the end of the window.
    pub(crate) backends_ends: (i64, i64),
    pub(crate) tries: Option<f64>,
    pub(crate) checks: f64,
    pub(crate) try_exec_us: Option<f64>,
    pub(crate) check_exec_us: Option<f64>,
    pub(crate) other: Option<f64>,
    pub(crate) check_count: u64,
    pub(crate) check_mean_ms: f64,
    pub(crate) check_p50: Option<f64>,
    pub(crate) check_p99: Option<f64>,
    pub(crate) within_tenth: Option<f64>,
    pub(crate) probe: Vec<u64>,
    pub(crate) changes: f64,
    pub(crate) client_cores: f64,
    /// Every CPU's busy time: the server, the fleet, the bench, and anything else running.
    pub(crate) machine_cores: f64,
    pub(crate) rss_total_kb: u64,
    pub(crate) rss_max_kb: u64,
    /// The fleet's WARN and ERROR lines over the whole run (start-up included).
    pub(crate) warnings: usize,
    /// The same by message and error, most frequent first.
    pub(crate) warning_kinds: Vec<(String, usize)>,
    /// The fleet's log lines (indices) written during the window.
    pub(crate) log_window: (usize, usize),
    pub(crate) window_warnings: usize,
    pub(crate) window_warning_kinds: Vec<(String, usize)>,
    pub(crate) log_tail: Vec<String>,
}
