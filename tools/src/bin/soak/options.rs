//! The soak's command line.

use std::path::PathBuf;
use std::time::Duration;

use pg_elector_tools::args::{Args, names};
use pg_elector_tools::rng::time_seed;

use pg_elector_testkit::server::failover::Follow;

use crate::faults::Kind;

/// Which replicas run with fast takeover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// None: every standby only tries, once per I.
    Poll,
    /// All of them (`ElectorBuilder::fast_takeover(true)`).
    Fast,
    /// Each replica process, at each (re)spawn, draws its mode from the seed: both kinds
    /// stand by side by side, and a slot changes mode over the run.
    Mixed,
}

impl Mode {
    /// The mode's name on the command line and in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Fast => "fast",
            Mode::Mixed => "mixed",
        }
    }
}

/// How the soak's primary replicates to its standby (`--cluster`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Replication {
    /// Commits wait until the standby has flushed them: no claim of the schedule is lost.
    Sync,
    /// Commits do not wait: the claims of the lag before a crash are lost with the old primary.
    Async,
}

impl Replication {
    /// The name on the command line and in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Replication::Sync => "sync",
            Replication::Async => "async",
        }
    }
}

/// Everything the command line sets.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Fixes every random draw of the run (printed at the start).
    pub(crate) seed: u64,
    /// How long faults are injected (the settling and the checks come after).
    pub(crate) duration: Duration,
    /// Replica processes running at once.
    pub(crate) replicas: usize,
    /// The check interval I of every elector.
    pub(crate) interval: Duration,
    /// Poll, fast or mixed.
    pub(crate) mode: Mode,
    /// The fault kinds to inject.
    pub(crate) faults: Vec<Kind>,
    /// The probability that a fault starts while earlier ones are still in effect.
    pub(crate) overlap: f64,
    /// Slot 0 is never killed nor restarted, so one process lives through the whole run and
    /// its memory is measured over all of it.
    pub(crate) keep_one: bool,
    /// Also write the report to this file.
    pub(crate) out: Option<PathBuf>,
    /// Print every fault as it is injected.
    pub(crate) verbose: bool,
    /// Checks the checker: every replica process elects on a key of its own, so they all
    /// lead at once and write rows of unrelated epochs; the run must report violations.
    pub(crate) split_key: bool,
    /// Shard mode: every replica runs one group of this many shards instead of one elector
    /// (0: key mode). Shards have no fast takeover and no resign: poll mode, no `resign`.
    pub(crate) shards: usize,
    /// A primary and a streaming standby, replicating so, and the `failover` fault (`None`:
    /// one server).
    pub(crate) cluster: Option<Replication>,
    /// How the replicas follow a failover: a multi-host URL or a moving address.
    pub(crate) follow: Follow,
    /// A run that completed fewer failovers fails (1 with `--cluster`, else 0).
    pub(crate) min_failovers: usize,
    /// Key mode: every replica gets a preference, new ones a higher one as in a rolling
    /// deploy, and the handover faults are drawn (`--no-preferences`: none; shard mode: none,
    /// groups of shards do not use preferences).
    pub(crate) preferences: bool,
}

/// The most shards shard mode runs (the board keeps a replica's owned shards in a `u64`).
pub(crate) const MAX_SHARDS: usize = 64;

/// The usage line printed on a bad option.
pub(crate) const USAGE: &str =
    "usage: cargo run --release -p pg-elector-tools --bin soak -- [--seed N] [--duration 60s] \
[--replicas 5] [--interval-ms 250] [--mode poll|fast|mixed] [--faults all|kind[,kind…]] \
[--overlap 0.25] [--shards N] [--cluster sync|async] [--follow moving-address|multi-host] \
[--min-failovers N] [--no-preferences] \
[--no-keep-one] [--out FILE] [--verbose] [--sabotage split-key]
fault kinds: kill, stop, terminate-lock, terminate-random (terminate: both), partition, reset, \
restart-fast, restart-immediate (restart: both), exhaust, graceful, resign, long-partition \
(key mode), join-partition (shard mode), sync-standby, failover (with --cluster), \
handover-live, handover-dying, handover-missing (handover: all three; key mode with preferences)";

