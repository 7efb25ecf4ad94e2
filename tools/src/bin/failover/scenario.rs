//! The faults, and what one run of one measures.

use std::time::Duration;

use pg_elector_testkit::server::ShutdownMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scenario {
    Graceful,
    Sigkill,
    Terminate,
    Reset,
    Partition,
    Freeze,
    Restart(ShutdownMode),
}

impl Scenario {
    pub(crate) const ALL: [Scenario; 8] = [
        Scenario::Graceful,
        Scenario::Sigkill,
        Scenario::Terminate,
        Scenario::Reset,
        Scenario::Partition,
        Scenario::Freeze,
        Scenario::Restart(ShutdownMode::Fast),
        Scenario::Restart(ShutdownMode::Immediate),
    ];

    pub(crate) fn by_name(name: &str) -> Result<Vec<Scenario>, String> {
        Ok(match name {
            "all" => Scenario::ALL.to_vec(),
            "graceful" => vec![Scenario::Graceful],
            "sigkill" | "kill" => vec![Scenario::Sigkill],
            "terminate" => vec![Scenario::Terminate],
            "reset" => vec![Scenario::Reset],
            "partition" => vec![Scenario::Partition],
            "freeze" | "sigstop" => vec![Scenario::Freeze],
            "restart" => vec![
                Scenario::Restart(ShutdownMode::Fast),
                Scenario::Restart(ShutdownMode::Immediate),
            ],
            "restart-fast" => vec![Scenario::Restart(ShutdownMode::Fast)],
            "restart-immediate" => vec![Scenario::Restart(ShutdownMode::Immediate)],
            other => return Err(format!("unknown scenario {other:?}")),
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Graceful => "graceful shutdown",
            Scenario::Sigkill => "SIGKILL of the leader process",
            Scenario::Terminate => "pg_terminate_backend",
            Scenario::Reset => "connection reset (proxy RST)",
            Scenario::Partition => "partition (blackhole)",
            Scenario::Freeze => "frozen leader (SIGSTOP, SIGCONT)",
            Scenario::Restart(ShutdownMode::Immediate) => "server restart, immediate",
            Scenario::Restart(_) => "server restart, fast",
        }
    }

    /// How long to wait for the new leader after the fault.
    pub(crate) fn limit(self, interval: Duration) -> Duration {
        match self {
            Scenario::Partition => 10 * interval,
            Scenario::Freeze => 8 * interval,
            Scenario::Restart(_) => Duration::from_secs(60) + 2 * interval,
            _ => 5 * interval,
        }
    }
}

/// One run, in µs.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) none: u64,
    pub(crate) both: u64,
    /// From the fault to the old leader's demotion (none for a killed or frozen process).
    pub(crate) demoted: Option<u64>,
    /// Frozen leader: from SIGCONT to its standby report.
    pub(crate) resumed: Option<u64>,
    /// From the fault (for a restart: from the server accepting again) to the new leader.
    pub(crate) takeover: u64,
    /// From the old term's last fenced write to the new term's first, by the server's clock;
    /// negative would mean the writes of two terms interleaved.
    pub(crate) write_gap: Option<i64>,
    /// Something that must not happen (a frozen leader acting after SIGCONT).
    pub(crate) wrong: Option<String>,
}
