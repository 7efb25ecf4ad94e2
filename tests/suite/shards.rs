//! Shards (F6): membership from the server, a balanced assignment, ownership by the lock, one
//! session per member, moves only after their drain, and every way a member goes away.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::shards::{Held, Member, Monitor, balanced, joined, on_server, shares};
use common::{I, fresh_db, timing, wait_for};
use pg_elector::shards::Shards;
use pg_elector::{BuildError, Error, TermEnd};

mod f6 {
    use super::*;

    /// Three members over 32 shards: each owns 10 or 11 within 2.5·I of the last join, every
    /// shard has one owner, and the three hold one lock session each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_members_balance_on_one_session_each() {
        let _timing = timing();
        let db = fresh_db().await;
        let monitor = Monitor::start(32);
        let members: Vec<Member> = (0..3)
            .map(|_| Member::start(db.pool(2), "balance", 32, I))
            .collect();
        for m in &members {
            monitor.watch(&m.shards);
        }
        let handles: Vec<&Shards> = members.iter().map(|m| &m.shards).collect();
        joined(&handles, I).await;
        // A join's share: the mark, the check that proves it heard half an interval later, the
        // others' next check, and the joiner's next try: 2.5·I at worst, with I of slack.
        let took = wait_for(3 * I + I / 2, || balanced(&handles, 32)).await;
        assert!(
            took.is_some(),
            "balanced within 2.5·I of the joins: {:?}",
            shares(&handles)
        );
        let admin = db.connect().await.unwrap();
        assert_eq!(
            on_server(&admin, &members[0].shards, Held::Sessions).await,
            3,
            "one lock session per member"
        );
        for m in members {
            m.stop().await.unwrap();
        }
        let seen = monitor.finish().await;
        assert!(
            seen.two_owners.is_empty(),
            "two owners: {:?}",
            &seen.two_owners[..seen.two_owners.len().min(5)]
        );
        assert_eq!(
            on_server(&admin, &handles_group(&db), Held::Sessions).await,
            0,
            "every lock released"
        );
    }

    /// Each shard's owner (an index into `members`), once balanced.
    fn owners(members: &[&Shards], count: u32) -> Vec<usize> {
        let mut owner = vec![usize::MAX; count as usize];
        for (m, shards) in members.iter().enumerate() {
            for shard in shards.owned() {
                owner[shard.index() as usize] = m;
            }
        }
        owner
    }

    /// Waits up to `limit` for the owners of `members`' shards to be balanced and to stay the
    /// same for 2·I (so not a passing state of a race between members that started together);
    /// then each shard's owner.
    async fn settled(limit: Duration, members: &[Member], count: u32) -> Option<Vec<usize>> {
        let handles: Vec<&Shards> = members.iter().map(|m| &m.shards).collect();
        let start = std::time::Instant::now();
        let (mut last, mut since) = (None, std::time::Instant::now());
        while start.elapsed() < limit {
            let now = balanced(&handles, count).then(|| owners(&handles, count));
            if now.is_some() && now == last {
                if since.elapsed() >= 2 * I {
                    return now;
                }
            } else {
                (last, since) = (now, std::time::Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// F6.2: a join moves the newcomer's share and nothing else (no shard changes hands
    /// between the members already there), and a graceful leave moves the leaver's shards
    /// and nothing else.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_join_moves_only_the_newcomers_share_and_a_leave_only_the_leavers() {
        let _timing = timing();
        let db = fresh_db().await;
        const S: u32 = 50;
        let mut members: Vec<Member> = (0..3)
            .map(|_| Member::start(db.pool(2), "sticky", S, I))
            .collect();
        let handles: Vec<&Shards> = members.iter().map(|m| &m.shards).collect();
        joined(&handles, I).await;
        let before = settled(8 * I, &members, S).await.expect("3 balanced");
        members.push(Member::start(db.pool(2), "sticky", S, I));
        let after = settled(8 * I, &members, S).await.expect("4 balanced");
        let moved: Vec<usize> = (0..S as usize).filter(|&s| before[s] != after[s]).collect();
        let newcomers = after.iter().filter(|&&m| m == 3).count();
        assert!(newcomers == 12 || newcomers == 13, "{newcomers}");
        assert!(
            moved.iter().all(|&s| after[s] == 3),
            "only the newcomer's shards moved: {moved:?} of {before:?} → {after:?}"
        );
        // The first member leaves; its shards go to the others, nothing else moves.
        let leaver = members.remove(0);
        leaver.stop().await.unwrap();
        let left = settled(8 * I, &members, S).await.expect("3 balanced again");
        for s in 0..S as usize {
            if after[s] != 0 {
                assert_eq!(
                    after[s] - 1,
                    left[s],
                    "shard {s}: only the leaver's shards moved"
                );
            }
        }
        for m in members {
            m.stop().await.unwrap();
        }
    }

    /// F6.5, F6.2: a killed member's shards are owned again by the others within 1·I (each
    /// takes its share at its next check, whatever the others took before it), and nothing
    /// else moves: 50 shards over 4 members, then 3 (50 is not a multiple of 3, so the
    /// survivors' shares differ).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kill_moves_only_the_killed_members_shards_within_one_check() {
        let _timing = timing();
        let db = fresh_db().await;
        const S: u32 = 50;
        let mut members: Vec<Member> = (0..4)
            .map(|_| Member::start(db.pool(2), "kill", S, I))
            .collect();
        let handles: Vec<&Shards> = members.iter().map(|m| &m.shards).collect();
        joined(&handles, I).await;
        let before = settled(8 * I, &members, S).await.expect("4 balanced");
        let victim = members.remove(3);
        let killed: Vec<_> = victim.shards.owned();
        victim.kill().await;
        let took = wait_for(2 * I, || {
            killed
                .iter()
                .all(|&s| members.iter().any(|m| m.shards.is_owner(s)))
        })
        .await
        .expect("the killed member's shards owned again");
        assert!(
            took <= I + I / 2,
            "owned again within 1·I (+ slack): {took:?}"
        );
        let after = settled(5 * I, &members, S).await.expect("3 balanced");
        for s in 0..S as usize {
            if before[s] != 3 {
                assert_eq!(
                    before[s], after[s],
                    "shard {s}: only the killed member's moved"
                );
            }
        }
        for m in members {
            m.stop().await.unwrap();
        }
    }

    fn handles_group(db: &common::TestDb) -> Shards {
        Shards::builder(db.pool(1), "balance", 32).build().unwrap()
    }

    /// A member joins, one is killed, one leaves gracefully: never two owners of a shard; the
    /// killed member's shards are owned again within 1·I of its session closing, the leaver's
    /// within 1·I of its unlock; balanced within 2.5·I of the joins, and again within 2·I after the kill and the leave.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn joins_kills_and_leaves_never_give_a_shard_two_owners() {
        let _timing = timing();
        let db = fresh_db().await;
        let count = 32;
        let monitor = Monitor::start(count);
        let a = Member::start(db.pool(2), "churn", count, I);
        monitor.watch(&a.shards);
        joined(&[&a.shards], I).await;
        wait_for(2 * I, || a.shards.owned().len() == count as usize)
            .await
            .expect("a lone member owns every shard within 2·I");
        let (b, c) = (
            Member::start(db.pool(2), "churn", count, I),
            Member::start(db.pool(2), "churn", count, I),
        );
        monitor.watch(&b.shards);
        monitor.watch(&c.shards);
        let three = [&a.shards, &b.shards, &c.shards];
        // From the starts: the connections, then a join's 2.5·I (no drain here), I/2 of slack.
        wait_for(3 * I + I / 2, || balanced(&three, count))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "balanced within 2.5·I + drain of the joins: {:?}",
                    shares(&three)
                )
            });

        let killed: Vec<_> = c.shards.owned();
        c.kill().await;
        let two = [&a.shards, &b.shards];
        let took = wait_for(2 * I, || {
            killed
                .iter()
                .all(|&s| a.shards.is_owner(s) || b.shards.is_owner(s))
        })
        .await
        .unwrap_or_else(|| panic!("the killed member's {} shards owned again", killed.len()));
        assert!(
            took <= I + I / 2,
            "owned again within 1·I (+ slack) of the kill: {took:?}"
        );
        // The shards that change hands between the survivors (their quotas shift) take one
        // more interval.
        let balanced_after = wait_for(2 * I + I / 2, || balanced(&two, count))
            .await
            .unwrap_or_else(|| panic!("balanced again within 2·I of the kill: {:?}", shares(&two)));
        eprintln!(
            "killed member's {} shards owned again after {took:?}, balanced after {:?}",
            killed.len(),
            took + balanced_after
        );

        b.stop().await.unwrap();
        let took = wait_for(2 * I, || a.shards.owned().len() == count as usize)
            .await
            .expect("the leaver's shards owned again");
        assert!(
            took <= I + I / 2,
            "owned again within 1·I (+ slack) of the unlock: {took:?}"
        );

        a.stop().await.unwrap();
        let seen = monitor.finish().await;
        assert!(
            seen.two_owners.is_empty(),
            "two owners: {:?}",
            &seen.two_owners[..seen.two_owners.len().min(5)]
        );
        // A shard that changes hands between survivors is unowned from its old owner's check
        // (its release) to its new owner's next check: up to 1·I, and up to 2·I when the two
        // saw the member list change at different checks.
        assert!(
            seen.longest_unowned <= 2 * I + I / 2,
            "no shard unowned past 2·I (+ slack) while members ran: {:?}",
            seen.longest_unowned
        );
    }

    /// A shard moves only after its work drained: a's `do_work` on a shard that moves to b
    /// returns before b's term of it starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_moving_shard_waits_for_its_work_to_drain() {
        let _timing = timing();
        let db = fresh_db().await;
        let a = Member::build(
            Shards::builder(db.pool(2), "drain", 2)
                .check_interval(I)
                .drain_timeout(4 * I),
        );
        wait_for(10 * I, || a.shards.owned().len() == 2)
            .await
            .expect("a owns both");
        // When each shard's work returned, whatever do_work made of its outcome.
        let ended: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
        let work: Vec<_> = a
            .shards
            .all()
            .map(|shard| {
                let (shards, ended) = (a.shards.clone(), ended.clone());
                tokio::spawn(async move {
                    shards
                        .do_work(shard, |_term| async move {
                            tokio::time::sleep(2 * I).await;
                            ended.lock().unwrap().push((shard.index(), Instant::now()));
                            Ok::<_, ()>(())
                        })
                        .await
                })
            })
            .collect();
        let terms: Vec<_> = a.shards.all().map(|s| a.shards.term(s)).collect();
        tokio::time::sleep(I / 4).await;
        let b = Member::start(db.pool(2), "drain", 2, I);
        wait_for(10 * I, || b.shards.owned().len() == 1)
            .await
            .expect("one shard moves to b");
        let gained_at = Instant::now();
        let shard = b.shards.owned()[0];
        assert!(!a.shards.is_owner(shard));
        assert_eq!(
            terms[shard.index() as usize].end(),
            Some(TermEnd::Moved),
            "a's term of the moved shard ended as moved"
        );
        let mut outcomes = Vec::new();
        for w in work {
            outcomes.push(w.await.unwrap());
        }
        // The moved shard's work ended with its term: its outcome is dropped.
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| o.is_ok_and(|v| v.is_some()))
                .count(),
            1,
            "only the kept shard's work returns its outcome: {outcomes:?}"
        );
        let ended = ended.lock().unwrap().clone();
        let (_, work_end) = *ended
            .iter()
            .find(|(s, _)| *s == shard.index())
            .expect("the moved shard's work ran to its end");
        assert!(
            work_end <= gained_at,
            "b gained the shard only after a's work on it returned"
        );
        // Drained, unlocked, and tried by b at its next check.
        assert!(
            gained_at - work_end <= I + I / 2,
            "b gained it within 1·I (+ slack) of the drain: {:?}",
            gained_at - work_end
        );
        b.stop().await.unwrap();
        a.stop().await.unwrap();
    }

    /// A graceful leave whose drain outlasts the server's bound on a silent session (4·I)
    /// keeps the session checked while it drains: the leaver's shards move only after its work
    /// on them returned. (Before, nothing checked the session during the leave's drain, the
    /// server ended it at 4·I, and b owned shard 0 about 820 ms after a's shutdown while a's
    /// work on it still ran.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_drain_at_leave_keeps_the_shards_until_the_work_ends() {
        let _timing = timing();
        let db = fresh_db().await;
        let group = |pool| {
            Shards::builder(pool, "long-drain", 2)
                .check_interval(I)
                .drain_timeout(20 * I)
        };
        let a = Member::build(group(db.pool(2)));
        wait_for(10 * I, || a.shards.owned().len() == 2)
            .await
            .expect("a owns both");
        let shard = a.shards.shard(0).unwrap();
        // When the work returned (its outcome is dropped: its term ended under it).
        let ended: Arc<Mutex<Option<Instant>>> = Arc::default();
        let work = tokio::spawn({
            let (shards, ended) = (a.shards.clone(), ended.clone());
            async move {
                shards
                    .do_work(shard, |_term| async move {
                        tokio::time::sleep(8 * I).await;
                        *ended.lock().unwrap() = Some(Instant::now());
                        Ok::<_, ()>(())
                    })
                    .await
            }
        });
        tokio::time::sleep(I / 4).await;
        let left = Instant::now();
        a.shutdown.cancel();
        let b = Member::build(group(db.pool(2)));
        wait_for(30 * I, || b.shards.is_owner(shard))
            .await
            .expect("b owns shard 0 once a has drained and left");
        let gained_at = Instant::now();
        work.await.unwrap().unwrap();
        let work_end = ended.lock().unwrap().expect("the work ran to its end");
        assert!(
            work_end <= gained_at,
            "b owned shard 0 {:?} after a's shutdown, while a's work on it ran until {:?}",
            gained_at - left,
            work_end - left
        );
        assert!(
            gained_at - work_end <= 2 * I,
            "b owns it within 2·I of the drain's end: {:?}",
            gained_at - work_end
        );
        a.task.await.unwrap().unwrap();
        b.stop().await.unwrap();
    }

    /// A member whose lock session is terminated ends every shard's term at once, and its
    /// shards are owned again within 1·I (F6.5): by the other member at its next check, or by
    /// the terminated one, which joins again at its next interval and takes its share at once.
    /// Every shard of the group is owned within 2·I: a member that joins again before the
    /// other's check is a new member (a new session, another pid, so another assignment), and
    /// the shards the other hands it then wait for its next check. Never two owners.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_session_ends_every_term_of_its_member() {
        let _timing = timing();
        let db = fresh_db().await;
        let count = 16;
        let monitor = Monitor::start(count);
        let a = Member::start(db.pool(2), "terminate", count, I);
        let b = Member::start(db.pool(2), "terminate", count, I);
        monitor.watch(&a.shards);
        monitor.watch(&b.shards);
        let two = [&a.shards, &b.shards];
        wait_for(10 * I, || balanced(&two, count))
            .await
            .expect("balanced");
        // The member that owns shard 0, and its lock session's backend.
        let shard0 = a.shards.shard(0).unwrap();
        let victim = if a.shards.is_owner(shard0) { &a } else { &b };
        let theirs = victim.shards.owned();
        let victim_terms: Vec<_> = theirs.iter().map(|&s| victim.shards.term(s)).collect();
        let admin = db.connect().await.unwrap();
        let pid = common::holders(&admin, shard0.key()).await[0];
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        let start = Instant::now();
        for term in &victim_terms {
            tokio::time::timeout(Duration::from_millis(100), term.cancelled())
                .await
                .expect("every term of the member ends within 100 ms of the terminate");
            assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        }
        let ended = start.elapsed();
        wait_for(3 * I, || {
            theirs
                .iter()
                .all(|&s| a.shards.is_owner(s) || b.shards.is_owner(s))
        })
        .await
        .expect("its shards owned again");
        let theirs_again = start.elapsed();
        wait_for(3 * I, || {
            a.shards.owned().len() + b.shards.owned().len() == count as usize
        })
        .await
        .expect("every shard owned again");
        let all_again = start.elapsed();
        eprintln!(
            "terms ended after {ended:?}; its shards owned again after {theirs_again:?}, all after {all_again:?}"
        );
        // The slack, I/2: a check's and a try's statements, a new connection for the rejoin,
        // the 5 ms before a gained shard's term starts, on a loaded machine.
        assert!(
            theirs_again <= I + I / 2,
            "its shards owned again within 1·I (+ I/2): {theirs_again:?}"
        );
        assert!(
            all_again <= 2 * I + I / 2,
            "every shard owned within 2·I (+ I/2): {all_again:?}"
        );
        let seen = monitor.finish().await;
        assert!(
            seen.two_owners.is_empty(),
            "two owners: {:?}",
            &seen.two_owners[..seen.two_owners.len().min(5)]
        );
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }
}

