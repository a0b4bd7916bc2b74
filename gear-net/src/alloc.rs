//! Keeps glibc's allocator from returning message buffers to the kernel.
//!
//! gRPC messages here are MiB-sized (whole trajectories, sample replies).
//! With glibc's defaults an allocation that size is either mapped afresh
//! (above the mmap threshold) or, once freed, trimmed back to the kernel;
//! both make the next message fault in and zero every page again, which
//! measured at about a fifth of the CPU a remote insert costs. Raising the
//! two thresholds once per process keeps such buffers in the heap for
//! reuse. `GEAR_KEEP_MALLOC_DEFAULTS=1` leaves glibc as it is.
//!
//! A shard's `Sample` replies can be larger than the highest mmap threshold
//! glibc accepts (32 MiB: a batch of 32 windows of 512 Atari frames is 38
//! MB a shard), so each was still mapped afresh and every page faulted in
//! and cleared per reply: half a shard's CPU in the training benchmark at
//! L 512. A process that only serves shards (`gear serve`) also turns
//! glibc's mmap off ([`serve_every_message_from_the_heap`]).

use std::sync::Once;

/// Allocations below this come from the heap (glibc's largest allowed
/// mmap threshold on 64-bit targets, 32 MiB).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// Free memory at the top of the heap kept before trimming.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 256 << 20;

/// For a process that is a shard server and nothing else (`gear serve`
/// calls it; a library embedding a server does not): every allocation
/// comes from the heap, whatever its size (glibc's `M_MMAP_MAX` 0), so
/// that reply buffers above the highest mmap threshold are reused instead
/// of mapped and faulted in per reply; the heap's top is still trimmed
/// past [`keep_message_buffers`]' threshold. Does nothing on other C
/// libraries or when `GEAR_KEEP_MALLOC_DEFAULTS` is set.
pub fn serve_every_message_from_the_heap() {
    keep_message_buffers();
    if std::env::var_os("GEAR_KEEP_MALLOC_DEFAULTS").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; 0 is a value glibc
    // documents for M_MMAP_MAX (never use mmap for allocations).
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
    }
}

/// Raises glibc's mmap and trim thresholds once per process (see the module
/// doc); does nothing on other C libraries or when
/// `GEAR_KEEP_MALLOC_DEFAULTS` is set. The shard server and the cluster
/// client call it; calling it again is free.
pub fn keep_message_buffers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("GEAR_KEEP_MALLOC_DEFAULTS").is_some() {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator parameters; both values are
        // within the ranges glibc documents, and a refused value is ignored.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    });
}
