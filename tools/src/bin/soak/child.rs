//! One replica process of the soak: an elector (or, in shard mode, one group of shards), a
//! fenced ticker per key, a watcher that reports every change of `is_leader()` on stdout, and
//! commands on stdin.
//!
//! Lines on stdout, each `@soak <what> …` with µs UNIX timestamps of this process's clock. In
//! shard mode the lines about one shard say which: `<what>/<shard>` (`leader/3 …`); each
//! shard's elector is watched, and ticks, as the one elector is in key mode.
//!
//! - `started <t>`;
//! - `leader <definite> <possible> <epoch|->`: a read of `is_leader()` found it leading, and
//!   the one before did not. The watcher stamps each read on both sides, so the replica
//!   certainly led at `<definite>` (the stamp after the read) and may have led from
//!   `<possible>` on (the stamp before the previous read);
//! - `standby <definite> <possible>`: the reverse: it certainly led until `<definite>` (before
//!   the last leading read) and may have until `<possible>` (after the first standby read);
//! - `woke <at> <previous> <0|1> <epoch|->`: a read that came more than 100 ms after the
//!   previous one (the process was stopped or starved), and what it found;
//! - `fenced <t> <epoch>`: a tick's `Term::fence` refused its transaction;
//! - `resigned <t> <0|1>`: `resign` returned (1: it led);
//! - `exhausted <t> <n>`, `released <t>`: the dummy borrowers got `n` connections of the
//!   elector's pool, and gave them back;
//! - `exited <t>`: a graceful shutdown is over;
//! - `run`, `ran`, `pool`: the schedule's runs and the probes of the application's pool (see
//!   `soak/app.rs`).
//!
//! Commands on stdin: `stop` (graceful shutdown), `resign <ms>` (resign with that cooldown),
//! `exhaust <ms>` (borrow every connection of the elector's pool for that long), `probe <id>
//! [idle]` (ask every connection of the application's pool `SELECT 1`), `long <ms>` (the
//! schedule's runs that start within that time run long). The process
//! exits when its stdin closes (the parent is gone).

use std::time::Duration;

use pg_elector::Elector;
pub(crate) use pg_elector_testkit::replica::unix_us;
use pg_elector_testkit::replica::{
    key_setting, log_to_stderr, ms_setting, on_current_thread, setting,
};
use pg_elector_testkit::server::config::{config_with_addr, pool_from_config};
use tokio_util::sync::CancellationToken;

/// The argument that makes the soak binary a replica.
pub(crate) const FLAG: &str = "--soak-replica";
/// The database URL (user, password, database) of the soak's database.
pub(crate) const ENV_URL: &str = "PG_ELECTOR_SOAK_URL";
/// The address to connect to instead of the URL's (the replica's fault proxy).
pub(crate) const ENV_ADDR: &str = "PG_ELECTOR_SOAK_ADDR";
/// `class,object` of the lock key.
pub(crate) const ENV_KEY: &str = "PG_ELECTOR_SOAK_KEY";
/// The check interval in ms.
pub(crate) const ENV_INTERVAL_MS: &str = "PG_ELECTOR_SOAK_INTERVAL_MS";
/// The replica's identity (`replica-<n>`); its pools' connections are named
/// `replica-<n>/pool` and `replica-<n>/app` until the elector renames a lock session.
pub(crate) const ENV_IDENTITY: &str = "PG_ELECTOR_SOAK_IDENTITY";
/// Set: fast takeover.
pub(crate) const ENV_FAST: &str = "PG_ELECTOR_SOAK_FAST";
/// Key mode with `--preferences`: the elector's preference (unset: none).
pub(crate) const ENV_PREFERENCE: &str = "PG_ELECTOR_SOAK_PREFERENCE";
/// Shard mode: `<group>,<count>` (unset: key mode).
pub(crate) const ENV_SHARDS: &str = "PG_ELECTOR_SOAK_SHARDS";
/// Set (key mode): run a leader schedule on the application's pool; its value is the run's
/// seed, which fixes how long each due runs.
pub(crate) const ENV_SCHEDULE: &str = "PG_ELECTOR_SOAK_SCHEDULE";
/// The size of the elector's pool.
pub(crate) const POOL_SIZE: usize = 2;
/// The size of the application's pool: the ticker's, which the schedule shares; one beyond
/// what the ticker and the schedule's own statements hold at once, so that a probe can borrow
/// a connection they gave back.
pub(crate) const APP_POOL_SIZE: usize = 3;
/// The prefix of every line meant for the parent.
pub(crate) const MARK: &str = "@soak ";
/// A gap between two reads of the watcher after which it says `woke`.
pub(crate) const WOKE_GAP_US: u64 = 100_000;

