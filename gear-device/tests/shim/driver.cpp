// Runs the GEAR kernels on the CPU through shim.h. Reads commands from
// stdin and writes results to stdout, all as little-endian 64-bit words and
// raw bytes; the protocol is defined by tests/cpu_shim.rs (gear-device), which builds this
// file with g++ and compares the results with CPU references.
#define GEAR_SHIM_COUNT_LOADS 1
#include "shim.h"
#include "common.cuh"
#include "gather.cu"
#include "sample.cu"
#include "priority.cu"
#include "bench.cu"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static void die(const char* what) {
    std::fprintf(stderr, "driver: %s\n", what);
    std::exit(2);
}

static bool rd_raw(void* p, size_t n) { return std::fread(p, 1, n, stdin) == n; }
static gear_u64 rd() {
    gear_u64 v;
    if (!rd_raw(&v, 8)) die("truncated input");
    return v;
}
static double rdf() {
    gear_u64 v = rd();
    double d;
    std::memcpy(&d, &v, 8);
    return d;
}
static void wr_raw(const void* p, size_t n) {
    if (std::fwrite(p, 1, n, stdout) != n) die("short write");
}
static void wr(gear_u64 v) { wr_raw(&v, 8); }
static void wrf(double d) { wr_raw(&d, 8); }

// A zero-initialised buffer whose usable part starts `misalign` bytes past a
// 64-byte boundary, filled with `fill`.
struct Buf {
    std::vector<gear_u8> store;
    gear_u8* p;
    Buf(gear_u64 len, gear_u64 misalign, gear_u8 fill) : store(len + 128, fill) {
        gear_u64 a = (gear_u64)store.data();
        gear_u64 base = (a + 63) & ~63ULL;
        p = (gear_u8*)(base + (misalign & 63));
    }
};

static gear_dim3 dims(gear_u64 x, gear_u64 y) { return {(unsigned)x, (unsigned)y, 1}; }

static void op_gather() {
    gear_u64 gx = rd(), gy = rd(), bx = rd();
    gear_u64 rows = rd(), ncols = rd();
    gear_i64 w_offset = (gear_i64)rd();
    gear_u64 w_len = rd();
    gear_u32 pad_head = (gear_u32)rd();
    gear_u64 blob_len = rd(), blob_mis = rd();
    Buf blob(blob_len, blob_mis, 0);
    if (!rd_raw(blob.p, blob_len)) die("truncated blob");
    std::vector<gear_u64> row_src(rows), row_len(rows), cols(3 * ncols), dst_mis(ncols);
    for (auto& v : row_src) v = rd() + (gear_u64)blob.p;
    for (auto& v : row_len) v = rd();
    for (auto& v : cols) v = rd();
    for (auto& v : dst_mis) v = rd();
    std::vector<Buf*> dst;
    for (gear_u64 c = 0; c < ncols; ++c) {
        gear_u64 len = rows * w_len * cols[3 * c + 1];
        dst.push_back(new Buf(len, dst_mis[c], 0xAB));  // garbage the kernel must overwrite
        cols[3 * c + 2] += (gear_u64)dst.back()->p;
    }
    std::vector<gear_u64> lengths(rows, ~0ULL);
    std::memset(gear_loads, 0, sizeof gear_loads);
    gear_launch(dims(gx, gy), dims(bx, 1), [&] {
        gear_gather(row_src.data(), row_len.data(), cols.data(), rows, ncols, w_offset, w_len, pad_head,
                    lengths.data());
    });
    for (auto v : lengths) wr(v);
    wr(gear_loads[1]);
    wr(gear_loads[16]);
    for (gear_u64 c = 0; c < ncols; ++c) {
        wr_raw(dst[c]->p, rows * w_len * cols[3 * c + 1]);
        delete dst[c];
    }
}

static void op_sample() {
    gear_u64 gx = rd(), bx = rd();
    gear_u64 n = rd();
    double alpha = rdf(), beta = rdf();
    gear_u64 chunk_len = rd(), nchunks = rd(), seed = rd(), draws = rd();
    gear_u32 stratified = (gear_u32)rd();
    gear_u64 dgx = rd();
    std::vector<double> prio(n);
    for (auto& v : prio) v = rdf();
    std::vector<double> chunk_sum(nchunks), chunk_min(nchunks), chunk_off(nchunks), prefix(n), stats(2);
    std::vector<gear_u32> slot(draws, 0xffffffffu);
    std::vector<double> prob(draws), weight(draws);
    gear_launch(dims(gx, 1), dims(bx, 1), [&] {
        gear_prio_chunks(prio.data(), n, alpha, chunk_len, nchunks, chunk_sum.data(), chunk_min.data());
    });
    gear_launch(dims(1, 1), dims(1, 1), [&] {
        gear_prio_scan(chunk_sum.data(), chunk_min.data(), nchunks, chunk_off.data(), stats.data());
    });
    gear_launch(dims(gx, 1), dims(bx, 1), [&] {
        gear_prio_prefix(prio.data(), n, alpha, chunk_len, nchunks, chunk_off.data(), prefix.data());
    });
    if (draws > 0 && stats[0] > 0.0) {
        gear_launch(dims(dgx, 1), dims(bx, 1), [&] {
            gear_sample_draws(prio.data(), prefix.data(), n, alpha, beta, stats.data(), seed, draws, stratified,
                              slot.data(), prob.data(), weight.data());
        });
    }
    for (auto v : prefix) wrf(v);
    wrf(stats[0]);
    wrf(stats[1]);
    for (gear_u64 d = 0; d < draws; ++d) {
        wr(slot[d]);
        wrf(prob[d]);
        wrf(weight[d]);
    }
}

