//! # gear-cuda
//!
//! The CUDA backend of GEAR-rs: gear-core's device trait for CUDA
//! ([`CudaApi`], with [`CudaDevice`] as its device), memory the GPU can
//! reach, and the kernels compiled for it. Everything above the device
//! (the gather, selection on the device, the device cache) is gear-device's,
//! written once over the trait; the aliases below name it for CUDA.
//!
//! * Memory ([`memory`]): [`DeviceMemory`] (device), [`PinnedMemory`]
//!   (page-locked host memory mapped for the device) and
//!   [`RegisteredRegion`] (any host [`gear_core::MemoryRegion`], such as a
//!   shared-memory table that actor processes write, page-locked and mapped
//!   in place, so a trainer GPU reads it with no copy). Each implements
//!   [`gear_core::MemoryRegion`].
//! * Collection ([`CudaCollector`], gear-device's collector): one kernel
//!   launch gathers the windows of a batch into device buffers, reading
//!   each row zero-copy from mapped host memory or from a [`DeviceCache`].
//! * Selection ([`DevicePriorities`], [`CudaPrioritized`], [`CudaTopK`],
//!   [`DeviceSlots`], [`DrawnRows`]): priorities and slots mirrored in
//!   device memory; proportional draws with importance weights, top-k,
//!   draws that go into the gather without leaving the device.
//! * [`bench::run_bench`]: zero-copy gather, device-cache gather and a
//!   device-to-device copy of the same bytes, in GB/s.
//!
//! Kernels are the CUDA C sources in `gear-device/kernels/`, compiled to
//! PTX and CUBIN by `build.rs` when NVRTC is present at build time and
//! embedded, so a GPU machine needs only the driver; otherwise NVRTC
//! compiles them at run time ([`kernels`]). Modules are loaded once per
//! process and device.
//!
//! The CUDA driver (and NVRTC, when needed) is loaded at run time: the
//! driver through cudarc's `dynamic-loading`, NVRTC by path through a small
//! binding of our own (`GEAR_NVRTC_DIR`). cudarc panics when a library is
//! missing, so every entry point probes first ([`probe`]) and returns
//! [`Error::BackendUnavailable`] instead: this crate builds and its tests
//! pass on a machine without a GPU, where device tests print
//! `skipped: no CUDA device` (or fail when `GEAR_REQUIRE_GPU=1`).
//!
//! ## What has run where
//!
//! See `gear-cuda/README.md` ("What ran on a GPU"): the last GPU run and
//! the code that changed since. Without a GPU, CI checks that every kernel
//! compiles under NVRTC 13.0 for sm_80 and sm_90 (`nvrtc_compile`), and
//! runs the device suite and gear-api's device sampler on gear-device's CPU
//! device, which runs the same kernels compiled as C++.

pub mod api;
pub mod bench;
pub mod device;
mod error;
mod ffi;
pub mod kernels;
pub mod memory;
mod nvrtc_lib;
pub mod probe;

pub use api::{CudaApi, CudaKernels};
pub use device::{CudaDevice, KernelOrigin};
pub use error::{Error, Result};
pub use gear_device::{DeviceDraws, DrawnRow, RowCache, SlotMirror, SlotUpdate};
pub use memory::{DeviceMemory, PinnedMemory, RegisteredRegion};

/// gear-device's collector on CUDA.
pub type CudaCollector = gear_device::DeviceCollector<CudaApi>;
/// A batch in CUDA device memory.
pub type CudaBatch = gear_device::DeviceBatch<CudaApi>;
/// gear-device's device cache on CUDA.
pub type DeviceCache<R> = gear_device::DeviceCache<CudaApi, R>;
/// A table's slots mirrored in CUDA device memory.
pub type DeviceSlots = gear_device::DeviceSlots<CudaApi>;
/// One batch's draw buffers on CUDA.
pub type DrawnRows = gear_device::DrawnRows<CudaApi>;
/// Priorities in CUDA device memory.
pub type DevicePriorities = gear_device::DevicePriorities<CudaApi>;
/// Prioritized replay with priorities on the GPU.
pub type CudaPrioritized = gear_device::DevicePrioritized<CudaApi>;
/// Top-k selection with priorities on the GPU.
pub type CudaTopK = gear_device::DeviceTopK<CudaApi>;

/// The cudarc version this crate is written against, re-exported so callers
/// can name streams and events ([`cudarc::driver::CudaStream`],
/// [`cudarc::driver::CudaEvent`]) without a second dependency.
pub use cudarc;
