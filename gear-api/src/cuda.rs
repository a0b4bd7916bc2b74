//! The CUDA sampler (Cargo feature `cuda`): gear-api's [`DeviceSampler`] on
//! gear-cuda's [`CudaApi`], and [`ReplayTable::cuda_sampler`], which opens
//! the device by ordinal.
//!
//! Without a CUDA driver or device, [`ReplayTable::cuda_sampler`] returns
//! [`Error::Backend`] holding gear-cuda's `BackendUnavailable` (message
//! `backend: cuda backend unavailable: ...`); nothing panics.
//!
//! The device sampler's protocol runs in CI on gear-device's CPU device
//! (`gear-api/tests/device.rs`, the conformance suite); the CUDA tests in
//! `gear-api/tests/cuda.rs` are packed by `cargo xtask gpu-test`. Which
//! commit last ran on a GPU is in `gear-cuda/README.md`.

use crate::device::{DeviceColumn, DeviceSampledBatch, DeviceSampler, DeviceSamplerOptions};
use crate::error::{Error, Result};
use crate::sampler::SampleConfig;
use crate::table::ReplayTable;
use gear_cuda::{CudaApi, CudaDevice};

impl From<gear_cuda::Error> for Error {
    /// gear-core refusals keep their own variant; everything else is boxed
    /// as [`Error::Backend`] and can be downcast to [`gear_cuda::Error`].
    fn from(e: gear_cuda::Error) -> Self {
        match e {
            gear_cuda::Error::Core(c) => Error::Core(c),
            other => Error::Backend(Box::new(other)),
        }
    }
}

/// Which GPU a [`CudaSampler`] gathers on (`ordinal`), the trainer's
/// stream, the ring and the device cache.
pub type CudaSamplerOptions = DeviceSamplerOptions<CudaApi>;
/// Draws batches and gathers them on a CUDA GPU.
pub type CudaSampler = DeviceSampler<CudaApi>;
/// One batch gathered on a CUDA GPU.
pub type CudaSampledBatch = DeviceSampledBatch<CudaApi>;
/// One column of a [`CudaSampledBatch`].
pub type CudaColumn<'a> = DeviceColumn<'a, CudaApi>;

impl ReplayTable {
    /// A sampler that gathers batches on CUDA device `options.ordinal`,
    /// reading this table's memory zero-copy. The first one per table and
    /// process page-locks and maps the table's region for the device.
    /// Fails with [`Error::Backend`] (gear-cuda's `BackendUnavailable`)
    /// when there is no usable CUDA driver or device, and when a kernel
    /// image (or NVRTC, when needed) is missing.
    pub fn cuda_sampler(&self, config: SampleConfig, options: CudaSamplerOptions) -> Result<CudaSampler> {
        let device = CudaDevice::new(options.ordinal)?;
        device.warm_up()?;
        self.device_sampler(&device, config, options)
    }
}
