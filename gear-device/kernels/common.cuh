// Prelude shared by every GEAR kernel source. The Rust side prepends it to
// each .cu file before handing the text to NVRTC; the CPU test shim
// (tests/shim/shim.h) includes it after defining the CUDA built-ins.
//
// Rules for kernel sources, so that one text compiles under NVRTC (gear-cuda),
// hiprtc (a ROCm backend) and g++ (the CPU device, gear-device/cpu/shim.h):
// no #include, no block-level synchronisation (__syncthreads, shared
// memory), no atomics, no warp intrinsics; only these typedefs, C++17, the
// math functions pow/fmin/fmax, which NVRTC provides built in, and
// gear_clock_ns below. Every kernel must also be correct when its threads
// run one after another in any order (the CPU device runs them so).
#ifndef GEAR_COMMON_CUH
#define GEAR_COMMON_CUH

typedef unsigned long long gear_u64;
typedef long long gear_i64;
typedef unsigned int gear_u32;
typedef unsigned char gear_u8;

// Sixteen bytes moved as one unit: with 16-byte alignment the compiler
// emits a single 128-bit load/store (ld.v2.u64) for a copy of this struct.
struct alignas(16) gear_v16 {
    gear_u64 lo;
    gear_u64 hi;
};

// Called by the gather before each source load with the load's width in
// bytes. Nothing on the device; the CPU shim counts them, so tests can show
// how many bytes each load moves (cpu/shim.h).
#ifndef GEAR_COUNT_LOAD
#define GEAR_COUNT_LOAD(bytes)
#endif

// Index of this thread in a 1-D grid-stride loop over x.
__device__ __forceinline__ gear_u64 gear_thread_x() {
    return (gear_u64)blockIdx.x * (gear_u64)blockDim.x + (gear_u64)threadIdx.x;
}

// Threads in a 1-D grid over x.
__device__ __forceinline__ gear_u64 gear_threads_x() {
    return (gear_u64)gridDim.x * (gear_u64)blockDim.x;
}

// Nanoseconds from a clock that runs at a fixed rate (the global timer on a
// GPU; the shim defines its own on the host).
#ifndef GEAR_HOST_SHIM
__device__ __forceinline__ gear_u64 gear_clock_ns() {
    gear_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

#endif
