//! Which member should own which shard: the same answer on every member that sees the same
//! member list, balanced, and moving few shards when a member joins or leaves.
//!
//! Rendezvous hashing with a quota: every (shard, member) pair gets a weight from a hash of
//! the group, the shard and the member; the pairs are taken in order of weight, and a shard
//! goes to the first member of its pairs that still has room. Each member's quota is ⌊S/N⌋,
//! and ⌈S/N⌉ for S mod N of them (chosen by a hash too, not by age). A join takes from every
//! member about its share of the newcomer's quota; a leave gives the leaver's shards to the
//! others. Pure: unit-tested here on fixed member lists.

/// The most shards a group may have: the assignment sorts S·N weights when the member list
/// changes, and every owned shard takes a slot of the server's shared lock table.
pub(crate) const MAX_SHARDS: u32 = 16_384;

/// The target owner of every shard, as an index into `members` (the members' lock session
/// pids, in any order); empty without members.
pub(crate) fn assign(salt: u64, count: u32, members: &[i32]) -> Vec<usize> {
    if members.is_empty() {
        return Vec::new();
    }
    let n = members.len();
    let quota = quotas(salt, count, members);
    let mut left = quota;
    let mut pairs: Vec<(u64, u32, u32)> = Vec::with_capacity(count as usize * n);
    for shard in 0..count {
        for (m, &pid) in members.iter().enumerate() {
            pairs.push((weight(salt, shard, pid), shard, m as u32));
        }
    }
    // Heaviest first; ties (vanishingly rare) by shard, then by pid, so every member agrees.
    pairs.sort_unstable_by(|a, b| {
        b.0.cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(members[a.2 as usize].cmp(&members[b.2 as usize]))
    });
    let mut owner = vec![usize::MAX; count as usize];
    let mut unassigned = count;
    for (_, shard, m) in pairs {
        let (shard, m) = (shard as usize, m as usize);
        if owner[shard] == usize::MAX && left[m] > 0 {
            owner[shard] = m;
            left[m] -= 1;
            unassigned -= 1;
            if unassigned == 0 {
                break;
            }
        }
    }
    owner
}

/// Each member's number of shards: ⌊S/N⌋, plus one for the S mod N members whose hash of the
/// group ranks first.
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

    #[test]
    fn every_member_gets_the_floor_or_the_ceiling_of_its_share() {
        for count in [1, 2, 7, 32, 100, 1024] {
            for n in 1..=9usize {
                let members: Vec<i32> = (0..n as i32).map(|i| 1000 + 37 * i).collect();
                let owner = assign(7, count, &members);
                assert_eq!(owner.len(), count as usize);
                let c = counts(n, &owner);
                let (lo, hi) = (count as usize / n, (count as usize).div_ceil(n));
                assert!(
                    c.iter().all(|&k| k == lo || k == hi),
                    "S={count} N={n}: {c:?}"
                );
                assert_eq!(c.iter().sum::<usize>(), count as usize);
            }
        }
    }

    #[test]
    fn every_member_computes_the_same_owners_whatever_its_list_order() {
        let members = [4411, 17, 902, 3, 65000];
        let reversed: Vec<i32> = members.iter().rev().copied().collect();
        let a = assign(99, 1024, &members);
        let b = assign(99, 1024, &reversed);
        for shard in 0..1024 {
            assert_eq!(members[a[shard]], reversed[b[shard]], "shard {shard}");
        }
    }

    #[test]
    fn a_join_moves_at_most_a_fair_share_and_five_percent() {
        let count = 1024u32;
        for n in 1..=8usize {
            for salt in 0..20u64 {
                let before: Vec<i32> = (0..n as i32).map(|i| 200 + 11 * i + salt as i32).collect();
                let mut after = before.clone();
                after.push(90_000 + salt as i32);
                let (b, a) = (assign(salt, count, &before), assign(salt, count, &after));
                let moves = moved((&before, &b), (&after, &a));
                let bound = (count as usize).div_ceil(n + 1) + count as usize / 20;
                assert!(
                    moves <= bound,
                    "N={n}→{} salt {salt}: {moves} moved, bound {bound}",
                    n + 1
                );
            }
        }
    }

    #[test]
    fn a_leave_moves_the_leavers_shards_and_few_others() {
        let count = 1024u32;
        for n in 2..=8usize {
            for salt in 0..20u64 {
                let before: Vec<i32> = (0..n as i32).map(|i| 500 + 13 * i + salt as i32).collect();
                let after: Vec<i32> = before[1..].to_vec();
                let (b, a) = (assign(salt, count, &before), assign(salt, count, &after));
                let moves = moved((&before, &b), (&after, &a));
                let leavers = counts(n, &b)[0];
                let bound = leavers + count as usize / 20;
                assert!(
                    moves <= bound,
                    "N={n}→{} salt {salt}: {moves} moved, the leaver had {leavers}",
                    n - 1
                );
            }
        }
    }

    #[test]
    fn no_members_no_owners() {
        assert!(assign(1, 10, &[]).is_empty());
    }
}
