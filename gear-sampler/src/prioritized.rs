//! Proportional prioritized replay (Schaul, Quan, Antonoglou & Silver,
//! "Prioritized Experience Replay", ICLR 2016, section 3.3 and appendix
//! B.2.1): `P(i) = p_i^alpha / sum_k p_k^alpha`, importance weights
//! `w_i = (N * P(i))^-beta / max_j w_j`, stratified batch draws over a sum
//! tree ([`crate::sum_tree`]), and new items given the largest priority
//! seen so far.
//!
//! Choices where the paper leaves room (documented on [`Prioritized`]):
//! zero priorities have zero mass for every `alpha` (so `alpha = 0` is
//! uniform over the items of positive priority); when every mass is zero
//! the draw is uniform over all items; masses are bounded so the total
//! cannot overflow; stale keys in [`Prioritized::update_batch`] are skipped.

use gear_core::{
    check_batch_priorities, check_priority, Error, RandomSource, Result, Sampled, SelectionRule, Selector, SlotKey,
};

use crate::keys::{check_capacity, reserve_draws, DenseKeys};
use crate::sum_tree::{SumTree, GROUP};

const NAME: &str = "prioritized";

/// The largest mass `p^alpha` one item may have: 2^-33 of `f64::MAX`, so
/// the sum over 2^32 slots stays finite.
const MAX_MASS: f64 = f64::MAX / 8_589_934_592.0;

/// How far ahead [`Prioritized::update_batch`] touches the tree paths of
/// coming updates.
const UPDATE_LOOKAHEAD: usize = 8;

/// Draws per stack-allocated group in [`Prioritized::sample`].
const DRAW_GROUP: usize = 256;

/// `x^e` with the common exponents special-cased (exact and cheaper than
/// `powf`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Power {
    Zero,
    Half,
    One,
    Other(f64),
}

impl Power {
    fn new(e: f64) -> Power {
        match e {
            0.0 => Power::Zero,
            0.5 => Power::Half,
            1.0 => Power::One,
            e => Power::Other(e),
        }
    }

    #[inline]
    fn apply(self, x: f64) -> f64 {
        match self {
            Power::Zero => 1.0,
            Power::Half => x.sqrt(),
            Power::One => x,
            Power::Other(e) => x.powf(e),
        }
    }
}

/// Configures a [`Prioritized`] strategy; see [`Prioritized::builder`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrioritizedBuilder {
    alpha: f64,
    beta: f64,
    stratified: bool,
}

impl Default for PrioritizedBuilder {
    fn default() -> Self {
        PrioritizedBuilder { alpha: Prioritized::DEFAULT_ALPHA, beta: Prioritized::DEFAULT_BETA, stratified: true }
    }
}

impl PrioritizedBuilder {
    /// Priority exponent: finite and `>= 0` (0: uniform over the items of
    /// positive priority; 1: proportional to priority).
    pub fn alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }

    /// Importance-sampling exponent, in `[0, 1]` (0: no correction, all
    /// weights 1; 1: full correction). Can be annealed later with
    /// [`Prioritized::set_beta`].
    pub fn beta(mut self, beta: f64) -> Self {
        self.beta = beta;
        self
    }

    /// Whether a batch of `n` draws takes one draw from each of `n` equal
    /// segments of the total mass (the default, as in the paper) rather
    /// than `n` independent draws. Either way each draw has probability
    /// `P(i)`; stratification lowers the variance of a batch's make-up.
    pub fn stratified(mut self, stratified: bool) -> Self {
        self.stratified = stratified;
        self
    }

    /// Checks the parameters and builds an empty strategy.
    pub fn build(self) -> crate::Result<Prioritized> {
        check_alpha(self.alpha)?;
        check_beta(self.beta)?;
        let priority_limit = match self.alpha {
            0.0 => f64::MAX,
            // inf for alpha < 1: then every finite priority is allowed.
            a => MAX_MASS.powf(1.0 / a),
        };
        Ok(Prioritized {
            alpha: self.alpha,
            beta: self.beta,
            stratified: self.stratified,
            alpha_pow: Power::new(self.alpha),
            beta_pow: Power::new(self.beta),
            priority_limit,
            members: DenseKeys::default(),
            tree: SumTree::default(),
            max_priority: 0.0,
        })
    }
}

