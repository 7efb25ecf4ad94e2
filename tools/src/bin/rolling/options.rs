//! The command line: deploys, interval, pause, fleet size, and which parts run.

use std::time::Duration;

use pg_elector_tools::Mode;
use pg_elector_tools::args::{Args, names};

/// One electors part: with a preference or without, in one mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub(crate) pref: bool,
    pub(crate) mode: Mode,
}

impl Config {
    pub(crate) const ALL: [Config; 4] = [
        Config::new(false, Mode::Poll),
        Config::new(false, Mode::Fast),
        Config::new(true, Mode::Poll),
        Config::new(true, Mode::Fast),
    ];

    const fn new(pref: bool, mode: Mode) -> Self {
        Config { pref, mode }
    }

    /// `nopref-poll`, `pref-fast`, …: what `--only` takes and the tables show.
    pub(crate) fn name(self) -> String {
        let pref = if self.pref { "pref" } else { "nopref" };
        format!("{pref}-{}", self.mode.name())
    }
}

/// A part `--only` names: an electors configuration or the shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Electors(Config),
    Shards,
}

fn by_name(name: &str) -> Result<Vec<Part>, String> {
    let electors = |keep: fn(&Config) -> bool| {
        let parts = Config::ALL.into_iter().filter(keep).map(Part::Electors);
        Ok(parts.collect())
    };
    match name {
        "all" => Ok([electors(|_| true)?, vec![Part::Shards]].concat()),
        "electors" => electors(|_| true),
        "pref" => electors(|c| c.pref),
        "nopref" => electors(|c| !c.pref),
        "poll" => electors(|c| c.mode == Mode::Poll),
        "fast" => electors(|c| c.mode == Mode::Fast),
        "shards" => Ok(vec![Part::Shards]),
        other => Config::ALL
            .into_iter()
            .find(|c| c.name() == other)
            .map(|c| vec![Part::Electors(c)])
            .ok_or_else(|| format!("unknown part {other:?}")),
    }
}

#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) deploys: usize,
    pub(crate) interval: Duration,
    /// How long a deploy waits after a new replica stands by before it stops an old one.
    pub(crate) pause: Duration,
    pub(crate) replicas: usize,
    pub(crate) shard_count: u32,
    /// The electors parts to run, in the order of [`Config::ALL`].
    pub(crate) configs: Vec<Config>,
    /// Whether the shards part runs.
    pub(crate) shards: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options {
            deploys: 20,
            interval: Duration::from_secs(1),
            pause: Duration::ZERO,
            replicas: 5,
            shard_count: 64,
            configs: Config::ALL.to_vec(),
            shards: true,
        };
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{v:?} is not a number"))
        };
        let mut args = Args::new(args);
        while let Some(flag) = args.next_flag() {
            match flag {
                "--deploys" => o.deploys = number(args.value()?)? as usize,
                "--interval" => o.interval = parse_duration(&args.value()?, 10)?,
                "--pause" => o.pause = parse_duration(&args.value()?, 0)?,
                "--replicas" => o.replicas = number(args.value()?)? as usize,
                "--shards" => o.shard_count = number(args.value()?)? as u32,
                "--only" => {
                    let parts = names(&args.value()?, by_name)?;
                    o.configs = Config::ALL
                        .into_iter()
                        .filter(|c| parts.contains(&Part::Electors(*c)))
                        .collect();
                    o.shards = parts.contains(&Part::Shards);
                }
                _ => args.other()?,
            }
        }
        if o.deploys == 0 || o.replicas < 2 || o.shard_count == 0 {
            return Err("--deploys and --shards take at least 1, --replicas at least 2".into());
        }
        Ok(o)
    }
}

/// `1s`, `200ms`, or a number of seconds; at least `min_ms`.
fn parse_duration(text: &str, min_ms: u64) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s * scale))
        .filter(|d| *d >= Duration::from_millis(min_ms))
        .ok_or_else(|| format!("{text:?} is not a duration of at least {min_ms} ms"))
}
