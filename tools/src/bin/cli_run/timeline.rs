//! What happened, with the wall clock (µs since 1970): each command's life from the log its
//! processes write (its start; its end, or the moment the bench saw it gone, looking every
//! millisecond), and who held the key's lock as `pg_locks` showed it (sampled every
//! millisecond).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_elector::LockKey;
use pg_elector_testkit::TestDb;
use pg_elector_testkit::replica::unix_us;
use pg_elector_testkit::server::sql::lock_sessions;
use tokio_util::sync::CancellationToken;

/// One command's life.
#[derive(Clone, Debug)]
pub(crate) struct Life {
    pub(crate) name: String,
    pub(crate) pid: i32,
    pub(crate) start: u64,
    /// Its SIGTERM, when it got one.
    pub(crate) term: Option<u64>,
    /// Its own end, or when it was seen gone (at most a millisecond late).
    pub(crate) end: Option<u64>,
}

/// Everything recorded so far.
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub(crate) lives: Vec<Life>,
    /// Each change of the lock's holder: when, and the holding backend's pid.
    pub(crate) holders: Vec<(u64, Option<i32>)>,
}

/// The record, filled by a thread (the log and the processes) and a task (the lock).
#[derive(Clone, Debug)]
pub(crate) struct Timeline {
    pub(crate) record: Arc<Mutex<Record>>,
    stop: CancellationToken,
}

impl Timeline {
    /// Starts watching `log` and the lock of `key` in `db`.
    pub(crate) async fn start(log: PathBuf, db: &TestDb, key: LockKey) -> Self {
        let timeline = Timeline {
            record: Arc::default(),
            stop: CancellationToken::new(),
        };
        let (record, stop) = (timeline.record.clone(), timeline.stop.clone());
        std::thread::spawn(move || watch_log(&log, &record, &stop));
        let client = db.connect().await.expect("a connection for pg_locks");
        let (record, stop) = (timeline.record.clone(), timeline.stop.clone());
        tokio::spawn(async move {
            let mut last = None;
            while !stop.is_cancelled() {
                if let Ok(sessions) = lock_sessions(&client, key).await {
                    let holder = sessions.iter().find(|s| s.granted).map(|s| s.pid);
                    if holder != last {
                        record.lock().unwrap().holders.push((unix_us(), holder));
                        last = holder;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        timeline
    }

    /// Stops watching.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// A copy of what was recorded.
    pub(crate) fn lives(&self) -> Vec<Life> {
        self.record.lock().unwrap().lives.clone()
    }

    /// The first grant of the lock to another backend than the one holding it at `at`,
    /// after `at`.
    pub(crate) fn next_grant(&self, at: u64) -> Option<u64> {
        let record = self.record.lock().unwrap();
        let before = record
            .holders
            .iter()
            .rev()
            .find(|h| h.0 <= at)
            .and_then(|h| h.1);
        record
            .holders
            .iter()
            .find(|h| h.0 > at && h.1.is_some() && h.1 != before)
            .map(|h| h.0)
    }

    /// The command that runs now, if one does.
    pub(crate) fn running(&self) -> Option<Life> {
        self.lives().into_iter().rev().find(|l| l.end.is_none())
    }
}

/// Reads new lines of `log` and looks at the running commands every millisecond.
fn watch_log(log: &std::path::Path, record: &Mutex<Record>, stop: &CancellationToken) {
    let mut read = 0;
    while !stop.is_cancelled() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Whole lines only: a line being written is read at the next look.
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        let mut record = record.lock().unwrap();
        if complete > read {
            for line in text[read..complete].lines() {
                apply(&mut record, line);
            }
            read = complete;
        }
        let now = unix_us();
        for life in record.lives.iter_mut().filter(|l| l.end.is_none()) {
            if !alive(life.pid) {
                life.end = Some(now);
            }
        }
        drop(record);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One line of the log: `start|term|end NAME PID US`.
fn apply(record: &mut Record, line: &str) {
    let words: Vec<&str> = line.split(' ').collect();
    let [kind, name, pid, us] = words[..] else {
        return;
    };
    let (Ok(pid), Ok(us)) = (pid.parse::<i32>(), us.parse::<u64>()) else {
        return;
    };
    let life = record.lives.iter_mut().rev().find(|l| l.pid == pid);
    match (kind, life) {
        ("start", _) => record.lives.push(Life {
            name: name.to_owned(),
            pid,
            start: us,
            term: None,
            end: None,
        }),
        ("term", Some(life)) => life.term = Some(us),
        ("end", Some(life)) => life.end = Some(life.end.map_or(us, |seen| seen.min(us))),
        _ => {}
    }
}

/// Whether `pid` runs (exists and is not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Pairs of commands that ran at once: `(earlier, later, overlap µs)`.
pub(crate) fn overlaps(lives: &[Life], until: u64) -> Vec<(String, String, u64)> {
    let mut found = Vec::new();
    for (i, a) in lives.iter().enumerate() {
        for b in &lives[i + 1..] {
            let (a_end, b_end) = (a.end.unwrap_or(until), b.end.unwrap_or(until));
            let overlap = a_end.min(b_end).saturating_sub(a.start.max(b.start));
            if overlap > 0 {
                found.push((a.name.clone(), b.name.clone(), overlap));
            }
        }
    }
    found
}
