//! Keeps glibc's allocator from returning message buffers to the kernel.
//!
//! gRPC messages here are MiB-sized (whole trajectories, sample replies).
//! With glibc's defaults an allocation that size is either mapped afresh
//! (above the mmap threshold) or, once freed, trimmed back to the kernel;
//! both make the next message fault in and zero every page again, which
//! measured at about a fifth of the CPU a remote insert costs. Raising the
//! two thresholds once per process keeps such buffers in the heap for
//! reuse. `GEAR_KEEP_MALLOC_DEFAULTS=1` leaves glibc as it is.

use std::sync::Once;

/// Allocations below this come from the heap (glibc's largest allowed
/// mmap threshold on 64-bit targets, 32 MiB).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// Free memory at the top of the heap kept before trimming.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 256 << 20;

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
