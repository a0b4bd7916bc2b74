//! Hints to the CPU for the hot paths of selection and gathering.

/// Asks the CPU to start loading the cache line that holds `p`, so that a
/// later load finds it in cache. Sampling reads a few lines at random per
/// row (tree nodes, slot records, step data); issuing the prefetches for a
/// whole batch first lets their memory latencies overlap instead of adding
/// up. A hint only: it reads nothing the program can observe, never
/// faults, and is a no-op on targets without a stable prefetch instruction.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint that never faults and has no effect
    // the program can observe, whatever the address (even null or
    // unmapped); SSE, which the intrinsic requires, is part of the x86_64
    // baseline every Rust x86_64 target enables.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