impl Options {
    /// Parses the arguments after `--` (a `--bench`, which `cargo bench` used to add, is ignored).
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options {
            seed: std::env::var("SOAK_SEED")
                .ok()
                .map(|s| s.parse().map_err(|_| "SOAK_SEED takes a number".to_owned()))
                .transpose()?
                .unwrap_or_else(time_seed),
            duration: Duration::from_secs(60),
            replicas: 5,
            interval: Duration::from_millis(250),
            mode: Mode::Mixed,
            faults: Kind::ALL.to_vec(),
            overlap: 0.25,
            keep_one: true,
            out: None,
            verbose: false,
            split_key: false,
            shards: 0,
            cluster: None,
            follow: Follow::MovingAddress,
            min_failovers: 0,
            preferences: true,
        };
        let mut faults_given = false;
        let mut follow_given = false;
        let mut min_failovers = None;
        let mut mode_given = false;
        let mut args = Args::new(args);
        while let Some(flag) = args.next_flag() {
            match flag {
                "--seed" => options.seed = args.seed()?,
                "--duration" => options.duration = parse_duration(&args.value()?)?,
                "--replicas" => {
                    options.replicas = args
                        .value()?
                        .parse()
                        .ok()
                        .filter(|n| (2..=50).contains(n))
                        .ok_or("--replicas takes a number from 2 to 50")?;
                }
                "--interval-ms" => {
                    options.interval = Duration::from_millis(
                        args.value()?
                            .parse()
                            .ok()
                            .filter(|ms| *ms >= 50)
                            .ok_or("--interval-ms takes a number of ms, at least 50")?,
                    );
                }
                "--mode" => {
                    mode_given = true;
                    options.mode = match args.value()?.as_str() {
                        "poll" => Mode::Poll,
                        "fast" => Mode::Fast,
                        "mixed" => Mode::Mixed,
                        other => return Err(format!("unknown mode {other:?}")),
                    };
                }
                "--faults" => {
                    let kinds = names(&args.value()?, Kind::by_name)?;
                    if kinds.is_empty() {
                        return Err("--faults names no fault".into());
                    }
                    options.faults = kinds;
                    faults_given = true;
                }
                "--cluster" => {
                    options.cluster = Some(match args.value()?.as_str() {
                        "sync" => Replication::Sync,
                        "async" => Replication::Async,
                        other => return Err(format!("unknown --cluster {other:?}: sync or async")),
                    });
                }
                "--min-failovers" => {
                    min_failovers = Some(
                        args.value()?
                            .parse()
                            .map_err(|_| "--min-failovers takes a number")?,
                    );
                }
                "--follow" => {
                    follow_given = true;
                    options.follow = match args.value()?.as_str() {
                        "moving-address" => Follow::MovingAddress,
                        "multi-host" => Follow::MultiHost,
                        other => {
                            return Err(format!(
                                "unknown --follow {other:?}: moving-address or multi-host"
                            ));
                        }
                    };
                }
                "--overlap" => {
                    options.overlap = args
                        .value()?
                        .parse()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or("--overlap takes a probability from 0 to 1")?;
                }
                "--shards" => {
                    options.shards = args
                        .value()?
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_SHARDS).contains(n))
                        .ok_or(format!("--shards takes a number from 1 to {MAX_SHARDS}"))?;
                }
                "--no-keep-one" => options.keep_one = false,
                "--preferences" => options.preferences = true,
                "--no-preferences" => options.preferences = false,
                "--out" => options.out = Some(PathBuf::from(args.value()?)),
                "--verbose" | "-v" => options.verbose = true,
                "--sabotage" => match args.value()?.as_str() {
                    "split-key" => options.split_key = true,
                    other => return Err(format!("unknown sabotage {other:?}")),
                },
                _ => args.other()?,
            }
        }
        let shards = options.shards;
        options.faults.retain(|k| k.of_mode(shards));
        // Groups of shards do not use preferences (docs/preferences.md).
        options.preferences &= shards == 0;
        if !options.preferences {
            if faults_given && options.faults.iter().any(|k| k.handover()) {
                return Err("the handover faults need preferences (key mode, no \
                            --no-preferences)"
                    .into());
            }
            options.faults.retain(|k| !k.handover());
        }
        if options.cluster.is_none() {
            if faults_given && options.faults.contains(&Kind::Failover) {
                return Err("--faults failover needs --cluster sync or --cluster async".into());
            }
            if follow_given || min_failovers.is_some() {
                return Err("--follow and --min-failovers need --cluster sync or async".into());
            }
            options.faults.retain(|&k| k != Kind::Failover);
        } else if options.faults.contains(&Kind::Failover) {
            options.min_failovers = min_failovers.unwrap_or(1);
        } else if min_failovers.is_some_and(|n| n > 0) {
            return Err("--min-failovers: --faults leaves out failover".into());
        }
        if options.shards > 0 {
            options.shard_mode(mode_given)?;
        } else if options.faults.is_empty() {
            return Err("--faults: join-partition is a fault of shard mode; name another".into());
        }
        Ok(options)
    }

    /// Shard mode's limits: poll only (shards have no fast takeover), no `resign` (a shard's
    /// owner gives it up only when the assignment moves it).
    fn shard_mode(&mut self, mode_given: bool) -> Result<(), String> {
        if mode_given && self.mode != Mode::Poll {
            return Err("--shards runs in poll mode only (shards have no fast takeover)".into());
        }
        self.mode = Mode::Poll;
        if self.faults.is_empty() {
            return Err(
                "--shards: resign and long-partition are not faults of shards; name another".into(),
            );
        }
        Ok(())
    }

    /// How many lock keys the checks look at: the shards, or the one key.
    pub(crate) fn lanes(&self) -> usize {
        self.shards.max(1)
    }

    /// The slack every time bound gets on a loaded machine: I/2 + 250 ms.
    pub(crate) fn slack(&self) -> Duration {
        self.interval / 2 + Duration::from_millis(250)
    }

    /// The arguments that replay this run (the seed and every option that shapes the draws).
    pub(crate) fn replay_args(&self, duration: Duration) -> String {
        let mut args = format!(
            "--seed {} --duration {}s --replicas {} --interval-ms {} --mode {}",
            self.seed,
            duration.as_secs().max(1),
            self.replicas,
            self.interval.as_millis(),
            self.mode.name()
        );
        let defaults: Vec<Kind> = Kind::ALL
            .into_iter()
            .filter(|k| k.of_mode(self.shards))
            .filter(|&k| self.cluster.is_some() || k != Kind::Failover)
            .filter(|k| self.preferences || !k.handover())
            .collect();
        if self.faults != defaults {
            let names: Vec<&str> = self.faults.iter().map(|k| k.name()).collect();
            args.push_str(&format!(" --faults {}", names.join(",")));
        }
        if self.overlap != 0.25 {
            args.push_str(&format!(" --overlap {}", self.overlap));
        }
        if !self.keep_one {
            args.push_str(" --no-keep-one");
        }
        if !self.preferences && self.shards == 0 {
            args.push_str(" --no-preferences");
        }
        if self.shards > 0 {
            args.push_str(&format!(" --shards {}", self.shards));
        }
        if let Some(replication) = self.cluster {
            args.push_str(&format!(" --cluster {}", replication.name()));
            args.push_str(&format!(" --follow {}", follow_name(self.follow)));
        }
        if self.split_key {
            args.push_str(" --sabotage split-key");
        }
        args
    }
}

/// `--follow`'s name for `follow`.
pub(crate) fn follow_name(follow: Follow) -> &'static str {
    match follow {
        Follow::MultiHost => "multi-host",
        _ => "moving-address",
    }
}

/// `90`, `90s`, `1500ms`, `5m`, `1h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (text, 1.0)
    };
    number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .map(|s| Duration::from_secs_f64(s * scale))
        .ok_or_else(|| format!("{text:?} is not a duration (e.g. 60s, 5m, 1h)"))
}
