//! The trainer stand-in's step (`kernels/bench.cu`): what a model's step
//! does to the replay system, and nothing else. It reads every byte of the
//! batch's buffers on the trainer's stream (a model's first layer loads
//! its whole input) and then holds the stream for a set time (the model's
//! compute). gear-cli's `train-bench` runs it against a device sampler and
//! against a host-fed baseline; the device tests use it as a trainer whose
//! reads the ordering rules must respect.

use crate::kernels::KernelFn;
use crate::launch::launch;
use gear_core::{Access, Device, DeviceApi, DeviceBuffer, KernelArg};
use std::time::Duration;

/// Blocks of the step's grid (each of 256 threads writes one partial sum):
/// enough for the reads to run at device-memory speed on a GPU of 132
/// multiprocessors (32 blocks of byte loads read an H200 at 15 GB/s).
const BLOCKS: u32 = 512;

/// One trainer's step kernel and its scratch.
pub struct TrainStep<A: DeviceApi> {
    device: A::Device,
    /// One partial sum per thread, written by every step.
    partial: A::Buffer,
}

impl<A: DeviceApi> std::fmt::Debug for TrainStep<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainStep").finish()
    }
}

impl<A: DeviceApi> TrainStep<A> {
    /// A step on `device`.
    pub fn new(device: &A::Device) -> Result<Self, A::Error> {
        let threads = u64::from(BLOCKS) * u64::from(crate::plan::BLOCK);
        Ok(TrainStep { device: device.clone(), partial: device.alloc(threads * 8)? })
    }

    /// Queues one step on `stream`: every byte of `inputs` read, then the
    /// stream held until `compute` has passed since the last read began.
    /// The caller orders `stream` after the work that fills `inputs` (a
    /// batch's `wait_on`) and keeps them alive and unwritten until the
    /// stream has passed the step.
    pub fn queue(&self, stream: &A::Stream, inputs: &[&A::Buffer], compute: Duration) -> Result<(), A::Error> {
        let last = inputs.len().saturating_sub(1);
        for (i, b) in inputs.iter().enumerate() {
            let spin = if i == last { compute.as_nanos().min(u128::from(u64::MAX)) as u64 } else { 0 };
            let args = [
                KernelArg::Ptr(b.device_addr(), Access::Read),
                KernelArg::U64(b.len()),
                KernelArg::U64(spin),
                KernelArg::Ptr(self.partial.device_addr(), Access::Write),
            ];
            let dims = ([BLOCKS, 1, 1], [crate::plan::BLOCK, 1, 1]);
            // SAFETY: gear_train_step's arguments (checked by `launch`): it
            // reads `len` bytes of the input, which the caller keeps alive
            // and ordered (this function's contract), and writes one word per
            // thread of the grid into `partial`, which holds that many and
            // lives in `self` (its drop waits for the device).
            unsafe { launch::<A>(&self.device, stream, KernelFn::TrainStep, dims, &args, &[]) }?;
        }
        Ok(())
    }
}

impl<A: DeviceApi> Drop for TrainStep<A> {
    fn drop(&mut self) {
        // Steps still queued write `partial`.
        let _ = self.device.synchronize();
    }
}
