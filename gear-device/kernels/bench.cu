// The trainer stand-in's step (gear-cli `train-bench`, `./run.sh train`):
// what a model's forward and backward pass does to the replay system, and
// nothing else. Every thread reads its share of the batch's bytes (a
// model's first layer loads its whole input) and writes one partial sum;
// thread 0 of block 0 then holds the stream until `spin_ns` nanoseconds
// have passed since it started (the model's compute), so the kernel takes
// the configured time per step whatever the device.
//
// The reads are 16-byte loads (bytes before the first 16-byte boundary and
// after the last are read one by one), over a grid wide enough to load at
// the device memory's speed: byte loads from a small grid capped an H200
// at about 15 GB/s, which the first GPU run of train-bench counted as the
// replay system's time.
//
// partial[t] = wrapping sum, over the 16-byte units i = t, t + T, ... (T
// threads in the grid), of their two 8-byte words, plus the single bytes
// at offsets t, t + T, ... of the head and of the tail.
extern "C" __global__ void gear_train_step(const gear_u8* __restrict__ src, gear_u64 bytes, gear_u64 spin_ns,
                                           gear_u64* __restrict__ partial) {
    const gear_u64 t = gear_thread_x();
    const gear_u64 threads = gear_threads_x();
    const gear_u64 start = t == 0 ? gear_clock_ns() : 0ULL;
    gear_u64 head = (16 - ((gear_u64)src & 15)) & 15;
    if (head > bytes) head = bytes;
    const gear_u64 units = (bytes - head) / 16;
    const gear_v16* body = (const gear_v16*)(src + head);
    gear_u64 acc = 0;
    for (gear_u64 i = t; i < units; i += threads) {
        const gear_v16 v = body[i];
        acc += v.lo + v.hi;
    }
    for (gear_u64 i = t; i < head; i += threads) acc += src[i];
    for (gear_u64 i = head + units * 16 + t; i < bytes; i += threads) acc += src[i];
    partial[t] = acc;
    if (t == 0) {
        while (gear_clock_ns() - start < spin_ns) {
        }
    }
}
