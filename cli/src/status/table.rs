//! The table for people, one line per key, as `kubectl get` shows leases.

use std::time::{Duration, SystemTime};

use pg_elector::status::{JobStatus, KeyStatus};

use super::{Group, Shown};

const HEADER: [&str; 9] = [
    "KEY",
    "LEADER",
    "PID",
    "ADDRESS",
    "AGE",
    "EPOCH",
    "WAITING",
    "CANDIDATES",
    "HANDOVER",
];

const JOB_HEADER: [&str; 9] = [
    "NAMESPACE",
    "JOB",
    "SCHEDULE",
    "NEXT",
    "LAST-DUE",
    "OUTCOME",
    "BY",
    "SKIPPED",
    "RERUNS",
];

const GROUP_HEADER: [&str; 6] = ["GROUP", "SHARDS", "MEMBER", "PID", "OWNS", "INDEXES"];

/// Every group of shards, one line per member, and one for the shards nobody owns (if any).
pub(crate) fn groups(groups: &[Group]) -> String {
    let mut rows = Vec::new();
    for group in groups {
        let (label, count) = (group.label(), group.status.count.to_string());
        for member in &group.status.members {
            let identity = match member.count {
                Some(c) if c != group.status.count => {
                    format!("{} (runs {c})", member.session.identity)
                }
                Some(_) => member.session.identity.clone(),
                None => format!("{} (not live)", member.session.identity),
            };
            rows.push([
                label.clone(),
                count.clone(),
                identity,
                member.session.pid.to_string(),
                member.owned.len().to_string(),
                ranges(&member.owned),
            ]);
        }
        if !group.status.unowned.is_empty() {
            rows.push([
                label.clone(),
                count.clone(),
                "(nobody)".into(),
                "-".into(),
                group.status.unowned.len().to_string(),
                ranges(&group.status.unowned),
            ]);
        }
    }
    aligned(GROUP_HEADER, rows)
}

/// Ascending indexes as runs: `0-3,7,9-10`; `-` for none.
fn ranges(indexes: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &i in indexes {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == i => *end = i,
            _ => runs.push((i, i)),
        }
    }
    list(runs.into_iter().map(|(start, end)| {
        if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        }
    }))
}

/// `shown` as aligned columns under a header; `-` where there is nothing to show.
pub(crate) fn render(shown: &[Shown], now: SystemTime) -> String {
    aligned(HEADER, shown.iter().map(|s| row(s, now)).collect())
}

/// Every job as aligned columns under a header: NEXT is `in 45s`, or `45s late` for a due
/// no leader has claimed yet; LAST-DUE how long ago the last claimed due was.
pub(crate) fn jobs(jobs: &[JobStatus], now: SystemTime) -> String {
    aligned(JOB_HEADER, jobs.iter().map(|j| job_row(j, now)).collect())
}

fn aligned<const N: usize>(header: [&str; N], rows: Vec<[String; N]>) -> String {
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut lines = vec![line(header)];
    lines.extend(rows.iter().map(|r| line(r.each_ref().map(String::as_str))));
    lines.join("\n")
}

fn job_row(job: &JobStatus, now: SystemTime) -> [String; 9] {
    let dash = || "-".to_owned();
    let last = job.last_run.as_ref();
    [
        job.namespace.clone(),
        job.job.clone(),
        job.schedule.clone(),
        job.next_due.map_or_else(dash, |next| {
            if next >= now {
                format!("in {}", age(next, now))
            } else {
                format!("{} late", age(now, next))
            }
        }),
        last.and_then(|l| l.due)
            .map_or_else(dash, |due| format!("{} ago", age(now, due))),
        last.and_then(|l| l.outcome.clone()).unwrap_or_else(dash),
        last.and_then(|l| l.by.clone()).unwrap_or_else(dash),
        job.skipped.to_string(),
        job.reruns_owed.to_string(),
    ]
}

fn row(shown: &Shown, now: SystemTime) -> [String; 9] {
    let dash = || "-".to_owned();
    let label = shown.label();
    let Some(status) = &shown.status else {
        return [
            label,
            "(nobody)".into(),
            dash(),
            dash(),
            dash(),
            dash(),
            dash(),
            dash(),
            dash(),
        ];
    };
    let leader = status.leader.as_ref();
    [
        label,
        leader.map_or_else(|| "(nobody)".into(), |l| l.identity.clone()),
        leader.map_or_else(dash, |l| l.pid.to_string()),
        leader
            .and_then(|l| l.client_addr)
            .map_or_else(dash, |a| a.to_string()),
        leader
            .and_then(|l| l.since)
            .map_or_else(dash, |since| age(now, since)),
        leader
            .and_then(|l| l.epoch)
            .map_or_else(dash, |e| e.to_string()),
        list(status.waiting.iter().map(|s| s.identity.clone())),
        candidates(status),
        status
            .handover
            .as_ref()
            .map_or_else(dash, |h| format!("to {} (for {})", h.to, age(h.until, now))),
    ]
}

/// Each candidate as `identity:preference`, `*` for one that waits for the lock, and `(dead)`
/// for one no longer live.
fn candidates(status: &KeyStatus) -> String {
    list(status.candidates.iter().map(|c| {
        let waits = if c.waits { "*" } else { "" };
        let dead = if c.live { "" } else { "(dead)" };
        format!("{}:{}{waits}{dead}", c.identity, c.preference)
    }))
}

fn list(items: impl Iterator<Item = String>) -> String {
    let joined: Vec<String> = items.collect();
    if joined.is_empty() {
        "-".into()
    } else {
        joined.join(",")
    }
}

/// How long from `since` to `now`, as `kubectl` writes ages: `45s`, `3m12s`, `5h3m`, `2d4h`.
pub(crate) fn age(now: SystemTime, since: SystemTime) -> String {
    let secs = now
        .duration_since(since)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    match secs {
        0..60 => format!("{secs}s"),
        60..3_600 => format!("{}m{}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h{}m", secs / 3_600, secs % 3_600 / 60),
        _ => format!("{}d{}h", secs / 86_400, secs % 86_400 / 3_600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_elector::LockKey;

    #[test]
    fn indexes_as_runs() {
        assert_eq!(ranges(&[]), "-");
        assert_eq!(ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3,7,9-10");
        assert_eq!(ranges(&[5]), "5");
    }

    #[test]
    fn ages_as_kubectl_writes_them() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let after = |s| t + Duration::from_secs(s);
        assert_eq!(age(after(45), t), "45s");
        assert_eq!(age(after(192), t), "3m12s");
        assert_eq!(age(after(5 * 3_600 + 180), t), "5h3m");
        assert_eq!(age(after(2 * 86_400 + 4 * 3_600), t), "2d4h");
        assert_eq!(age(t, after(5)), "0s", "a clock behind the server's");
    }

    #[test]
    fn a_named_key_nobody_holds_is_a_line_of_dashes() {
        let shown = [Shown {
            name: Some("billing/sweep".into()),
            key: LockKey::from_name("billing/sweep"),
            status: None,
        }];
        let table = render(&shown, SystemTime::now());
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("KEY            LEADER    PID"),
            "{table}"
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells[..2], ["billing/sweep", "(nobody)"], "{table}");
        assert_eq!(cells[2..], ["-"; 7], "{table}");
    }
}
