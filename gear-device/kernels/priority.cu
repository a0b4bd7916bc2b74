// Priority maintenance and deterministic selection on the device.
//
// gear_scatter_f64 writes new priorities. Indices must be distinct: the host
// resolves duplicate keys before the launch by keeping the last occurrence
// (last write wins, as a sequential loop would), so no two threads write
// the same word and no atomics are needed.
//
extern "C" __global__ void gear_scatter_f64(const gear_u32* __restrict__ idx, const double* __restrict__ val,
                                            gear_u64 m, double* __restrict__ dst) {
    for (gear_u64 i = gear_thread_x(); i < m; i += gear_threads_x()) dst[idx[i]] = val[i];
}

// The same for 64-bit words (device slot keys and lengths); indices
// distinct as above.
extern "C" __global__ void gear_scatter_u64(const gear_u32* __restrict__ idx, const gear_u64* __restrict__ val,
                                            gear_u64 m, gear_u64* __restrict__ dst) {
    for (gear_u64 i = gear_thread_x(); i < m; i += gear_threads_x()) dst[idx[i]] = val[i];
}

// Top-k by a bitonic sort of slot indices (Batcher's network), best first.
// Order: higher priority first, ties by lower slot index; empty slots
// (negative priority) and the padding up to a power of two m (index
// 0xffffffff) come last. gear_topk_init fills idx[0..m), then the host
// launches gear_topk_step for every (size, stride) of the network
// (size = 2, 4, ..., m; stride = size/2, ..., 1: log2(m)(log2(m)+1)/2
// launches of m/2 compare-exchanges each), and gear_topk_emit writes the
// first k. Work is O(n log^2 n) whatever k is, spread over m/2 threads per
// launch; the earlier per-thread insertion lists cost O(n k) on one thread
// when k neared n/4. Each launch touches disjoint pairs, so no
// synchronisation is needed inside a launch.
#define GEAR_TOPK_PAD 0xffffffffu

// Whether slot a ranks before slot b (see the order above).
__device__ __forceinline__ bool gear_topk_better(const double* __restrict__ prio, gear_u64 n, gear_u32 a,
                                                 gear_u32 b) {
    const bool va = a != GEAR_TOPK_PAD && a < n && prio[a] >= 0.0;
    const bool vb = b != GEAR_TOPK_PAD && b < n && prio[b] >= 0.0;
    if (va != vb) return va;
    if (va) {
        const double pa = prio[a], pb = prio[b];
        if (pa != pb) return pa > pb;
    }
    return a < b;
}

extern "C" __global__ void gear_topk_init(gear_u64 n, gear_u64 m, gear_u32* __restrict__ idx) {
    for (gear_u64 i = gear_thread_x(); i < m; i += gear_threads_x()) idx[i] = i < n ? (gear_u32)i : GEAR_TOPK_PAD;
}

// One step of the network: m/2 pairs (i, i + stride); pairs inside an
// aligned run of `size` with (i & size) == 0 are put best first, the others
// worst first (the last stage, size == m, has every run best first).
extern "C" __global__ void gear_topk_step(const double* __restrict__ prio, gear_u64 n, gear_u64 m, gear_u64 size,
                                          gear_u64 stride, gear_u32* __restrict__ idx) {
    const gear_u64 pairs = m / 2;
    for (gear_u64 t = gear_thread_x(); t < pairs; t += gear_threads_x()) {
        const gear_u64 i = 2 * stride * (t / stride) + t % stride;
        const gear_u64 j = i + stride;
        const gear_u32 a = idx[i], b = idx[j];
        const bool best_first = (i & size) == 0;
        if (gear_topk_better(prio, n, b, a) == best_first) {
            idx[i] = b;
            idx[j] = a;
        }
    }
}

// The first k of the sorted indices; empty entries as (0xffffffff, -1).
extern "C" __global__ void gear_topk_emit(const double* __restrict__ prio, gear_u64 n,
                                          const gear_u32* __restrict__ idx, gear_u64 k,
                                          gear_u32* __restrict__ out_slot, double* __restrict__ out_prio) {
    for (gear_u64 r = gear_thread_x(); r < k; r += gear_threads_x()) {
        const gear_u32 s = idx[r];
        const bool valid = s != GEAR_TOPK_PAD && s < n && prio[s] >= 0.0;
        out_slot[r] = valid ? s : GEAR_TOPK_PAD;
        out_prio[r] = valid ? prio[s] : -1.0;
    }
}
