//! E15 / F1 / F2: no instant with two leaders, as `is_leader` sees it, after the server ends a
//! leader's session while the leader lives and can hear it (`pg_terminate_backend`), in every
//! pairing of modes (poll → poll, poll → fast, fast → poll, fast → fast). The old leader
//! notices its closed connection within 1 ms in either mode; a new term whose lock was not
//! handed over gracefully starts 5 ms after its grant, whether the grant came to a waiting
//! session or to a try; and the handover marker of a graceful unlock counts only for the grant
//! that unlock made, not for the next one.
//!
//! The test kit's timeline reads every replica's `is_leader()` about every 50 µs for the whole
//! test.

mod common;

use std::time::{Duration, Instant};

use common::capture::Capture;
use common::*;
use pg_elector::{Elector, LockKey};
use pg_elector_testkit::Timeline;

/// The interval of the pairing runs: short, so that a standby that only tries lands its try
/// within a few milliseconds of a terminate in a good share of the runs (the window an overlap
/// needs), and the 200 runs take well under a minute.
const SHORT: Duration = Duration::from_millis(50);

/// Terminates per pairing.
const RUNS: usize = 50;

/// How long the first replica may take to lead: its first pool connection is opened then.
const STARTUP: Duration = Duration::from_secs(5);

/// How often the timeline reads every replica's `is_leader()`.
const SAMPLE: Duration = Duration::from_micros(50);

/// Records every replica's `is_leader()` every [`SAMPLE`] (the test kit's timeline).
fn sampler(electors: &[&Elector]) -> Timeline {
    let electors: Vec<Elector> = electors.iter().map(|e| (*e).clone()).collect();
    Timeline::start_sampling(&electors, None, SAMPLE)
}

fn elector(db: &TestDb, key: LockKey, interval: Duration, name: &str, fast: bool) -> Elector {
    Elector::builder(db.pool(2), key)
        .check_interval(interval)
        .identity(name)
        .fast_takeover(fast)
        .build()
        .expect("a valid elector")
}

/// A small xorshift generator, seeded from the clock and printed, for the phases.
struct Phases(u64);

impl Phases {
    fn new(name: &str) -> Self {
        let seed = std::env::var("OVERLAP_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{name}: phases from OVERLAP_SEED={seed}");
        Self(seed)
    }

    /// A delay in `[0, below)`.
    fn below(&mut self, below: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        below.mul_f64((self.0 % 10_000) as f64 / 10_000.0)
    }
}

/// Two replicas in the given modes; `runs` times: make replica `run % 2` the leader (by a
/// resign of the other, with a short cooldown, when it is not), wait until the other stands by
/// again (trying, and waiting too when it is fast) plus a random phase of its tries, and
/// terminate the leader's lock session. Asserts that no sample saw two leaders.
async fn terminates_under_a_live_leader(fast: [bool; 2], runs: usize) {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0x22, fast[0] as i32 * 2 + fast[1] as i32);
    let a = Replica::run(elector(&db, key, SHORT, "a", fast[0]));
    // Setup, not the property: the first connection to a new database can take longer than
    // the 50 ms a try waits for one on a loaded machine.
    wait_for(STARTUP, || a.elector.is_leader())
        .await
        .expect("a leads");
    let b = Replica::run(elector(&db, key, SHORT, "b", fast[1]));
    let replicas = [a, b];
    let sampler = sampler(&[&replicas[0].elector, &replicas[1].elector]);
    let mode = |i: usize| if fast[i] { "fast" } else { "poll" };
    let mut phases = Phases::new(&format!("{} + {}", mode(0), mode(1)));
    let admin = db.connect().await.unwrap();
    let cooldown = 2 * SHORT;
    // Terminates by (from, to): who led before it, and who led next.
    let mut moves = [[0usize; 2]; 2];
    for run in 0..runs {
        let from = run % 2;
        let leader = one_leader(&replicas, 10 * SHORT).await;
        if leader != from {
            replicas[leader].elector.resign(cooldown).await;
            wait_for(10 * SHORT, || replicas[from].elector.is_leader())
                .await
                .unwrap_or_else(|| panic!("run {run}: {} does not take over", ["a", "b"][from]));
        }
        // The other one stands by again (its cooldown over, a fast one's session waiting),
        // and then a random phase of its tries.
        tokio::time::sleep(cooldown + 2 * SHORT + phases.below(SHORT)).await;
        let pids = holders(&admin, key).await;
        assert_eq!(pids.len(), 1, "run {run}: one holder: {pids:?}");
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pids[0]])
            .await
            .unwrap();
        wait_for(3 * SHORT, || !replicas[from].elector.is_leader())
            .await
            .unwrap_or_else(|| panic!("run {run}: the old leader does not demote"));
        let to = one_leader(&replicas, 10 * SHORT).await;
        moves[from][to] += 1;
    }
    let seen = sampler.finish();
    eprintln!(
        "{} + {}: {runs} terminates, moves [from][to] {moves:?}; {} samples, {} terms, longest overlap {:?}",
        mode(0),
        mode(1),
        seen.samples,
        seen.leaders.len(),
        seen.longest_overlap()
    );
    assert!(
        seen.overlaps().is_empty(),
        "two leaders at once after a terminate under a live leader: {:?}",
        seen.overlaps()
    );
    for replica in replicas {
        replica.stop().await.unwrap();
    }
}