pub(crate) fn say(what: &str) {
    println!("{MARK}{what}");
}

/// One key this process competes for: its lane (the shard's index; 0 in key mode), the suffix
/// of its lines (`/<shard>`, or nothing), and its elector.
#[derive(Clone)]
struct Lane {
    tag: String,
    elector: Elector,
}

/// What this process runs: one elector, or one group of shards.
enum Runs {
    Key(Elector),
    Shards(pg_elector::shards::Shards),
}

impl Runs {
    /// From the environment: the elector, or the group in shard mode.
    fn build(pool: &deadpool_postgres::Pool, identity: &str, interval: Duration) -> Self {
        let Ok(shards) = std::env::var(ENV_SHARDS) else {
            // With a schedule, the drain timeout is above its longest run (docs).
            let drain = if std::env::var(ENV_SCHEDULE).is_ok() {
                crate::app::DRAIN
            } else {
                interval
            };
            let mut builder = Elector::builder(pool.clone(), key_setting(ENV_KEY))
                .check_interval(interval)
                .identity(identity)
                .fencing(true)
                .fast_takeover(std::env::var(ENV_FAST).is_ok())
                .drain_timeout(drain);
            if let Ok(preference) = std::env::var(ENV_PREFERENCE) {
                builder = builder.preference(preference.parse().expect("a preference"));
            }
            let elector = builder.build().expect("a valid elector");
            return Runs::Key(elector);
        };
        let (group, count) = shards.rsplit_once(',').expect("<group>,<count>");
        let shards = pg_elector::shards::Shards::builder(
            pool.clone(),
            group,
            count.parse().expect("a shard count"),
        )
        .check_interval(interval)
        .identity(identity)
        .fencing(true)
        .drain_timeout(interval)
        .build()
        .expect("a valid group of shards");
        Runs::Shards(shards)
    }

    /// Every key, with the tag its lines carry.
    fn lanes(&self) -> Vec<Lane> {
        match self {
            Runs::Key(elector) => vec![Lane {
                tag: String::new(),
                elector: elector.clone(),
            }],
            Runs::Shards(shards) => shards
                .all()
                .map(|shard| Lane {
                    tag: format!("/{shard}"),
                    elector: shards.elector(shard).expect("its own shard").clone(),
                })
                .collect(),
        }
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), pg_elector::Error> {
        match self {
            Runs::Key(elector) => elector.run(shutdown).await,
            Runs::Shards(shards) => shards.run(shutdown).await,
        }
    }
}

fn epoch_text(epoch: Option<u64>) -> String {
    epoch.map_or_else(|| "-".to_owned(), |e| e.to_string())
}

/// Runs one replica, with its settings in the environment, until a graceful shutdown or the
/// end of its stdin.
pub(crate) fn main() {
    on_current_thread(replica());
}

enum Command {
    Stop,
    Resign(Duration),
    Exhaust(Duration),
    Probe(u64, bool),
    Long(Duration),
}

