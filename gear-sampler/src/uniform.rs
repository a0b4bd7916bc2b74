//! Uniform selection with replacement.
//!
//! The held keys sit in a dense array with a per-slot position index
//! (swap-remove), so insert, remove and each draw are O(1) — the design of
//! Reverb's `UniformSelector` and of most replay buffers.

use gear_core::{check_priority, Error, RandomSource, Result, Sampled, Selector, SlotKey};

use crate::keys::{check_capacity, reserve_draws, DenseKeys};
use crate::sum_tree::GROUP;

const NAME: &str = "uniform";

/// Draws held items uniformly with replacement: probability `1/N`, weight 1.
/// Priorities are checked and recorded by the caller's table but do not
/// influence the draw.
#[derive(Clone, Debug, Default)]
pub struct Uniform {
    members: DenseKeys<()>,
}

impl Uniform {
    /// An empty strategy; the table sizes it with [`Selector::prepare`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `key` is held (with this generation).
    pub fn contains(&self, key: SlotKey) -> bool {
        self.members.holds(key)
    }
}

impl Selector for Uniform {
    fn name(&self) -> &str {
        NAME
    }

    fn mass(&self) -> Option<gear_core::SelectionMass> {
        Some(gear_core::SelectionMass { total: self.len() as f64, min: 1.0 })
    }

    fn prepare(&mut self, capacity: u64) -> Result<()> {
        let capacity = check_capacity(capacity, self.len(), NAME)?;
        self.members.prepare(capacity, NAME)
    }

    /// Records `key`; returns the priority given, or 1.0 when none was.
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
        self.members.check_insert(key, NAME)?;
        let p = check_priority(priority.unwrap_or(1.0))?;
        self.members.insert(key, ());
        Ok(p)
    }

    /// Checks the key and the priority; the draw ignores priorities.
    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
        self.members.check_held(key, NAME)?;
        check_priority(priority)?;
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> Result<()> {
        self.members.check_held(key, NAME)?;
        self.members.remove(key.slot);
        Ok(())
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
}

impl Uniform {
    /// [`Selector::sample`], which changes nothing here.
    fn draw(&self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
        let len = self.members.len();
        if len == 0 {
            return Err(Error::Empty(format!("{NAME}: no items held")));
        }
        let probability = 1.0 / len as f64;
        reserve_draws(out, n, NAME)?;
        let mut picks = [0usize; GROUP];
        let mut left = n;
        while left > 0 {
            let k = left.min(GROUP);
            for pick in &mut picks[..k] {
                *pick = rng.below(len as u64) as usize;
            }
            // Independent reads first, so their cache misses overlap.
            let mut touched = 0u32;
            for &i in &picks[..k] {
                touched ^= self.members.nth(i).slot;
            }
            std::hint::black_box(touched);
            out.extend(picks[..k].iter().map(|&i| Sampled { key: self.members.nth(i), probability, weight: 1.0 }));
            left -= k;
        }
        Ok(())
    }
}
