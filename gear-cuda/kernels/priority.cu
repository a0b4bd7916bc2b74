// Priority maintenance and deterministic selection on the device.
//
// gear_scatter_f64 writes new priorities. Indices must be distinct: the host
// resolves duplicate keys before the launch by keeping the last occurrence
// (last write wins, as a sequential loop would), so no two threads write
// the same word and no atomics are needed.
//
// Top-k in two passes without block-level synchronisation. Order: higher
// priority first, ties by lower slot index (a strict total order, so every
// candidate has a distinct rank). Negative priorities mark empty slots.
//   1. gear_topk_chunks: each thread keeps the best k of one contiguous
//      chunk, sorted best-first, by insertion into its own scratch list.
//   2. gear_topk_merge: each candidate counts, by binary search in every
//      chunk's sorted list, the candidates better than itself; that count is
//      its global rank, and ranks below k are written to the output. Cost:
//      (chunks * k) candidates x chunks x log k comparisons.

extern "C" __global__ void gear_scatter_f64(const gear_u32* __restrict__ idx, const double* __restrict__ val,
                                            gear_u64 m, double* __restrict__ dst) {
    for (gear_u64 i = gear_thread_x(); i < m; i += gear_threads_x()) dst[idx[i]] = val[i];
}

// Whether (pa, ia) ranks before (pb, ib).
__device__ __forceinline__ bool gear_better(double pa, gear_u32 ia, double pb, gear_u32 ib) {
    return pa > pb || (pa == pb && ia < ib);
}

// cand_p/cand_i: nchunks lists of k entries; cand_n[c]: entries in list c.
extern "C" __global__ void gear_topk_chunks(const double* __restrict__ prio, gear_u64 n, gear_u64 chunk_len,
                                            gear_u64 nchunks, gear_u64 k, double* __restrict__ cand_p,
                                            gear_u32* __restrict__ cand_i, gear_u64* __restrict__ cand_n) {
    for (gear_u64 c = gear_thread_x(); c < nchunks; c += gear_threads_x()) {
        gear_u64 b = c * chunk_len;
        if (b > n) b = n;
        gear_u64 e = b + chunk_len;
        if (e > n) e = n;
        double* lp = cand_p + c * k;
        gear_u32* li = cand_i + c * k;
        gear_u64 cnt = 0;
        for (gear_u64 i = b; i < e; ++i) {
            const double p = prio[i];
            if (p < 0.0) continue;
            const gear_u32 id = (gear_u32)i;
            gear_u64 pos;
            if (cnt < k) {
                pos = cnt++;
            } else if (gear_better(p, id, lp[k - 1], li[k - 1])) {
                pos = k - 1;
            } else {
                continue;
            }
            while (pos > 0 && gear_better(p, id, lp[pos - 1], li[pos - 1])) {
                lp[pos] = lp[pos - 1];
                li[pos] = li[pos - 1];
                --pos;
            }
            lp[pos] = p;
            li[pos] = id;
        }
        cand_n[c] = cnt;
    }
}

extern "C" __global__ void gear_topk_merge(const double* __restrict__ cand_p, const gear_u32* __restrict__ cand_i,
                                           const gear_u64* __restrict__ cand_n, gear_u64 nchunks, gear_u64 k,
                                           gear_u32* __restrict__ out_slot, double* __restrict__ out_prio) {
    const gear_u64 total = nchunks * k;
    for (gear_u64 t = gear_thread_x(); t < total; t += gear_threads_x()) {
        const gear_u64 c = t / k;
        const gear_u64 j = t - c * k;
        if (j >= cand_n[c]) continue;
        const double p = cand_p[t];
        const gear_u32 id = cand_i[t];
        gear_u64 rank = j;
        for (gear_u64 o = 0; o < nchunks && rank < k; ++o) {
            if (o == c) continue;
            const double* lp = cand_p + o * k;
            const gear_u32* li = cand_i + o * k;
            gear_u64 lo = 0, hi = cand_n[o];
            while (lo < hi) {
                gear_u64 mid = lo + (hi - lo) / 2;
                if (gear_better(lp[mid], li[mid], p, id)) lo = mid + 1; else hi = mid;
            }
            rank += lo;
        }
        if (rank < k) {
            out_slot[rank] = id;
            out_prio[rank] = p;
        }
    }
}
