// Window gather: for every (row, column) of a batch, copy the window of one
// trajectory column into a device batch buffer laid out [rows, w_len, *shape]
// (gear-core/src/collect.rs): copied steps where the window rule places them,
// zeros elsewhere, valid lengths out.
//
// Sources are addressed through a per-row table of slot base addresses, so
// one launch reads some rows from host memory mapped for the device
// (zero-copy) and others from a device-memory cache: both hold a slot in the
// same columnar layout (column c of the slot starts at col[3c] bytes, step t
// at col[3c] + t*s). All offsets are 64-bit.
//
// Grid: blockIdx.x strides over the rows*ncols tasks; the blockDim.x threads
// of the gridDim.y blocks that share an x index split one task's bytes.

// The window rule of gear_core::WindowSpec::resolve, for stored length k.
__device__ __forceinline__ void gear_resolve(gear_u64 k, gear_i64 offset, gear_u64 len, gear_u32 pad_head,
                                             gear_u64* src_step, gear_u64* dst_step, gear_u64* steps) {
    gear_u64 start;
    if (offset >= 0) {
        start = (gear_u64)offset;
    } else {
        // |offset| without overflow for the most negative value.
        gear_u64 back = (gear_u64)(-(offset + 1)) + 1ULL;
        start = k > back ? k - back : 0ULL;
    }
    gear_u64 end = start + len;
    if (end < start) end = ~0ULL;  // saturate
    if (end > k) end = k;
    gear_u64 n = end > start ? end - start : 0ULL;
    *steps = n;
    *src_step = n == 0 ? 0ULL : start;
    *dst_step = pad_head ? len - n : 0ULL;
}

// (x >> sh) | (y << (64 - sh)): the 8 bytes starting sh/8 bytes into the
// little-endian pair (x, y); sh in [0, 64).
__device__ __forceinline__ gear_u64 gear_funnel(gear_u64 x, gear_u64 y, gear_u32 sh) {
    return sh == 0 ? x : (x >> sh) | (y << (64u - sh));
}

// Copies n bytes: a byte head up to the 16-byte alignment of dst, then whole
// 16-byte words stored aligned, then a byte tail. Each word is loaded
// aligned too, whatever the source's alignment: when src and dst differ
// modulo 16 (an unpadded layout: odd T with [4096, 4, 4] columns, f32 [17],
// odd slot strides), the thread loads the two aligned 16-byte words that
// cover its 16 source bytes and funnel-shifts them into place. Neither load
// leaves the aligned 16-byte words holding wanted bytes, so none crosses a
// page the copy does not already read. Neighbouring threads load
// overlapping words in the same instruction pair, which the L1 serves.
__device__ __forceinline__ void gear_copy(gear_u8* __restrict__ dst, const gear_u8* __restrict__ src, gear_u64 n,
                                          gear_u64 tid, gear_u64 nthreads) {
    gear_u64 head = (16ULL - ((gear_u64)dst & 15ULL)) & 15ULL;
    if (head > n) head = n;
    const gear_u64 words = (n - head) / 16ULL;
    const gear_u64 tail = head + words * 16ULL;
    for (gear_u64 i = tid; i < head; i += nthreads) {
        GEAR_COUNT_LOAD(1);
        dst[i] = src[i];
    }
    gear_v16* dw = (gear_v16*)(dst + head);
    const gear_u8* s = src + head;
    const gear_u64 off = (gear_u64)s & 15ULL;
    const gear_v16* sw = (const gear_v16*)(s - off);
    if (off == 0) {
        for (gear_u64 i = tid; i < words; i += nthreads) {
            GEAR_COUNT_LOAD(16);
            dw[i] = sw[i];
        }
    } else {
        const gear_u32 sh = (gear_u32)(off & 7ULL) * 8u;
        const bool high = off >= 8;
        for (gear_u64 i = tid; i < words; i += nthreads) {
            GEAR_COUNT_LOAD(16);
            GEAR_COUNT_LOAD(16);
            const gear_v16 x0 = sw[i];
            const gear_v16 x1 = sw[i + 1];
            // The 24 bytes from which the word is cut start at lane 0 or 1.
            const gear_u64 a0 = high ? x0.hi : x0.lo;
            const gear_u64 a1 = high ? x1.lo : x0.hi;
            const gear_u64 a2 = high ? x1.hi : x1.lo;
            gear_v16 o;
            o.lo = gear_funnel(a0, a1, sh);
            o.hi = gear_funnel(a1, a2, sh);
            dw[i] = o;
        }
    }
    for (gear_u64 i = tail + tid; i < n; i += nthreads) {
        GEAR_COUNT_LOAD(1);
        dst[i] = src[i];
    }
}

