//! A member's ledger of its shards: for each, whether this member owns it, drains it before
//! its unlock or has neither, and whether the assignment makes it this member's. Plain state,
//! no I/O: the member ([`super::serve`]) asks it what to do, does the statements, and tells
//! it what happened.
//!
//! # Invariants
//!
//! - A shard is in exactly one of [`Hold::Free`], [`Hold::Owned`], [`Hold::Draining`]: never
//!   owned and draining at once. Only [`Ledger::gain`] makes a shard owned (from free), only
//!   [`Ledger::start_draining`] makes it draining (from owned), and [`Ledger::unlocked`] (a
//!   draining one), [`Ledger::renew_or_lose`] and [`Ledger::lose_owned`] (an owned one) and
//!   [`Ledger::end_all`] (either) free it.
//! - A shard is tried only when it is free, this member's target, and not held by the session
//!   (a held one without a term is adopted instead, [`Ledger::strays`]).
//! - A draining shard is neither tried nor adopted nor unlocked as a stray: its drain's end
//!   unlocks it, and until then it stays this member's to count.
//! - Each shard given up is counted once: a draining shard counts when its unlock answers or
//!   when every term ends, whichever comes first, and an owned one when its term ends.

/// Whether this member holds a shard, and with which purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Hold {
    /// No live term, nothing to drain: the session holds its lock only as a stray, if at all.
    #[default]
    Free,
    /// Its term is live on this member.
    Owned,
    /// Its term ended because it moved to another member; its work drains before the unlock.
    Draining,
}

/// One shard in the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Shard {
    hold: Hold,
    /// The assignment of the last member list makes it this member's.
    target: bool,
}

/// Every shard of the group, by index, as this member sees them.
#[derive(Debug)]
pub(super) struct Ledger {
    shards: Vec<Shard>,
}

/// What a check's list of held shards means for the owned ones.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Renewal {
    /// Owned and still held: their leases are renewed.
    pub(super) renew: Vec<usize>,
    /// Owned but no longer held: their terms ended, and the ledger freed them.
    pub(super) lost: Vec<usize>,
}

/// Locks the session holds without a term.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Strays {
    /// This member's targets: their terms start.
    pub(super) adopt: Vec<u32>,
    /// The others': they are unlocked.
    pub(super) unlock: Vec<u32>,
}

/// What [`Ledger::end_all`] ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Ended {
    /// The shards whose terms were live.
    pub(super) owned: Vec<usize>,
    /// How many moved shards were still draining.
    pub(super) draining: usize,
}

impl Ended {
    /// How many shards this member gave up: the owned and the draining alike, so that the
    /// moves counter adds up to the owned gauge.
    pub(super) fn count(&self) -> usize {
        self.owned.len() + self.draining
    }
}

impl Ledger {
    /// `count` shards, all free, none this member's.
    pub(super) fn new(count: usize) -> Self {
        Self {
            shards: vec![Shard::default(); count],
        }
    }

    /// Takes the targets of a new member list; returns how many shards are this member's.
    pub(super) fn retarget(&mut self, targets: impl IntoIterator<Item = bool>) -> usize {
        for (shard, target) in self.shards.iter_mut().zip(targets) {
            shard.target = target;
        }
        self.shards.iter().filter(|s| s.target).count()
    }

    /// Which shards the check's `held` (their indices; out of range ones ignored) lists, by
    /// index.
    pub(super) fn held(&self, held: &[u32]) -> Vec<bool> {
        let mut out = vec![false; self.shards.len()];
        for &s in held {
            if let Some(h) = out.get_mut(s as usize) {
                *h = true;
            }
        }
        out
    }

