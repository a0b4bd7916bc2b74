//! Flow control with Reverb's semantics (`reverb/cc/rate_limiter.h`), so
//! users moving from Reverb get the behaviour they know:
//!
//! * sampling waits until the table holds `min_size_to_sample` items;
//! * with a samples-per-insert ratio `spi`, the error
//!   `inserts * spi - samples` is kept inside `[min_diff, max_diff]`: an
//!   insert that would push it above `max_diff` waits for samples, a sample
//!   that would push it below `min_diff` waits for inserts;
//! * while the table is below `min_size_to_sample`, inserts never wait.
//!
//! This type is the pure rule over counters. The table keeps it under the
//! table mutex and waits on condition variables of that mutex, so the check
//! and the insert or selection that follows are one atomic step.

use crate::error::{Error, Result};

/// The rate limiter's configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimiterConfig {
    /// Samples allowed per insert (Reverb's `samples_per_insert`).
    pub samples_per_insert: f64,
    /// Items the table must hold before any sample.
    pub min_size_to_sample: u64,
    /// Lower bound of `inserts * spi - samples`.
    pub min_diff: f64,
    /// Upper bound of `inserts * spi - samples`.
    pub max_diff: f64,
}

impl Default for RateLimiterConfig {
    /// Sample as soon as one item exists, never block inserts.
    fn default() -> Self {
        RateLimiterConfig::min_size(1)
    }
}

impl RateLimiterConfig {
    /// Only a minimum size; no ratio (Reverb's `MinSize`).
    pub fn min_size(min_size_to_sample: u64) -> Self {
        RateLimiterConfig {
            samples_per_insert: 1.0,
            min_size_to_sample,
            min_diff: f64::NEG_INFINITY,
            max_diff: f64::INFINITY,
        }
    }

    /// A samples-per-insert ratio held within `error_buffer` of its target
    /// (Reverb's `SampleToInsertRatio`): the range is
    /// `min_size * spi ± error_buffer`.
    pub fn sample_to_insert_ratio(samples_per_insert: f64, min_size_to_sample: u64, error_buffer: f64) -> Result<Self> {
        let centre = min_size_to_sample as f64 * samples_per_insert;
        RateLimiterConfig {
            samples_per_insert,
            min_size_to_sample,
            min_diff: centre - error_buffer,
            max_diff: centre + error_buffer,
        }
        .validated()
    }

    /// A queue of `size` items: every item sampled exactly once (pair with
    /// FIFO selection and `max_times_sampled = 1`), writers wait when full.
    /// A queue cannot deadlock (each insert and each sample moves the
    /// error by exactly one), so only `size >= 1` is required.
    pub fn queue(size: u64) -> Result<Self> {
        if size == 0 {
            return Err(Error::Config("queue size must be at least 1".into()));
        }
        Ok(RateLimiterConfig { samples_per_insert: 1.0, min_size_to_sample: 1, min_diff: 0.0, max_diff: size as f64 })
    }

    /// Checks the configuration and refuses one that can deadlock: a range
    /// narrower than `2 * max(1, spi)` (one insert or sample could jump
    /// over it) or whose lower bound lies above `min_size * spi` (samples
    /// would wait forever once inserts stop at the minimum size).
    pub fn validated(self) -> Result<Self> {
        let RateLimiterConfig { samples_per_insert: spi, min_size_to_sample, min_diff, max_diff } = self;
        if !(spi.is_finite() && spi > 0.0) {
            return Err(Error::Config(format!("samples_per_insert must be finite and positive, got {spi}")));
        }
        if min_diff.is_nan() || max_diff.is_nan() || min_diff > max_diff {
            return Err(Error::Config(format!("rate limiter range [{min_diff}, {max_diff}] is empty")));
        }
        let width = max_diff - min_diff;
        if width < 2.0 * spi.max(1.0) {
            return Err(Error::Config(format!(
                "rate limiter range [{min_diff}, {max_diff}] is narrower than 2 * max(1, samples_per_insert) = {} \
                 and can deadlock",
                2.0 * spi.max(1.0)
            )));
        }
        let floor = min_size_to_sample as f64 * spi;
        if min_diff > floor {
            return Err(Error::Config(format!(
                "rate limiter min_diff {min_diff} is above min_size_to_sample * samples_per_insert = {floor} \
                 and can deadlock"
            )));
        }
        Ok(self)
    }
}

/// Counters the rule reads, and the rule.
#[derive(Clone, Debug, Default)]
pub(crate) struct RateLimiter {
    pub(crate) config: RateLimiterConfig,
    /// Committed inserts since creation.
    pub(crate) inserts: u64,
    /// Items drawn since creation (each row of a batch counts once).
    pub(crate) samples: u64,
}

impl RateLimiter {
    pub(crate) fn new(config: RateLimiterConfig) -> Self {
        RateLimiter { config, inserts: 0, samples: 0 }
    }

    pub(crate) fn error(&self) -> f64 {
        self.inserts as f64 * self.config.samples_per_insert - self.samples as f64
    }

    /// Whether one more insert may happen now, with `size` items stored.
    pub(crate) fn can_insert(&self, size: u64) -> bool {
        if size < self.config.min_size_to_sample {
            return true;
        }
        (self.inserts + 1) as f64 * self.config.samples_per_insert - self.samples as f64 <= self.config.max_diff
    }

    /// Whether `n` more samples may happen now, with `size` items stored.
    pub(crate) fn can_sample(&self, size: u64, n: u64) -> bool {
        if size == 0 || size < self.config.min_size_to_sample {
            return false;
        }
        self.error() - n as f64 >= self.config.min_diff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlocking_ranges_are_refused() {
        let e = RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 3.0).unwrap_err().to_string();
        assert!(e.contains("narrower"), "{e}");
        assert!(RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 4.0).is_ok());
        let above = RateLimiterConfig { samples_per_insert: 1.0, min_size_to_sample: 2, min_diff: 5.0, max_diff: 50.0 };
        assert!(above.validated().unwrap_err().to_string().contains("above"));
        assert!(RateLimiterConfig::queue(1).is_ok());
        assert!(RateLimiterConfig::queue(0).is_err());
        let bad = RateLimiterConfig { samples_per_insert: f64::NAN, ..Default::default() };
        assert!(bad.validated().is_err());
    }

    #[test]
    fn ratio_rule_matches_reverb() {
        let mut rl = RateLimiter::new(RateLimiterConfig::sample_to_insert_ratio(2.0, 1, 4.0).unwrap());
        // Range [2-4, 2+4] = [-2, 6]. Below min size inserts are free.
        assert!(rl.can_insert(0));
        assert!(!rl.can_sample(0, 1));
        rl.inserts = 3; // error 6
        assert!(!rl.can_insert(3), "a fourth insert would make the error 8 > 6");
        assert!(rl.can_sample(3, 8), "6 - 8 = -2 >= -2");
        assert!(!rl.can_sample(3, 9));
        rl.samples = 4; // error 2
        assert!(rl.can_insert(3));
    }

    #[test]
    fn queue_samples_each_item_once() {
        let mut rl = RateLimiter::new(RateLimiterConfig::queue(2).unwrap());
        assert!(rl.can_insert(0));
        rl.inserts = 2;
        assert!(!rl.can_insert(2), "full queue blocks writers");
        assert!(rl.can_sample(2, 2));
        assert!(!rl.can_sample(2, 3));
        rl.samples = 2;
        assert!(!rl.can_sample(2, 1), "every item already taken");
        assert!(rl.can_insert(0));
    }
}
