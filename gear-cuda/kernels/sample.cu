// Prioritized (proportional) sampling: B draws with P(i) = w_i / sum(w),
// w_i = p_i^alpha, with probabilities and importance weights out.
//
// Priorities live in device memory, one f64 per table slot; a negative value
// marks a slot that holds nothing (weight 0). Prefix sums are recomputed in
// f64 from the priorities whenever they changed, in a fixed order (so the
// same priorities always give bit-identical sums and a seed always gives the
// same draws), in three passes without block-level synchronisation:
//   1. gear_prio_chunks: each thread reduces one contiguous chunk (sum, and
//      the smallest positive weight);
//   2. gear_prio_scan: one thread scans the chunk sums (exclusive), and
//      writes the total and the smallest positive weight;
//   3. gear_prio_prefix: each thread writes its chunk's inclusive prefix as
//      chunk_off[c] + (the chunk-local running sum). The chunk-local sum at
//      the chunk's end is bit-identical to pass 1's, so the prefix is
//      non-decreasing across chunk boundaries too.
// Then gear_sample_draws: draw d takes u = the (d+1)-th output of splitmix64
// seeded with `seed` (a counter-based stream: any draw can be recomputed
// alone), x = u*total (or (d+u)/B*total when stratified), and binary-searches
// the first slot whose prefix exceeds x.

__device__ __forceinline__ double gear_weight(double p, double alpha) {
    if (p < 0.0) return 0.0;
    if (alpha == 1.0) return p;
    return pow(p, alpha);
}

// The (d+1)-th output of splitmix64 started at state `seed`
// (gear_core::rng::splitmix64 called d+1 times).
__device__ __forceinline__ gear_u64 gear_splitmix64_at(gear_u64 seed, gear_u64 d) {
    gear_u64 z = seed + (d + 1ULL) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ gear_u64 gear_chunk_begin(gear_u64 c, gear_u64 chunk_len, gear_u64 n) {
    gear_u64 b = c * chunk_len;
    return b < n ? b : n;
}

// Pass 1. chunk_sum[c] = sum of w over chunk c; chunk_min[c] = smallest
// positive w in it, or -1 when it has none.
extern "C" __global__ void gear_prio_chunks(const double* __restrict__ prio, gear_u64 n, double alpha,
                                            gear_u64 chunk_len, gear_u64 nchunks, double* __restrict__ chunk_sum,
                                            double* __restrict__ chunk_min) {
    for (gear_u64 c = gear_thread_x(); c < nchunks; c += gear_threads_x()) {
        gear_u64 b = gear_chunk_begin(c, chunk_len, n);
        gear_u64 e = gear_chunk_begin(c + 1, chunk_len, n);
        double acc = 0.0;
        double mn = -1.0;
        for (gear_u64 i = b; i < e; ++i) {
            double w = gear_weight(prio[i], alpha);
            acc += w;
            if (w > 0.0 && (mn < 0.0 || w < mn)) mn = w;
        }
        chunk_sum[c] = acc;
        chunk_min[c] = mn;
    }
}

// Pass 2, one thread. chunk_off[c] = sum of chunk_sum[0..c); stats[0] = total,
// stats[1] = smallest positive weight (-1 when none).
extern "C" __global__ void gear_prio_scan(const double* __restrict__ chunk_sum, const double* __restrict__ chunk_min,
                                          gear_u64 nchunks, double* __restrict__ chunk_off,
                                          double* __restrict__ stats) {
    if (gear_thread_x() != 0) return;
    double acc = 0.0;
    double mn = -1.0;
    for (gear_u64 c = 0; c < nchunks; ++c) {
        chunk_off[c] = acc;
        acc += chunk_sum[c];
        double m = chunk_min[c];
        if (m > 0.0 && (mn < 0.0 || m < mn)) mn = m;
    }
    stats[0] = acc;
    stats[1] = mn;
}

// Pass 3. prefix[i] = chunk_off[c] + (w summed over chunk c up to i).
extern "C" __global__ void gear_prio_prefix(const double* __restrict__ prio, gear_u64 n, double alpha,
                                            gear_u64 chunk_len, gear_u64 nchunks,
                                            const double* __restrict__ chunk_off, double* __restrict__ prefix) {
    for (gear_u64 c = gear_thread_x(); c < nchunks; c += gear_threads_x()) {
        gear_u64 b = gear_chunk_begin(c, chunk_len, n);
        gear_u64 e = gear_chunk_begin(c + 1, chunk_len, n);
        double off = chunk_off[c];
        double acc = 0.0;
        for (gear_u64 i = b; i < e; ++i) {
            acc += gear_weight(prio[i], alpha);
            prefix[i] = off + acc;
        }
    }
}

// First i in [0, n) with prefix[i] > x, or n when there is none.
__device__ __forceinline__ gear_u64 gear_first_greater(const double* prefix, gear_u64 n, double x) {
    gear_u64 lo = 0, hi = n;
    while (lo < hi) {
        gear_u64 mid = lo + (hi - lo) / 2;
        if (prefix[mid] > x) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// First i in [0, n) with prefix[i] >= x, or n when there is none.
__device__ __forceinline__ gear_u64 gear_first_at_least(const double* prefix, gear_u64 n, double x) {
    gear_u64 lo = 0, hi = n;
    while (lo < hi) {
        gear_u64 mid = lo + (hi - lo) / 2;
        if (prefix[mid] >= x) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// Draws. Requires stats[0] > 0 (checked on the host). Outputs per draw:
// the slot, P(slot) = w/total, and the importance weight
// (N*P)^-beta / (N*P_min)^-beta = (w_min / w)^beta.
extern "C" __global__ void gear_sample_draws(const double* __restrict__ prio, const double* __restrict__ prefix,
                                             gear_u64 n, double alpha, double beta,
                                             const double* __restrict__ stats, gear_u64 seed, gear_u64 draws,
                                             gear_u32 stratified, gear_u32* __restrict__ out_slot,
                                             double* __restrict__ out_prob, double* __restrict__ out_weight) {
    const double total = stats[0];
    const double wmin = stats[1];
    for (gear_u64 d = gear_thread_x(); d < draws; d += gear_threads_x()) {
        const gear_u64 bits = gear_splitmix64_at(seed, d);
        const double u = (double)(bits >> 11) * (1.0 / 9007199254740992.0);
        double x = stratified ? (((double)d + u) / (double)draws) * total : u * total;
        gear_u64 i = gear_first_greater(prefix, n, x);
        if (i >= n) {
            // x rounded up to the total: take the last slot with weight.
            i = gear_first_at_least(prefix, n, total);
            if (i >= n) i = n - 1;
        }
        const double w = gear_weight(prio[i], alpha);
        out_slot[d] = (gear_u32)i;
        out_prob[d] = w / total;
        out_weight[d] = beta == 0.0 ? 1.0 : pow(wmin / w, beta);
    }
}
