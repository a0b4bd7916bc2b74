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

/// The rule a strategy draws by, stated so that another implementation (a
/// GPU kernel over device copies of the priorities) can draw exactly as the
/// strategy would: same rows' distribution, same probabilities and
/// importance weights. A strategy names its rule through
/// [`Selector::selection_rule`]; strategies that name none are only ever
/// run by their own code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SelectionRule {
    /// Uniform with replacement over the held items: probability `1/N`,
    /// weight 1, priorities ignored.
    Uniform,
    /// Proportional to priority: mass `m_i = p_i^alpha` for `p_i > 0` and 0
    /// for `p_i = 0`, `P(i) = m_i / sum m`, weight `(m_min / m_i)^beta` with
    /// `m_min` the smallest positive mass; with `stratified`, draw `d` of
    /// `n` comes from the `d`-th of `n` equal segments of the total. When
    /// every mass is zero the strategy draws uniformly (its own code).
    Proportional {
        /// Priority exponent.
        alpha: f64,
        /// Importance-sampling exponent.
        beta: f64,
        /// Stratified batches.
        stratified: bool,
    },
    /// The highest priorities first, distinct while they last, then again
    /// from the first; probability and weight 1.
    TopK,
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

    /// Adds many committed trajectories in order, as [`Selector::insert`]
    /// of each would: `priorities`, when given, holds one priority per key
    /// (`None`: the strategy chooses each). Appends each recorded priority
    /// to `recorded`. On an error the keys before the failing one stay
    /// inserted (`recorded` grew by that many); it and the rest are not.
    ///
    /// Strategies override it to share work across a batch (prioritized
    /// replay refreshes each sum-tree node once per batch instead of once
    /// per key); whatever they defer is done before it returns, so every
    /// later call, and every draw, sees the whole batch.
    fn insert_batch(&mut self, keys: &[SlotKey], priorities: Option<&[f64]>, recorded: &mut Vec<f64>) -> Result<()> {
        check_batch_priorities(keys, priorities)?;
        for (i, &key) in keys.iter().enumerate() {
            recorded.push(self.insert(key, priorities.and_then(|p| p.get(i).copied()))?);
        }
        Ok(())
    }

    /// Changes the priority of a stored trajectory.
    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()>;

    /// Removes a trajectory (evicted or consumed).
    fn remove(&mut self, key: SlotKey) -> Result<()>;

    /// Removes many trajectories, as [`Selector::remove`] of each in order
    /// would. On an error the keys before the failing one are removed, it
    /// and the rest are not. Strategies override it to share work across
    /// the batch (prioritized replay refreshes each sum-tree node once);
    /// whatever they defer is done before it returns.
    fn remove_batch(&mut self, keys: &[SlotKey]) -> Result<()> {
        keys.iter().try_for_each(|&key| self.remove(key))
    }

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

    /// The rule this strategy draws by, when it is one another
    /// implementation can run (see [`SelectionRule`]); asked before every
    /// batch, so a rule whose exponents change (an annealed `beta`) is
    /// followed. The default, `None`, keeps selection in the strategy's own
    /// code.
    fn selection_rule(&self) -> Option<SelectionRule> {
        None
    }

    /// Appends to `out` what a checkpoint must keep of this strategy beyond
    /// what the table keeps itself (the held keys, their priorities and
    /// their insertion order): for example the dense order a uniform draw
    /// indexes, or the largest priority seen, which decides the priority of
    /// later inserts. The default keeps nothing, which is right for a
    /// strategy that is a function of its members inserted in order (FIFO,
    /// LIFO).
    fn export_state(&self, out: &mut Vec<u8>) -> Result<()> {
        let _ = out;
        Ok(())
    }

    /// Restores what [`Selector::export_state`] wrote, from a strategy of
    /// the same [`Selector::name`]. Called after the table re-inserted the
    /// checkpoint's members in insertion order, so that afterwards the
    /// strategy draws as the exporting one did. Keys named in `state` that
    /// are not held are skipped (the checkpoint may have dropped
    /// trajectories evicted while it was written); bytes that cannot be
    /// read are an error ([`crate::Error::Decode`]), never a panic. The
    /// default accepts only the empty state the default export writes.
    fn import_state(&mut self, state: &[u8]) -> Result<()> {
        if state.is_empty() {
            Ok(())
        } else {
            Err(crate::Error::Unsupported("this strategy keeps no state across checkpoints"))
        }
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
    fn insert_batch(&mut self, keys: &[SlotKey], priorities: Option<&[f64]>, recorded: &mut Vec<f64>) -> Result<()> {
        (**self).insert_batch(keys, priorities, recorded)
    }
    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
        (**self).update(key, priority)
    }
    fn remove(&mut self, key: SlotKey) -> Result<()> {
        (**self).remove(key)
    }
    fn remove_batch(&mut self, keys: &[SlotKey]) -> Result<()> {
        (**self).remove_batch(keys)
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
    fn selection_rule(&self) -> Option<SelectionRule> {
        (**self).selection_rule()
    }
    fn export_state(&self, out: &mut Vec<u8>) -> Result<()> {
        (**self).export_state(out)
    }
    fn import_state(&mut self, state: &[u8]) -> Result<()> {
        (**self).import_state(state)
    }
    fn mass(&self) -> Option<SelectionMass> {
        (**self).mass()
    }
}