fn check_alpha(alpha: f64) -> crate::Result<()> {
    if alpha.is_finite() && alpha >= 0.0 {
        Ok(())
    } else {
        Err(crate::Error::InvalidParameter { name: "alpha", value: alpha, expected: "a finite number >= 0" })
    }
}

fn check_beta(beta: f64) -> crate::Result<()> {
    if (0.0..=1.0).contains(&beta) {
        Ok(())
    } else {
        Err(crate::Error::InvalidParameter { name: "beta", value: beta, expected: "a number in [0, 1]" })
    }
}

/// Proportional prioritized selection over a sum tree.
///
/// * `P(i) = m_i / sum_k m_k` with mass `m_i = p_i^alpha` for `p_i > 0` and
///   `m_i = 0` for `p_i = 0`, for every `alpha` including 0: a zero
///   priority means "never draw this", so `alpha = 0` is uniform over the
///   items of positive priority. (A positive priority whose power
///   underflows to 0, e.g. `1e-200^2`, is likewise never drawn.)
/// * When every mass is zero the draw is uniform over all items:
///   probability `1/N`, weight 1.
/// * Weights: `w_i = (N P(i))^-beta / (N P_min)^-beta = (m_min / m_i)^beta`
///   with `P_min` the smallest *positive* probability, so drawn items have
///   weights in `(0, 1]`.
/// * Priorities must be finite and non-negative, and `p^alpha` at most
///   about `1e298` (so sums cannot overflow); others are refused with
///   [`Error::InvalidPriority`] and change nothing. `-0.0` is stored as 0.
/// * An insert without a priority gets the largest positive priority
///   recorded so far — given to an insert or update, or itself handed out
///   as a default — never decreasing (removed items still count), or 1.0
///   before any. [`gear_core::Selector::prepare`] starts over.
/// * Cost: insert, update and remove O(log_8 capacity); a draw is a
///   root-to-leaf walk of 7 cache lines at 10^6 slots.
///
/// Batches are returned in segment order (ascending cumulative mass, i.e.
/// slot order) when stratified.
#[derive(Clone, Debug)]
pub struct Prioritized {
    alpha: f64,
    beta: f64,
    stratified: bool,
    alpha_pow: Power,
    beta_pow: Power,
    /// Largest priority whose mass is at most [`MAX_MASS`].
    priority_limit: f64,
    /// Held keys, each with its priority as recorded.
    members: DenseKeys<f64>,
    /// Per slot: the mass `p^alpha` (0 when not held).
    tree: SumTree,
    /// Largest priority recorded since `prepare`, 0 before any positive.
    max_priority: f64,
}

impl Default for Prioritized {
    /// `alpha` 0.6, `beta` 0.4, stratified.
    fn default() -> Self {
        PrioritizedBuilder::default().build().expect("the default parameters are valid")
    }
}

impl Prioritized {
    /// The paper's `alpha` for proportional prioritization on Atari.
    pub const DEFAULT_ALPHA: f64 = 0.6;
    /// The paper's initial `beta` (annealed to 1 over training).
    pub const DEFAULT_BETA: f64 = 0.4;

    /// A builder starting from `alpha` 0.6, `beta` 0.4, stratified draws.
    pub fn builder() -> PrioritizedBuilder {
        PrioritizedBuilder::default()
    }

    /// A stratified strategy with these exponents (checked as in
    /// [`PrioritizedBuilder`]).
    pub fn new(alpha: f64, beta: f64) -> crate::Result<Self> {
        Self::builder().alpha(alpha).beta(beta).build()
    }

