//! `gear.CudaSampler` (Cargo feature `cuda`): batches gathered on the GPU
//! by gear-api's device sampler, handed to Python as CUDA tensors through
//! DLPack (`torch.from_dlpack(batch["obs"])`), with no host copy.
//!
//! Ownership follows the host rule (each batch owns its memory): the
//! sampler's ring buffers are reused by later calls, so every column is
//! copied device-to-device into an allocation of its own, which its DLPack
//! exports keep alive. Allocations are reused once no tensor holds them.
//!
//! Ordering is the device's, never the host's: the copies run on a stream
//! of the sampler's after its gather; the consumer's stream (`sample(stream=...)`,
//! DLPack's convention: `None` or 1 the legacy default stream, 2 the
//! per-thread default stream, else a `CUstream` such as
//! `torch.cuda.current_stream().cuda_stream`) waits on an event recorded
//! after them, and before an allocation is reused the copy stream waits on
//! an event recorded on the consumer's stream, so work the consumer queued
//! on a tensor before releasing it finishes before its memory is
//! overwritten. Nothing waits on the host (the sampler's own gather wait
//! aside), so PyTorch's queued work and the next gather overlap. A consumer
//! reading the tensors on another stream orders it after the one it gave.
//! The logic is written over gear-core's device trait ([`ColumnCopies`]) and
//! tested on gear-device's CPU device.

use crate::batch::{Batch, ColumnInfo, DlpackColumn, RowFacts};
use crate::dlpack::DlDevice;
use crate::error::{Error, Result};
use crate::wait;
use gear_api::DeviceSampledBatch;
use gear_core::{Device, DeviceApi, DeviceBuffer, Pad};
use gear_cuda::cudarc::driver::CudaStream;
use gear_cuda::{CudaApi, CudaDevice};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

fn device_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> gear_api::Error {
    gear_api::Error::Backend(Box::new(e))
}

/// Copies of a device sampler's batches into allocations of their own,
/// ordered against the consumer's stream on the device (see the module
/// doc), reusing the allocations no consumer holds any more.
struct ColumnCopies<A: DeviceApi> {
    device: A::Device,
    /// The stream the copies run on: the sampler's trainer stream, so its
    /// next gather into a ring buffer waits for the copy out of it.
    stream: A::Stream,
    /// Sets of per-column allocations, handed out as `Arc`s: a set is free
    /// again when only this pool holds it.
    pool: Vec<Vec<Arc<A::Buffer>>>,
    /// Recorded on the consumer's stream before a set is reused.
    released: A::Event,
    /// Recorded on the copy stream after the copies, waited on by the
    /// consumer's stream.
    ready: A::Event,
}

impl<A: DeviceApi> ColumnCopies<A> {
    fn new(device: &A::Device, stream: A::Stream) -> gear_api::Result<Self> {
        Ok(ColumnCopies {
            released: device.new_event().map_err(device_error)?,
            ready: device.new_event().map_err(device_error)?,
            device: device.clone(),
            stream,
            pool: Vec::new(),
        })
    }

    /// Allocation sets made so far (free or held).
    fn sets(&self) -> usize {
        self.pool.len()
    }

    /// Copies every column of `batch` (gathered for the copy stream: the
    /// sampler made it wait for the gather) into a free set, or a new one,
    /// and makes `consumer` wait for the copies. Returns the set.
    fn copy(&mut self, batch: &DeviceSampledBatch<A>, consumer: &A::Stream) -> gear_api::Result<Vec<Arc<A::Buffer>>> {
        let sizes: Vec<u64> = (0..batch.columns()).map(|i| batch.column_at(i).bytes()).collect();
        let fits = |set: &Vec<Arc<A::Buffer>>| {
            set.iter().all(|b| Arc::strong_count(b) == 1) && set.iter().map(|b| b.len()).eq(sizes.iter().copied())
        };
        let d = &self.device;
        let i = match self.pool.iter().position(fits) {
            Some(i) => {
                // The consumer may still have work queued on tensors it has
                // released: the copies into them wait for it.
                d.record(&self.released, consumer).map_err(device_error)?;
                d.wait(&self.stream, &self.released).map_err(device_error)?;
                i
            }
            None => {
                let set = sizes.iter().map(|&n| d.alloc(n).map(Arc::new)).collect::<Result<Vec<_>, _>>();
                self.pool.push(set.map_err(device_error)?);
                self.pool.len() - 1
            }
        };
        batch.wait_on(&self.stream)?;
        for (c, dst) in self.pool[i].iter().enumerate() {
            let src = batch.column_at(c).memory;
            d.copy(&self.stream, dst, 0, src, 0, dst.len()).map_err(device_error)?;
        }
        d.record(&self.ready, &self.stream).map_err(device_error)?;
        d.wait(consumer, &self.ready).map_err(device_error)?;
        Ok(self.pool[i].clone())
    }
}