mod e15 {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn poll_to_poll_a_terminated_session_never_gives_two_leaders() {
        terminates_under_a_live_leader([false, false], RUNS).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fast_to_fast_a_terminated_session_never_gives_two_leaders() {
        terminates_under_a_live_leader([true, true], RUNS).await;
    }

    /// A mixed pair: RUNS terminates of a poll leader with a fast standby, and RUNS of a fast
    /// leader with a poll standby.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mixed_modes_a_terminated_session_never_gives_two_leaders() {
        terminates_under_a_live_leader([false, true], 2 * RUNS).await;
    }
}

/// The handover marker counts only for the grant the graceful unlock made. A leader hands over
/// gracefully to one of two waiting standbys; the new leader's session is terminated at once,
/// well within the 50 ms an unlock may keep its marker; the other standby, granted next, must
/// not take that for a graceful handover: it waits before its term starts, and no instant has
/// two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_a_terminate_just_after_a_handover_is_not_taken_for_one() {
    let _serial = serial();
    let db = fresh_db().await;
    let key = LockKey::new(0x22, 0x9);
    let long = Duration::from_secs(2);
    let admin = db.connect().await.unwrap();
    for round in 0..5 {
        let a = Replica::run(elector(&db, key, long, "a", true));
        wait_for(3 * long, || a.elector.is_leader())
            .await
            .expect("a leads");
        let captures = [Capture::default(), Capture::default()];
        let standbys = [
            Replica::run_captured(elector(&db, key, long, "b", true), &captures[0]),
            Replica::run_captured(elector(&db, key, long, "c", true), &captures[1]),
        ];
        session_waiting(&admin, key, "b", 2 * long).await;
        session_waiting(&admin, key, "c", 2 * long).await;
        let sampler = sampler(&[&a.elector, &standbys[0].elector, &standbys[1].elector]);
        let stopping = tokio::spawn(a.stop());
        wait_for(long, || leaders(&standbys).len() == 1)
            .await
            .expect("a standby takes over");
        let first = leaders(&standbys)[0];
        let granted = Instant::now();
        let pid = holders(&admin, key).await[0];
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        let terminated = granted.elapsed();
        let second = 1 - first;
        wait_for(long, || standbys[second].elector.is_leader())
            .await
            .expect("the other standby takes over");
        stopping.await.unwrap().unwrap();
        let seen = sampler.finish();
        let grants = captures[second].events("lock granted; the server's bounds");
        let grant = grants.last().expect("the grant is logged");
        eprintln!(
            "round {round}: terminated {terminated:?} after the handover; the next grant: waited {}, handed_over {}; {seen:?}",
            grant.field("waited"),
            grant.field("handed_over")
        );
        assert_eq!(
            grant.field("handed_over"),
            "false",
            "round {round}: the lock came from a session that ended, not from the graceful unlock"
        );
        assert!(
            seen.overlaps().is_empty(),
            "round {round}: two leaders at once: {:?}",
            seen.overlaps()
        );
        for standby in standbys {
            standby.stop().await.unwrap();
        }
    }
}
