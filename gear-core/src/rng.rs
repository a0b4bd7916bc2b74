//! Seeded random numbers for selection. A small generator of our own keeps
//! gear-core free of foreign crates and lets GPU kernels reproduce the same
//! streams (xoshiro256++, Blackman & Vigna 2019, seeded by splitmix64).

/// A source of uniform 64-bit random numbers, object-safe so strategies
/// from downstream crates can take it as `&mut dyn RandomSource`.
pub trait RandomSource {
    /// The next uniform `u64`.
    fn next_u64(&mut self) -> u64;

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)`; `n` must be positive
    /// (Lemire's multiply-shift, with rejection for exactness).
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// splitmix64 step, used for seeding.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256++: fast, 256-bit state, passes BigCrush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut st = seed;
        Xoshiro256 { s: [splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st)] }
    }
}

impl RandomSource for Xoshiro256 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "safe arithmetic, nothing for Miri to check; 100 000 draws take minutes under it")]
    fn deterministic_and_roughly_uniform() {
        let mut a = Xoshiro256::seed_from_u64(7);
        let mut b = Xoshiro256::seed_from_u64(7);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[a.below(10) as usize] += 1;
        }
        // 10 bins of expected 10_000: a 5-sigma band is about +-475.
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
        let f = a.next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
