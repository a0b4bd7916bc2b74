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

// Copies n bytes in words of W: a byte head up to W-alignment of dst, whole
// words, then a byte tail. Callers choose W so that src and dst are equally
// misaligned modulo sizeof(W), which makes the word accesses aligned on both.
template <typename W>
__device__ __forceinline__ void gear_copy_words(gear_u8* __restrict__ dst, const gear_u8* __restrict__ src,
                                                gear_u64 n, gear_u64 tid, gear_u64 nthreads) {
    const gear_u64 w = (gear_u64)sizeof(W);
    gear_u64 head = (w - ((gear_u64)dst & (w - 1))) & (w - 1);
    if (head > n) head = n;
    gear_u64 words = (n - head) / w;
    gear_u64 tail = head + words * w;
    for (gear_u64 i = tid; i < head; i += nthreads) dst[i] = src[i];
    W* dw = (W*)(dst + head);
    const W* sw = (const W*)(src + head);
    for (gear_u64 i = tid; i < words; i += nthreads) dw[i] = sw[i];
    for (gear_u64 i = tail + tid; i < n; i += nthreads) dst[i] = src[i];
}

__device__ __forceinline__ void gear_copy(gear_u8* __restrict__ dst, const gear_u8* __restrict__ src, gear_u64 n,
                                          gear_u64 tid, gear_u64 nthreads) {
    gear_u64 rel = (gear_u64)dst ^ (gear_u64)src;
    if ((rel & 15ULL) == 0) {
        gear_copy_words<gear_v16>(dst, src, n, tid, nthreads);
    } else if ((rel & 7ULL) == 0) {
        gear_copy_words<gear_u64>(dst, src, n, tid, nthreads);
    } else if ((rel & 3ULL) == 0) {
        gear_copy_words<gear_u32>(dst, src, n, tid, nthreads);
    } else {
        for (gear_u64 i = tid; i < n; i += nthreads) dst[i] = src[i];
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
// row_len[r]: stored length k of row r's trajectory (k <= T, host-checked).
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
        gear_resolve(row_len[r], w_offset, w_len, pad_head, &src_step, &dst_step, &steps);
        const gear_u64 s = cols[3 * c + 1];
        const gear_u64 row_bytes = w_len * s;
        gear_u8* dst = (gear_u8*)(cols[3 * c + 2] + r * row_bytes);
        const gear_u8* src = (const gear_u8*)(row_src[r] + cols[3 * c] + src_step * s);
        const gear_u64 a = dst_step * s;
        const gear_u64 b = a + steps * s;
        gear_zero(dst, a, tid, nthreads);
        gear_copy(dst + a, src, b - a, tid, nthreads);
        gear_zero(dst + b, row_bytes - b, tid, nthreads);
        if (c == 0 && tid == 0) lengths_out[r] = steps;
    }
}
