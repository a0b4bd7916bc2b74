//! [`DeviceSampledBatch`], one batch gathered on a device, and its
//! [`DeviceColumn`]s.

use super::device_error;
use crate::error::Result;
use crate::sampler::BatchMeta;
use gear_core::{BatchLayout, DType, DeviceApi, DeviceBuffer};
use gear_device::DeviceBatch;

/// One column of a [`DeviceSampledBatch`]: a device buffer laid out
/// `[rows, window, *shape]`.
pub struct DeviceColumn<'a, A: DeviceApi> {
    /// Column name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Per-step shape.
    pub step_shape: &'a [u64],
    /// The device buffer.
    pub memory: &'a A::Buffer,
}

impl<A: DeviceApi> Clone for DeviceColumn<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: DeviceApi> Copy for DeviceColumn<'_, A> {}

impl<A: DeviceApi> std::fmt::Debug for DeviceColumn<'_, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceColumn").field("name", &self.name).field("dtype", &self.dtype).finish()
    }
}

impl<A: DeviceApi> DeviceColumn<'_, A> {
    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.memory.device_addr()
    }

    /// Size of the buffer in bytes.
    pub fn bytes(&self) -> u64 {
        self.memory.len()
    }
}

/// One batch gathered on a device: per column a device buffer, the valid
/// length of each row (host and device copies), per row the key,
/// probability and importance weight, and the event recorded after the
/// gather.
#[derive(Debug)]
pub struct DeviceSampledBatch<A: DeviceApi> {
    pub(super) device: DeviceBatch<A>,
    pub(super) meta: BatchMeta,
}

impl<A: DeviceApi> DeviceSampledBatch<A> {
    // Rows (0 before the first sample), keys, probabilities, weights and
    // starts, as every batch type has them.
    crate::sampler::row_metadata!();

    /// Number of requested columns.
    pub fn columns(&self) -> usize {
        self.meta.names.len()
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Result<DeviceColumn<'_, A>> {
        Ok(self.column_at(self.meta.index(name)?))
    }

    /// The `i`-th requested column; panics when `i >= self.columns()`.
    pub fn column_at(&self, i: usize) -> DeviceColumn<'_, A> {
        DeviceColumn {
            name: &self.meta.names[i],
            dtype: self.meta.dtypes[i],
            step_shape: &self.meta.shapes[i],
            memory: self.device.column(i).expect("one device buffer per requested column"),
        }
    }

    /// Waits for the batch and copies the `i`-th requested column to the
    /// host (for tests and debugging; trainers read the device buffers).
    pub fn column_to_host(&self, i: usize) -> Result<Vec<u8>> {
        self.device.column_to_host(i).map_err(device_error)
    }

    /// Valid steps of each row (host copy).
    pub fn lengths(&self) -> &[u64] {
        self.device.lengths()
    }

    /// Valid steps of each row as `u64` in device memory.
    pub fn lengths_device(&self) -> &A::Buffer {
        self.device.lengths_device()
    }

    /// The batch layout (columns, rows, window).
    pub fn layout(&self) -> &BatchLayout {
        self.device.layout()
    }

    /// The event recorded after the last gather into this batch.
    pub fn event(&self) -> &A::Event {
        self.device.event()
    }

    /// Makes `stream` wait, on the device, until the batch is complete.
    pub fn wait_on(&self, stream: &A::Stream) -> Result<()> {
        self.device.wait_on(stream).map_err(device_error)
    }

    /// Blocks the host until the batch is complete.
    pub fn synchronize(&self) -> Result<()> {
        self.device.synchronize().map_err(device_error)
    }

    /// gear-device's batch underneath.
    pub fn device_batch(&self) -> &DeviceBatch<A> {
        &self.device
    }
}
