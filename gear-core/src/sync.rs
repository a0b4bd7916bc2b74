//! The atomics every shared-memory protocol imports, in one place, so the
//! protocols can be model-checked with loom: under `--cfg loom` they are
//! loom's (see `gear-core/tests/loom.rs`, which checks the slot protocol).
//! Only the slot records' protocol runs under loom; the rest of the crate
//! merely compiles with loom's types.

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
