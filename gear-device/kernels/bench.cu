// The trainer stand-in's step (gear-cli `train-bench`, `./run.sh train`):
// what a model's forward and backward pass does to the replay system, and
// nothing else. Every thread reads its share of the batch's bytes (a
// model's first layer loads its whole input) and writes one partial sum;
// thread 0 of block 0 then holds the stream until `spin_ns` nanoseconds
// have passed since it started (the model's compute), so the kernel takes
// the configured time per step whatever the device.
//
// partial[t] = sum of src[i] over i = t, t + T, ... (T threads in the grid).
extern "C" __global__ void gear_train_step(const gear_u8* __restrict__ src, gear_u64 bytes, gear_u64 spin_ns,
                                           gear_u64* __restrict__ partial) {
    const gear_u64 t = gear_thread_x();
    const gear_u64 start = t == 0 ? gear_clock_ns() : 0ULL;
    gear_u64 acc = 0;
    for (gear_u64 i = t; i < bytes; i += gear_threads_x()) acc += src[i];
    partial[t] = acc;
    if (t == 0) {
        while (gear_clock_ns() - start < spin_ns) {
        }
    }
}
