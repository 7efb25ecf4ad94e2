//! `pg-elector status [NAME…] [--json] [--watch]`: who leads each key of the database, who
//! waits, the candidates and a pending handover; each group of shards, its members and their
//! shards; each job of the stored schedules; as tables or JSON, once or every interval.

mod json;
mod table;
mod watch;

use std::io::Write;
use std::time::{Duration, SystemTime};

use pg_elector::LockKey;
use pg_elector::status::{GroupStatus, JobStatus, KeyStatus, group_class};

use crate::connect;
use crate::exit::{self, Failure};

/// What `status` was asked.
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Names of keys (as the replicas name them: `run NAME`, `LockKey::from_name`), shown by
    /// name, and listed even while nobody holds them; and of groups of shards (as
    /// `Shards::builder` names them), shown by name. PostgreSQL keeps only a key's two
    /// numbers: a key whose name is not given shows as CLASS/OBJECT, a group as CLASS/*.
    names: Vec<String>,
    /// One JSON document (with --watch, one line per change) instead of the table.
    #[arg(long)]
    json: bool,
    /// Read again every --interval until SIGINT or SIGTERM: the table redrawn, and a line for
    /// each change of leader as it is seen.
    #[arg(long)]
    watch: bool,
    /// How often --watch reads (10ms at the least).
    #[arg(long, default_value = "1s", value_parser = watch::interval)]
    interval: Duration,
    /// How long to wait for the database's answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// What one read found: every key (a group's shards left out), every group of shards, and
/// every job of the stored schedules.
#[derive(Debug, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) keys: Vec<Shown>,
    pub(crate) groups: Vec<Group>,
    pub(crate) jobs: Vec<JobStatus>,
}

/// One group of shards as shown: the name given for it, if any, and what the database shows.
#[derive(Debug, PartialEq)]
pub(crate) struct Group {
    pub(crate) name: Option<String>,
    pub(crate) status: GroupStatus,
}

impl Group {
    /// The name given for the group, or CLASS/*.
    pub(crate) fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}/*", self.status.class))
    }

    /// Whether `key` is one of the group's shards.
    fn has_shard(&self, key: LockKey) -> bool {
        key.class() == self.status.class
            && u32::try_from(key.object()).is_ok_and(|i| i < self.status.count)
    }
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
    pub(crate) fn leader(&self) -> Option<(String, i32, Option<u64>)> {
        let leader = self.status.as_ref()?.leader.as_ref()?;
        Some((leader.identity.clone(), leader.pid, leader.epoch))
    }
}

/// Reads once and prints, or watches.
pub(crate) async fn status(url: Option<&str>, args: StatusArgs) -> Result<i32, Failure> {
    if args.watch {
        return watch::watch(url, &args).await;
    }
    let pool = connect::pool(url, args.timeout).await?;
    let snapshot = read(&pool, &args).await?;
    match emit(&render(&snapshot, &args, SystemTime::now())) {
        Ok(()) => Ok(exit::OK),
        Err(e) => write_failed(&e),
    }
}

/// Every key in the database and every key named (in the database's order, the named ones
/// nobody holds last), and every job. A connection whose answer did not come within
/// `--timeout` is closed, not given back to the pool: the statement may still be running on
/// it.
async fn read(pool: &deadpool_postgres::Pool, args: &StatusArgs) -> Result<Snapshot, Failure> {
    let no_answer = || {
        Failure::new(
            exit::TIMEOUT,
            format!("no answer from the database within {:?}", args.timeout),
        )
    };
    let client = tokio::time::timeout(args.timeout, pool.get())
        .await
        .map_err(|_| no_answer())?
        .map_err(|e| Failure::new(exit::UNREACHABLE, format!("cannot reach the database: {e}")))?;
    let both = async {
        let keys = pg_elector::status::read(&client).await?;
        let groups = pg_elector::status::groups(&client).await?;
        let jobs = pg_elector::status::jobs(&client).await?;
        Ok::<_, pg_elector::Error>((keys, groups, jobs))
    };
    let (keys, groups, jobs) = match tokio::time::timeout(args.timeout, both).await {
        Ok(read) => {
            read.map_err(|e| Failure::new(exit::INTERNAL, format!("cannot read the status: {e}")))?
        }
        Err(_) => {
            drop(deadpool_postgres::Object::take(client));
            return Err(no_answer());
        }
    };
    let groups: Vec<Group> = groups
        .into_iter()
        .map(|status| Group {
            name: args
                .names
                .iter()
                .find(|name| group_class(name) == status.class)
                .cloned(),
            status,
        })
        .collect();
    let keys = keys
        .into_iter()
        .filter(|k| !groups.iter().any(|g| g.has_shard(k.key)))
        .collect();
    let mut keys = named(keys, &args.names);
    // A name given for a group has no line of its own among the keys while its key is free.
    keys.retain(|k| {
        k.status.is_some() || !groups.iter().any(|g| g.name.is_some() && g.name == k.name)
    });
    Ok(Snapshot { keys, groups, jobs })
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

/// `snapshot` as the tables (the jobs' under the keys', when there are jobs) or the JSON
/// document (on one line with --watch).
fn render(snapshot: &Snapshot, args: &StatusArgs, now: SystemTime) -> String {
    if args.json {
        return json::document(snapshot, now, !args.watch);
    }
    let mut text = table::render(&snapshot.keys, now);
    if !snapshot.groups.is_empty() {
        text.push_str("\n\n");
        text.push_str(&table::groups(&snapshot.groups));
    }
    if !snapshot.jobs.is_empty() {
        text.push_str("\n\n");
        text.push_str(&table::jobs(&snapshot.jobs, now));
    }
    text
}

/// Writes `text` and a newline to stdout, flushed.
fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush())
}

/// The end of a failed write to stdout: a reader that went away (`status | head`) ends the
/// output quietly with 0, as for other tools; any other failure is 70.
fn write_failed(e: &std::io::Error) -> Result<i32, Failure> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(exit::OK)
    } else {
        Err(Failure::new(exit::INTERNAL, format!("cannot write: {e}")))
    }
}