/// `base` through the slot's addresses: one (a moving address), or several, tried in order
/// for a server that takes writes (a multi-host URL, as the docs tell users to write it).
fn config_of(base: &tokio_postgres::Config, addrs: &str) -> tokio_postgres::Config {
    let mut addrs = addrs
        .split(',')
        .map(|a| a.parse::<std::net::SocketAddr>().expect("a socket address"));
    let mut config = config_with_addr(base, addrs.next().expect("an address"));
    for addr in addrs {
        config
            .host(addr.ip().to_string())
            .port(addr.port())
            .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
    config
}

async fn replica() {
    log_to_stderr("pg_elector=info");
    let interval = ms_setting(ENV_INTERVAL_MS);
    let identity = setting(ENV_IDENTITY);
    let base: tokio_postgres::Config = setting(ENV_URL).parse().expect("a connection URL");
    let mut config = config_of(&base, &setting(ENV_ADDR));
    config.connect_timeout(Duration::from_secs(2));
    let named = |suffix: &str| {
        let mut c = config.clone();
        c.application_name(format!("{identity}/{suffix}"));
        c
    };
    let pool = pool_from_config(named("pool"), POOL_SIZE);
    let app = pool_from_config(named("app"), APP_POOL_SIZE);
    let runs = Runs::build(&pool, &identity, interval);
    let lanes = runs.lanes();
    tracing::info!(%identity, pid = std::process::id(), "soak replica starts");
    say(&format!("started {}", unix_us()));

    let received = read_commands();
    std::thread::spawn({
        let lanes = lanes.clone();
        move || watch(&lanes)
    });
    let shutdown = CancellationToken::new();
    let schedule = match (&runs, std::env::var(ENV_SCHEDULE)) {
        (Runs::Key(elector), Ok(seed)) => {
            let seed = seed.parse().expect("a seed");
            let schedule = crate::app::schedule(elector, &app, seed);
            let shutdown = shutdown.clone();
            Some(tokio::spawn(async move {
                if let Err(e) = schedule.run(shutdown).await {
                    tracing::error!(error = %e, "the schedule failed");
                }
            }))
        }
        _ => None,
    };
    let mut ticks = tick_every_lane(&lanes, &app, &identity, interval);
    tokio::select! {
        result = runs.run(shutdown.clone()) => {
            if let Err(e) = result {
                tracing::error!(error = %e, "run failed");
            }
        }
        () = obey(received, &lanes[0].elector, [&pool, &app], &shutdown) => {}
    }
    ticks.abort_all();
    if let Some(schedule) = schedule {
        // Its runs were drained with the elector's; whatever is left is cut off.
        let _ = tokio::time::timeout(Duration::from_secs(1), schedule).await;
    }
    // Let the watcher report the demotions before saying goodbye.
    let deadline = unix_us() + 200_000;
    while lanes.iter().any(|l| l.elector.is_leader()) && unix_us() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    say(&format!("exited {}", unix_us()));
}

/// The commands on stdin, read on a thread of their own; the process exits when stdin ends
/// (the parent is gone).
fn read_commands() -> tokio::sync::mpsc::UnboundedReceiver<Command> {
    let (commands, received) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            let mut words = line.split_whitespace();
            let ms = |w: Option<&str>| {
                Duration::from_millis(w.and_then(|w| w.parse().ok()).unwrap_or(0))
            };
            let command = match words.next() {
                Some("stop") => Command::Stop,
                Some("resign") => Command::Resign(ms(words.next())),
                Some("exhaust") => Command::Exhaust(ms(words.next())),
                Some("long") => Command::Long(ms(words.next())),
                Some("probe") => Command::Probe(
                    words.next().and_then(|w| w.parse().ok()).unwrap_or(0),
                    words.next() == Some("idle"),
                ),
                _ => continue,
            };
            if commands.send(command).is_err() {
                break;
            }
        }
        std::process::exit(0);
    });
    received
}

