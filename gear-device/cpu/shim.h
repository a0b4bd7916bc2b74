// Host shim: lets g++ compile the kernel sources in gear-device/kernels as
// plain C++, for the CPU device (cpu/kernels.cpp, one stream per worker
// thread) and for the kernel tests' driver (tests/shim/driver.cpp). The
// built-in index variables become thread-local globals that gear_launch
// sets in nested loops, one simulated thread at a time. That is only
// faithful for kernels without block-level synchronisation, shared memory
// or atomics, which is a rule for every kernel in this crate (see
// common.cuh).
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>

#define __global__
#define __device__
#define __forceinline__ inline
#define GEAR_HOST_SHIM 1

struct gear_dim3 {
    unsigned int x, y, z;
};
// Thread-local: the CPU device runs kernels of different streams at once.
static thread_local gear_dim3 threadIdx, blockIdx, blockDim, gridDim;

using std::pow;

// Source loads of the gather by width in bytes (index 1 or 16), counted by
// GEAR_COUNT_LOAD (common.cuh) and reported by the test driver; the CPU
// device does not count.
#ifdef GEAR_SHIM_COUNT_LOADS
static unsigned long long gear_loads[17];
#define GEAR_COUNT_LOAD(bytes) (++gear_loads[(bytes)])
#endif

// The GPU's global timer, on the host: a monotonic clock in nanoseconds.
static inline unsigned long long gear_clock_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Runs `body` once per (block, thread) of the grid, in order.
template <typename F>
static void gear_launch(gear_dim3 grid, gear_dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx)
                for (unsigned tz = 0; tz < block.z; ++tz)
                    for (unsigned ty = 0; ty < block.y; ++ty)
                        for (unsigned tx = 0; tx < block.x; ++tx) {
                            blockIdx = {bx, by, bz};
                            threadIdx = {tx, ty, tz};
                            body();
                        }
}
