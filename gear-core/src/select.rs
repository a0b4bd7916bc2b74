//! The selection-strategy trait: which stored trajectories a trainer gets.
//!
//! A table keeps two strategies: the *sampler* (what trainers draw) and the
//! *remover* (which committed trajectory is evicted when the table is full).
//! Both see every insert, priority update and removal. The trait is
//! object-safe so downstream crates can implement it and hand a
//! `Box<dyn Selector>` to the builder.

use crate::error::Result;
use crate::rng::RandomSource;
use crate::slot::SlotKey;

/// One draw of a strategy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The trajectory drawn.
    pub key: SlotKey,
    /// The probability with which it was drawn (1.0 for deterministic
    /// strategies, which pick rather than draw).
    pub probability: f64,
    /// Importance-sampling weight, normalised so the largest possible weight
    /// is 1 (1.0 where the strategy does not correct for bias).
    pub weight: f64,
}

/// The probability mass of a random strategy's items: what a sampler that
/// spreads one batch over several shards weighs each shard by, and what
/// global importance weights are normalised with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SelectionMass {
    /// Sum of the items' masses (`p^alpha` for prioritized, 1 per item for
    /// uniform): an item's probability is its mass over this total.
    pub total: f64,
    /// The smallest positive mass held (1 for uniform), which gives the
    /// largest importance weight.
    pub min: f64,
}

/// A selection strategy over the committed trajectories of one table.
///
/// Contract (checked by the conformance tests in `tests`):
/// * keys passed to `update`/`remove` were inserted and not yet removed;
///   a strategy returns an error for unknown keys and never panics;
/// * `sample` appends exactly `n` draws when `len() > 0` and returns
///   [`crate::Error::Empty`] when there is nothing to draw. Random
///   strategies draw with replacement; deterministic strategies (FIFO,
///   LIFO, heaps) return their items in order, distinct while they last,
///   then start again from the first;
/// * priorities are finite and non-negative (the table validates them
///   before calling; strategies may check again).
///
/// A strategy is `Sync` because a table lets several threads of one
/// process draw from it at once through [`Selector::sample_shared`].
pub trait Selector: Send + Sync {
    /// A short name for logs and benchmark output.
    fn name(&self) -> &str;

    /// Called once by the table before any other call, with the table's
    /// capacity (slots are `< capacity`), so strategies can size dense
    /// arrays.
    fn prepare(&mut self, capacity: u64) -> Result<()> {
        let _ = capacity;
        Ok(())
    }

    /// Adds a committed trajectory. `priority` is `None` when the writer
    /// gave none; the strategy chooses one (prioritized replay uses the
    /// largest seen so far) and returns the priority it recorded.
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64>;

    /// Changes the priority of a stored trajectory.
    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()>;

    /// Removes a trajectory (evicted or consumed).
    fn remove(&mut self, key: SlotKey) -> Result<()>;

    /// Number of trajectories held.
    fn len(&self) -> usize;

    /// Whether nothing is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `n` draws to `out`.
    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()>;

    /// Draws as [`Selector::sample`] does, through a shared reference, so
    /// several threads can draw at once. Strategies whose draws change no
    /// state of their own (random ones: uniform, prioritized) return
    /// `Some` with what `sample` would have done; the default, `None`,
    /// tells the table to call `sample` under its exclusive lock instead
    /// (deterministic strategies advance a cursor as they pick). A strategy
    /// answers alike for every call: the table asks once, with `n = 0`,
    /// when it opens.
    fn sample_shared(&self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Option<Result<()>> {
        let _ = (n, rng, out);
        None
    }

    /// The mass of the items held, for random strategies whose draws are
    /// proportional to a per-item mass; `None` (the default) for
    /// strategies that pick deterministically, which cannot be spread over
    /// shards by mass.
    fn mass(&self) -> Option<SelectionMass> {
        None
    }
}

impl<S: Selector + ?Sized> Selector for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn prepare(&mut self, capacity: u64) -> Result<()> {
        (**self).prepare(capacity)
    }
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
        (**self).insert(key, priority)
    }
    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
        (**self).update(key, priority)
    }
    fn remove(&mut self, key: SlotKey) -> Result<()> {
        (**self).remove(key)
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
        (**self).sample(n, rng, out)
    }
    fn sample_shared(&self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Option<Result<()>> {
        (**self).sample_shared(n, rng, out)
    }
    fn mass(&self) -> Option<SelectionMass> {
        (**self).mass()
    }
}

/// Checks that a priority is finite and non-negative.
pub fn check_priority(p: f64) -> Result<f64> {
    if p.is_finite() && p >= 0.0 {
        Ok(p)
    } else {
        Err(crate::Error::InvalidPriority(p))
    }
}
