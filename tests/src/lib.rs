//! Cross-crate conformance tests for GEAR-rs. The library part holds what a
//! downstream crate would write; the tests live in `tests/`. The README's
//! Rust snippets are this crate's doc tests (`ReadmeSnippets`, an item that exists only for them).
//!
//! [`AboveThreshold`] is a selection strategy written the way a user's crate
//! would write one: against `gear_core::Selector` only, with no access to
//! our crates' internals, and handed to the table builder unchanged.

// No unsafe code here; keep it that way (Miri and review focus on the crates that have some).
#![forbid(unsafe_code)]

use gear_core::{Error, RandomSource, Result, Sampled, Selector, SlotKey};
use std::collections::BTreeMap;

/// Samples uniformly among the items whose priority is strictly above a
/// threshold; items at or below it are kept but never drawn.
#[derive(Debug, Default)]
pub struct AboveThreshold {
    threshold: f64,
    items: BTreeMap<u32, (SlotKey, f64)>,
    eligible: Vec<SlotKey>,
}

impl AboveThreshold {
    /// A strategy drawing only items with priority above `threshold`.
    pub fn new(threshold: f64) -> Self {
        AboveThreshold { threshold, ..Default::default() }
    }

    fn rebuild(&mut self) {
        self.eligible = self.items.values().filter(|(_, p)| *p > self.threshold).map(|(k, _)| *k).collect();
    }

    fn entry(&mut self, key: SlotKey) -> Result<&mut (SlotKey, f64)> {
        match self.items.get_mut(&key.slot) {
            Some(e) if e.0 == key => Ok(e),
            _ => Err(Error::Selection(format!("unknown key {key}"))),
        }
    }
}

impl Selector for AboveThreshold {
    fn name(&self) -> &str {
        "above-threshold"
    }

    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
        let p = gear_core::check_priority(priority.unwrap_or(0.0))?;
        if self.items.contains_key(&key.slot) {
            return Err(Error::Selection(format!("slot {} inserted twice", key.slot)));
        }
        self.items.insert(key.slot, (key, p));
        self.rebuild();
        Ok(p)
    }

    fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
        let p = gear_core::check_priority(priority)?;
        self.entry(key)?.1 = p;
        self.rebuild();
        Ok(())
    }

    fn remove(&mut self, key: SlotKey) -> Result<()> {
        self.entry(key)?;
        self.items.remove(&key.slot);
        self.rebuild();
        Ok(())
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
        if self.eligible.is_empty() {
            return Err(Error::Empty(format!("no item has priority above {}", self.threshold)));
        }
        let p = 1.0 / self.eligible.len() as f64;
        for _ in 0..n {
            let key = self.eligible[rng.below(self.eligible.len() as u64) as usize];
            out.push(Sampled { key, probability: p, weight: 1.0 });
        }
        Ok(())
    }
}

/// The Rust snippets of the repository's README.md, compiled and run as
/// doc tests by `cargo test --workspace` (alone: `cargo test -p tests
/// --doc`), so that every snippet a user copies works as written.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeSnippets;