impl<A: DeviceApi> Drop for ColumnCopies<A> {
    fn drop(&mut self) {
        // Copies still queued write sets that may go with the pool.
        let _ = self.device.stream_synchronize(&self.stream);
    }
}

/// Draws batches into GPU memory. Create with `table.cuda_sampler(...)`.
#[pyclass(module = "gear._gear")]
pub struct CudaSampler {
    /// Declared first: dropped (waiting for its copies) before the sampler.
    copies: ColumnCopies<CudaApi>,
    inner: gear_api::CudaSampler,
    device: CudaDevice,
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
        let device = CudaDevice::new(ordinal).map_err(gear_api::Error::from)?;
        let copy_stream = device.new_stream().map_err(gear_api::Error::from)?;
        // The copy stream is the sampler's trainer stream: each batch is
        // ordered before it, and a ring buffer is gathered into again only
        // after the copy out of it.
        let options = gear_api::CudaSamplerOptions::new(ordinal).ring(ring).stream(copy_stream.clone());
        let inner = table.cuda_sampler(sliced, options)?;
        let device = inner.device().clone();
        let copies = ColumnCopies::new(&device, copy_stream)?;
        let infos: Arc<[ColumnInfo]> = if names.is_empty() {
            infos_of_table.into()
        } else {
            // In the order requested, as the batch's columns are.
            names.iter().filter_map(|n| infos_of_table.iter().find(|c| &c.name == n)).cloned().collect()
        };
        let ordinal = i32::try_from(ordinal).map_err(|_| Error::Spec(format!("device {ordinal} out of range")))?;
        Ok(CudaSampler { copies, inner, device, timeout, infos, window, pad, ordinal })
    }

    /// The consumer's stream, from DLPack's stream convention.
    fn consumer(&self, stream: Option<usize>) -> Result<Arc<CudaStream>> {
        let raw = match stream {
            None | Some(1) => 0x1, // CU_STREAM_LEGACY
            Some(0) => {
                return Err(Error::Spec(
                    "stream 0 is ambiguous (DLPack): give 1 (legacy default), 2 (per-thread default) or a stream"
                        .into(),
                ))
            }
            Some(s) => s,
        };
        // SAFETY: `raw` is one of the driver's default-stream handles, or a
        // stream of this device's context the caller (PyTorch) owns and
        // keeps alive while it uses the batch; the wrapper never destroys
        // it, and lives only for this call.
        Ok(unsafe { self.device.context().wrap_borrowed_stream(raw as _) })
    }

    fn sample_columns(&mut self, py: Python<'_>, stream: Option<usize>) -> Result<DeviceColumns> {
        let consumer = self.consumer(stream)?;
        let (inner, copies) = (&mut self.inner, &mut self.copies);
        wait::interruptible(py, self.timeout, || {
            let batch = inner.sample()?;
            let memory = copies.copy(batch, &consumer)?;
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
    /// of the batch's own device memory); keys, lengths, mask,
    /// probabilities and weights are NumPy arrays. `stream` is the stream
    /// that reads the tensors (DLPack's convention; default the legacy
    /// default stream): it is made to wait for the batch on the device.
    #[pyo3(signature = (stream=None))]
    fn sample(&mut self, py: Python<'_>, stream: Option<usize>) -> PyResult<Batch> {
        let DeviceColumns { memory, facts } = self.sample_columns(py, stream)?;
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

    /// The next batch (on the legacy default stream); iteration stops when
    /// the table is closed.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        match self.sample(py, None) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_instance_of::<crate::error::ClosedError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Column allocations made so far (each batch reuses a set no tensor
    /// holds any more).
    #[getter]
    fn allocation_sets(&self) -> usize {
        self.copies.sets()
    }
}

#[cfg(test)]
mod tests {
    use super::ColumnCopies;
    use gear_api::gear_device::{CpuDevice, CpuDeviceApi, TrainStep};
    use gear_api::{DeviceSamplerOptions, ReplayTable, SampleConfig, StepValue};
    use gear_core::{ColumnSpec, DType, Device, DeviceBuffer, TableSpec, WindowSpec};
    use std::time::Duration;

    /// The copies on the CPU device (which reports any unordered access):
    /// the consumer's stream is ordered after them without the host waiting
    /// for the consumer's earlier work, tensors released while the consumer
    /// still reads them are reused only after it did, and a few allocation
    /// sets serve every batch (the old code synchronised the whole context
    /// and allocated every column of every batch).
    #[test]
    fn copies_are_ordered_on_the_device_and_reuse_released_allocations() {
        let dev = match CpuDevice::new() {
            Ok(d) => d,
            Err(e) => return println!("skipped: {e}"),
        };
        let spec =
            TableSpec::new(vec![ColumnSpec::new("x", DType::U8, [32]), ColumnSpec::new("r", DType::F32, [])], 8, 8)
                .unwrap();
        let table = ReplayTable::builder(spec).build().unwrap();
        for id in 0..8u8 {
            let mut t = table.writer().begin(None).unwrap();
            for s in 0..8u8 {
                t.append_step(&[StepValue::typed(&[id ^ s; 32]), StepValue::typed(&[f32::from(id)])]).unwrap();
            }
            t.end().unwrap();
        }
        let copy_stream = dev.new_stream().unwrap();
        let options = DeviceSamplerOptions::<CpuDeviceApi>::default().stream(copy_stream.clone());
        let mut sampler = table.device_sampler(&dev, SampleConfig::new(4, WindowSpec::last(4)), options).unwrap();
        let mut copies = ColumnCopies::<CpuDeviceApi>::new(&dev, copy_stream).unwrap();
        let consumer = dev.new_stream().unwrap();
        let step = TrainStep::<CpuDeviceApi>::new(&dev).unwrap();
        let busy = dev.new_event().unwrap();
        for round in 0..12 {
            let batch = sampler.sample().unwrap();
            let want: Vec<Vec<u8>> = (0..2).map(|c| batch.column_to_host(c).unwrap()).collect();
            let set = copies.copy(batch, &consumer).unwrap();
            // The consumer reads its tensors, a long step, then releases
            // them while that step may still run.
            let inputs: Vec<&gear_api::gear_device::cpu::CpuBuffer> = set.iter().map(|b| &**b).collect();
            step.queue(&consumer, &inputs, Duration::from_millis(if round == 0 { 1500 } else { 1 })).unwrap();
            dev.record(&busy, &consumer).unwrap();
            if round == 0 {
                // The next copies do not wait on the host for the step.
                let batch = sampler.sample().unwrap();
                let next = copies.copy(batch, &consumer).unwrap();
                assert!(!dev.event_done(&busy).unwrap(), "the copies waited for the consumer on the host");
                drop(next);
            }
            if round % 2 == 1 {
                // Released with the step still queued: the next copies into
                // this set must wait for it on the device.
                drop(set);
                continue;
            }
            dev.stream_synchronize(&consumer).unwrap();
            for (c, b) in set.iter().enumerate() {
                let mut got = vec![0u8; b.len() as usize];
                dev.read(b, 0, &mut got).unwrap();
                assert_eq!(got, want[c], "round {round}: column {c}");
            }
            drop(set);
        }
        assert!(copies.sets() <= 3, "{} allocation sets for 13 batches", copies.sets());
    }
}
