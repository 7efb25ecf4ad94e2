//! Which member should own which shard: the same answer on every member that sees the same
//! member list and the same holders, balanced, and moving as few shards as balance needs when
//! a member joins or leaves.
//!
//! Sticky, with a quota. Each member's quota is ⌊S/N⌋, and ⌈S/N⌉ for S mod N of them (chosen
//! by a hash of the group and the member, not by age or by what it holds). Each member keeps
//! the shards it holds, up to its quota (the ones it weighs most, if it holds more). Every other shard (free, held by
//! no member, or beyond its holder's quota) goes by rendezvous hashing: every (shard, member)
//! pair gets a weight from a hash of the group, the shard and the member, the pairs are taken
//! heaviest first, and a shard goes to the first member of its pairs that still has room.
//!
//! So a join moves the newcomer's quota and nothing else (each member gives up what it holds
//! beyond its new quota), a leave moves the leaver's shards, and with nothing held it is plain
//! rendezvous hashing with a quota. Pure: unit-tested here.

/// The most shards a group may have: the assignment sorts the free shards' weights (S·N at
/// most) when shards come free, and every owned shard takes a slot of the server's shared
/// lock table.
pub(crate) const MAX_SHARDS: u32 = 16_384;

use std::collections::HashMap;

/// The target owner of every shard, as an index into `members` (the members' lock session
/// pids, in any order); empty without members. `holders` are the pids holding shards now, by
/// shard (`None`: free; a pid that is not a member counts as free; shards beyond `holders`
/// are free).
pub(crate) fn assign(
    salt: u64,
    count: u32,
    members: &[i32],
    holders: &[Option<i32>],
) -> Vec<usize> {
    if members.is_empty() {
        return Vec::new();
    }
    let held = held_by_member(count, members, holders);
    let quota = quotas(salt, count, members);
    let mut owner = vec![usize::MAX; count as usize];
    let mut left = quota;
    for (m, shards) in held.into_iter().enumerate() {
        for shard in kept(salt, members[m], shards, left[m]) {
            owner[shard as usize] = m;
            left[m] -= 1;
        }
    }
    share_out(salt, members, &mut owner, left);
    owner
}

/// The shards each member holds (by index into `members`), in shard order.
fn held_by_member(count: u32, members: &[i32], holders: &[Option<i32>]) -> Vec<Vec<u32>> {
    let index: HashMap<i32, usize> = members
        .iter()
        .enumerate()
        .map(|(m, &pid)| (pid, m))
        .collect();
    let mut held = vec![Vec::new(); members.len()];
    for (shard, holder) in holders.iter().enumerate().take(count as usize) {
        if let Some(&m) = holder.and_then(|pid| index.get(&pid)) {
            held[m].push(shard as u32);
        }
    }
    held
}

/// The at most `quota` of `shards` that `pid` keeps: the ones it weighs most.
fn kept(salt: u64, pid: i32, mut shards: Vec<u32>, quota: u32) -> Vec<u32> {
    if shards.len() > quota as usize {
        shards.sort_unstable_by_key(|&shard| (std::cmp::Reverse(weight(salt, shard, pid)), shard));
        shards.truncate(quota as usize);
    }
    shards
}

/// Gives every shard without an owner yet to a member with room (`left`), heaviest pair first.
fn share_out(salt: u64, members: &[i32], owner: &mut [usize], mut left: Vec<u32>) {
    let mut pairs: Vec<(u64, u32, u32)> = Vec::new();
    for (shard, _) in owner.iter().enumerate().filter(|(_, o)| **o == usize::MAX) {
        for (m, &pid) in members.iter().enumerate().filter(|(m, _)| left[*m] > 0) {
            pairs.push((weight(salt, shard as u32, pid), shard as u32, m as u32));
        }
    }
    // Heaviest first; ties (vanishingly rare) by shard, then by pid, so every member agrees.
    pairs.sort_unstable_by(|a, b| {
        b.0.cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(members[a.2 as usize].cmp(&members[b.2 as usize]))
    });
    for (_, shard, m) in pairs {
        let (shard, m) = (shard as usize, m as usize);
        if owner[shard] == usize::MAX && left[m] > 0 {
            owner[shard] = m;
            left[m] -= 1;
        }
    }
}

