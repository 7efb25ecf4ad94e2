//! `pg-elector status [NAME…] [--json] [--watch]`: who leads each key of the database, who
//! waits, the candidates and a pending handover, as a table or JSON, once or every interval.

mod json;
mod table;

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use pg_elector::LockKey;
use pg_elector::status::KeyStatus;

use crate::connect;
use crate::exit::{self, Failure};

/// What `status` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Names of keys (as the replicas name them: `run NAME`, `LockKey::from_name`), shown by
    /// name, and listed even while nobody holds them. PostgreSQL keeps only a key's two
    /// numbers: a key whose name is not given shows as CLASS/OBJECT.
    names: Vec<String>,
    /// One JSON document (with --watch, one line per change) instead of the table.
    #[arg(long)]
    json: bool,
    /// Read again every --interval until SIGINT or SIGTERM: the table redrawn, and a line for
    /// each change of leader as it is seen.
    #[arg(long)]
    watch: bool,
    /// How often --watch reads.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// How long to wait for the database's answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// One key as shown: the name given for it, if any, and what the database shows of it
/// (`None` for a key named that nothing in the database mentions).
#[derive(Debug, PartialEq)]
pub(crate) struct Shown {
    pub(crate) name: Option<String>,
    pub(crate) key: LockKey,
    pub(crate) status: Option<KeyStatus>,
}

impl Shown {
    /// The name given for the key, or CLASS/OBJECT.
    pub(crate) fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.key.class(), self.key.object()))
    }

    /// Who leads: identity, pid and epoch.
    fn leader(&self) -> Option<(String, i32, Option<u64>)> {
        let leader = self.status.as_ref()?.leader.as_ref()?;
        Some((leader.identity.clone(), leader.pid, leader.epoch))
    }
}

/// Reads once and prints, or watches.
pub(crate) async fn status(url: Option<&str>, args: StatusArgs) -> Result<i32, Failure> {
    let pool = connect::pool(url, args.timeout).await?;
    let first = read(&pool, &args).await?;
    if !args.watch {
        print(&first, &args, SystemTime::now())?;
        return Ok(exit::OK);
    }
    watch(&pool, &args, first).await
}

/// Every key in the database and every key named, in the database's order, the named ones
/// nobody holds last.
async fn read(pool: &deadpool_postgres::Pool, args: &StatusArgs) -> Result<Vec<Shown>, Failure> {
    let read = async {
        let client = pool.get().await.map_err(|e| {
            Failure::new(exit::UNREACHABLE, format!("cannot reach the database: {e}"))
        })?;
        pg_elector::status::read(&client)
            .await
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot read the status: {e}")))
    };
    let keys = tokio::time::timeout(args.timeout, read)
        .await
        .map_err(|_| {
            Failure::new(
                exit::TIMEOUT,
                format!("no answer from the database within {:?}", args.timeout),
            )
        })??;
    Ok(named(keys, &args.names))
}

/// `keys` with the names of those in `names`, and a line for each name whose key is not there.
fn named(keys: Vec<KeyStatus>, names: &[String]) -> Vec<Shown> {
    let name_of = |key: LockKey| {
        names
            .iter()
            .find(|name| LockKey::from_name(name) == key)
            .cloned()
    };
    let mut shown: Vec<Shown> = keys
        .into_iter()
        .map(|status| Shown {
            name: name_of(status.key),
            key: status.key,
            status: Some(status),
        })
        .collect();
    for name in names {
        if !shown.iter().any(|s| s.name.as_ref() == Some(name)) {
            shown.push(Shown {
                name: Some(name.clone()),
                key: LockKey::from_name(name),
                status: None,
            });
        }
    }
    shown
}

/// Prints `shown` as the table or the JSON document.
fn print(shown: &[Shown], args: &StatusArgs, now: SystemTime) -> Result<(), Failure> {
    let text = if args.json {
        json::document(shown, now, !args.watch)
    } else {
        table::render(shown, now)
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot write: {e}")))
}

/// Reads every `args.interval` until SIGINT or SIGTERM: prints each change of leader as a
/// line, and the table (or a JSON line) whenever anything changed. A failed read is a line on
/// stderr, and the next interval reads again (a server restart does not end the watch).
async fn watch(
    pool: &deadpool_postgres::Pool,
    args: &StatusArgs,
    first: Vec<Shown>,
) -> Result<i32, Failure> {
    let stop = stop_signals()?;
    tokio::pin!(stop);
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut last = first;
    redraw(&last, args, terminal)?;
    loop {
        tokio::select! {
            biased;
            () = &mut stop => return Ok(exit::OK),
            () = tokio::time::sleep(args.interval) => {}
        }
        let next = match read(pool, args).await {
            Ok(next) => next,
            Err(failure) => {
                eprintln!("pg-elector: {}", failure.message);
                continue;
            }
        };
        let changes = leader_changes(&last, &next);
        if !args.json {
            for change in &changes {
                println!(
                    "{} {change}",
                    humantime::format_rfc3339_seconds(SystemTime::now())
                );
            }
        }
        if last != next || terminal {
            redraw(&next, args, terminal)?;
        }
        last = next;
    }
}

/// The table (the screen cleared first on a terminal) or a JSON line.
fn redraw(shown: &[Shown], args: &StatusArgs, terminal: bool) -> Result<(), Failure> {
    if terminal {
        print!("\x1b[H\x1b[2J");
    }
    print(shown, args, SystemTime::now())
}

/// A line for each key whose leader changed between `before` and `after`.
pub(crate) fn leader_changes(before: &[Shown], after: &[Shown]) -> Vec<String> {
    let mut keys: Vec<LockKey> = Vec::new();
    for key in before.iter().chain(after).map(|s| s.key) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let find = |list: &[Shown], key| list.iter().find(|s| s.key == key).and_then(Shown::leader);
    let mut lines = Vec::new();
    for key in keys {
        let (was, now) = (find(before, key), find(after, key));
        if was.as_ref().map(|l| l.1) == now.as_ref().map(|l| l.1) {
            continue;
        }
        let label = before
            .iter()
            .chain(after)
            .find(|s| s.key == key)
            .map(Shown::label)
            .unwrap_or_default();
        let who = |l: &Option<(String, i32, Option<u64>)>| match l {
            Some((identity, pid, Some(epoch))) => format!("{identity} (pid {pid}, epoch {epoch})"),
            Some((identity, pid, None)) => format!("{identity} (pid {pid})"),
            None => "nobody".to_owned(),
        };
        lines.push(format!("{label}: leader {} -> {}", who(&was), who(&now)));
    }
    lines
}

/// Resolves at the first SIGINT or SIGTERM.
fn stop_signals() -> Result<impl std::future::Future<Output = ()>, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind| {
        signal(kind)
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot listen for signals: {e}")))
    };
    let (mut int, mut term) = (
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
    );
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
