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

// A slot's weight p^alpha; a negative priority (no item) and a zero one have
// none whatever alpha (pow(0, 0) is 1), as the host strategies give them none.
__device__ __forceinline__ double gear_weight(double p, double alpha) {
    if (p <= 0.0) return 0.0;
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

// Draws. Outputs per draw: the slot, P(slot) = w/total, and the importance
// weight (N*P)^-beta / (N*P_min)^-beta = (w_min / w)^beta. When the total is
// not a positive finite number (every weight zero, or an overflow) there is
// nothing to draw from: every draw is slot 0xffffffff with probability and
// weight 0, which gear_drawn_rows turns into rows without a key (the host
// draws those rows itself).
extern "C" __global__ void gear_sample_draws(const double* __restrict__ prio, const double* __restrict__ prefix,
                                             gear_u64 n, double alpha, double beta,
                                             const double* __restrict__ stats, gear_u64 seed, gear_u64 draws,
                                             gear_u32 stratified, gear_u32* __restrict__ out_slot,
                                             double* __restrict__ out_prob, double* __restrict__ out_weight) {
    const double total = stats[0];
    const double wmin = stats[1];
    // total - total is 0 only for a finite total.
    const bool drawable = total > 0.0 && total - total == 0.0;
    for (gear_u64 d = gear_thread_x(); d < draws; d += gear_threads_x()) {
        if (!drawable) {
            out_slot[d] = 0xffffffffu;
            out_prob[d] = 0.0;
            out_weight[d] = 0.0;
            continue;
        }
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

// A row without a key (see gear_drawn_rows).
#define GEAR_NO_KEY 0xffffffffffffffffULL

// Turns draws made on the device into the gather's row tables, so the draw
// never leaves the device before the gather reads it. Row r takes draw
// drawn[r % ndrawn] (top-k repeats its k best from the first; proportional
// draws have ndrawn == rows). slot_key[s] is slot s's key as
// generation << 32 | slot (GEAR_NO_KEY: nothing drawable there) and
// slot_len[s] its stored length (<= T, checked on the host when the slot
// was uploaded). With random_start, a trajectory of k > w_len steps is cut
// to w_len + u steps, u uniform in [0, k - w_len] from splitmix64 keyed by
// (seed, r), so the window of its last w_len steps starts uniformly.
//
// Writes row_tab[r] = the slot's base address (data_base + s * stride) and
// row_tab[rows + r] = the length the gather uses (gear_gather's row_src and
// row_len tables), and the host's copy out[0..4 rows): the key, that
// length, and the draw's probability and weight as f64 bits (1 and 1 when
// draw_prob/draw_weight are null: top-k). A draw outside the table, or on
// a slot without a key, gives a row of key GEAR_NO_KEY and length 0 (the
// gather writes zeros), which the host redraws.
extern "C" __global__ void gear_drawn_rows(const gear_u32* __restrict__ drawn, gear_u64 ndrawn, gear_u64 rows,
                                           const gear_u64* __restrict__ slot_key,
                                           const gear_u64* __restrict__ slot_len, gear_u64 capacity,
                                           gear_u64 data_base, gear_u64 stride, gear_u64 w_len,
                                           gear_u32 random_start, gear_u64 seed,
                                           const double* __restrict__ draw_prob,
                                           const double* __restrict__ draw_weight, gear_u64* __restrict__ row_tab,
                                           gear_u64* __restrict__ out) {
    double* out_f = (double*)out;
    for (gear_u64 r = gear_thread_x(); r < rows; r += gear_threads_x()) {
        const gear_u64 s = ndrawn == 0 ? capacity : (gear_u64)drawn[r % ndrawn];
        gear_u64 key = GEAR_NO_KEY;
        gear_u64 k = 0;
        gear_u64 base = data_base;
        double p = 0.0, w = 0.0;
        if (s < capacity && slot_key[s] != GEAR_NO_KEY) {
            key = slot_key[s];
            k = slot_len[s];
            base = data_base + s * stride;
            if (random_start && k > w_len) k = w_len + gear_splitmix64_at(seed, r) % (k - w_len + 1ULL);
            p = draw_prob ? draw_prob[r] : 1.0;
            w = draw_weight ? draw_weight[r] : 1.0;
        }
        row_tab[r] = base;
        row_tab[rows + r] = k;
        out[r] = key;
        out[rows + r] = k;
        out_f[2 * rows + r] = p;
        out_f[3 * rows + r] = w;
    }
}
