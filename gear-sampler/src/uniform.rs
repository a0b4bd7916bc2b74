//! Uniform selection with replacement.
//!
//! The held keys sit in a dense array with a per-slot position index
//! (swap-remove), so insert, remove and each draw are O(1) — the design of
//! Reverb's `UniformSelector` and of most replay buffers.

use gear_core::{
    check_priority, insert_batch_ignoring_priorities, Error, RandomSource, Result, Sampled, SelectionRule, Selector,
    SlotKey,
};

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

    /// [`Selector::insert`] of each key in order, in one loop.
    fn insert_batch(&mut self, keys: &[SlotKey], priorities: Option<&[f64]>, recorded: &mut Vec<f64>) -> Result<()> {
        insert_batch_ignoring_priorities(keys, priorities, recorded, |key| {
            self.members.check_insert(key, NAME)?;
            self.members.insert(key, ());
            Ok(())
        })
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

    fn selection_rule(&self) -> Option<SelectionRule> {
        Some(SelectionRule::Uniform)
    }

    /// The dense order draws index (8 bytes per held key): after
    /// evictions it is no longer the insertion order.
    fn export_state(&self, out: &mut Vec<u8>) -> Result<()> {
        self.members.export_order(out);
        Ok(())
    }

    fn import_state(&mut self, state: &[u8]) -> Result<()> {
        self.members.import_order(state, NAME)
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

#[cfg(test)]
mod tests {
    use super::*;
    use gear_core::Xoshiro256;

    fn key(slot: u32) -> SlotKey {
        SlotKey { slot, generation: 1 }
    }

    #[test]
    fn exported_order_survives_a_rebuild_in_insertion_order() {
        let mut a = Uniform::new();
        a.prepare(16).unwrap();
        for s in 0..10 {
            a.insert(key(s), None).unwrap();
        }
        for s in [0, 3, 7] {
            a.remove(key(s)).unwrap();
        }
        let mut state = Vec::new();
        a.export_state(&mut state).unwrap();
        let mut b = Uniform::new();
        b.prepare(16).unwrap();
        for s in (0..10).filter(|s| ![0, 3, 7].contains(s)) {
            b.insert(key(s), None).unwrap();
        }
        let draw = |u: &Uniform| {
            let mut out = Vec::new();
            u.draw(200, &mut Xoshiro256::seed_from_u64(5), &mut out).unwrap();
            out.iter().map(|d| d.key).collect::<Vec<_>>()
        };
        assert_ne!(draw(&a), draw(&b), "swap-removes reorder the dense array");
        b.import_state(&state).unwrap();
        assert_eq!(draw(&a), draw(&b));
        assert!(b.import_state(&state[..5]).is_err());
    }
}