// Input: the grid x of init/emit and the block size, n, k, the network
// (m, steps as (size, stride), each launched with its own grid x), then n
// priorities. Output: k (slot, priority) pairs.
static void op_topk() {
    gear_u64 gx_init = rd(), gx_emit = rd(), bx = rd();
    gear_u64 n = rd(), k = rd(), m = rd(), nsteps = rd();
    std::vector<gear_u64> step_gx(nsteps), size(nsteps), stride(nsteps);
    for (gear_u64 s = 0; s < nsteps; ++s) {
        step_gx[s] = rd();
        size[s] = rd();
        stride[s] = rd();
    }
    std::vector<double> prio(n);
    for (auto& v : prio) v = rdf();
    std::vector<gear_u32> idx(m, 0x12345678u);
    std::vector<gear_u32> out_slot(k, 0x0badf00du);
    std::vector<double> out_prio(k, -2.0);
    gear_launch(dims(gx_init, 1), dims(bx, 1), [&] { gear_topk_init(n, m, idx.data()); });
    for (gear_u64 s = 0; s < nsteps; ++s) {
        gear_launch(dims(step_gx[s], 1), dims(bx, 1),
                    [&] { gear_topk_step(prio.data(), n, m, size[s], stride[s], idx.data()); });
    }
    gear_launch(dims(gx_emit, 1), dims(bx, 1),
                [&] { gear_topk_emit(prio.data(), n, idx.data(), k, out_slot.data(), out_prio.data()); });
    for (gear_u64 i = 0; i < k; ++i) {
        wr(out_slot[i]);
        wrf(out_prio[i]);
    }
}

static void op_scatter() {
    gear_u64 gx = rd(), bx = rd();
    gear_u64 n = rd(), m = rd();
    std::vector<double> dst(n), val(m);
    std::vector<gear_u32> idx(m);
    for (auto& v : dst) v = rdf();
    for (auto& v : idx) v = (gear_u32)rd();
    for (auto& v : val) v = rdf();
    gear_launch(dims(gx, 1), dims(bx, 1), [&] { gear_scatter_f64(idx.data(), val.data(), m, dst.data()); });
    for (auto v : dst) wrf(v);
}

static void op_scatter_u64() {
    gear_u64 gx = rd(), bx = rd();
    gear_u64 n = rd(), m = rd();
    std::vector<gear_u64> dst(n), val(m);
    std::vector<gear_u32> idx(m);
    for (auto& v : dst) v = rd();
    for (auto& v : idx) v = (gear_u32)rd();
    for (auto& v : val) v = rd();
    gear_launch(dims(gx, 1), dims(bx, 1), [&] { gear_scatter_u64(idx.data(), val.data(), m, dst.data()); });
    for (auto v : dst) wr(v);
}

