//! Percentiles of samples.

/// Nearest-rank percentile `p` (from 0 to 1) of `sorted` values, `None` when there are none.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// `values` sorted, for [`percentile`].
pub fn sorted(mut values: Vec<u64>) -> Vec<u64> {
    values.sort_unstable();
    values
}

/// `p50 / p99 / max` of `values`, each shown by `show`; `-` when there are none.
pub fn summary(values: Vec<u64>, show: fn(u64) -> String) -> String {
    let values = sorted(values);
    let at = |p| percentile(&values, p).map(show);
    match (at(0.5), at(0.99), at(1.0)) {
        (Some(p50), Some(p99), Some(max)) => format!("{p50} / {p99} / {max}"),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let values: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&values, 0.5), Some(5));
        assert_eq!(percentile(&values, 0.99), Some(10));
        assert_eq!(percentile(&values, 0.0), Some(1));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(summary(vec![3, 1, 2], |v| v.to_string()), "2 / 3 / 3");
        assert_eq!(summary(Vec::new(), |v| v.to_string()), "-");
    }
}
