//! # gear-cuda
//!
//! The CUDA backend of GEAR-rs: trajectory memory the GPU can reach, and the
//! kernels that select and collect trajectories on the GPU.
//!
//! * Memory ([`memory`]): [`DeviceMemory`] (device), [`PinnedMemory`]
//!   (page-locked host memory mapped for the device) and
//!   [`RegisteredRegion`] (any host [`gear_core::MemoryRegion`], such as a
//!   shared-memory table that actor processes write, page-locked and mapped
//!   in place, so a trainer GPU reads it with no copy). Each implements
//!   [`gear_core::MemoryRegion`].
//! * Collection ([`CudaCollector`], a [`gear_core::Collector`]): one kernel
//!   launch gathers the windows of a batch into device buffers laid out as
//!   `gear_core::collect` documents, reading each row either zero-copy from
//!   mapped host memory or from a [`DeviceCache`] of hot trajectories. The
//!   batch carries an event the trainer's stream can wait on.
//! * Selection ([`DevicePriorities`], [`CudaPrioritized`], [`CudaTopK`]):
//!   priorities mirrored in device memory; proportional sampling with
//!   importance weights (f64 prefix sums, counter-based RNG, so a seed fixes
//!   the draws), top-k, and batched priority updates (last write wins).
//! * [`bench::run_bench`]: zero-copy gather, device-cache gather and a
//!   device-to-device copy of the same bytes, in GB/s.
//!
//! Kernels are CUDA C in `gear-cuda/kernels/`, compiled to PTX and CUBIN
//! by `build.rs` when NVRTC is present at build time and embedded, so a GPU
//! machine needs only the driver; otherwise NVRTC compiles them at run time
//! ([`kernels`]). Modules are loaded once per process and device.
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
//! Every test, including the device tests, passed on an NVIDIA H100 (driver
//! 580, CUDA 13.0) on 2026-11-22, from the package `cargo xtask gpu-test`
//! builds; `docs/PERFORMANCE.md` has the figures. Without a GPU, CI checks
//! that every kernel compiles under NVRTC 13.0 for sm_80 and sm_90, and the
//! gather, sampling, top-k and scatter kernels, compiled as C++ by g++ with
//! a host shim, match CPU references (tests `nvrtc_compile`, `cpu_shim`).

pub mod bench;
pub mod cache;
pub mod device;
pub mod drawn;
mod error;
mod ffi;
pub mod gather;
pub mod kernels;
pub mod memory;
mod nvrtc_lib;
#[doc(hidden)]
pub mod plan;
pub mod probe;
pub mod select;

pub use cache::{DeviceCache, RowCache};
pub use device::{CudaDevice, KernelOrigin};
pub use drawn::{DeviceSlots, DrawnRow, DrawnRows, SlotMirror, SlotUpdate};
pub use error::{Error, Result};
pub use gather::{CudaBatch, CudaCollector};
pub use memory::{DeviceMemory, PinnedMemory, RegisteredRegion};
pub use select::{CudaPrioritized, CudaTopK, DeviceDraws, DevicePriorities};

/// The cudarc version this crate is written against, re-exported so callers
/// can name streams and events ([`cudarc::driver::CudaStream`],
/// [`cudarc::driver::CudaEvent`]) without a second dependency.
pub use cudarc;
