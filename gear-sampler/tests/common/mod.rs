//! Helpers shared by the integration tests: statistics and small builders.

#![allow(dead_code)]

use gear_core::{Sampled, Selector, SlotKey, Xoshiro256};

/// Upper-tail standard normal quantile for p = 0.001.
pub const Z_0_001: f64 = 3.090_232_306_167_813;

/// The chi-square critical value with `df` degrees of freedom at upper-tail
/// probability p, given the normal quantile `z` of p (Wilson & Hilferty,
/// "The distribution of chi-square", PNAS 1931): `df (1 - 2/(9 df) + z
/// sqrt(2/(9 df)))^3`.
pub fn chi_square_critical(df: usize, z: f64) -> f64 {
    let k = df as f64;
    let c = 2.0 / (9.0 * k);
    k * (1.0 - c + z * c.sqrt()).powi(3)
}

/// Pearson's statistic of `counts` against `probs` (which sum to 1);
/// bins of probability 0 must be empty and are left out.
pub fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    assert_eq!(counts.len(), probs.len());
    let n: u64 = counts.iter().sum();
    let mut stat = 0.0;
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            assert_eq!(c, 0, "a bin of probability 0 was drawn");
            continue;
        }
        let e = p * n as f64;
        stat += (c as f64 - e).powi(2) / e;
    }
    stat
}

/// Degrees of freedom: bins of positive probability, less one.
pub fn degrees_of_freedom(probs: &[f64]) -> usize {
    probs.iter().filter(|&&p| p > 0.0).count() - 1
}

/// Whether `counts` fit `probs` at p = 0.001; also returns the statistic and
/// critical value for messages.
pub fn fits(counts: &[u64], probs: &[f64]) -> (bool, f64, f64) {
    let stat = chi_square(counts, probs);
    let crit = chi_square_critical(degrees_of_freedom(probs), Z_0_001);
    (stat < crit, stat, crit)
}

/// Neumaier's compensated sum (Kahan–Babuška).
pub fn exact_sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() { (s - t) + x } else { (x - t) + s };
        s = t;
    }
    s + c
}

pub fn key(slot: u32, generation: u32) -> SlotKey {
    SlotKey { slot, generation }
}

pub fn rng(seed: u64) -> Xoshiro256 {
    Xoshiro256::seed_from_u64(seed)
}

/// Draws `n` items in batches of `batch`, counting draws per slot.
pub fn count_draws(s: &mut dyn Selector, capacity: usize, n: usize, batch: usize, seed: u64) -> Vec<u64> {
    let mut r = rng(seed);
    let mut counts = vec![0u64; capacity];
    let mut out: Vec<Sampled> = Vec::with_capacity(batch);
    let mut left = n;
    while left > 0 {
        let b = left.min(batch);
        out.clear();
        s.sample(b, &mut r, &mut out).unwrap();
        assert_eq!(out.len(), b);
        for d in &out {
            counts[d.key.slot as usize] += 1;
        }
        left -= b;
    }
    counts
}
