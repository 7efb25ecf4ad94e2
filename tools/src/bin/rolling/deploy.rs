//! One electors part: a fleet of replicas on one key, then `--deploys` rolling deploys.

use std::time::{Duration, Instant};

use pg_elector_testkit::PgServer;
use pg_elector_testkit::replica::unix_us;
use pg_elector_tools::Mode;

use crate::KEY;
use crate::lanes::{Move, holders_at, moves, overlap_us, spans};
use crate::options::{Config, Options};
use crate::procs::{Procs, Spec};
use crate::sampler::{Sampler, holders};

/// One deploy's figures.
#[derive(Debug)]
pub(crate) struct Deploy {
    /// Leadership moves as the replicas said them.
    pub(crate) moves: Vec<Move>,
    /// Changes of the lock's holder as the server showed them.
    pub(crate) holder_changes: usize,
    pub(crate) no_holder_us: u64,
    pub(crate) two_leaders_us: u64,
    /// The leader at the end runs the new version, as the replicas said it.
    pub(crate) new_leads: bool,
    /// The same, as `current_leader` tells it from the server.
    pub(crate) new_holds: bool,
    pub(crate) took: Duration,
}

/// A part's deploys, and why it stopped early, if it did.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) deploys: Vec<Deploy>,
    pub(crate) failed: Option<String>,
    /// The sampler's reads, and their mean period (ms).
    pub(crate) sampler: (u64, f64),
}

/// A deploy's window and what it is about.
struct Window {
    from: u64,
    to: u64,
    version: u64,
    took: Duration,
}

pub(crate) async fn run_part(server: &PgServer, o: &Options, config: Config) -> Outcome {
    let tag = config.name();
    let db = server.create_database().await.expect("a database");
    let admin = db.connect().await.expect("an admin connection");
    let sampler = Sampler::start(&db).await.expect("the sampler's connection");
    let mut procs = Procs::new(Spec {
        url: db.url(),
        interval: o.interval,
        pref: config.pref,
        fast: config.mode == Mode::Fast,
        shards: None,
    });
    let mut outcome = Outcome::default();
    let run = async {
        let up = Instant::now();
        start_fleet(&mut procs, &admin, o).await?;
        eprintln!(
            "[{tag}] {} replicas of v1 up, one leads, in {:.1} s",
            o.replicas,
            up.elapsed().as_secs_f64()
        );
        for d in 1..=o.deploys {
            let window = one_deploy(&mut procs, &admin, o, d as u64 + 1).await?;
            let deploy = figures(&procs, &sampler, &admin, &window).await;
            say(&tag, d, o.deploys, &procs, &sampler, &window, &deploy);
            outcome.deploys.push(deploy);
        }
        Ok::<(), String>(())
    };
    if let Err(e) = run.await {
        eprintln!("[{tag}] stopped: {e}");
        outcome.failed = Some(e);
    }
    procs.stop_all().await;
    outcome.sampler = sampler.stop().await;
    drop(db);
    outcome
}

/// Starts `--replicas` replicas of version 1, each once the one before stands by, then waits
/// for a single leader and 2·I more.
async fn start_fleet(
    procs: &mut Procs,
    admin: &tokio_postgres::Client,
    o: &Options,
) -> Result<(), String> {
    for _ in 0..o.replicas {
        start_one(procs, admin, o, 1).await?;
    }
    single_leader(procs, o.interval).await?;
    tokio::time::sleep(2 * o.interval).await;
    Ok(())
}

/// One rolling deploy to `version`: each old replica, oldest first, replaced by a new one that
/// stands by (and `--pause` more) before the old one is stopped; then a single leader and 3·I
/// more.
async fn one_deploy(
    procs: &mut Procs,
    admin: &tokio_postgres::Client,
    o: &Options,
    version: u64,
) -> Result<Window, String> {
    let (from, started) = (unix_us(), Instant::now());
    for _ in 0..o.replicas {
        start_one(procs, admin, o, version).await?;
        tokio::time::sleep(o.pause).await;
        let t = Instant::now();
        let old = procs.stop_oldest().await?;
        trace(format_args!(
            "{} stopped in {:?}",
            procs.names[old],
            t.elapsed()
        ));
    }
    single_leader(procs, o.interval).await?;
    tokio::time::sleep(3 * o.interval).await;
    Ok(Window {
        from,
        to: unix_us(),
        version,
        took: started.elapsed(),
    })
}

/// Starts a replica of `version` and waits until it stands by.
async fn start_one(
    procs: &mut Procs,
    admin: &tokio_postgres::Client,
    o: &Options,
    version: u64,
) -> Result<(), String> {
    let index = procs.spawn(version);
    let t = Instant::now();
    stands_by(admin, &procs.names[index], o.interval).await?;
    if procs.fast() {
        waits(admin, &procs.names[index], o.interval).await?;
    }
    trace(format_args!(
        "{} stands by in {:?}",
        procs.names[index],
        t.elapsed()
    ));
    Ok(())
}