    /// The priority exponent.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The importance-sampling exponent.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// Changes `beta` (annealing); must be in `[0, 1]`.
    pub fn set_beta(&mut self, beta: f64) -> crate::Result<()> {
        check_beta(beta)?;
        self.beta = beta;
        self.beta_pow = Power::new(beta);
        Ok(())
    }

    /// Whether batches are stratified.
    pub fn is_stratified(&self) -> bool {
        self.stratified
    }

    /// `sum_k p_k^alpha`, the mass a multi-shard sampler weighs this shard
    /// by.
    pub fn total_mass(&self) -> f64 {
        self.tree.total()
    }

    /// The priority an insert without one gets now.
    pub fn default_priority(&self) -> f64 {
        if self.max_priority > 0.0 {
            self.max_priority
        } else {
            1.0
        }
    }

    /// The recorded priority of `key`.
    pub fn priority(&self, key: SlotKey) -> Result<f64> {
        self.members.check_held(key, NAME)?;
        Ok(self.members.value(key.slot as usize))
    }

    /// `P(key)`, the probability of each draw returning `key`.
    pub fn probability(&self, key: SlotKey) -> Result<f64> {
        self.members.check_held(key, NAME)?;
        let total = self.tree.total();
        Ok(if total > 0.0 { self.tree.get(key.slot as usize) / total } else { 1.0 / self.len() as f64 })
    }

    /// The importance weight a draw of `key` carries: in `(0, 1]` for
    /// drawable items, `+inf` (or 1 when `beta` is 0) for an item of zero
    /// probability, 1 when every mass is zero.
    pub fn weight(&self, key: SlotKey) -> Result<f64> {
        self.members.check_held(key, NAME)?;
        if self.tree.total() <= 0.0 {
            return Ok(1.0);
        }
        Ok(self.weight_of(self.tree.get(key.slot as usize), self.tree.min_positive()))
    }

    #[inline]
    fn weight_of(&self, mass: f64, min_mass: f64) -> f64 {
        if self.beta_pow == Power::Zero {
            1.0
        } else {
            self.beta_pow.apply(min_mass / mass)
        }
    }

    #[inline]
    fn mass(&self, p: f64) -> f64 {
        if p > 0.0 {
            self.alpha_pow.apply(p)
        } else {
            0.0
        }
    }

    /// Loads every line an update of `slot` reads or writes (see
    /// `SumTree::touch`).
    #[inline]
    fn touch(&self, slot: usize) -> u64 {
        u64::from(self.members.touch(slot)) ^ self.tree.touch(slot)
    }

    /// A valid priority, normalised (`-0.0` -> `0.0`).
    #[inline]
    fn check(&self, p: f64) -> Result<f64> {
        let p = check_priority(p)?;
        if p > self.priority_limit {
            return Err(Error::PriorityTooLarge { priority: p, alpha: self.alpha, limit: self.priority_limit });
        }
        Ok(p + 0.0)
    }

    /// Records priority `p` (checked) for held `slot`.
    #[inline]
    fn store(&mut self, slot: usize, p: f64, propagate: bool) {
        self.members.set_value(slot, p);
        self.max_priority = self.max_priority.max(p);
        let m = self.mass(p);
        if propagate {
            self.tree.set(slot, m);
        } else {
            self.tree.set_leaf(slot, m);
        }
    }

