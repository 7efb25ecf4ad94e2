//! The command line: modes, intervals, scenarios, runs.

use std::time::Duration;

use pg_elector_tools::Mode;
use pg_elector_tools::args::{Args, names};

use crate::scenario::Scenario;
use crate::{DEFAULT_REPS, QUICK_REPS};

#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) modes: Vec<Mode>,
    pub(crate) intervals: Vec<Duration>,
    pub(crate) scenarios: Vec<Scenario>,
    pub(crate) reps: usize,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options {
            modes: vec![Mode::Poll, Mode::Fast],
            intervals: vec![Duration::from_secs(1), Duration::from_secs(5)],
            scenarios: Scenario::ALL.to_vec(),
            reps: std::env::var("FAILOVER_REPS")
                .ok()
                .map(|n| n.parse().map_err(|_| "FAILOVER_REPS takes a number"))
                .transpose()?
                .unwrap_or(DEFAULT_REPS),
        };
        let mut reps_given = std::env::var("FAILOVER_REPS").is_ok();
        let mut quick = false;
        let mut args = Args::new(args);
        while let Some(flag) = args.next_flag() {
            match flag {
                "--quick" => quick = true,
                "--reps" => {
                    options.reps = args
                        .value()?
                        .parse()
                        .map_err(|_| "--reps takes a number".to_owned())?;
                    reps_given = true;
                }
                "--mode" => {
                    options.modes = match args.value()?.as_str() {
                        "poll" => vec![Mode::Poll],
                        "fast" => vec![Mode::Fast],
                        "both" | "all" => vec![Mode::Poll, Mode::Fast],
                        other => return Err(format!("unknown mode {other:?}")),
                    }
                }
                "--interval" => {
                    let v = args.value()?;
                    options.intervals = if v == "both" || v == "all" {
                        vec![Duration::from_secs(1), Duration::from_secs(5)]
                    } else {
                        v.split(',').map(parse_interval).collect::<Result<_, _>>()?
                    };
                }
                "--scenario" | "--scenarios" => {
                    options.scenarios = names(&args.value()?, Scenario::by_name)?;
                }
                _ => args.other()?,
            }
        }
        if quick && !reps_given {
            options.reps = QUICK_REPS;
        }
        if options.reps == 0 {
            return Err("--reps must be at least 1".into());
        }
        Ok(options)
    }
}

pub(crate) fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1.0)
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .map(|s| Duration::from_secs_f64(s * scale))
        .ok_or_else(|| format!("--interval: {text:?} is not a number of seconds"))
}
