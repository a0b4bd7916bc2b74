// The CPU device's kernels: every source in gear-device/kernels compiled as
// C++ through the host shim (cpu/shim.h), and one entry point that runs a
// kernel by name over a grid with its arguments as 64-bit words, which is
// how src/cpu/exec.rs calls them on a stream's worker thread. Built by
// gear-device/build.rs with the `cc` crate.
#include "shim.h"
#include "common.cuh"
#include "gather.cu"
#include "sample.cu"
#include "priority.cu"
#include "bench.cu"

#include <cstring>

namespace {

template <typename T>
T word(const gear_u64* a, int i) {
    return (T)a[i];
}

template <>
double word<double>(const gear_u64* a, int i) {
    double d;
    std::memcpy(&d, &a[i], 8);
    return d;
}

template <typename T>
T* ptr(const gear_u64* a, int i) {
    return (T*)(uintptr_t)a[i];
}

}  // namespace

// Runs kernel `name` over grid x block with arguments `a[0..nargs)`.
// Returns 0, or 1 for an unknown kernel, 2 for a wrong argument count.
extern "C" int gear_cpu_launch(const char* name, const unsigned* g, const unsigned* b, const gear_u64* a,
                               gear_u64 nargs) {
    const gear_dim3 grid = {g[0], g[1], g[2]};
    const gear_dim3 block = {b[0], b[1], b[2]};
#define GEAR_KERNEL(kname, n, call)                 \
    if (std::strcmp(name, #kname) == 0) {           \
        if (nargs != (n)) return 2;                 \
        gear_launch(grid, block, [&] { call; });    \
        return 0;                                   \
    }
    GEAR_KERNEL(gear_gather, 9,
                gear_gather(ptr<const gear_u64>(a, 0), ptr<const gear_u64>(a, 1), ptr<const gear_u64>(a, 2),
                            word<gear_u64>(a, 3), word<gear_u64>(a, 4), word<gear_i64>(a, 5), word<gear_u64>(a, 6),
                            word<gear_u32>(a, 7), ptr<gear_u64>(a, 8)))
    GEAR_KERNEL(gear_prio_chunks, 7,
                gear_prio_chunks(ptr<const double>(a, 0), word<gear_u64>(a, 1), word<double>(a, 2),
                                 word<gear_u64>(a, 3), word<gear_u64>(a, 4), ptr<double>(a, 5), ptr<double>(a, 6)))
    GEAR_KERNEL(gear_prio_scan, 5,
                gear_prio_scan(ptr<const double>(a, 0), ptr<const double>(a, 1), word<gear_u64>(a, 2),
                               ptr<double>(a, 3), ptr<double>(a, 4)))
    GEAR_KERNEL(gear_prio_prefix, 7,
                gear_prio_prefix(ptr<const double>(a, 0), word<gear_u64>(a, 1), word<double>(a, 2),
                                 word<gear_u64>(a, 3), word<gear_u64>(a, 4), ptr<const double>(a, 5),
                                 ptr<double>(a, 6)))
    GEAR_KERNEL(gear_sample_draws, 12,
                gear_sample_draws(ptr<const double>(a, 0), ptr<const double>(a, 1), word<gear_u64>(a, 2),
                                  word<double>(a, 3), word<double>(a, 4), ptr<const double>(a, 5),
                                  word<gear_u64>(a, 6), word<gear_u64>(a, 7), word<gear_u32>(a, 8),
                                  ptr<gear_u32>(a, 9), ptr<double>(a, 10), ptr<double>(a, 11)))
    GEAR_KERNEL(gear_drawn_rows, 15,
                gear_drawn_rows(ptr<const gear_u32>(a, 0), word<gear_u64>(a, 1), word<gear_u64>(a, 2),
                                ptr<const gear_u64>(a, 3), ptr<const gear_u64>(a, 4), word<gear_u64>(a, 5),
                                word<gear_u64>(a, 6), word<gear_u64>(a, 7), word<gear_u64>(a, 8),
                                word<gear_u32>(a, 9), word<gear_u64>(a, 10), ptr<const double>(a, 11),
                                ptr<const double>(a, 12), ptr<gear_u64>(a, 13), ptr<gear_u64>(a, 14)))
    GEAR_KERNEL(gear_scatter_f64, 4,
                gear_scatter_f64(ptr<const gear_u32>(a, 0), ptr<const double>(a, 1), word<gear_u64>(a, 2),
                                 ptr<double>(a, 3)))
    GEAR_KERNEL(gear_scatter_u64, 4,
                gear_scatter_u64(ptr<const gear_u32>(a, 0), ptr<const gear_u64>(a, 1), word<gear_u64>(a, 2),
                                 ptr<gear_u64>(a, 3)))
    GEAR_KERNEL(gear_topk_init, 3, gear_topk_init(word<gear_u64>(a, 0), word<gear_u64>(a, 1), ptr<gear_u32>(a, 2)))
    GEAR_KERNEL(gear_topk_step, 6,
                gear_topk_step(ptr<const double>(a, 0), word<gear_u64>(a, 1), word<gear_u64>(a, 2),
                               word<gear_u64>(a, 3), word<gear_u64>(a, 4), ptr<gear_u32>(a, 5)))
    GEAR_KERNEL(gear_topk_emit, 6,
                gear_topk_emit(ptr<const double>(a, 0), word<gear_u64>(a, 1), ptr<const gear_u32>(a, 2),
                               word<gear_u64>(a, 3), ptr<gear_u32>(a, 4), ptr<double>(a, 5)))
    GEAR_KERNEL(gear_train_step, 4,
                gear_train_step(ptr<const gear_u8>(a, 0), word<gear_u64>(a, 1), word<gear_u64>(a, 2),
                                ptr<gear_u64>(a, 3)))
#undef GEAR_KERNEL
    return 1;
}
