//! # gear-cpu
//!
//! The CPU backend of GEAR-rs:
//!
//! * [`HostPool`]: page-aligned, zeroed, process-private heap memory;
//! * [`ShmPool`]: named shared memory (a file in `/dev/shm` or a chosen
//!   directory, space reserved up front with `posix_fallocate`) that other
//!   processes of the same server attach to; the creator removes the name
//!   on drop unless told to keep it, attachers never do;
//! * [`CpuCollector`]: gathers windows from a host-addressable table into
//!   [`HostBatch`] buffers with one `memcpy` per (row, column), zeroing only
//!   the padding, splitting large batches across threads. Its output is
//!   byte-for-byte the gear-core [`Collector`](gear_core::Collector)
//!   contract, the reference other backends are compared with;
//! * [`TransitionCollector`]: DQN-style transitions (frame-stacked
//!   observations and next observations as views of frames gathered once,
//!   n-step returns) from item windows, through the same
//!   [`Collector`](gear_core::Collector) trait;
//! * [`sync`]: process leases (liveness across PID namespaces), a robust
//!   table lock with deadlines, and futex waits, for metadata that several
//!   processes update;
//! * [`create_shared_table`], [`open_shared_table`], [`create_host_table`]:
//!   a [`TableRegion`] laid out in, or attached from, these pools.
//!
//! Architecture invariant: gear-cpu depends on gear-core only (plus
//! `memmap2`, `libc`, `thiserror`); it knows nothing of devices, sampling
//! or the network. All `unsafe` code is in the private `raw` module and in `sync` (FFI).
//! Unix only (`posix_fallocate`, `MAP_SHARED` files).

#![warn(missing_docs)]

mod caller;
mod collect;
mod error;
mod host;
mod raw;
mod shm;
pub mod sync;
mod transition;

pub use caller::{CallerBatch, IntoCallerBuffers};
pub use collect::{check_column_buffers, CpuCollector, HostBatch, BATCH_ALIGN, DEFAULT_BYTES_PER_THREAD};
pub use error::{Error, Result};
pub use host::{HostPool, HOST_POOL_ALIGN};
pub use shm::{validate_name, ShmOptions, ShmPool, DEFAULT_SHM_DIR, MAX_SHM_NAME_BYTES, SHM_POOL_ALIGN};
pub use transition::{
    FrameView, TransitionBatch, TransitionCollector, TransitionColumns, TransitionLayout, TransitionRule,
};

use gear_core::{RegionLayout, TableRegion, TableSpec};
use std::path::Path;

/// Creates the shared-memory pool `name` sized for `spec` (its
/// [`RegionLayout`]) and lays an empty table out in it. If laying out fails,
/// the pool is dropped, and removed unless `opts.keep`.
pub fn create_shared_table(name: &str, spec: &TableSpec, opts: ShmOptions) -> Result<TableRegion<ShmPool>> {
    let rl = RegionLayout::for_spec(spec)?;
    let pool = ShmPool::create(name, rl.total_bytes, opts)?;
    Ok(TableRegion::create(pool, spec)?)
}

/// Attaches to the table another process created as `name` in `dir`
/// (default `/dev/shm`). With `expected`, the stored spec must equal it
/// ([`gear_core::Error::SpecMismatch`] otherwise). A file that is not a
/// table, is truncated or has another format version is refused with a
/// [`gear_core::Error::Decode`] error.
pub fn open_shared_table(name: &str, dir: Option<&Path>, expected: Option<&TableSpec>) -> Result<TableRegion<ShmPool>> {
    let pool = ShmPool::open(name, dir)?;
    Ok(TableRegion::open(pool, expected)?)
}

/// Lays an empty table out in a new [`HostPool`] sized for `spec`.
pub fn create_host_table(spec: &TableSpec) -> Result<TableRegion<HostPool>> {
    let rl = RegionLayout::for_spec(spec)?;
    Ok(TableRegion::create(HostPool::new(rl.total_bytes)?, spec)?)
}