// Zeroes n bytes: a byte head to 16-byte alignment, 16-byte stores, a byte tail.
__device__ __forceinline__ void gear_zero(gear_u8* dst, gear_u64 n, gear_u64 tid, gear_u64 nthreads) {
    gear_u64 head = (16ULL - ((gear_u64)dst & 15ULL)) & 15ULL;
    if (head > n) head = n;
    gear_u64 words = (n - head) / 16ULL;
    gear_u64 tail = head + words * 16ULL;
    for (gear_u64 i = tid; i < head; i += nthreads) dst[i] = 0;
    gear_v16 z;
    z.lo = 0;
    z.hi = 0;
    gear_v16* dw = (gear_v16*)(dst + head);
    for (gear_u64 i = tid; i < words; i += nthreads) dw[i] = z;
    for (gear_u64 i = tail + tid; i < n; i += nthreads) dst[i] = 0;
}

// row_src[r]: device address of row r's slot base (mapped host or cache).
// row_len[r]: start << 32 | k: the window applies to the k steps of row r's
//             slot from step start (a whole trajectory: start 0 and its
//             stored length; an item: its window); start + k <= T < 2^32,
//             host-checked.
// cols[3c..3c+3]: column c's offset inside a slot, bytes per step s, and
//                 the device address of its batch buffer.
// lengths_out[r]: valid steps of row r (written once per row).
extern "C" __global__ void gear_gather(const gear_u64* __restrict__ row_src, const gear_u64* __restrict__ row_len,
                                       const gear_u64* __restrict__ cols, gear_u64 rows, gear_u64 ncols,
                                       gear_i64 w_offset, gear_u64 w_len, gear_u32 pad_head,
                                       gear_u64* __restrict__ lengths_out) {
    const gear_u64 tasks = rows * ncols;
    const gear_u64 tid = (gear_u64)blockIdx.y * (gear_u64)blockDim.x + (gear_u64)threadIdx.x;
    const gear_u64 nthreads = (gear_u64)gridDim.y * (gear_u64)blockDim.x;
    for (gear_u64 task = blockIdx.x; task < tasks; task += gridDim.x) {
        const gear_u64 r = task / ncols;
        const gear_u64 c = task - r * ncols;
        gear_u64 src_step, dst_step, steps;
        // start << 32 | k: the window applies to steps [start, start + k).
        const gear_u64 k = row_len[r] & 0xffffffffULL;
        const gear_u64 start = row_len[r] >> 32;
        gear_resolve(k, w_offset, w_len, pad_head, &src_step, &dst_step, &steps);
        const gear_u64 s = cols[3 * c + 1];
        const gear_u64 row_bytes = w_len * s;
        gear_u8* dst = (gear_u8*)(cols[3 * c + 2] + r * row_bytes);
        const gear_u8* src = (const gear_u8*)(row_src[r] + cols[3 * c] + (start + src_step) * s);
        const gear_u64 a = dst_step * s;
        const gear_u64 b = a + steps * s;
        gear_zero(dst, a, tid, nthreads);
        gear_copy(dst + a, src, b - a, tid, nthreads);
        gear_zero(dst + b, row_bytes - b, tid, nthreads);
        if (c == 0 && tid == 0) lengths_out[r] = steps;
    }
}