// The device-side draw into the gather: prefix passes and draws (or the
// top-k network when topk != 0), gear_drawn_rows filling the gather's row
// tables, and gear_gather reading them, as CudaCollector::gather_drawn
// queues them. Input: grid x and block size, capacity n, alpha, beta,
// chunking, seed, rows, stratified, topk (k), the top-k network, random
// start flag and seed, w_len/offset/pad, ncols, the table blob, per slot
// priority, then per slot its key word and length, the column table (offsets, step bytes).
// Output: the host words (4 per row), the kernel's lengths, the columns.
static void op_drawn() {
    gear_u64 gx = rd(), bx = rd();
    gear_u64 n = rd();
    double alpha = rdf(), beta = rdf();
    gear_u64 chunk_len = rd(), nchunks = rd(), seed = rd(), rows = rd();
    gear_u32 stratified = (gear_u32)rd();
    gear_u64 k = rd(), m = rd(), nsteps = rd();
    std::vector<gear_u64> size(nsteps), stride_v(nsteps);
    for (gear_u64 s = 0; s < nsteps; ++s) {
        size[s] = rd();
        stride_v[s] = rd();
    }
    gear_u32 random_start = (gear_u32)rd();
    gear_u64 rs_seed = rd();
    gear_u64 w_len = rd();
    gear_i64 w_offset = (gear_i64)rd();
    gear_u32 pad_head = (gear_u32)rd();
    gear_u64 ncols = rd(), slot_stride = rd();
    gear_u64 blob_len = rd();
    Buf blob(blob_len, 0, 0);
    if (!rd_raw(blob.p, blob_len)) die("truncated blob");
    std::vector<double> prio(n);
    std::vector<gear_u64> slot_key(n), slot_len(n);
    for (auto& v : prio) v = rdf();
    for (gear_u64 s = 0; s < n; ++s) {
        slot_key[s] = rd();
        slot_len[s] = rd();
    }
    std::vector<gear_u64> cols(3 * ncols);
    for (gear_u64 c = 0; c < ncols; ++c) {
        cols[3 * c] = rd();
        cols[3 * c + 1] = rd();
    }
    std::vector<Buf*> dst;
    for (gear_u64 c = 0; c < ncols; ++c) {
        dst.push_back(new Buf(rows * w_len * cols[3 * c + 1], 0, 0xAB));
        cols[3 * c + 2] = (gear_u64)dst.back()->p;
    }
    gear_u64 r1 = rows ? rows : 1;
    std::vector<gear_u32> drawn(r1, 0x5a5a5a5au);
    std::vector<double> dprob(r1, -7.0), dweight(r1, -7.0);
    gear_u64 ndrawn = rows;
    const double* prob_p = dprob.data();
    const double* weight_p = dweight.data();
    if (k == 0) {
        std::vector<double> chunk_sum(nchunks), chunk_min(nchunks), chunk_off(nchunks), prefix(n), stats(2);
        gear_launch(dims(gx, 1), dims(bx, 1), [&] {
            gear_prio_chunks(prio.data(), n, alpha, chunk_len, nchunks, chunk_sum.data(), chunk_min.data());
        });
        gear_launch(dims(1, 1), dims(1, 1), [&] {
            gear_prio_scan(chunk_sum.data(), chunk_min.data(), nchunks, chunk_off.data(), stats.data());
        });
        gear_launch(dims(gx, 1), dims(bx, 1), [&] {
            gear_prio_prefix(prio.data(), n, alpha, chunk_len, nchunks, chunk_off.data(), prefix.data());
        });
        gear_launch(dims(gx, 1), dims(bx, 1), [&] {
            gear_sample_draws(prio.data(), prefix.data(), n, alpha, beta, stats.data(), seed, rows, stratified,
                              drawn.data(), dprob.data(), dweight.data());
        });
    } else {
        std::vector<gear_u32> idx(m);
        gear_launch(dims(gx, 1), dims(bx, 1), [&] { gear_topk_init(n, m, idx.data()); });
        for (gear_u64 s = 0; s < nsteps; ++s) {
            gear_launch(dims(gx, 1), dims(bx, 1),
                        [&] { gear_topk_step(prio.data(), n, m, size[s], stride_v[s], idx.data()); });
        }
        gear_launch(dims(gx, 1), dims(bx, 1),
                    [&] { gear_topk_emit(prio.data(), n, idx.data(), k, drawn.data(), dprob.data()); });
        ndrawn = k;
        prob_p = nullptr;
        weight_p = nullptr;
    }
    std::vector<gear_u64> row_tab(2 * r1, 0x77), out(4 * r1, 0x77), lengths(r1, ~0ULL);
    gear_launch(dims(gx, 1), dims(bx, 1), [&] {
        gear_drawn_rows(drawn.data(), ndrawn, rows, slot_key.data(), slot_len.data(), n, (gear_u64)blob.p,
                        slot_stride, w_len, random_start, rs_seed, prob_p, weight_p, row_tab.data(), out.data());
    });
    const gear_u64 tasks = rows * ncols;
    gear_launch(dims(tasks > 0 ? tasks : 1, 2), dims(bx, 1), [&] {
        gear_gather(row_tab.data(), row_tab.data() + rows, cols.data(), rows, ncols, w_offset, w_len, pad_head,
                    lengths.data());
    });
    for (gear_u64 i = 0; i < 4 * rows; ++i) wr(out[i]);
    for (gear_u64 i = 0; i < rows; ++i) wr(lengths[i]);
    for (gear_u64 c = 0; c < ncols; ++c) {
        wr_raw(dst[c]->p, rows * w_len * cols[3 * c + 1]);
        delete dst[c];
    }
}

int main() {
    gear_u64 op;
    while (rd_raw(&op, 8)) {
        switch (op) {
            case 1: op_gather(); break;
            case 2: op_sample(); break;
            case 3: op_topk(); break;
            case 4: op_scatter(); break;
            case 5: op_drawn(); break;
            case 6: op_scatter_u64(); break;
            default: die("unknown op");
        }
    }
    return 0;
}