    /// Updates many priorities at once. Every priority is checked first: one
    /// invalid value refuses the whole batch and changes nothing. Keys that
    /// are not held (stale generation, removed, out of range) are skipped,
    /// as late priority updates are normal in prioritized replay. A key
    /// given twice takes its last priority. Returns how many entries were
    /// applied. Large batches (over 1/32 of capacity) write the leaves and
    /// rebuild the tree once, O(capacity) sequential work instead of
    /// O(batch * log capacity) scattered work.
    pub fn update_batch(&mut self, updates: &[(SlotKey, f64)]) -> Result<usize> {
        for &(_, p) in updates {
            self.check(p)?;
        }
        let rebuild = updates.len() > 64 && updates.len() >= self.tree.capacity() / 32;
        let mut applied = 0;
        if rebuild {
            // Leaves only; the rebuild below recomputes the rest.
            for group in updates.chunks(GROUP) {
                let mut touched = 0u64;
                for &(key, _) in group {
                    let slot = key.slot as usize;
                    touched ^= u64::from(self.members.touch(slot));
                    touched ^= self.tree.touch_leaf(slot);
                }
                std::hint::black_box(touched);
                for &(key, p) in group {
                    if self.members.holds(key) {
                        self.store(key.slot as usize, p + 0.0, false);
                        applied += 1;
                    }
                }
            }
        } else {
            for (j, &(key, p)) in updates.iter().enumerate() {
                // Software pipelining: start the misses of a later update.
                if let Some(&(ahead, _)) = updates.get(j + UPDATE_LOOKAHEAD) {
                    std::hint::black_box(self.touch(ahead.slot as usize));
                }
                if self.members.holds(key) {
                    self.store(key.slot as usize, p + 0.0, true);
                    applied += 1;
                }
            }
        }
        if rebuild && applied > 0 {
            self.tree.rebuild();
        }
        Ok(applied)
    }
}

impl Selector for Prioritized {
    fn name(&self) -> &str {
        NAME
    }

    fn mass(&self) -> Option<gear_core::SelectionMass> {
        Some(gear_core::SelectionMass { total: self.tree.total(), min: self.tree.min_positive() })
    }

    fn prepare(&mut self, capacity: u64) -> Result<()> {
        let capacity = check_capacity(capacity, self.len(), NAME)?;
        self.members.prepare(capacity, NAME)?;
        self.tree = SumTree::new(capacity, NAME)?;
        self.max_priority = 0.0;
        Ok(())
    }

