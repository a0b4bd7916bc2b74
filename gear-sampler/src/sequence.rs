//! The priority of a whole sequence from its per-step TD errors, as in
//! R2D2 (Kapturowski et al., "Recurrent Experience Replay in Distributed
//! Reinforcement Learning", ICLR 2019, section 2) and SEED RL (Espeholt et
//! al., ICLR 2020): `p = eta * max_t |d_t| + (1 - eta) * mean_t |d_t|`.
//! A pure max over-weights single outliers and a pure mean washes out rare
//! large errors in long sequences; `eta = 0.9` mixes them.

/// The `eta` of R2D2 and SEED RL.
pub const DEFAULT_ETA: f64 = 0.9;

/// `eta * max|d| + (1 - eta) * mean|d|` over `td_errors` (`f32` or `f64`,
/// accumulated in `f64`).
///
/// * An empty sequence has priority 0 (no error to learn from), which
///   prioritized replay never draws while other items have mass.
/// * A NaN error gives NaN and an infinite one gives infinity, which
///   [`gear_core::check_priority`] (and every strategy) refuses, so a
///   diverged loss cannot enter the tree silently.
/// * `eta` is expected in `[0, 1]`; outside it the result is still the
///   formula's value, which may be negative (and then refused likewise).
pub fn sequence_priority<T: Copy + Into<f64>>(td_errors: &[T], eta: f64) -> f64 {
    if td_errors.is_empty() {
        return 0.0;
    }
    let mut sum = 0.0f64;
    let mut max = 0.0f64;
    for &d in td_errors {
        let a = d.into().abs();
        sum += a;
        max = max.max(a);
    }
    // f64::max ignores NaN, but the sum keeps it (and keeps infinities).
    if !sum.is_finite() {
        return sum;
    }
    let mean = sum / td_errors.len() as f64;
    eta * max + (1.0 - eta) * mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_max_and_mean() {
        let d = [1.0f32, -3.0, 2.0];
        // max 3, mean 2
        assert!((sequence_priority(&d, DEFAULT_ETA) - (0.9 * 3.0 + 0.1 * 2.0)).abs() < 1e-12);
        assert_eq!(sequence_priority(&d, 1.0), 3.0);
        assert_eq!(sequence_priority(&d, 0.0), 2.0);
        assert_eq!(sequence_priority(&[-0.5f64], 0.3), 0.5);
    }

    #[test]
    fn empty_is_zero_and_bad_values_propagate() {
        assert_eq!(sequence_priority::<f32>(&[], DEFAULT_ETA), 0.0);
        assert!(sequence_priority(&[1.0, f64::NAN], DEFAULT_ETA).is_nan());
        assert!(sequence_priority(&[f64::NAN, 1.0], 1.0).is_nan());
        assert_eq!(sequence_priority(&[1.0, f64::NEG_INFINITY], 1.0), f64::INFINITY);
        assert!(gear_core::check_priority(sequence_priority(&[f32::NAN], 0.9)).is_err());
    }
}