    /// Splits the owned shards by whether the session still holds them (`held`, by index),
    /// and frees the ones it no longer holds.
    pub(super) fn renew_or_lose(&mut self, held: &[bool]) -> Renewal {
        let mut renewal = Renewal::default();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            if shard.hold != Hold::Owned {
                continue;
            }
            if held.get(i).copied().unwrap_or(false) {
                renewal.renew.push(i);
            } else {
                shard.hold = Hold::Free;
                renewal.lost.push(i);
            }
        }
        renewal
    }

    /// The owned shards that are no longer this member's target, now draining.
    pub(super) fn start_draining(&mut self) -> Vec<usize> {
        let mut moved = Vec::new();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            if shard.hold == Hold::Owned && !shard.target {
                shard.hold = Hold::Draining;
                moved.push(i);
            }
        }
        moved
    }

    /// The locks the session holds (`held`, by index) without a term: free shards, adopted
    /// when this member's, unlocked otherwise.
    pub(super) fn strays(&self, held: &[bool]) -> Strays {
        let mut strays = Strays::default();
        for (i, shard) in self.shards.iter().enumerate() {
            if !held.get(i).copied().unwrap_or(false) || shard.hold != Hold::Free {
                continue;
            }
            if shard.target {
                strays.adopt.push(i as u32);
            } else {
                strays.unlock.push(i as u32);
            }
        }
        strays
    }

    /// The shards to try: free, this member's, and not held by the session (`held`).
    pub(super) fn to_try(&self, held: &[bool]) -> Vec<i32> {
        (0..self.shards.len())
            .filter(|&i| {
                let shard = self.shards[i];
                shard.hold == Hold::Free && shard.target && !held.get(i).copied().unwrap_or(false)
            })
            .map(|i| i as i32)
            .collect()
    }

    /// Shard `index`'s term started. Returns `false`, changing nothing, when it was not free.
    pub(super) fn gain(&mut self, index: usize) -> bool {
        let shard = &mut self.shards[index];
        if shard.hold != Hold::Free {
            return false;
        }
        shard.hold = Hold::Owned;
        true
    }

    /// The moved shard `index` was unlocked after its drain. Returns whether it was draining,
    /// that is whether this is the one time it counts as moved.
    pub(super) fn unlocked(&mut self, index: usize) -> bool {
        let shard = &mut self.shards[index];
        if shard.hold != Hold::Draining {
            return false;
        }
        shard.hold = Hold::Free;
        true
    }

    /// The shards owned or draining: those a leave waits for.
    pub(super) fn owned_or_draining(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|&i| self.shards[i].hold != Hold::Free)
            .collect()
    }

    /// Frees every owned shard (a leave ends their terms first); returns them. The draining
    /// ones stay draining.
    pub(super) fn lose_owned(&mut self) -> Vec<usize> {
        let mut owned = Vec::new();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            if shard.hold == Hold::Owned {
                shard.hold = Hold::Free;
                owned.push(i);
            }
        }
        owned
    }

    /// Frees every shard: the session is gone or the member leaves.
    pub(super) fn end_all(&mut self) -> Ended {
        let mut ended = Ended::default();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            match std::mem::take(&mut shard.hold) {
                Hold::Owned => ended.owned.push(i),
                Hold::Draining => ended.draining += 1,
                Hold::Free => {}
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(targets: &[bool]) -> Ledger {
        let mut ledger = Ledger::new(targets.len());
        ledger.retarget(targets.iter().copied());
        ledger
    }

    fn holds(ledger: &Ledger) -> Vec<Hold> {
        ledger.shards.iter().map(|s| s.hold).collect()
    }

    fn hold(ledger: &Ledger, index: usize) -> Hold {
        ledger.shards[index].hold
    }

    /// How many shards are owned and how many draining.
    fn counts(ledger: &Ledger) -> (usize, usize) {
        let holds = holds(ledger);
        let count = |hold| holds.iter().filter(|&&h| h == hold).count();
        (count(Hold::Owned), count(Hold::Draining))
    }

    #[test]
    fn a_new_ledger_is_free_and_tries_its_targets() {
        let ledger = ledger(&[true, false, true]);
        assert_eq!(holds(&ledger), vec![Hold::Free; 3]);
        assert_eq!(ledger.to_try(&[false; 3]), vec![0, 2]);
        assert_eq!(counts(&ledger), (0, 0));
    }

    #[test]
    fn held_ignores_out_of_range_shards() {
        let ledger = Ledger::new(3);
        assert_eq!(ledger.held(&[2, 0, 7]), vec![true, false, true]);
    }

    #[test]
    fn retarget_counts_the_share() {
        let mut ledger = Ledger::new(4);
        assert_eq!(ledger.retarget([true, false, true, true]), 3);
        assert_eq!(ledger.retarget([false; 4]), 0);
    }

    #[test]
    fn only_a_free_target_not_held_is_tried() {
        let mut ledger = ledger(&[true, true, true, false]);
        assert!(ledger.gain(0));
        assert!(ledger.gain(1));
        ledger.retarget([false, true, true, false]);
        assert_eq!(ledger.start_draining(), vec![0]);
        // 0 draining, 1 owned, 2 held as a stray, 3 not this member's.
        assert_eq!(ledger.to_try(&[true, true, true, false]), Vec::<i32>::new());
        assert_eq!(ledger.to_try(&[true, true, false, false]), vec![2]);
        // A draining shard that becomes this member's again is still not tried before its
        // unlock.
        ledger.retarget([true, true, true, true]);
        assert_eq!(ledger.to_try(&[false; 4]), vec![2, 3]);
    }

    #[test]
    fn gain_takes_only_a_free_shard() {
        let mut ledger = ledger(&[true, true]);
        assert!(ledger.gain(0));
        assert!(!ledger.gain(0), "an owned shard is not gained twice");
        ledger.retarget([false, true]);
        ledger.start_draining();
        assert!(!ledger.gain(0), "a draining shard is not gained");
        assert_eq!(hold(&ledger, 0), Hold::Draining);
    }

    #[test]
    fn no_shard_is_both_owned_and_draining() {
        let mut ledger = ledger(&[true, true, true]);
        for i in 0..3 {
            ledger.gain(i);
        }
        ledger.retarget([false, true, false]);
        assert_eq!(ledger.start_draining(), vec![0, 2]);
        assert_eq!(
            holds(&ledger),
            vec![Hold::Draining, Hold::Owned, Hold::Draining]
        );
        assert_eq!(counts(&ledger), (1, 2));
        // A second pass drains nothing new.
        assert_eq!(ledger.start_draining(), Vec::<usize>::new());
    }

    #[test]
    fn a_check_that_no_longer_lists_an_owned_shard_frees_it() {
        let mut ledger = ledger(&[true, true, true]);
        ledger.gain(0);
        ledger.gain(1);
        let renewal = ledger.renew_or_lose(&[true, false, true]);
        assert_eq!(renewal.renew, vec![0]);
        assert_eq!(renewal.lost, vec![1]);
        assert_eq!(holds(&ledger), vec![Hold::Owned, Hold::Free, Hold::Free]);
        // The lost shard is this member's and not held: tried again.
        assert_eq!(ledger.to_try(&[true, false, true]), vec![1]);
    }

    #[test]
    fn renew_or_lose_leaves_draining_shards_alone() {
        let mut ledger = ledger(&[true]);
        ledger.gain(0);
        ledger.retarget([false]);
        ledger.start_draining();
        assert_eq!(ledger.renew_or_lose(&[false]), Renewal::default());
        assert_eq!(hold(&ledger, 0), Hold::Draining);
    }

    #[test]
    fn strays_are_adopted_when_targets_and_unlocked_otherwise() {
        let mut ledger = ledger(&[true, false, true, false]);
        ledger.gain(2);
        ledger.gain(0);
        ledger.retarget([true, false, false, false]);
        ledger.start_draining(); // 2 draining
        let strays = ledger.strays(&[true, true, true, false]);
        // 0 is owned, 2 draining: neither is a stray.
        assert_eq!(strays.adopt, Vec::<u32>::new());
        assert_eq!(strays.unlock, vec![1]);
        ledger.retarget([true, true, true, true]);
        let strays = ledger.strays(&[false, true, true, true]);
        assert_eq!(strays.adopt, vec![1, 3]);
        assert!(strays.unlock.is_empty());
    }

    #[test]
    fn a_move_is_counted_once() {
        let mut ledger = ledger(&[true, true]);
        ledger.gain(0);
        ledger.gain(1);
        ledger.retarget([false, false]);
        assert_eq!(ledger.start_draining(), vec![0, 1]);
        assert!(ledger.unlocked(0));
        assert!(!ledger.unlocked(0), "a second unlock does not count again");
        // The session is lost before 1's unlock: it counts with the rest, once.
        let ended = ledger.end_all();
        assert_eq!(
            ended,
            Ended {
                owned: vec![],
                draining: 1
            }
        );
        assert_eq!(ended.count(), 1);
        assert!(
            !ledger.unlocked(1),
            "an unlock after every term ended counts nothing"
        );
        assert_eq!(ledger.end_all().count(), 0);
    }

    #[test]
    fn end_all_frees_every_shard_and_keeps_the_targets() {
        let mut ledger = ledger(&[true, true, false]);
        ledger.gain(0);
        ledger.gain(1);
        ledger.retarget([true, false, false]);
        ledger.start_draining();
        let ended = ledger.end_all();
        assert_eq!(ended.owned, vec![0]);
        assert_eq!(ended.draining, 1);
        assert_eq!(ended.count(), 2);
        assert_eq!(holds(&ledger), vec![Hold::Free; 3]);
        assert_eq!(ledger.to_try(&[false; 3]), vec![0]);
    }

    #[test]
    fn a_leave_ends_the_owned_terms_and_then_the_drains() {
        let mut ledger = ledger(&[true, true, false]);
        ledger.gain(0);
        ledger.gain(1);
        ledger.retarget([true, false, false]);
        ledger.start_draining();
        assert_eq!(ledger.owned_or_draining(), vec![0, 1]);
        assert_eq!(ledger.lose_owned(), vec![0]);
        assert_eq!(hold(&ledger, 1), Hold::Draining);
        assert_eq!(
            ledger.end_all(),
            Ended {
                owned: vec![],
                draining: 1
            }
        );
    }

    /// Random rounds of a member's life: every shard gained is given up once (lost, moved or
    /// ended), and what the ledger asks to try or adopt is always free.
    #[test]
    fn random_rounds_count_every_shard_once() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut ledger = Ledger::new(8);
        let (mut gained, mut given_up) = (0, 0);
        for _ in 0..10_000 {
            let held: Vec<bool> = (0..8).map(|_| next(2) == 0).collect();
            match next(6) {
                0 => {
                    ledger.retarget((0..8).map(|_| next(2) == 0));
                }
                1 => given_up += ledger.renew_or_lose(&held).lost.len(),
                2 => {
                    ledger.start_draining();
                }
                3 => {
                    let mut want: Vec<usize> =
                        ledger.to_try(&held).iter().map(|&i| i as usize).collect();
                    want.extend(ledger.strays(&held).adopt.iter().map(|&i| i as usize));
                    for i in want {
                        assert_eq!(hold(&ledger, i), Hold::Free);
                        if ledger.gain(i) {
                            gained += 1;
                        }
                    }
                }
                4 => {
                    let i = next(8) as usize;
                    if ledger.unlocked(i) {
                        given_up += 1;
                    }
                }
                _ => {
                    if next(10) == 0 {
                        given_up += ledger.end_all().count();
                    }
                }
            }
            let (owned, draining) = counts(&ledger);
            assert_eq!(gained, given_up + owned + draining);
        }
    }
}
