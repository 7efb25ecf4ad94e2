//! Shard members under the kit's faults: the fault acts on one shard's owner (its lock session
//! holds every shard it owns), the shards move to the others, and no shard ever has two owners
//! at once on the timeline.

use std::time::Duration;

use pg_elector_testkit::replicas::timing;
use pg_elector_testkit::{PgServer, ShardMembers, TestDb, Who};

const I: Duration = Duration::from_millis(200);
const SHARDS: u32 = 8;
const STARTUP: Duration = Duration::from_secs(10);

async fn balanced(group: &str) -> (TestDb, ShardMembers) {
    let db = PgServer::shared()
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a test database");
    let members = ShardMembers::builder(&db, group, SHARDS)
        .members(3)
        .check_interval(I)
        .start()
        .await
        .expect("members start");
    members
        .wait_for_balance(STARTUP)
        .await
        .expect("the shards spread");
    (db, members)
}

async fn one_owner_at_a_time(members: ShardMembers) {
    // A lane is a shard: two leaders of a lane are two owners of one shard.
    members.finish().await.assert_no_two_leaders();
}

#[tokio::test]
async fn shards_spread_and_each_has_one_owner() {
    let _timing = timing();
    let (_db, members) = balanced("kit-spread").await;
    let shares: Vec<usize> = (0..members.len())
        .map(|m| members.owned_by(m).len())
        .collect();
    assert_eq!(shares.iter().sum::<usize>(), SHARDS as usize, "{shares:?}");
    assert!(shares.iter().all(|&s| (2..=3).contains(&s)), "{shares:?}");
    for shard in 0..SHARDS {
        assert_eq!(members.owners(shard).len(), 1, "shard {shard}");
    }
    let err = members.partition(Who::Leader).unwrap_err();
    assert!(err.to_string().contains("Who::Owner"), "{err}");
    let err = members.partition(Who::Owner(SHARDS)).unwrap_err();
    assert!(err.to_string().contains("no shard"), "{err}");
    one_owner_at_a_time(members).await;
}

#[tokio::test]
async fn killing_an_owners_session_moves_its_shards() {
    let _timing = timing();
    let (_db, members) = balanced("kit-kill").await;
    let owner = members.kill_session(Who::Owner(0)).await.unwrap();
    // Its session held every shard it owned: each begins a new term within a few intervals
    // (the member rejoins, and the assignment settles again).
    let next = members
        .wait_for_next_owner(0, 5 * I)
        .await
        .expect("shard 0 owned again");
    eprintln!(
        "shard 0: member {owner} killed, member {} owns it {:?} later",
        next.replica, next.took
    );
    members
        .wait_for_balance(10 * I)
        .await
        .expect("balanced again");
    one_owner_at_a_time(members).await;
}

#[tokio::test]
async fn a_crashed_member_loses_its_shards_to_the_others() {
    let _timing = timing();
    let (_db, mut members) = balanced("kit-crash").await;
    let owner = members.resolve(Who::Owner(3)).unwrap();
    let had = members.owned_by(owner);
    members.crash(owner).await;
    for &shard in &had {
        let next = members
            .wait_for_owner(shard, Some(owner), 5 * I)
            .await
            .expect("owned again by another member");
        assert_ne!(next.replica, owner);
    }
    members
        .wait_for_balance(10 * I)
        .await
        .expect("balanced over the two left");
    one_owner_at_a_time(members).await;
}

#[tokio::test]
async fn a_partitioned_owner_gives_up_its_shards_before_others_take_them() {
    let _timing = timing();
    let (_db, members) = balanced("kit-partition").await;
    let owner = members.partition(Who::Owner(1)).unwrap();
    // Every term of the member ends within 2·I (next check and its timeout).
    let gone = tokio::time::timeout(3 * I, async {
        while !members.owned_by(owner).is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the partitioned member still owned {:?} after 3·I",
        members.owned_by(owner)
    );
    members.heal(owner);
    members
        .wait_for_balance(20 * I)
        .await
        .expect("balanced once healed");
    one_owner_at_a_time(members).await;
}
