//! The byte copies of the hot paths (writing steps into the table,
//! gathering windows into a batch), chosen by size.
//!
//! * Up to [`SMALL_COPY_MAX`] bytes: a few unaligned loads and stores
//!   inline, where a call to `memcpy` would spend more on the call and its
//!   size dispatch than on the bytes (small items copy 4 to 64 bytes per
//!   column).
//! * From [`STREAM_MIN_BYTES`] on: non-temporal stores. A plain copy into
//!   memory that is not in cache first reads every destination line (the
//!   "read for ownership") and then writes it back: three bytes of memory
//!   traffic per byte copied. Non-temporal stores write whole lines without
//!   reading them, two bytes per byte, and leave the caller's cache alone.
//!   Copies this large (a trajectory landing in the table, a batch bound
//!   for a trainer or for the GPU by DMA) are mostly past the caches anyway.
//! * In between: `memcpy`.

/// Copies of at most this many bytes are done inline.
pub const SMALL_COPY_MAX: usize = 64;

/// Copies `len` bytes from `src` to `dst` by the size rules of the module
/// documentation. Streaming stores are made visible to other cores before
/// returning, so a release store that publishes the bytes afterwards orders
/// after them as it would after a plain copy.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` must be valid for reads
/// and `dst` for writes of `len` bytes, and the ranges must not overlap.
#[inline(always)]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: each branch passes on the caller's contract unchanged.
    unsafe {
        if len <= SMALL_COPY_MAX {
            copy_small(src, dst, len);
        } else if len >= STREAM_MIN_BYTES {
            copy_streaming(src, dst, len);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}

/// Copies `n <= SMALL_COPY_MAX` bytes with unaligned loads and stores of
/// 16, 8, 4 or 1 bytes; chunks may overlap at the end, and each byte gets
/// its source value.
///
/// # Safety
/// As for [`copy_bytes`].
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!(n <= SMALL_COPY_MAX);
    // SAFETY: every `copy(k, bytes)` in this block has `k + bytes <= n`
    // (the branches pick chunk sizes no larger than `n`), so it reads and
    // writes inside both ranges (the caller's contract);
    // `read_unaligned`/`write_unaligned` take any alignment.
    unsafe {
        let copy = |k: usize, bytes: usize| match bytes {
            16 => dst.add(k).cast::<u128>().write_unaligned(src.add(k).cast::<u128>().read_unaligned()),
            8 => dst.add(k).cast::<u64>().write_unaligned(src.add(k).cast::<u64>().read_unaligned()),
            4 => dst.add(k).cast::<u32>().write_unaligned(src.add(k).cast::<u32>().read_unaligned()),
            _ => dst.add(k).write(src.add(k).read()),
        };
        if n >= 16 {
            let mut k = 0;
            while k + 16 < n {
                copy(k, 16);
                k += 16;
            }
            copy(n - 16, 16);
        } else if n >= 8 {
            copy(0, 8);
            copy(n - 8, 8);
        } else if n >= 4 {
            copy(0, 4);
            copy(n - 4, 4);
        } else {
            for k in 0..n {
                copy(k, 1);
            }
        }
    }
}

/// Copies of at least this many bytes stream past the cache. (Under Miri
/// the threshold is small, so that the streaming path is checked on copies
/// Miri can run in reasonable time.)
#[cfg(not(miri))]
pub const STREAM_MIN_BYTES: usize = 128 << 10;
/// Copies of at least this many bytes stream past the cache (Miri's value).
#[cfg(miri)]
pub const STREAM_MIN_BYTES: usize = 256;

/// Copies `len` bytes from `src` to `dst`, with non-temporal stores where
/// the target has them (x86-64), and makes the stores visible to other
/// cores before returning, so a release store that publishes them
/// afterwards orders after them as it would after a plain copy.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` must be valid for reads
/// and `dst` for writes of `len` bytes, and the ranges must not overlap.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128};
        // A non-temporal store of 16 bytes to a 16-byte aligned address.
        // Under Miri (which cannot run the instruction's inline assembly) a
        // plain aligned store with the same addresses, so that Miri checks
        // every access of the loop below.
        #[cfg(not(miri))]
        use core::arch::x86_64::_mm_stream_si128 as store16;
        #[cfg(miri)]
        unsafe fn store16(p: *mut __m128i, v: __m128i) {
            // SAFETY: as for `_mm_stream_si128`: `p` is valid for a 16-byte
            // write and 16-byte aligned (the caller's obligation).
            unsafe { p.write(v) }
        }
        let s = src;
        // Plain stores up to the first 16-byte boundary of `dst`.
        let head = dst.align_offset(16).min(len);
        // SAFETY: every offset in this block stays under `len`, so all
        // reads are inside `src` and all writes inside `dst` (the caller's
        // contract); `dst.add(i)` for `i >= head` is 16-byte aligned, as
        // `_mm_stream_si128` requires; `_mm_loadu_si128` takes any
        // alignment. SSE2 is part of the x86-64 baseline. `_mm_sfence`
        // orders the weakly-ordered streaming stores before any later
        // store, which is what makes a following release store publish them
        // (under Miri the stores are plain and need no fence).
        unsafe {
            std::ptr::copy_nonoverlapping(s, dst, head);
            let mut i = head;
            while i + 64 <= len {
                let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
                let d = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
                store16(dst.add(i).cast::<__m128i>(), a);
                store16(dst.add(i + 16).cast::<__m128i>(), b);
                store16(dst.add(i + 32).cast::<__m128i>(), c);
                store16(dst.add(i + 48).cast::<__m128i>(), d);
                i += 64;
            }
            while i + 16 <= len {
                store16(dst.add(i).cast::<__m128i>(), _mm_loadu_si128(s.add(i).cast::<__m128i>()));
                i += 16;
            }
            std::ptr::copy_nonoverlapping(s.add(i), dst.add(i), len - i);
            #[cfg(not(miri))]
            core::arch::x86_64::_mm_sfence();
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

    /// Every length around the inline, `memcpy` and streaming thresholds
    /// and the 16- and 64-byte steps, at every alignment, lands every byte
    /// where a plain copy would, and nothing outside.
    #[test]
    fn copies_exactly_at_every_alignment_and_length() {
        let max = STREAM_MIN_BYTES + 200;
        let src: Vec<u8> = (0..max as u32).map(|i| (i * 7 + 3) as u8).collect();
        let lengths = (0..=200).chain([255, 256, 257, 511, 600]).chain(STREAM_MIN_BYTES - 3..STREAM_MIN_BYTES + 130);
        let mut dst = vec![0u8; max + 40];
        let untouched = vec![0xAAu8; dst.len()];
        // Miri checks every pointer of every copy: fewer cases, same paths.
        // (The checks compare slices, one `memcmp` Miri runs natively,
        // rather than interpreting a loop over every byte.)
        let (step, offsets) = if cfg!(miri) { (7, 3) } else { (1, 20) };
        for len in lengths.step_by(step) {
            for offset in 0..offsets {
                dst.fill(0xAA);
                // SAFETY: `offset + len <= 20 + max <= dst.len()`, and `dst`
                // is a separate buffer from `src`.
                unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr().add(offset), len) };
                assert!(dst[..offset] == untouched[..offset], "offset {offset} len {len}: head touched");
                assert!(dst[offset..offset + len] == src[..len], "offset {offset} len {len}: wrong bytes");
                let tail = offset + len;
                assert!(dst[tail..] == untouched[tail..], "offset {offset} len {len}: tail touched");
            }
        }
    }
}
