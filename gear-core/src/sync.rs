//! The atomics every shared-memory protocol imports, in one place, so the
//! protocols can be model-checked with loom later by swapping this module.

pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
