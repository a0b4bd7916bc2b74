//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A pool name no other test (or concurrent test run) uses.
pub fn unique_name(tag: &str) -> String {
    format!("gear-cpu-test-{}-{}-{tag}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A fresh directory, removed with its contents on drop.
pub struct TestDir(PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(unique_name(tag));
        std::fs::create_dir_all(&p).unwrap();
        TestDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic bytes that differ per (slot, column, step, byte).
pub fn pattern(slot: u64, column: usize, step: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| {
            let mut x = slot.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ (column as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9)
                ^ step.wrapping_mul(0x94d0_49bb_1331_11eb)
                ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d);
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            (x >> 56) as u8 | 1 // never zero, so zero padding is told apart
        })
        .collect()
}