/// Checks that [`Selector::insert_batch`] got one priority per key, when
/// it got priorities.
pub fn check_batch_priorities(keys: &[SlotKey], priorities: Option<&[f64]>) -> Result<()> {
    match priorities {
        Some(p) if p.len() != keys.len() => {
            Err(crate::Error::Selection(format!("{} priorities given for a batch of {} keys", p.len(), keys.len())))
        }
        _ => Ok(()),
    }
}

/// [`Selector::insert_batch`] for strategies whose draws ignore
/// priorities (uniform, insertion order), which record the priority given
/// or 1.0: checks the priority count, then calls `insert` for each key in
/// order (it refuses a key with an error, changing nothing for it) and
/// appends the recorded priorities. The priorities are checked in one
/// branch-free pass before the loop, not per key inside it (a check per
/// key, paid twice per small insert, the sampler's and the remover's, was
/// a tenth of its instructions). On an error the keys before the failing
/// one stay inserted with their priorities recorded: a refused key, or the
/// first invalid priority (reported before its key is looked at).
pub fn insert_batch_ignoring_priorities(
    keys: &[SlotKey],
    priorities: Option<&[f64]>,
    recorded: &mut Vec<f64>,
    mut insert: impl FnMut(SlotKey) -> Result<()>,
) -> Result<()> {
    check_batch_priorities(keys, priorities)?;
    let valid = match priorities {
        Some(p) if !all_priorities_valid(p) => p.iter().position(|&p| check_priority(p).is_err()).unwrap_or(p.len()),
        _ => keys.len(),
    };
    let record = |n: usize, recorded: &mut Vec<f64>| match priorities {
        Some(p) => recorded.extend_from_slice(&p[..n]),
        None => recorded.resize(recorded.len() + n, 1.0),
    };
    for (i, &key) in keys[..valid].iter().enumerate() {
        if let Err(e) = insert(key) {
            record(i, recorded);
            return Err(e);
        }
    }
    record(valid, recorded);
    match priorities.and_then(|p| p.get(valid)) {
        Some(&bad) => check_priority(bad).map(|_| ()),
        None => Ok(()),
    }
}

/// Whether every priority is finite and non-negative, as
/// [`check_priority`] would say of each: `0 <= p <= f64::MAX` (a NaN fails
/// both), without a branch per priority, so that the compiler vectorises
/// it.
pub fn all_priorities_valid(priorities: &[f64]) -> bool {
    priorities.iter().fold(true, |ok, p| ok & (0.0..=f64::MAX).contains(p))
}

/// Checks that a priority is finite and non-negative.
pub fn check_priority(p: f64) -> Result<f64> {
    if p.is_finite() && p >= 0.0 {
        Ok(p)
    } else {
        Err(crate::Error::InvalidPriority(p))
    }
}
