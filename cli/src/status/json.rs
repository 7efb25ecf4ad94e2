//! The JSON for scripts: `{"at": …, "keys": [{"name", "class", "object", "leader",
//! "waiting", "candidates", "handover"}], "groups": [{"name", "class", "count", "members":
//! [{"identity", "pid", "client_addr", "count", "owned"}], "unowned"}], "jobs": [{"namespace", "job", "schedule",
//! "next_due", "last_run", "skipped", "reruns_owed"}]}`, times in RFC 3339 (UTC), durations
//! in milliseconds, `null` where there is nothing.

use std::time::SystemTime;

use serde_json::{Value, json};

use pg_elector::status::JobStatus;

use super::{Group, Shown, Snapshot};

/// The document, indented for one read, or on one line for `--watch`.
pub(crate) fn document(snapshot: &Snapshot, now: SystemTime, pretty: bool) -> String {
    let doc = json!({
        "at": time(now),
        "keys": snapshot.keys.iter().map(key).collect::<Vec<_>>(),
        "groups": snapshot.groups.iter().map(group).collect::<Vec<_>>(),
        "jobs": snapshot.jobs.iter().map(job).collect::<Vec<_>>(),
    });
    if pretty {
        serde_json::to_string_pretty(&doc)
    } else {
        serde_json::to_string(&doc)
    }
    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn key(shown: &Shown) -> Value {
    let status = shown.status.as_ref();
    let leader = status.and_then(|s| s.leader.as_ref()).map(|l| {
        json!({
            "identity": l.identity,
            "pid": l.pid,
            "client_addr": l.client_addr.map(|a| a.to_string()),
            "since": l.since.map(time),
            "epoch": l.epoch,
        })
    });
    let waiting: Vec<Value> = status
        .map(|s| &s.waiting[..])
        .unwrap_or_default()
        .iter()
        .map(|w| {
            json!({
                "identity": w.identity,
                "pid": w.pid,
                "client_addr": w.client_addr.map(|a| a.to_string()),
            })
        })
        .collect();
    let candidates: Vec<Value> = status
        .map(|s| &s.candidates[..])
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "identity": c.identity,
                "preference": c.preference,
                "live": c.live,
                "waits": c.waits,
                "live_since": time(c.live_since),
            })
        })
        .collect();
    let handover = status.and_then(|s| s.handover.as_ref()).map(|h| {
        json!({
            "to": h.to,
            "until": time(h.until),
            "stay_away_ms": u64::try_from(h.stay_away.as_millis()).unwrap_or(u64::MAX),
        })
    });
    json!({
        "name": shown.name,
        "class": shown.key.class(),
        "object": shown.key.object(),
        "leader": leader,
        "waiting": waiting,
        "candidates": candidates,
        "handover": handover,
    })
}

fn group(group: &Group) -> Value {
    let members: Vec<Value> = group
        .status
        .members
        .iter()
        .map(|m| {
            json!({
                "identity": m.session.identity,
                "pid": m.session.pid,
                "client_addr": m.session.client_addr.map(|a| a.to_string()),
                "count": m.count,
                "owned": m.owned,
            })
        })
        .collect();
    json!({
        "name": group.name,
        "class": group.status.class,
        "count": group.status.count,
        "members": members,
        "unowned": group.status.unowned,
    })
}

fn job(job: &JobStatus) -> Value {
    let last = job.last_run.as_ref().map(|l| {
        json!({
            "due": l.due.map(time),
            "by": l.by,
            "started_at": l.started_at.map(time),
            "finished_at": l.finished_at.map(time),
            "outcome": l.outcome,
            "error": l.error,
        })
    });
    json!({
        "namespace": job.namespace,
        "job": job.job,
        "schedule": job.schedule,
        "next_due": job.next_due.map(time),
        "last_run": last,
        "skipped": job.skipped,
        "reruns_owed": job.reruns_owed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_elector::LockKey;

    #[test]
    fn a_named_key_nobody_holds_has_nulls_and_empty_lists() {
        let shown = Snapshot {
            keys: vec![Shown {
                name: Some("billing/sweep".into()),
                key: LockKey::new(-3, 7),
                status: None,
            }],
            groups: Vec::new(),
            jobs: Vec::new(),
        };
        let at = SystemTime::UNIX_EPOCH;
        let doc: Value = serde_json::from_str(&document(&shown, at, true)).unwrap();
        assert_eq!(
            doc,
            json!({
                "at": "1970-01-01T00:00:00.000Z",
                "keys": [{
                    "name": "billing/sweep", "class": -3, "object": 7, "leader": null,
                    "waiting": [], "candidates": [], "handover": null,
                }],
                "groups": [],
                "jobs": [],
            })
        );
        assert!(!document(&shown, at, false).contains('\n'), "one line");
    }
}