    /// Records `key` with `priority`, or [`Prioritized::default_priority`]
    /// when none is given; returns the priority recorded.
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
        std::hint::black_box(self.touch(key.slot as usize));
        self.members.check_insert(key, NAME)?;
        let p = match priority {
            Some(p) => self.check(p)?,
            None => self.default_priority(),
        };
        self.members.insert(key, p);
        self.store(key.slot as usize, p, true);
        Ok(p)
    }

    /// Records each key as [`Selector::insert`] does, writing the leaves
    /// first and then refreshing every sum-tree node above them once
    /// (`SumTree::refresh`), also when a key is refused part way: the
    /// tree equals, bit for bit, the one inserting each key would leave.
    fn insert_batch(&mut self, keys: &[SlotKey], priorities: Option<&[f64]>, recorded: &mut Vec<f64>) -> Result<()> {
        check_batch_priorities(keys, priorities)?;
        let mut result = Ok(());
        let mut done = 0;
        for (j, &key) in keys.iter().enumerate() {
            if let Some(ahead) = keys.get(j + UPDATE_LOOKAHEAD) {
                let slot = ahead.slot as usize;
                std::hint::black_box(u64::from(self.members.touch(slot)) ^ self.tree.touch_leaf(slot));
            }
            let p = match self.members.check_insert(key, NAME) {
                Ok(()) => match priorities.and_then(|p| p.get(j).copied()) {
                    Some(p) => self.check(p),
                    None => Ok(self.default_priority()),
                },
                Err(e) => Err(e),
            };
            match p {
                Ok(p) => {
                    self.members.insert(key, p);
                    self.store(key.slot as usize, p, false);
                    recorded.push(p);
                    done += 1;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.tree.refresh(keys[..done].iter().map(|k| k.slot as usize));
        result
    }

    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
        std::hint::black_box(self.touch(key.slot as usize));
        self.members.check_held(key, NAME)?;
        let p = self.check(priority)?;
        self.store(key.slot as usize, p, true);
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> Result<()> {
        std::hint::black_box(self.touch(key.slot as usize));
        self.members.check_held(key, NAME)?;
        self.members.remove(key.slot);
        self.tree.set(key.slot as usize, 0.0);
        Ok(())
    }

    /// Zeroes the batch's leaves, then refreshes every sum-tree node above
    /// them once (as [`Selector::insert_batch`] does), also when a key is
    /// refused part way: the tree is the one removing each key leaves.
    fn remove_batch(&mut self, keys: &[SlotKey]) -> Result<()> {
        let mut result = Ok(());
        let mut done = 0;
        for &key in keys {
            if let Err(e) = self.members.check_held(key, NAME) {
                result = Err(e);
                break;
            }
            self.members.remove(key.slot);
            self.tree.set_leaf(key.slot as usize, 0.0);
            done += 1;
        }
        self.tree.refresh(keys[..done].iter().map(|k| k.slot as usize));
        result
    }

    fn len(&self) -> usize {
        self.members.len()
    }

    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
        self.draw(n, rng, out)
    }

    fn sample_shared(&self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Option<Result<()>> {
        Some(self.draw(n, rng, out))
    }

    fn selection_rule(&self) -> Option<SelectionRule> {
        Some(SelectionRule::Proportional { alpha: self.alpha, beta: self.beta, stratified: self.stratified })
    }

    /// The largest priority seen (8 bytes): the priority of later inserts
    /// that bring none. Draws depend only on the per-slot masses, which
    /// the table restores.
    fn export_state(&self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&self.max_priority.to_le_bytes());
        Ok(())
    }

    fn import_state(&mut self, state: &[u8]) -> Result<()> {
        self.max_priority = self.max_priority.max(crate::keys::decode_max_priority(state, NAME)?);
        Ok(())
    }
}

impl Prioritized {
    /// [`Selector::sample`], which changes nothing here.
    fn draw(&self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
        let len = self.members.len();
        if len == 0 {
            return Err(Error::Empty(format!("{NAME}: no items held")));
        }
        reserve_draws(out, n, NAME)?;
        let total = self.tree.total();
        // Masses are finite, so the total is never NaN.
        if total <= 0.0 {
            let probability = 1.0 / len as f64;
            for _ in 0..n {
                let key = self.members.nth(rng.below(len as u64) as usize);
                out.push(Sampled { key, probability, weight: 1.0 });
            }
            return Ok(());
        }
        let min_mass = self.tree.min_positive();
        let segment = total / n as f64;
        let mut us = [0.0f64; DRAW_GROUP];
        let mut leaves = [0usize; DRAW_GROUP];
        let mut probabilities = [0.0f64; DRAW_GROUP];
        let mut weights = [0.0f64; DRAW_GROUP];
        let mut start = 0;
        while start < n {
            let k = (n - start).min(DRAW_GROUP);
            for (j, u) in us[..k].iter_mut().enumerate() {
                let r = rng.next_f64();
                *u = if self.stratified { ((start + j) as f64 + r) * segment } else { r * total };
            }
            // Each drawn slot's key is a likely miss: start loading it as
            // soon as its leaf is found, then compute the weights (a `pow`
            // each) while the keys arrive.
            self.tree.find_many(&us[..k], &mut leaves[..k], |leaf| self.members.prefetch(leaf));
            for (&leaf, (p, w)) in leaves[..k].iter().zip(probabilities.iter_mut().zip(weights.iter_mut())) {
                let mass = self.tree.get(leaf);
                debug_assert!(mass > 0.0, "descent landed on zero-mass leaf {leaf}");
                *p = mass / total;
                *w = self.weight_of(mass, min_mass);
            }
            for (&leaf, (&probability, &weight)) in leaves[..k].iter().zip(probabilities.iter().zip(&weights)) {
                out.push(Sampled { key: self.members.key(leaf), probability, weight });
            }
            start += k;
        }
        Ok(())
    }
}