mod e17 {
    use super::*;

    /// One run at a time, as for an elector; and two members with one identity are still two.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_run_at_a_time_and_identities_need_not_differ() {
        let _timing = timing();
        let db = fresh_db().await;
        let same = |pool| {
            Shards::builder(pool, "twins", 8)
                .check_interval(I)
                .identity("the-same-name")
        };
        let a = Member::build(same(db.pool(2)));
        wait_for(10 * I, || a.shards.is_member())
            .await
            .expect("a joins");
        let err = tokio::time::timeout(I, a.shards.run(Default::default()))
            .await
            .expect("a second run returns at once")
            .unwrap_err();
        assert!(matches!(err, Error::AlreadyRunning), "{err}");
        let b = Member::build(same(db.pool(2)));
        let two = [&a.shards, &b.shards];
        wait_for(10 * I, || balanced(&two, 8))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "two members of one identity split the shards: {:?}",
                    shares(&two)
                )
            });
        b.stop().await.unwrap();
        a.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_count_out_of_range_is_an_error() {
        let db = fresh_db().await;
        for count in [0, 16_385, u32::MAX] {
            let err = Shards::builder(db.pool(1), "g", count).build().unwrap_err();
            assert!(
                matches!(err, Error::Build(BuildError::InvalidShardCount { .. })),
                "{count}: {err}"
            );
        }
        let err = Shards::builder(db.pool(1), "g", 4)
            .check_interval(Duration::from_millis(1))
            .build()
            .unwrap_err();
        assert!(
            matches!(err, Error::Build(BuildError::IntervalTooSmall { .. })),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_shards_elector_is_run_by_its_group() {
        let db = fresh_db().await;
        let shards = Shards::builder(db.pool(1), "g", 4).build().unwrap();
        let elector = shards.elector(shards.shard(3).unwrap()).unwrap();
        let err = elector.run(Default::default()).await.unwrap_err();
        assert!(matches!(err, Error::RunOnShard), "{err}");
        assert!(!elector.resign(Duration::ZERO).await);
        assert!(shards.shard(4).is_none());
        let other = Shards::builder(db.pool(1), "h", 8).build().unwrap();
        let foreign = other.shard(1).unwrap();
        assert!(
            shards.elector(foreign).is_none(),
            "a shard of another group"
        );
        assert!(!shards.is_owner(foreign));
        assert_eq!(shards.term(foreign).end(), Some(TermEnd::NotLeader));
    }
}