/// A step's line on stderr, with `ROLLING_TRACE` set.
pub(crate) fn trace(line: std::fmt::Arguments<'_>) {
    if std::env::var_os("ROLLING_TRACE").is_some() {
        eprintln!("  {line}");
    }
}

/// Waits until the server has seen the replica `name` try the lock: a backend of its pool
/// (`application_name` = its identity) whose latest statement names an advisory-lock function
/// (a try, or fast takeover's wait), or that holds the lock (a replica that leads at once: its
/// lock session's latest statement is often the read of the candidates table). With a
/// preference, its candidates row was written just before that try.
async fn stands_by(
    admin: &tokio_postgres::Client,
    name: &str,
    interval: Duration,
) -> Result<(), String> {
    let seen = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a \
                WHERE a.application_name = $1 AND (a.query LIKE '%advisory%' \
                  OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.pid = a.pid \
                             AND l.locktype = 'advisory' AND l.granted)))";
    let limit = 10 * interval + Duration::from_secs(30);
    match until_true(admin, seen, name, limit).await? {
        true => Ok(()),
        false => Err(format!("{name} did not try the lock within {limit:?}")),
    }
}

/// Polls `sql` (one boolean, `$1` = `name`) every 5 ms until it answers true (`true`) or
/// `limit` has passed (`false`).
async fn until_true(
    admin: &tokio_postgres::Client,
    sql: &str,
    name: &str,
    limit: Duration,
) -> Result<bool, String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let row = admin
            .query_one(sql, &[&name])
            .await
            .map_err(|e| e.to_string())?;
        if row.get::<_, bool>(0) {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(false)
}

/// With fast takeover a standby stands by once its session waits for the lock, as the server
/// sees it (an ungranted advisory lock of a backend named after it), or it leads. Only three
/// standbys wait at once: a replica that gets no waiting slot within 3·I (every slot held by
/// standbys that are not outranked, as without preferences) stands by with its tries alone.
async fn waits(
    admin: &tokio_postgres::Client,
    name: &str,
    interval: Duration,
) -> Result<(), String> {
    let seen = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a \
                JOIN pg_catalog.pg_locks l ON l.pid = a.pid \
                WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.objsubid = 2 \
                AND (NOT l.granted OR l.mode = 'ExclusiveLock'))";
    if until_true(admin, seen, name, 3 * interval).await? {
        return Ok(());
    }
    trace(format_args!("{name} got no waiting slot within 3·I"));
    Ok(())
}

/// Waits until exactly one replica says it leads.
async fn single_leader(procs: &Procs, interval: Duration) -> Result<usize, String> {
    let limit = 10 * interval + Duration::from_secs(10);
    procs
        .until(limit, |events| {
            match holders_at(&spans(events), 0, unix_us())[..] {
                [one] => Some(one),
                _ => None,
            }
        })
        .await
        .ok_or_else(|| format!("no single leader within {limit:?}"))
}

async fn figures(
    procs: &Procs,
    sampler: &Sampler,
    admin: &tokio_postgres::Client,
    w: &Window,
) -> Deploy {
    let spans = spans(&procs.events());
    let leaders = holders_at(&spans, 0, w.to);
    let server = holders(&sampler.changes(), w.from, w.to);
    let holder = pg_elector::current_leader(admin, KEY).await.ok().flatten();
    Deploy {
        moves: moves(&spans, 0, w.from, w.to),
        holder_changes: server.changes,
        no_holder_us: server.none_us,
        two_leaders_us: overlap_us(spans.iter().filter(|s| s.lane == 0), w.from, w.to),
        new_leads: matches!(leaders[..], [one] if procs.versions[one] == w.version),
        new_holds: holder.is_some_and(|h| h.identity.starts_with(&format!("v{}-", w.version))),
        took: w.took,
    }
}

/// One deploy's line on stderr: its figures, the moves and the server's holders.
fn say(
    tag: &str,
    d: usize,
    n: usize,
    procs: &Procs,
    sampler: &Sampler,
    w: &Window,
    deploy: &Deploy,
) {
    let name = |i: usize| procs.names[i].as_str();
    let moves: Vec<String> = deploy
        .moves
        .iter()
        .map(|m| {
            format!(
                "{} → {} ({:.1} ms)",
                name(m.from_child),
                name(m.to_child),
                m.gap_us as f64 / 1e3
            )
        })
        .collect();
    let held: Vec<String> = holders(&sampler.changes(), w.from, w.to)
        .held
        .iter()
        .map(|(pid, us)| format!("{} {:.1} ms", sampler.name(*pid), *us as f64 / 1e3))
        .collect();
    eprintln!(
        "[{tag}] deploy {d}/{n} to v{}: {} moves [{}]; two leaders {} µs; \
         new version leads: {} (server: {}); server holders [{}], no holder {:.1} ms; {:.1} s",
        w.version,
        deploy.moves.len(),
        moves.join(", "),
        deploy.two_leaders_us,
        deploy.new_leads,
        deploy.new_holds,
        held.join(", "),
        deploy.no_holder_us as f64 / 1e3,
        deploy.took.as_secs_f64(),
    );
}
