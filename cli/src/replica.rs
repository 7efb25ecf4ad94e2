//! What `run` and `cron` share: the replica's options, its elector, its stop at a signal and
//! what its commands are told.

use std::time::Duration;

use deadpool_postgres::Pool;
use pg_elector::{Elector, LockKey, Term};
use tokio_util::sync::CancellationToken;

use crate::exit::{self, Failure};

/// How much longer than `--grace` a graceful end may wait for a command's group: the
/// keeper's second after its SIGKILL, and room to spare.
const DRAIN_SLACK: Duration = Duration::from_secs(2);

/// The options of a replica of a key.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    /// How often a standby tries the lock and the leader checks it.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) interval: Duration,
    /// A standby waits on the lock and leads within milliseconds of the leader's end.
    #[arg(long)]
    pub(crate) fast_takeover: bool,
    /// Lead in preference to live standbys with a lower number (a handover moves the lead).
    #[arg(long, value_name = "N")]
    pub(crate) preference: Option<u64>,
    /// How long the command's group has after SIGTERM before SIGKILL, at a graceful end.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) grace: Duration,
    /// Count terms in an epoch table and give the command `PG_ELECTOR_EPOCH`.
    #[arg(long)]
    pub(crate) fencing: bool,
    /// This replica's name in `pg_stat_activity` and to `handover --to` (default: host and pid).
    #[arg(long)]
    pub(crate) identity: Option<String>,
}

impl ReplicaArgs {
    /// The check interval the elector uses: `--interval`, or the library's default for 0.
    pub(crate) fn check_interval(&self) -> Duration {
        if self.interval.is_zero() {
            pg_elector::DEFAULT_CHECK_INTERVAL
        } else {
            self.interval
        }
    }

    /// The elector of the key `name`, its drain long enough for a command's group to end.
    pub(crate) fn elector(&self, pool: Pool, name: &str) -> Result<Elector, Failure> {
        let mut builder = Elector::builder(pool, LockKey::from_name(name))
            .check_interval(self.interval)
            .fast_takeover(self.fast_takeover)
            .fencing(self.fencing)
            .drain_timeout(self.grace + DRAIN_SLACK);
        if let Some(identity) = &self.identity {
            builder = builder.identity(identity);
        }
        if let Some(preference) = self.preference {
            builder = builder.preference(preference);
        }
        builder
            .build()
            .map_err(|e| Failure::new(exit::USAGE, e.to_string()))
    }
}

/// What a command is told: the key, this replica's identity, the term's epoch (with fencing).
pub(crate) fn environment(
    elector: &Elector,
    term: &Term,
    name: &str,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PG_ELECTOR_KEY", name.to_owned()),
        (
            "PG_ELECTOR_IDENTITY",
            elector.identity().unwrap_or_default().to_owned(),
        ),
    ];
    if let Some(epoch) = term.epoch() {
        env.push(("PG_ELECTOR_EPOCH", epoch.to_string()));
    }
    env
}

/// A token cancelled at SIGTERM, SIGINT or SIGHUP, listening from this call on (so a signal
/// while the database is first reached stops `pg-elector` cleanly too). A second signal
/// changes nothing: the stop under way finishes (SIGKILL does not wait).
pub(crate) fn stop_on_signal() -> CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = CancellationToken::new();
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!(
            "cannot listen for SIGTERM, SIGINT and SIGHUP: stop pg-elector with SIGKILL"
        );
        return shutdown;
    };
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
        tracing::info!("stopping: the command's group ends, then the lock is given up");
        stop.cancel();
    });
    shutdown
}

/// The pool of `url`, unless a signal comes first (`None`: stop with 0).
pub(crate) async fn connect_unless_stopped(
    url: Option<&str>,
    shutdown: &CancellationToken,
) -> Result<Option<Pool>, Failure> {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => Ok(None),
        pool = crate::connect::pool(url, crate::connect::FIRST_ANSWER) => pool.map(Some),
    }
}
