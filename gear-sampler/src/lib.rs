//! # gear-sampler
//!
//! The built-in selection strategies of GEAR-rs, each a
//! [`gear_core::Selector`] that a table uses as its sampler (what trainers
//! draw) or its remover (what is evicted when full):
//!
//! * [`Uniform`]: with replacement, O(1);
//! * [`Prioritized`]: proportional prioritized replay over an f64 sum tree,
//!   with importance weights, stratified batches and [`Prioritized::update_batch`];
//! * [`Fifo`], [`Lifo`]: insertion order, O(1);
//! * [`MaxHeap`] (top-k), [`MinHeap`] (lowest priority first), O(log n);
//! * [`sequence_priority`]: R2D2's priority of a sequence of TD errors;
//! * [`StrategyKind`] and [`build`]: pick one by name.
//!
//! Contract, for every strategy: [`gear_core::Selector::prepare`] sizes per-slot
//! arrays (slots are `< capacity`); `insert` refuses a slot already held,
//! `update`/`remove` refuse a slot not held ([`gear_core::Error::Selection`]),
//! a key of another generation ([`gear_core::Error::StaleKey`]) and a slot
//! out of range ([`gear_core::Error::SlotOutOfRange`]); invalid priorities
//! are refused with [`gear_core::Error::InvalidPriority`]; a refused call
//! changes nothing, and no input panics. `sample(n)` appends exactly `n`
//! draws, or returns [`gear_core::Error::Empty`] when nothing is held, and
//! never changes the strategy.
//!
//! ```
//! use gear_core::{Selector, SlotKey, Xoshiro256};
//! use gear_sampler::{build, Prioritized, StrategyKind, StrategyParams};
//!
//! let mut per = Prioritized::builder().alpha(0.6).beta(0.4).build()?;
//! per.prepare(1024)?;
//! per.insert(SlotKey { slot: 0, generation: 1 }, Some(2.0))?;
//! per.insert(SlotKey { slot: 1, generation: 1 }, None)?; // gets 2.0, the largest seen
//! let mut batch = Vec::new();
//! per.sample(256, &mut Xoshiro256::seed_from_u64(7), &mut batch)?;
//! assert_eq!(batch.len(), 256);
//! per.update_batch(&[(batch[0].key, 0.5), (SlotKey { slot: 1, generation: 0 }, 9.0)])?; // stale: skipped
//!
//! // By name, for a command line:
//! let kind: StrategyKind = "min-heap".parse()?;
//! let remover = build(kind, &StrategyParams::default())?;
//! assert_eq!(remover.name(), "min-heap");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Architecture invariant: gear-sampler depends only on gear-core; it knows
//! nothing of tables, memory or devices, only keys and priorities.

// No unsafe code here; keep it that way (Miri and review focus on the crates that have some).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod heap;
mod keys;
mod kind;
mod order;
mod prioritized;
mod sequence;
mod sum_tree;
mod uniform;

pub use error::{Error, Result};
pub use heap::{MaxHeap, MinHeap};
pub use kind::{build, StrategyKind, StrategyParams};
pub use order::{Fifo, Lifo};
pub use prioritized::{Prioritized, PrioritizedBuilder};
pub use sequence::{sequence_priority, DEFAULT_ETA};
pub use uniform::Uniform;
