// Runs the GEAR kernels on the CPU through shim.h. Reads commands from
// stdin and writes results to stdout, all as little-endian 64-bit words and
// raw bytes; the protocol is defined by tests/cpu_shim.rs, which builds this
// file with g++ and compares the results with CPU references.
#include "shim.h"
#include "common.cuh"
#include "gather.cu"
#include "sample.cu"
#include "priority.cu"

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

int main() {
    gear_u64 op;
    while (rd_raw(&op, 8)) {
        switch (op) {
            case 1: op_gather(); break;
            case 2: op_sample(); break;
            case 3: op_topk(); break;
            case 4: op_scatter(); break;
            default: die("unknown op");
        }
    }
    return 0;
}
