//! Importance weights of a cross-shard batch, at most 1 by construction.
//!
//! One table gives row `i` the weight `(P_min / P_i)^beta`, `P_min` the
//! smallest probability of any stored item, so no weight exceeds 1. Across
//! shards the client knows `P_min` only from the shards' reports, and a
//! report may be older than a row's probability: another client that
//! lowers priorities between two batches makes a row's fresh probability
//! smaller than the cached `P_min` (weights of 2.5 and 50 were seen), and
//! a shard's masses are read just after its draw, not with it.
//!
//! The rule here: the normaliser is the smallest of
//! - each shard's smallest probability from its freshest report: for a
//!   shard drawn from in this batch, its reply's `min_mass / total_mass`
//!   (read just after the draw) scaled by the shard's share of the split;
//!   for the others, their last report's `min_mass` over the split's total;
//! - and every row's probability in this batch.
//!
//! So `P_norm <= P_i` for every row and each weight `(P_norm / P_i)^beta`
//! is at most 1 exactly (IEEE division of a number by a larger or equal
//! one is at most 1, and so is its power for `beta >= 0`). When nothing
//! changed between the reports and the draw the normaliser is one table's
//! `P_min` and every weight is one table's (tests/cross_shard.rs).

/// The normaliser of one batch's weights (module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WeightNorm {
    smallest: f64,
}

impl Default for WeightNorm {
    fn default() -> Self {
        WeightNorm { smallest: f64::INFINITY }
    }
}

impl WeightNorm {
    /// Counts a shard's smallest global probability, as reported.
    /// Non-finite or non-positive values (an empty shard, a broken
    /// report) are ignored.
    pub(crate) fn smallest_probability(&mut self, p: f64) {
        if p.is_finite() && p > 0.0 {
            self.smallest = self.smallest.min(p);
        }
    }

    /// Counts a row's global probability.
    pub(crate) fn row(&mut self, p: f64) {
        self.smallest_probability(p);
    }

    /// The weight of a row of probability `p` (counted with
    /// [`WeightNorm::row`]): `(P_norm / p)^beta`, in (0, 1].
    pub(crate) fn weight(&self, p: f64, beta: f64) -> f64 {
        if beta == 0.0 || p.is_nan() || p <= 0.0 || !self.smallest.is_finite() {
            return 1.0;
        }
        (self.smallest.min(p) / p).powf(beta).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_weight_exceeds_one(
            reported in prop::collection::vec(-1.0f64..1.0, 0..4),
            rows in prop::collection::vec(1e-300f64..1.0, 1..16),
            beta in 0.0f64..4.0,
        ) {
            let mut norm = WeightNorm::default();
            for p in reported {
                norm.smallest_probability(p);
            }
            for &p in &rows {
                norm.row(p);
            }
            for &p in &rows {
                let w = norm.weight(p, beta);
                prop_assert!(w > 0.0 && w <= 1.0, "p {p}: weight {w}");
            }
        }
    }

    #[test]
    fn a_stale_report_larger_than_a_row_gives_way_to_the_row() {
        let mut norm = WeightNorm::default();
        // The cached smallest probability is 2e-3; a row drawn after its
        // priority was lowered has 1e-4.
        norm.smallest_probability(2e-3);
        for p in [1e-4, 3e-3] {
            norm.row(p);
        }
        assert_eq!(norm.weight(1e-4, 1.0), 1.0);
        assert!((norm.weight(3e-3, 1.0) - 1e-4 / 3e-3).abs() < 1e-15);
        // Consistent reports: one table's weights.
        let mut exact = WeightNorm::default();
        exact.smallest_probability(0.01);
        exact.row(0.04);
        assert_eq!(exact.weight(0.04, 0.5), 0.5);
    }
}
