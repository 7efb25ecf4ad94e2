//! Who led when: each process's leadership intervals from its reports, and where two led.

use super::Input;
use super::intervals::{Iv, normalize, subtract};
use crate::fleet::{Event, What};

/// The per-process leadership intervals.
#[derive(Debug)]
pub(super) struct Lead {
    /// Certainly led (and ran), stops removed.
    pub(super) definite: Vec<Vec<Iv>>,
    /// May have led (and ran), stops removed.
    pub(super) possible: Vec<Vec<Iv>>,
    /// May have led, stops included, one interval per term (not merged: a term that ends
    /// and a term that begins a read later touch).
    pub(super) possible_terms: Vec<Vec<Iv>>,
    /// SIGSTOP to SIGCONT.
    pub(super) stops: Vec<Vec<Iv>>,
    /// When each process ended (kill or exit).
    pub(super) ended: Vec<Option<u64>>,
}

pub(super) fn leadership(input: &Input<'_>) -> Lead {
    let n = input.procs.len();
    let mut per: Vec<Vec<Event>> = vec![Vec::new(); n];
    for e in input.events {
        if e.replica < n {
            per[e.replica].push(*e);
        }
    }
    let mut lead = Lead {
        definite: Vec::with_capacity(n),
        possible: Vec::with_capacity(n),
        possible_terms: Vec::with_capacity(n),
        stops: Vec::with_capacity(n),
        ended: Vec::with_capacity(n),
    };
    for (p, events) in per.iter_mut().enumerate() {
        events.sort_by_key(|e| e.at);
        let (mut definite, mut possible, mut stops) = (Vec::new(), Vec::new(), Vec::new());
        let (mut def_open, mut pos_open, mut stop_open) = (None, None, None);
        let mut ended = input.procs[p].ended;
        for e in events.iter() {
            match e.what {
                What::Leader { possible: from, .. } => {
                    def_open.get_or_insert(e.at);
                    pos_open.get_or_insert(from);
                }
                What::Standby { definite: until } => {
                    if let Some(s) = def_open.take() {
                        definite.push((s, until));
                    }
                    if let Some(s) = pos_open.take() {
                        possible.push((s, e.at));
                    }
                }
                What::Killed | What::Exited => {
                    if let Some(s) = def_open.take() {
                        definite.push((s, e.at));
                    }
                    if let Some(s) = pos_open.take() {
                        possible.push((s, e.at));
                    }
                    ended = Some(ended.map_or(e.at, |x| x.min(e.at)));
                }
                What::Stopped => {
                    stop_open.get_or_insert(e.at);
                }
                What::Continued => {
                    if let Some(s) = stop_open.take() {
                        stops.push((s, e.at));
                    }
                }
                _ => {}
            }
        }
        let close = ended.unwrap_or(input.end).min(input.end);
        if let Some(s) = def_open {
            definite.push((s, close));
        }
        if let Some(s) = pos_open {
            possible.push((s, close));
        }
        if let Some(s) = stop_open {
            stops.push((s, close));
        }
        let stops = normalize(stops);
        possible.sort_unstable();
        lead.definite.push(subtract(&normalize(definite), &stops));
        lead.possible
            .push(subtract(&normalize(possible.clone()), &stops));
        lead.possible_terms.push(possible);
        lead.stops.push(stops);
        lead.ended.push(ended);
    }
    lead
}

/// Where two or more processes certainly led at once, and which.
pub(super) fn two_leaders(lead: &Lead) -> Vec<(Iv, Vec<usize>)> {
    let mut points: Vec<(u64, i32, usize)> = Vec::new();
    for (p, ivs) in lead.definite.iter().enumerate() {
        for &(s, e) in ivs {
            points.push((s, 1, p));
            points.push((e, -1, p));
        }
    }
    points.sort_unstable();
    let mut active: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    let mut last = 0;
    for (t, delta, p) in points {
        if active.len() >= 2 && t > last {
            out.push(((last, t), active.clone()));
        }
        if delta > 0 {
            active.push(p);
        } else if let Some(i) = active.iter().position(|&a| a == p) {
            active.swap_remove(i);
        }
        last = t;
    }
    out
}
