//! Small seeded PRNGs with no dependency: [`Rng`] (SplitMix64), whose draws a seed fixes (the
//! soak's faults, the database failover's phases), [`time_seed`] for a run that gives none,
//! and [`xorshift`], for jitter that only needs to differ between runs.

/// SplitMix64: fast, 64 bits of state, good enough to pick faults.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose draws are fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A seed from the clock, for runs that do not give one: six decimal digits of mixed bits,
/// short enough to type when replaying a run with `--seed`.
pub fn time_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    Rng::new(nanos ^ u64::from(std::process::id())).next_u64() % 1_000_000
}

/// The next number of a xorshift64 sequence whose state is `seed` (not 0).
pub fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}
