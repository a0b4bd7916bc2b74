//! # gear-api
//!
//! The public face of GEAR-rs: build a replay table from a spec, a memory
//! pool and selection strategies; write trajectories from actors; sample
//! batches of windows from trainers; update priorities; control the flow
//! between both sides.
//!
//! ```no_run
//! use gear_api::{ReplayTable, SampleConfig, StepValue};
//! use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
//!
//! # fn main() -> gear_api::Result<()> {
//! let spec = TableSpec::new(
//!     vec![ColumnSpec::new("obs", DType::F32, vec![4]), ColumnSpec::new("reward", DType::F32, vec![])],
//!     100, // max trajectory length T
//!     1000, // capacity in trajectories
//! )?;
//! let table = ReplayTable::builder(spec).build()?;
//! let mut traj = table.writer().begin(None)?;
//! traj.append_step(&[StepValue::typed(&[0.0f32; 4]), StepValue::typed(&[1.0f32])])?;
//! let key = traj.end()?;
//! let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::last(8)))?;
//! let batch = sampler.sample()?;
//! let obs: &[f32] = batch.column("obs")?.as_slice()?;
//! table.update_priorities(&[(key, 2.0)])?;
//! # let _ = obs; Ok(()) }
//! ```
//!
//! Architecture invariant: gear-api is the only crate that composes
//! backends and strategies; no workspace crate depends on it except
//! `gear-cli` (the `gear` binary), examples and tests.

#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod error;
pub mod limiter;
pub mod sampler;
pub mod table;
pub mod transitions;
pub mod writer;

#[cfg(feature = "cuda")]
pub use cuda::{CudaColumn, CudaSampledBatch, CudaSampler, CudaSamplerOptions};
pub use device::{DeviceColumn, DeviceSampledBatch, DeviceSampler, DeviceSamplerOptions};
pub use error::{Error, Result};
pub use gear_core::{ItemPattern, WaitReason, WaitRole};
pub use limiter::RateLimiterConfig;
pub use sampler::{ColumnBatch, SampleConfig, SampledBatch, SampledRows, Sampler, MAX_BATCH_ROWS};
pub use table::{
    latest_checkpoint, shared_tables, AttachOptions, CheckpointReport, CommittedTrajectory, NewItem, PoolConfig,
    ReplayTable, SlotCounts, StoredItem, TableBuilder, TableInfo, WaitStats, Waiting,
};
pub use transitions::{FrameView, Observations, TransitionBatch, TransitionConfig, TransitionSampler, Transitions};
pub use writer::{ColumnId, StepValue, Trajectory, Writer};

pub use gear_core;
pub use gear_device;
pub use gear_sampler;
