//! The command line: shapes, modes, fleet sizes, times, server settings.

use std::time::Duration;

use pg_elector_tools::Mode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Every process runs one elector per key.
    Keys,
    /// Every elector competes for one key.
    OneKey,
}

impl Shape {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::Keys => "keys",
            Shape::OneKey => "one-key",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) shapes: Vec<Shape>,
    pub(crate) modes: Vec<Mode>,
    pub(crate) sizes: Vec<usize>,
    pub(crate) per_proc: usize,
    pub(crate) pool: usize,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) baseline: Duration,
    pub(crate) interval: Duration,
    pub(crate) statements: bool,
    pub(crate) sweep: bool,
    pub(crate) sweep_max: usize,
    /// `--bare-try`: after each shape's runs, one with bare prepared tries as the standbys.
    pub(crate) bare_try: bool,
    /// `--prepared`: the electors send their tries and checks as prepared statements
    /// (`Some(true)`); `--unnamed`: as unnamed ones (`Some(false)`); neither: the default.
    pub(crate) prepared: Option<bool>,
    /// Server settings (`name=value`) applied with `ALTER SYSTEM` before the first run.
    pub(crate) settings: Vec<String>,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Self {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let value = |flag: &str| {
            args.iter().position(|a| a == flag).map(|i| {
                args.get(i + 1)
                    .cloned()
                    .unwrap_or_else(|| panic!("{flag} takes a value"))
            })
        };
        let number = |flag: &str| {
            value(flag).map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{flag} takes a number, not {v:?}"))
            })
        };
        let quick = has("--quick");
        let shapes = match value("--shape").as_deref() {
            None | Some("both") => vec![Shape::Keys, Shape::OneKey],
            Some("keys") => vec![Shape::Keys],
            Some("one-key") => vec![Shape::OneKey],
            Some(other) => panic!("--shape takes keys, one-key or both, not {other:?}"),
        };
        let modes = match value("--mode").as_deref() {
            None | Some("both") => vec![Mode::Poll, Mode::Fast],
            Some("poll") => vec![Mode::Poll],
            Some("fast") => vec![Mode::Fast],
            Some(other) => panic!("--mode takes poll, fast or both, not {other:?}"),
        };
        let sizes = value("--electors").map_or_else(
            || vec![if quick { 200 } else { 1000 }],
            |list| {
                list.split(',')
                    .map(|n| n.trim().parse().expect("--electors takes numbers"))
                    .collect()
            },
        );
        let secs = |flag: &str, full: u64, quick_value: u64| {
            Duration::from_secs(number(flag).unwrap_or(if quick { quick_value } else { full }))
        };
        let options = Options {
            shapes,
            modes,
            sizes,
            per_proc: number("--per-proc").unwrap_or(20) as usize,
            pool: number("--pool").unwrap_or(4) as usize,
            duration: secs("--duration", 60, 10),
            warmup: secs("--warmup", 5, 2),
            baseline: secs("--baseline", 10, 3),
            interval: Duration::from_millis(number("--interval-ms").unwrap_or(1000)),
            statements: !has("--no-statements"),
            sweep: has("--sweep"),
            sweep_max: number("--sweep-max").unwrap_or(16_000) as usize,
            bare_try: has("--bare-try"),
            prepared: if has("--prepared") {
                Some(true)
            } else if has("--unnamed") {
                Some(false)
            } else {
                None
            },
            settings: args
                .iter()
                .enumerate()
                .filter(|(_, a)| *a == "--set")
                .map(|(i, _)| {
                    let setting = args.get(i + 1).expect("--set takes name=value");
                    assert!(
                        setting.contains('=') && !setting.contains(';'),
                        "--set takes name=value, not {setting:?}"
                    );
                    setting.clone()
                })
                .collect(),
        };
        assert!(
            options.per_proc > 0 && options.pool > 0,
            "--per-proc and --pool must be > 0"
        );
        assert!(
            options.sizes.iter().all(|&n| n > 0),
            "--electors must be > 0"
        );
        options
    }
}