/// The watcher: every change of `is_leader()` of every lane, read every millisecond, each
/// read stamped on both sides. Runs forever, on a thread of its own.
fn watch(lanes: &[Lane]) {
    let mut watches: Vec<Watch> = lanes.iter().map(Watch::new).collect();
    loop {
        for watch in &mut watches {
            watch.read();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The watch of one lane's elector. A term can end and the next begin between two reads (a
/// leader whose lock session is terminated, with nobody waiting, takes the lock again within
/// a millisecond): the epoch tells them apart, and the watch reports the end of the one and
/// the start of the other.
struct Watch {
    lane: Lane,
    leadership: tokio::sync::watch::Receiver<pg_elector::Leadership>,
    leading: bool,
    led_epoch: Option<u64>,
    prev_before: u64,
    prev_after: u64,
}

impl Watch {
    fn new(lane: &Lane) -> Self {
        Watch {
            leadership: lane.elector.subscribe(),
            lane: lane.clone(),
            leading: false,
            led_epoch: None,
            prev_before: unix_us(),
            prev_after: unix_us(),
        }
    }

    /// One read, and the lines it calls for.
    fn read(&mut self) {
        let tag = &self.lane.tag;
        let (prev_before, prev_after) = (self.prev_before, self.prev_after);
        let before = unix_us();
        let now = self.lane.elector.is_leader();
        let after = unix_us();
        // The term the watch shows; it may already be past the read (a demotion or
        // a promotion since), which the next read settles.
        let (watched, epoch) = {
            let l = self.leadership.borrow();
            (l.is_leader, l.epoch)
        };
        let epoch = if now { epoch } else { None };
        let read = unix_us();
        if before.saturating_sub(prev_after) > WOKE_GAP_US {
            say(&format!(
                "woke{tag} {before} {prev_after} {} {}",
                u8::from(now),
                epoch_text(epoch)
            ));
        }
        if now && self.leading && watched && self.led_epoch.is_none() {
            // Promoted before the watch showed it: its epoch is known now.
            self.led_epoch = epoch;
        } else if now && self.leading && watched && epoch.is_some() && epoch != self.led_epoch {
            // The previous term led at the previous read and may have until this
            // one; the new one may have from the previous read on.
            say(&format!("standby{tag} {prev_before} {read}"));
            say(&format!(
                "leader{tag} {read} {prev_before} {}",
                epoch_text(epoch)
            ));
            self.led_epoch = epoch;
        }
        if now != self.leading {
            if now {
                say(&format!(
                    "leader{tag} {after} {prev_before} {}",
                    epoch_text(epoch)
                ));
            } else {
                say(&format!("standby{tag} {prev_before} {after}"));
            }
            self.leading = now;
            self.led_epoch = epoch;
        }
        (self.prev_before, self.prev_after) = (before, after);
    }
}

/// One ticker per lane, each in a task of its own.
fn tick_every_lane(
    lanes: &[Lane],
    app: &deadpool_postgres::Pool,
    identity: &str,
    interval: Duration,
) -> tokio::task::JoinSet<()> {
    let mut ticks = tokio::task::JoinSet::new();
    for (shard, lane) in lanes.iter().enumerate() {
        let (lane, app, identity) = (lane.clone(), app.clone(), identity.to_owned());
        ticks.spawn(async move { tick(&lane, shard as i32, &app, &identity, interval).await });
    }
    ticks
}

/// The ticker of one lane: every I/10, one fenced row through do_work.
async fn tick(
    lane: &Lane,
    shard: i32,
    app: &deadpool_postgres::Pool,
    identity: &str,
    interval: Duration,
) {
    let mut every = tokio::time::interval(interval / 10);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let tag = &lane.tag;
    loop {
        every.tick().await;
        let _ = lane
            .elector
            .do_work(|term| async move {
                if let Err(Refused::Fence(epoch)) = write(app, &term, shard, identity).await {
                    say(&format!("fenced{tag} {} {}", unix_us(), epoch_text(epoch)));
                }
                Ok::<_, std::convert::Infallible>(())
            })
            .await;
    }
}

/// Carries out the commands until stdin ends; never returns.
async fn obey(
    mut received: tokio::sync::mpsc::UnboundedReceiver<Command>,
    elector: &Elector,
    [pool, app]: [&deadpool_postgres::Pool; 2],
    shutdown: &CancellationToken,
) {
    while let Some(command) = received.recv().await {
        match command {
            Command::Stop => shutdown.cancel(),
            Command::Resign(cooldown) => {
                let elector = elector.clone();
                tokio::spawn(async move {
                    let led = elector.resign(cooldown).await;
                    say(&format!("resigned {} {}", unix_us(), u8::from(led)));
                });
            }
            Command::Exhaust(hold) => {
                tokio::spawn(exhaust(pool.clone(), hold));
            }
            Command::Long(window) => crate::app::long_runs(window),
            Command::Probe(id, idle) => {
                tokio::spawn(crate::app::probe(app.clone(), id, idle));
            }
        }
    }
    std::future::pending::<()>().await;
}

/// Why a tick wrote nothing.
enum Refused {
    /// `Term::fence` refused: the term's epoch.
    Fence(Option<u64>),
    /// Anything else (the database unreachable, a terminated session): the parent reads what
    /// landed, so it is not reported.
    Other,
}

/// One fenced row of this term: replica, shard (0 in key mode), epoch and the server's
/// `clock_timestamp()`.
async fn write(
    app: &deadpool_postgres::Pool,
    term: &pg_elector::Term,
    shard: i32,
    identity: &str,
) -> Result<(), Refused> {
    let mut client = app.get().await.map_err(|_| Refused::Other)?;
    let tx = client.transaction().await.map_err(|_| Refused::Other)?;
    term.fence(&tx)
        .await
        .map_err(|_| Refused::Fence(term.epoch()))?;
    let epoch = term.epoch().map(|e| e as i64);
    tx.execute(
        "INSERT INTO soak_writes (replica, shard, epoch, at) \
         VALUES ($1, $2, $3, clock_timestamp())",
        &[&identity, &shard, &epoch],
    )
    .await
    .map_err(|_| Refused::Other)?;
    tx.commit().await.map_err(|_| Refused::Other)
}

/// Borrows every connection of `pool` (each borrow waiting at most `hold`), keeps them for
/// what is left of `hold`, and gives them back.
async fn exhaust(pool: deadpool_postgres::Pool, hold: Duration) {
    let until = tokio::time::Instant::now() + hold;
    let mut held = Vec::new();
    for _ in 0..pool.status().max_size {
        match tokio::time::timeout_at(until, pool.get()).await {
            Ok(Ok(object)) => held.push(object),
            _ => break,
        }
    }
    say(&format!("exhausted {} {}", unix_us(), held.len()));
    tokio::time::sleep_until(until).await;
    drop(held);
    say(&format!("released {}", unix_us()));
}
