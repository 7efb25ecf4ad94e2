//! Everything PostgreSQL-specific. The election loop behind [`Elector::run`](crate::Elector::run)
//! is here, short: a standby waits for a grant ([`standby`]), a term is started on it
//! ([`begin`]), led ([`lead`]) and given back ([`give_back`]). The SQL of the lock session is
//! in [`session`], fast takeover's waiting session in [`waiter`], the graceful unlock's marker
//! in [`handover`], the epoch table in [`fence`].

use std::time::Duration;

use tokio::time::{MissedTickBehavior, interval};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::Error;
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::{LossCause, TermEnd};
use begin::{Start, start_term};
use borrower::Borrower;

use candidates::{SHORT_TERM_INTERVALS, StayAway};
use lead::Ended;
use repeats::Repeats;
use session::LockSession;
use settings::PgSettings;
use standby::Standby;
use tokio::time::Instant;

mod begin;
pub(crate) mod borrower;
mod cancel_key;
pub(crate) mod candidates;
pub(crate) mod give_back;
mod handover;
pub(crate) mod lead;
mod leader;
pub(crate) mod lock_table;
pub(crate) mod loss;
mod prepared;
pub(crate) mod repeats;
pub(crate) mod session;
mod session_error;
pub(crate) mod settings;
pub(crate) mod standby;
mod waiter;

pub(crate) use candidates::CandidatesTable;
pub use candidates::{HandoverTo, request_handover, request_handover_in};
pub(crate) use leader::leader_via;
pub use leader::{LeaderInfo, current_leader};

pub(crate) use crate::fence::{DEFAULT_TABLE as DEFAULT_FENCING_TABLE, FenceTable};

/// The election on PostgreSQL, until `shutdown`: standby, start a term, lead, give back.
pub(crate) async fn run(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut borrower = Borrower::new(pg.pool.clone(), pg.interval);
    borrower.prepared = session::Prepared::new(pg.prepared_statements);
    run_with(shared, pg, shutdown, borrower).await
}

