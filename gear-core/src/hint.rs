//! Hints to the CPU and the kernel for the hot paths of selection and
//! gathering.

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

/// Bytes in a transparent huge page on x86-64 (and on aarch64 with 4 KiB
/// base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole pages inside `[start, start + len)`
/// with transparent huge pages (`madvise(MADV_HUGEPAGE)`) as they are
/// faulted in; call it on freshly allocated memory before first writing it.
///
/// Sampling reads a few cache lines at random places in arrays of tens to
/// hundreds of MB (sum tree, keys, slot records, step data); with 4 KiB
/// pages nearly every such read also misses the TLB, and in a virtual
/// machine each TLB miss is a two-dimensional page walk. With 2 MiB pages
/// the same arrays need 512 times fewer TLB entries.
///
/// A hint: it changes neither the contents nor the mapping of any page, it
/// takes effect only where transparent huge pages are enabled (`always` or
/// `madvise` in `/sys/kernel/mm/transparent_hugepage/enabled`), and ranges
/// smaller than a huge page, or not mapped, are left as they are. Returns
/// whether the kernel accepted the advice (always `false` off Linux, and
/// under Miri, which cannot call the kernel).
pub fn advise_huge_pages(start: *const u8, len: usize) -> bool {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        if len < HUGE_PAGE {
            return false;
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        // madvise wants a page-aligned start; advise only the whole pages.
        let first = (start as usize).div_ceil(page) * page;
        let end = (start as usize).saturating_add(len) / page * page;
        if end <= first {
            return false;
        }
        // SAFETY: MADV_HUGEPAGE only changes how the kernel backs the pages
        // of the range, never their contents, protection or mapping, so it
        // cannot break any reference the program holds; an unmapped range
        // is refused with ENOMEM.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) == 0 }
    }
    #[cfg(any(not(target_os = "linux"), miri))]
    {
        let _ = (start, len);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "madvise is a system call Miri cannot make (the function returns false there)")]
    fn advice_keeps_contents_and_ignores_what_it_cannot_take() {
        let mut v = vec![7u8; 3 * HUGE_PAGE + 123];
        // Accepted or not (kernels without THP refuse), contents stay.
        advise_huge_pages(v.as_ptr(), v.len());
        assert!(v.iter().all(|&b| b == 7));
        v.fill(9);
        assert!(v.iter().all(|&b| b == 9));
        // Too small, empty, or not ours to advise: refused, nothing breaks.
        assert!(!advise_huge_pages(v.as_ptr(), 100));
        assert!(!advise_huge_pages(std::ptr::null(), 0));
        assert!(!advise_huge_pages(std::ptr::null(), HUGE_PAGE));
    }
}
