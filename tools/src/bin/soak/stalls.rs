//! The stall monitors: a thread and a task that sleep 1 ms at a time and note when they ran
//! more than 20 ms late, so that the bounds can give the machine's stalls back (see
//! `check::intervals::extend`).
//!
//! The task runs on the soak's runtime, which runs every replica's proxy: a task there that ran
//! late held up the proxied traffic of every replica for that long, as if the whole fleet were
//! partitioned. Those stalls extend the bounds too, and the report counts them apart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::child::unix_us;

/// Stalls as `(from, to)` in µs.
type Stalls = Arc<Mutex<Vec<(u64, u64)>>>;

/// A stall: a 1 ms sleep that took more than this (µs).
const LATE_US: u64 = 20_000;

/// The two monitors, running.
#[derive(Debug)]
pub(crate) struct Monitors {
    machine: Stalls,
    runtime: Stalls,
    monitoring: Arc<AtomicBool>,
    runtime_monitor: tokio::task::JoinHandle<()>,
}

/// Notes `(before + 1 ms, after)` in `stalls` if that is a stall.
fn note(stalls: &Mutex<Vec<(u64, u64)>>, before: u64, after: u64) {
    if after.saturating_sub(before) > LATE_US {
        stalls.lock().unwrap().push((before + 1_000, after));
    }
}

impl Monitors {
    /// Starts both.
    pub(crate) fn start() -> Self {
        let machine: Stalls = Arc::default();
        let monitoring = Arc::new(AtomicBool::new(true));
        std::thread::spawn({
            let (stalls, monitoring) = (machine.clone(), monitoring.clone());
            move || {
                while monitoring.load(Ordering::Relaxed) {
                    let before = unix_us();
                    std::thread::sleep(Duration::from_millis(1));
                    note(&stalls, before, unix_us());
                }
            }
        });
        let runtime: Stalls = Arc::default();
        let runtime_monitor = tokio::spawn({
            let (stalls, monitoring) = (runtime.clone(), monitoring.clone());
            async move {
                while monitoring.load(Ordering::Relaxed) {
                    let before = unix_us();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    note(&stalls, before, unix_us());
                }
            }
        });
        Monitors {
            machine,
            runtime,
            monitoring,
            runtime_monitor,
        }
    }

    /// Stops both; every stall (the machine's, then the runtime's), and the runtime's.
    pub(crate) async fn stop(&mut self) -> (Vec<(u64, u64)>, Vec<(u64, u64)>) {
        self.monitoring.store(false, Ordering::Relaxed);
        let _ = (&mut self.runtime_monitor).await;
        let runtime = self.runtime.lock().unwrap().clone();
        let mut all = self.machine.lock().unwrap().clone();
        all.extend(runtime.iter().copied());
        (all, runtime)
    }
}
