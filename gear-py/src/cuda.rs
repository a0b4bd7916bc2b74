//! `gear.CudaSampler` (Cargo feature `cuda`): batches gathered on the GPU
//! by gear-api's CUDA sampler, handed to Python as CUDA tensors through
//! DLPack (`torch.from_dlpack(batch["obs"])`), with no host copy.
//!
//! Ownership follows the host rule (each batch owns its memory): the
//! sampler's ring buffers are reused by later calls, so every column is
//! copied device-to-device into an allocation of its own, which its
//! DLPack exports keep alive. A device copy costs a fraction of the
//! gather; it is the price of views that can never change under a tensor.

use crate::batch::{Batch, ColumnInfo, DlpackColumn, RowFacts};
use crate::dlpack::DlDevice;
use crate::error::{Error, Result};
use crate::wait;
use gear_core::Pad;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

/// Draws batches into GPU memory. Create with `table.cuda_sampler(...)`.
#[pyclass(module = "gear._gear")]
pub struct CudaSampler {
    inner: gear_api::CudaSampler,
    device: gear_cuda::CudaDevice,
    timeout: Option<Duration>,
    infos: Arc<[ColumnInfo]>,
    window: usize,
    pad: Pad,
    ordinal: i32,
}

/// One sampled batch's device columns, copied out of the sampler's ring.
struct DeviceColumns {
    memory: Vec<Arc<gear_cuda::DeviceMemory>>,
    facts: RowFacts,
}

fn cuda_error(e: gear_cuda::Error) -> gear_api::Error {
    gear_api::Error::Backend(Box::new(e))
}

impl CudaSampler {
    pub(crate) fn new(
        table: &gear_api::ReplayTable,
        infos_of_table: &[ColumnInfo],
        config: gear_api::SampleConfig,
        ordinal: usize,
        ring: usize,
    ) -> Result<Self> {
        let timeout = config.timeout;
        let pad = config.window.pad;
        let window = config.window.len as usize;
        let names = config.columns.clone();
        let sliced = config.timeout(Some(wait::slice_of(timeout)));
        let options = gear_api::CudaSamplerOptions::new(ordinal).ring(ring);
        let inner = table.cuda_sampler(sliced, options)?;
        let device = inner.device().clone();
        let infos: Arc<[ColumnInfo]> = if names.is_empty() {
            infos_of_table.into()
        } else {
            // In the order requested, as the batch's columns are.
            names.iter().filter_map(|n| infos_of_table.iter().find(|c| &c.name == n)).cloned().collect()
        };
        let ordinal = i32::try_from(ordinal).map_err(|_| Error::Spec(format!("device {ordinal} out of range")))?;
        Ok(CudaSampler { inner, device, timeout, infos, window, pad, ordinal })
    }

    fn sample_columns(&mut self, py: Python<'_>) -> Result<DeviceColumns> {
        let (inner, device) = (&mut self.inner, &self.device);
        wait::interruptible(py, self.timeout, || {
            let batch = inner.sample()?;
            batch.wait_on(device.stream())?;
            let mut memory = Vec::with_capacity(batch.columns());
            for i in 0..batch.columns() {
                let column = batch.column_at(i);
                let own = device.alloc(column.bytes()).map_err(cuda_error)?;
                own.copy_from_async(0, column.memory, 0, column.bytes(), device.stream()).map_err(cuda_error)?;
                memory.push(Arc::new(own));
            }
            // The copies must be complete before a consumer on any stream
            // reads the tensors.
            device.synchronize().map_err(cuda_error)?;
            let facts = RowFacts {
                keys: batch.keys().iter().map(|k| k.to_u64()).collect(),
                lengths: batch.lengths().iter().map(|&l| l as i64).collect(),
                probabilities: batch.probabilities().to_vec(),
                weights: batch.weights().to_vec(),
                starts: batch.starts().iter().map(|&s| s as i64).collect(),
            };
            Ok(DeviceColumns { memory, facts })
        })
    }
}

#[pymethods]
impl CudaSampler {
    /// Draws one batch on the GPU. `batch["obs"]` is an object with
    /// `__dlpack__` (`torch.from_dlpack(batch["obs"])` gives a CUDA tensor
    /// sharing the batch's own device memory); keys, lengths, mask,
    /// probabilities and weights are NumPy arrays.
    fn sample(&mut self, py: Python<'_>) -> PyResult<Batch> {
        let DeviceColumns { memory, facts } = self.sample_columns(py)?;
        let rows = facts.keys.len();
        let columns = PyDict::new(py);
        for (info, mem) in self.infos.iter().zip(memory) {
            let mut shape = vec![rows, self.window];
            shape.extend(&info.shape);
            let column =
                DlpackColumn::new(mem.device_addr() as usize, shape, info.dtype, DlDevice::cuda(self.ordinal), mem);
            columns.set_item(&info.name, Bound::new(py, column)?)?;
        }
        Ok(Batch::new(py, columns, facts, self.window, self.pad, self.infos.clone(), None)?)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; iteration stops when the table is closed.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        match self.sample(py) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_instance_of::<crate::error::ClosedError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
