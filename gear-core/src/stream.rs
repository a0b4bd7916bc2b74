//! Copies that bypass the cache, for landing large trajectory writes in
//! the table.
//!
//! A plain copy into memory that is not in cache first reads every
//! destination line (the "read for ownership") and then writes it back: three
//! bytes of memory traffic per byte copied. Non-temporal stores write whole
//! lines without reading them, two bytes of traffic per byte, and do not
//! evict the caller's working set for data it will not read again. Writers
//! landing trajectories larger than the caches are exactly that case: the
//! bytes are read next by a sampler, usually in another process and much
//! later. Small writes keep plain stores (they may be read soon, and a
//! partial line written with streaming stores costs more than it saves).

/// Writes of at least this many bytes stream past the cache (see the module
/// documentation); smaller ones use a plain copy.
pub const STREAM_MIN_BYTES: usize = 128 << 10;

/// Copies `len` bytes from `src` to `dst`, with non-temporal stores where
/// the target has them (x86-64), and makes the stores visible to other
/// cores before returning, so a release store that publishes them
/// afterwards orders after them as it would after a plain copy.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` must be valid for reads
/// and `dst` for writes of `len` bytes, and the ranges must not overlap.
pub unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let s = src;
        // Plain stores up to the first 16-byte boundary of `dst`.
        let head = dst.align_offset(16).min(len);
        // SAFETY: every offset in this block stays under `len`, so all
        // reads are inside `src` and all writes inside `dst` (the caller's
        // contract); `dst.add(i)` for `i >= head` is 16-byte aligned, as
        // `_mm_stream_si128` requires; `_mm_loadu_si128` takes any
        // alignment. SSE2 is part of the x86-64 baseline. `_mm_sfence`
        // orders the weakly-ordered streaming stores before any later
        // store, which is what makes a following release store publish them.
        unsafe {
            std::ptr::copy_nonoverlapping(s, dst, head);
            let mut i = head;
            while i + 64 <= len {
                let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
                let d = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
                _mm_stream_si128(dst.add(i).cast::<__m128i>(), a);
                _mm_stream_si128(dst.add(i + 16).cast::<__m128i>(), b);
                _mm_stream_si128(dst.add(i + 32).cast::<__m128i>(), c);
                _mm_stream_si128(dst.add(i + 48).cast::<__m128i>(), d);
                i += 64;
            }
            while i + 16 <= len {
                _mm_stream_si128(dst.add(i).cast::<__m128i>(), _mm_loadu_si128(s.add(i).cast::<__m128i>()));
                i += 16;
            }
            std::ptr::copy_nonoverlapping(s.add(i), dst.add(i), len - i);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length and alignment around the 16- and 64-byte steps lands
    /// every byte where a plain copy would, and nothing outside.
    #[test]
    fn copies_exactly_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..700u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..20 {
            for len in (0..200).chain([255, 256, 257, 511, 600]) {
                let mut dst = vec![0xAAu8; 720];
                // SAFETY: `offset + len <= 620 < 720`, and `dst` is a
                // separate buffer from `src`.
                unsafe { copy_streaming(src.as_ptr(), dst.as_mut_ptr().add(offset), len) };
                assert!(dst[..offset].iter().all(|&b| b == 0xAA), "offset {offset} len {len}: head touched");
                assert_eq!(&dst[offset..offset + len], &src[..len], "offset {offset} len {len}");
                assert!(dst[offset + len..].iter().all(|&b| b == 0xAA), "offset {offset} len {len}: tail touched");
            }
        }
    }
}