/// Each member's number of shards: ⌊S/N⌋, plus one for the S mod N members whose hash of the
/// group ranks first. A function of the member list alone, not of who holds what: members
/// whose checks see the holders at different moments of a move (one has taken its new shards,
/// the next not yet) still agree on every quota, so each takes its share at its next check.
fn quotas(salt: u64, count: u32, members: &[i32]) -> Vec<u32> {
    let n = members.len() as u32;
    let (base, extra) = (count / n, count % n);
    let mut ranked: Vec<usize> = (0..members.len()).collect();
    ranked.sort_unstable_by_key(|&m| {
        (
            std::cmp::Reverse(weight(salt, u32::MAX, members[m])),
            members[m],
        )
    });
    let mut quota = vec![base; members.len()];
    for &m in ranked.iter().take(extra as usize) {
        quota[m] += 1;
    }
    quota
}

/// A well-mixed 64-bit weight of one (shard, member) pair (SplitMix64's finaliser).
fn weight(salt: u64, shard: u32, pid: i32) -> u64 {
    let mut x = salt ^ (u64::from(shard) << 32 | u64::from(pid as u32));
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shards whose owner (by pid) differs between two assignments.
    fn moved(before: (&[i32], &[usize]), after: (&[i32], &[usize])) -> usize {
        before
            .1
            .iter()
            .zip(after.1)
            .filter(|(b, a)| before.0[**b] != after.0[**a])
            .count()
    }

    fn counts(n: usize, owner: &[usize]) -> Vec<usize> {
        let mut c = vec![0; n];
        for &m in owner {
            c[m] += 1;
        }
        c
    }

    /// The holders once every member holds what `owner` gives it.
    fn holding(members: &[i32], owner: &[usize]) -> Vec<Option<i32>> {
        owner.iter().map(|&m| Some(members[m])).collect()
    }

    fn balanced(count: u32, n: usize, owner: &[usize]) -> bool {
        let c = counts(n, owner);
        let (lo, hi) = (count as usize / n, (count as usize).div_ceil(n));
        owner.len() == count as usize && c.iter().all(|&k| k == lo || k == hi)
    }

    /// A small xorshift, for reproducible random holders.
    fn next(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn every_member_gets_the_floor_or_the_ceiling_of_its_share() {
        for count in [1, 2, 7, 32, 100, 1024] {
            for n in 1..=9usize {
                let members: Vec<i32> = (0..n as i32).map(|i| 1000 + 37 * i).collect();
                let owner = assign(7, count, &members, &[]);
                assert!(
                    balanced(count, n, &owner),
                    "S={count} N={n}: {:?}",
                    counts(n, &owner)
                );
            }
        }
    }

    #[test]
    fn every_member_computes_the_same_owners_whatever_its_list_order() {
        let members = [4411, 17, 902, 3, 65000];
        let reversed: Vec<i32> = members.iter().rev().copied().collect();
        let mut seed = 0x9e37_79b9;
        let holders: Vec<Option<i32>> = (0..1024)
            .map(|_| match next(&mut seed) % 7 {
                5 => None,
                6 => Some(12345),
                k => Some(members[k as usize % 5]),
            })
            .collect();
        for holders in [&[][..], &holders[..]] {
            let a = assign(99, 1024, &members, holders);
            let b = assign(99, 1024, &reversed, holders);
            for shard in 0..1024 {
                assert_eq!(members[a[shard]], reversed[b[shard]], "shard {shard}");
            }
        }
    }

    #[test]
    fn a_join_moves_the_newcomers_share_and_nothing_else() {
        for count in [7u32, 100, 1024] {
            for n in 1..=8usize {
                for salt in 0..20u64 {
                    let before: Vec<i32> =
                        (0..n as i32).map(|i| 200 + 11 * i + salt as i32).collect();
                    let b = assign(salt, count, &before, &[]);
                    let mut after = before.clone();
                    after.push(90_000 + salt as i32);
                    let a = assign(salt, count, &after, &holding(&before, &b));
                    assert!(balanced(count, n + 1, &a), "S={count} N={}", n + 1);
                    let moves = moved((&before, &b), (&after, &a));
                    assert_eq!(
                        moves,
                        counts(n + 1, &a)[n],
                        "S={count} N={n}→{} salt {salt}: only the newcomer's shards moved",
                        n + 1
                    );
                    assert!(moves <= (count as usize).div_ceil(n + 1));
                }
            }
        }
    }

    #[test]
    fn a_leave_moves_the_leavers_shards_and_nothing_else() {
        for count in [7u32, 100, 1024] {
            for n in 2..=8usize {
                for salt in 0..20u64 {
                    let before: Vec<i32> =
                        (0..n as i32).map(|i| 500 + 13 * i + salt as i32).collect();
                    let b = assign(salt, count, &before, &[]);
                    let after: Vec<i32> = before[1..].to_vec();
                    // The leaver's shards are free once its session is gone.
                    let holders: Vec<Option<i32>> = holding(&before, &b)
                        .into_iter()
                        .map(|h| h.filter(|&pid| pid != before[0]))
                        .collect();
                    let a = assign(salt, count, &after, &holders);
                    assert!(balanced(count, n - 1, &a), "S={count} N={}", n - 1);
                    let moves = moved((&before, &b), (&after, &a));
                    let leavers = counts(n, &b)[0];
                    assert_eq!(moves, leavers, "S={count} N={n}→{} salt {salt}", n - 1);
                }
            }
        }
    }

    #[test]
    fn from_any_holders_one_step_balances_and_the_next_moves_nothing() {
        let mut seed = 0x2545_f491;
        for round in 0..200 {
            let n = 1 + (next(&mut seed) % 9) as usize;
            let count = 1 + (next(&mut seed) % 300) as u32;
            let members: Vec<i32> = (0..n).map(|_| (next(&mut seed) % 100_000) as i32).collect();
            let mut members = members;
            members.sort_unstable();
            members.dedup();
            let n = members.len();
            let holders: Vec<Option<i32>> = (0..count)
                .map(|_| match next(&mut seed) % (n as u64 + 2) {
                    k if k as usize == n => None,
                    k if k as usize == n + 1 => Some(-1),
                    k => Some(members[k as usize]),
                })
                .collect();
            let first = assign(round, count, &members, &holders);
            assert!(balanced(count, n, &first), "round {round}");
            let second = assign(round, count, &members, &holding(&members, &first));
            assert_eq!(first, second, "round {round}: a balanced holding stays");
        }
    }

    #[test]
    fn a_member_over_its_quota_keeps_the_shards_it_weighs_most() {
        let members = [10, 20];
        // Member 10 holds all 8 shards: it keeps 4 of them, and gives up the other 4.
        let holders = vec![Some(10); 8];
        let owner = assign(3, 8, &members, &holders);
        assert_eq!(counts(2, &owner), vec![4, 4]);
        let kept: Vec<usize> = (0..8).filter(|&s| owner[s] == 0).collect();
        let mut heaviest: Vec<usize> = (0..8).collect();
        heaviest.sort_by_key(|&s| std::cmp::Reverse(weight(3, s as u32, 10)));
        heaviest.truncate(4);
        heaviest.sort_unstable();
        assert_eq!(kept, heaviest);
    }

    /// A member is killed and its shards come free; the others check one after another, each
    /// taking its targets among the free shards as it sees them then (with what those before
    /// it took). Each takes at its first check what it would have taken had it checked first,
    /// so every free shard is owned once each member has checked once.
    #[test]
    fn members_checking_one_after_another_take_every_free_shard_in_one_round() {
        let mut seed = 0x5eed_0001;
        for round in 0..200u64 {
            let n = 2 + (next(&mut seed) % 8) as usize;
            let count = 20 + (next(&mut seed) % 1000) as u32;
            let all: Vec<i32> = (0..=n).map(|i| 100 + 7 * i as i32).collect();
            let before = assign(round, count, &all, &[]);
            let killed = all[(next(&mut seed) % (n as u64 + 1)) as usize];
            let members: Vec<i32> = all.iter().copied().filter(|&p| p != killed).collect();
            let mut holders: Vec<Option<i32>> = before
                .iter()
                .map(|&m| Some(all[m]).filter(|&p| p != killed))
                .collect();
            let first = assign(round, count, &members, &holders);
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (next(&mut seed) % (i as u64 + 1)) as usize);
            }
            for &m in &order {
                let seen = assign(round, count, &members, &holders);
                for s in 0..count as usize {
                    if seen[s] == m && holders[s].is_none() {
                        holders[s] = Some(members[m]);
                    }
                }
            }
            let after: Vec<Option<usize>> = holders
                .iter()
                .map(|h| members.iter().position(|&p| Some(p) == *h))
                .collect();
            let first: Vec<Option<usize>> = first.into_iter().map(Some).collect();
            assert_eq!(
                after, first,
                "round {round}: one round took every free shard"
            );
        }
    }

    #[test]
    fn no_members_no_owners() {
        assert!(assign(1, 10, &[], &[]).is_empty());
    }
}
