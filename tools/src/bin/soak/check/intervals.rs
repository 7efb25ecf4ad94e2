//! Intervals of µs, `[start, end)`, and their arithmetic.

/// An interval of µs, `[start, end)`.
pub(crate) type Iv = (u64, u64);

/// Sorts and merges intervals, dropping empty ones.
pub(crate) fn normalize(mut v: Vec<Iv>) -> Vec<Iv> {
    v.retain(|&(s, e)| e > s);
    v.sort_unstable();
    let mut out: Vec<Iv> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `a` minus `holes` (both normalized).
pub(crate) fn subtract(a: &[Iv], holes: &[Iv]) -> Vec<Iv> {
    let mut out = Vec::new();
    let mut h = 0;
    for &(mut s, e) in a {
        while h < holes.len() && holes[h].1 <= s {
            h += 1;
        }
        let mut k = h;
        while k < holes.len() && holes[k].0 < e {
            if holes[k].0 > s {
                out.push((s, holes[k].0));
            }
            s = s.max(holes[k].1);
            k += 1;
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// The length of `ivs` (normalized) within `span`.
pub(crate) fn within(ivs: &[Iv], span: Iv) -> u64 {
    ivs.iter()
        .map(|&(s, e)| e.min(span.1).saturating_sub(s.max(span.0)))
        .sum()
}

/// `iv` with its end pushed back by the stall time within it (the docs' bounds are
/// "+ scheduling": time the machine could not run the replicas is not theirs), repeated for
/// the stalls within the extension.
pub(crate) fn extend(iv: Iv, stalls: &[Iv]) -> Iv {
    let mut end = iv.1;
    let mut counted = 0;
    for _ in 0..4 {
        let stalled = within(stalls, (iv.0, end));
        if stalled == counted {
            break;
        }
        end += stalled - counted;
        counted = stalled;
    }
    (iv.0, end)
}
