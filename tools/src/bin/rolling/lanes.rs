//! What the replicas said, as spans: who led (lane 0) or owned each shard (lane = shard) when;
//! and the moves and overlaps within a window. All times in µs since the UNIX epoch.

use std::collections::HashMap;

use crate::procs::{Event, What};

/// The end of a span that has not ended.
pub(crate) const OPEN: u64 = u64::MAX;

/// One replica's hold of one lane, from its gain to its loss (or [`OPEN`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) lane: u32,
    pub(crate) child: usize,
    pub(crate) from: u64,
    pub(crate) to: u64,
}

/// A move of a lane from one replica to another, and the time nobody held it in between.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Move {
    pub(crate) from_child: usize,
    pub(crate) to_child: usize,
    pub(crate) gap_us: u64,
}

/// Every span the events tell of, in the order they began. An `exited` ends every span of
/// its replica that is still open.
pub(crate) fn spans(events: &[Event]) -> Vec<Span> {
    let mut sorted = events.to_vec();
    // At one µs, losses before gains: a handover within one µs is no overlap.
    sorted.sort_by_key(|e| (e.at, matches!(e.what, What::Leader | What::Gain(_))));
    let mut open: HashMap<(usize, u32), u64> = HashMap::new();
    let mut out = Vec::new();
    let mut close = |child, lane, from, to| {
        out.push(Span {
            lane,
            child,
            from,
            to,
        })
    };
    for e in sorted {
        match e.what {
            What::Leader => drop(open.insert((e.child, 0), e.at)),
            What::Gain(shard) => drop(open.insert((e.child, shard), e.at)),
            What::Standby | What::Lose(_) => {
                let lane = if let What::Lose(shard) = e.what {
                    shard
                } else {
                    0
                };
                if let Some(from) = open.remove(&(e.child, lane)) {
                    close(e.child, lane, from, e.at);
                }
            }
            What::Exited => {
                let lanes: Vec<u32> = open
                    .keys()
                    .filter(|k| k.0 == e.child)
                    .map(|k| k.1)
                    .collect();
                for lane in lanes {
                    close(e.child, lane, open.remove(&(e.child, lane)).unwrap(), e.at);
                }
            }
            What::Started | What::Member => {}
        }
    }
    for ((child, lane), from) in open {
        close(child, lane, from, OPEN);
    }
    out.sort_by_key(|s| (s.from, s.lane));
    out
}

/// The moves of `lane` that happened in `(from, to]`: a span that began there on another
/// replica than the span before it. The gap is 0 when the two overlapped.
pub(crate) fn moves(spans: &[Span], lane: u32, from: u64, to: u64) -> Vec<Move> {
    let lane_spans: Vec<&Span> = spans.iter().filter(|s| s.lane == lane).collect();
    lane_spans
        .windows(2)
        .filter(|w| w[1].from > from && w[1].from <= to && w[0].child != w[1].child)
        .map(|w| Move {
            from_child: w[0].child,
            to_child: w[1].child,
            gap_us: w[1].from.saturating_sub(w[0].to),
        })
        .collect()
}

/// How long, within `[from, to]`, two or more of `spans` (of one lane) were open at once.
pub(crate) fn overlap_us<'a>(spans: impl Iterator<Item = &'a Span>, from: u64, to: u64) -> u64 {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for s in spans {
        let (a, b) = (s.from.max(from), s.to.min(to));
        if a < b {
            edges.extend([(a, 1), (b, -1)]);
        }
    }
    edges.sort_unstable();
    let (mut open, mut since, mut total) = (0, 0, 0);
    for (at, delta) in edges {
        if open >= 2 {
            total += at - since;
        }
        open += delta;
        since = at;
    }
    total
}

/// The replicas whose span of `lane` is open at `at`.
pub(crate) fn holders_at(spans: &[Span], lane: u32, at: u64) -> Vec<usize> {
    spans
        .iter()
        .filter(|s| s.lane == lane && s.from <= at && s.to > at)
        .map(|s| s.child)
        .collect()
}