/// [`run`], with the standby's way to the pool given.
async fn run_with(
    shared: &Shared,
    pg: &PgSettings,
    shutdown: CancellationToken,
    borrower: Borrower,
) -> Result<(), Error> {
    let _slot = shared.claim_run()?;
    let mut ticks = interval(pg.interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut resigns = shared.resign.subscribe();
    resigns.borrow_and_update();
    let mut standby = Standby::new(shared, pg, &shutdown, borrower);
    let mut repeats = Repeats::default();
    let mut held = Held {
        shared,
        pg,
        session: None,
        settle_until: None,
    };
    loop {
        let Some(grant) = standby.wait_for_grant(&mut ticks, &mut resigns).await else {
            standby.withdraw(settings::RELEASE_BOUND).await;
            return Ok(());
        };
        let begun = match start_term(shared, pg, &shutdown, grant, &mut held, &mut repeats).await {
            Start::Leading(begun) => begun,
            Start::GaveUp => {
                standby.could_not_keep().await;
                continue;
            }
            Start::Deferred => {
                standby.hold_off = true;
                continue;
            }
            Start::Stopped => return Ok(()),
        };
        // One span per term, inside the election's: every line of the term carries its epoch.
        let term_span = tracing::info_span!("term", epoch = begun.epoch);
        let led = lead::lead_term(
            shared,
            pg,
            &shutdown,
            &mut ticks,
            &mut resigns,
            &mut held,
            begun,
        );
        let began = tokio::time::Instant::now();
        let ended = led.instrument(term_span).await;
        if after_term(&mut standby, ended, began).await {
            return Ok(());
        }
    }
}

/// After a term that began at `began` and `ended` so: a term lost within a few intervals
/// is a lead this replica could not keep (it stays quiet a while), any other resets that
/// count; a yield holds the next try off (and stays away when a handover asked it to).
/// `true` when the election is over (a shutdown).
async fn after_term(standby: &mut Standby<'_>, ended: Ended, began: Instant) -> bool {
    let short = began.elapsed() < SHORT_TERM_INTERVALS * standby.pg.interval;
    if matches!(ended, Ended::Lost) && short {
        standby.could_not_keep().await;
    } else {
        standby.backoff.held();
    }
    match ended {
        Ended::Lost => {}
        Ended::Yielded(request) => {
            standby.hold_off = true;
            standby.stay_away = request.map(|r| StayAway::new(r, Instant::now()));
        }
        Ended::Gracefully(TermEnd::Shutdown) => return true,
        Ended::Gracefully(_) => standby.shared.resign_handled(),
    }
    false
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The local lease: the server cannot free the lock within 4·I of the last check's
/// send time; one I of that is kept as a margin.
pub(crate) fn lease_length(interval: Duration) -> Duration {
    3 * interval
}

/// The lock session of a running election. If `run` is dropped or unwinds while leading, the
/// session is closed without an unlock, since it may be mid-query.
struct Held<'a> {
    shared: &'a Shared,
    pg: &'a PgSettings,
    session: Option<Box<LockSession>>,
    /// The grant was not handed over gracefully: no graceful unlock before this instant.
    settle_until: Option<tokio::time::Instant>,
}

impl Held<'_> {
    /// Gives the lock back before a term began on it: unlocked, then closed. A lock freed by a
    /// session that ended under its leader is unlocked only once that leader has had its
    /// settle time to step down: the graceful unlock marks the next waiting session as handed
    /// over, which spares it that wait.
    async fn give_back(&mut self) {
        if let Some(until) = self.settle_until.take() {
            tokio::time::sleep_until(until).await;
        }
        if let Some(session) = self.session.take() {
            give_back::unlock(self.pg, session, false, true).await;
        }
    }

    /// Closes the session without an unlock (the server frees the lock with it).
    fn close(&mut self) {
        drop(self.session.take());
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.shared
                .demote(TermEnd::LeadershipLost, Change::Lost(LossCause::Abandoned));
            drop(session);
            tracing::warn!(key = %self.pg.key, "lock abandoned: run was dropped or panicked while leading; closing its session frees the lock");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::now_ms;
    use crate::{Elector, LockKey};
    use pg_elector_testkit::replicas::{serial, timing};
    use pg_elector_testkit::{FaultProxy, PgServer};
    use std::net::{Ipv4Addr, SocketAddr};
    use std::process::Command;
    use tokio::time::Instant;

    /// An address whose SYNs vanish, as behind a firewall that drops them or a host that is
    /// gone: a veth pair whose far end, holding the address, sits in a network namespace of
    /// its own (the test's own host: nothing leaves the machine), and a static neighbour entry
    /// whose hardware address nobody has, so that every frame to the address crosses the veth
    /// and is dropped by the far end; no RST, no ICMP ever comes back. Needs
    /// root (`CAP_NET_ADMIN`) and iproute2. Taken down when dropped.
    struct SynHole {
        addr: SocketAddr,
        netns: String,
        link: String,
    }

    impl SynHole {
        fn open() -> Self {
            let pid = std::process::id();
            let (netns, link, peer) = (
                format!("pge-synhole-{pid}"),
                format!("pgesh{pid}a"),
                format!("pgesh{pid}b"),
            );
            // A /30 of its own per process: 10.213.x.y.
            let base = 4 * (pid % 16_000);
            let ip = |n: u32| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 213, 0, 0)) + base + n);
            let (near, far) = (ip(1), ip(2));
            let hole = Self {
                addr: SocketAddr::from((far, 5432)),
                netns,
                link,
            };
            let ip_cmd = |args: &[&str]| {
                let out = Command::new("ip")
                    .args(args)
                    .output()
                    .unwrap_or_else(|e| panic!("ip {args:?}: {e} (iproute2 is needed)"));
                assert!(
                    out.status.success(),
                    "ip {args:?}: {} (dropping SYNs needs root, CAP_NET_ADMIN)",
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            hole.close();
            ip_cmd(&["netns", "add", &hole.netns]);
            ip_cmd(&[
                "link",
                "add",
                &hole.link,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
                "netns",
                &hole.netns,
            ]);
            ip_cmd(&["addr", "add", &format!("{near}/30"), "dev", &hole.link]);
            ip_cmd(&["link", "set", &hole.link, "up"]);
            // The far address is the namespace's own (a test host of this test, nowhere else);
            // the frames sent to it carry a hardware address its interface does not have, so
            // it drops them.
            ip_cmd(&[
                "-n",
                &hole.netns,
                "addr",
                "add",
                &format!("{far}/30"),
                "dev",
                &peer,
            ]);
            ip_cmd(&["-n", &hole.netns, "link", "set", &peer, "up"]);
            ip_cmd(&[
                "neigh",
                "replace",
                &far.to_string(),
                "lladdr",
                "02:00:5e:00:53:99",
                "dev",
                &hole.link,
                "nud",
                "permanent",
            ]);
            hole
        }

        fn close(&self) {
            let _ = Command::new("ip")
                .args(["link", "del", &self.link])
                .output();
            let _ = Command::new("ip")
                .args(["netns", "del", &self.netns])
                .output();
        }
    }

    impl Drop for SynHole {
        fn drop(&mut self) {
            self.close();
        }
    }

    /// A pool of two over a two-host URL: `hole` first, then `server`, as the database of
    /// `direct`, with `connect_timeout` when given.
    fn past_the_hole(
        hole: &SynHole,
        server: &PgServer,
        direct: &tokio_postgres::Config,
        connect_timeout: Option<Duration>,
    ) -> deadpool_postgres::Pool {
        let mut config = tokio_postgres::Config::new();
        config
            .user(direct.get_user().unwrap())
            .dbname(direct.get_dbname().unwrap())
            .host(hole.addr.ip().to_string())
            .port(hole.addr.port())
            .host(server.addr().ip().to_string())
            .port(server.addr().port());
        if let Some(limit) = connect_timeout {
            config.connect_timeout(limit);
        }
        if let Some(password) = direct.get_password() {
            config.password(password);
        }
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        deadpool_postgres::Pool::builder(manager)
            .max_size(2)
            .build()
            .unwrap()
    }

    /// A pool over a two-host URL: first a host that drops every SYN, then the live server,
    /// with no `connect_timeout`: each connect waits out the kernel's SYN timeout (about 127 s
    /// on Linux) at the first host before it tries the second. The borrow that the standby took
    /// for stuck after 10·I (at least 75 s) was started again at the first host, every time,
    /// so no replica ever led. The kernel's SYN timeout cannot be shortened for one test, so
    /// the test runs at a smaller scale: the SYNs are really dropped, `connect_timeout` plays
    /// the kernel's SYN timeout (`syn`), and the standby takes a borrow for stuck after `base`
    /// instead of 75 s. The leader must come within three times the connect past the dead
    /// host, plus six intervals (the bound the docs state).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_host_that_drops_syns_delays_the_leader_a_bounded_time() {
        let _timing = timing();
        let hole = SynHole::open();
        let dropped = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(hole.addr),
        )
        .await;
        assert!(dropped.is_err(), "the first host drops SYNs: {dropped:?}");

        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let direct = db.config();
        let syn = Duration::from_secs(3);
        let base = Duration::from_secs(1);
        let pool = past_the_hole(&hole, server, &direct, Some(syn));
        let interval = Duration::from_millis(200);
        let elector = Elector::builder(pool.clone(), LockKey::new(10, 11))
            .check_interval(interval)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move {
                let pg = elector.pg().expect("an elector on PostgreSQL");
                let borrower = Borrower::stuck_after(pool, base);
                run_with(&elector.shared, pg, shutdown, borrower).await
            }
        });
        // Three times the connect past the dead host (`syn`, and the live connect: a second
        // on a loaded machine), six intervals, and a second of slack.
        let bound = 3 * (syn + Duration::from_secs(1)) + 6 * interval + Duration::from_secs(1);
        let led = tokio::time::timeout(bound, elector.wait_for_leadership()).await;
        let took = started.elapsed();
        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert!(led.is_ok(), "no leader within {bound:?}");
        assert!(
            took >= syn,
            "led after {took:?}, before the first host's SYN timeout"
        );
        eprintln!("led {took:?} after start; the first host drops SYNs for {syn:?}");
    }

    /// The same at full scale, through `run` as an application calls it: no `connect_timeout`,
    /// so the kernel's own SYN timeout holds each connect at the first host (about 127 s with
    /// Linux's default `tcp_syn_retries` of 6), and the first limit is 75 s. A leader within
    /// 3·C + 6·I, with C the SYN timeout and the live connect. Takes three to four minutes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "full scale: three to four minutes"]
    async fn a_first_host_that_drops_syns_at_full_scale() {
        // Alone: the small-scale test's hole has the same name (one per process).
        let _serial = serial();
        let hole = SynHole::open();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let direct = db.config();
        let pool = past_the_hole(&hole, server, &direct, None);
        let interval = Duration::from_secs(1);
        let elector = Elector::builder(pool, LockKey::new(10, 12))
            .check_interval(interval)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let run = elector.spawn(shutdown.clone());
        let syn = Duration::from_secs(128);
        let bound = 3 * syn + 6 * interval;
        let led = tokio::time::timeout(bound, elector.wait_for_leadership()).await;
        let took = started.elapsed();
        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert!(led.is_ok(), "no leader within {bound:?}");
        eprintln!("led {took:?} after start, at full scale");
    }

    /// A machine suspend moves the lease's clock (`CLOCK_BOOTTIME`) but not tokio's timers, so
    /// a check in flight across it would not time out for up to I. The test makes the lease
    /// run out while a check hangs in a partition, and wants the term over within the watch's
    /// poll, not at the check's timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_running_out_mid_check_ends_the_term_at_once() {
        let _timing = timing();
        let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
        let db = server.create_database().await.unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let interval = Duration::from_secs(1);
        let elector = Elector::builder(db.pool_via(proxy.addr(), 2), LockKey::new(10, 10))
            .check_interval(interval)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        // Promoted at t; the first check goes out at t + I and, in the partition, hangs until
        // its bound at t + 2·I.
        let term = elector.wait_for_leadership().await;
        tokio::time::sleep(interval / 2).await;
        proxy.blackhole();
        tokio::time::sleep(interval).await;
        assert!(term.is_leader(), "the check is still in flight");
        let expired = Instant::now();
        elector.shared.lease().hold_until(now_ms());
        tokio::time::timeout(interval / 4, term.cancelled())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the token was still live {:?} after the lease ran out",
                    interval / 4
                )
            });
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        eprintln!(
            "token cancelled {:?} after the lease ran out mid-check",
            expired.elapsed()
        );
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }
}
