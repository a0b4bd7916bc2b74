//! # gear-device
//!
//! The device side of GEAR's sampling, written once over gear-core's
//! [`DeviceApi`](gear_core::DeviceApi), and a CPU device that runs it in CI.
//!
//! * Kernels ([`kernels`]): the CUDA C sources in `gear-device/kernels/`
//!   and their parameter lists; every launch is checked against them
//!   ([`launch`]). gear-cuda compiles the sources with NVRTC; the CPU
//!   device runs them compiled as C++.
//! * Collection ([`DeviceCollector`], a [`gear_core::Collector`]): one
//!   kernel launch gathers a batch's windows into device buffers laid out
//!   as `gear_core::collect` documents, reading each row either zero-copy
//!   from the mapped table or from a [`DeviceCache`] of hot trajectories.
//!   The batch carries an event a trainer's stream waits on.
//! * Selection on the device ([`DeviceSlots`], [`DrawnRows`],
//!   [`DeviceCollector::gather_drawn`]): the table's slots mirrored in
//!   device memory and synced by changed slot, draws that go from the draw
//!   kernel into the gather's row tables without leaving the device;
//!   [`DevicePriorities`] (prefix sums, proportional draws, top-k) and two
//!   strategies on it ([`DevicePrioritized`], [`DeviceTopK`]).
//! * The trainer stand-in's step ([`TrainStep`]): reads a batch and holds
//!   its stream for a set time.
//! * The CPU device ([`cpu`]): the kernels on worker threads, one per
//!   stream, with events, asynchronous copies and poisoned frees, reporting
//!   every use after free, read before its event and unordered write. It is
//!   how CI runs gear-api's device sampler.
//!
//! Architecture invariant: depends on gear-core only (plus `parking_lot`
//! and `thiserror`; `cc` builds the CPU kernels). Knows nothing of CUDA:
//! gear-cuda implements the device trait and depends on this crate for
//! everything above it.

pub mod cache;
pub mod cpu;
pub mod drawn;
mod error;
pub mod gather;
pub mod kernels;
pub mod launch;
#[doc(hidden)]
pub mod plan;
pub mod priorities;
pub mod select;
pub mod train;

pub use cache::{DeviceCache, RowCache};
pub use cpu::{CpuDevice, CpuDeviceApi, CpuDeviceOptions, FailPoint, OnMisuse};
pub use drawn::{DeviceSlots, DrawnKeys, DrawnRow, DrawnRows, SlotMirror, SlotUpdate};
pub use error::{Error, Result};
pub use gather::{DeviceBatch, DeviceCollector};
pub use priorities::{DeviceDraws, DevicePriorities};
pub use select::{DevicePrioritized, DeviceTopK};
pub use train::TrainStep;
