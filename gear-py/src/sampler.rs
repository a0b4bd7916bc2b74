//! `gear.Sampler`: batches into buffers the batch owns (`sample`), or into
//! the caller's arrays (`sample_into`), and iteration.

use crate::batch::{self, Batch, BatchBuffer, BatchMemory, BatchStorage, BufferPool, ColumnInfo, RowFacts};
use crate::dtype;
use crate::error::{Error, Result};
use crate::wait;
use gear_core::Pad;
use numpy::PyArrayDescr;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

/// Draws batches of windows from a table. Create one per thread
/// (`table.sampler(...)`); a sampler used by two threads at once raises.
#[pyclass(module = "gear._gear")]
pub struct Sampler {
    inner: gear_api::Sampler,
    timeout: Option<Duration>,
    infos: Arc<[ColumnInfo]>,
    descrs: Vec<Py<PyArrayDescr>>,
    column_bytes: Vec<usize>,
    rows: usize,
    window: usize,
    pad: Pad,
    pool: BufferPool<BatchStorage>,
}

impl Sampler {
    pub(crate) fn new(py: Python<'_>, table: &gear_api::ReplayTable, config: gear_api::SampleConfig) -> Result<Self> {
        let timeout = config.timeout;
        let pad = config.window.pad;
        let sliced = config.clone().timeout(Some(wait::slice_of(timeout)));
        let inner = table.sampler(sliced)?;
        let layout = inner.layout();
        let spec = table.spec();
        let mut infos = Vec::new();
        let mut descrs = Vec::new();
        let mut column_bytes = Vec::new();
        for (i, &c) in layout.columns().iter().enumerate() {
            let col = &spec.columns()[c];
            infos.push(ColumnInfo {
                name: col.name().to_owned(),
                dtype: col.dtype(),
                shape: col.shape().iter().map(|&d| d as usize).collect(),
            });
            descrs.push(dtype::numpy_descr(py, col.dtype())?.unbind());
            column_bytes.push(layout.column_bytes(i) as usize);
        }
        let (rows, window) = (layout.rows(), layout.window().len as usize);
        Ok(Sampler {
            inner,
            timeout,
            infos: infos.into(),
            descrs,
            column_bytes,
            rows,
            window,
            pad,
            pool: BufferPool::new(),
        })
    }

    fn sample_batch(&mut self, py: Python<'_>) -> Result<Batch> {
        let column_bytes = &self.column_bytes;
        let mut storage = self.pool.take_or(|| BatchStorage::new(column_bytes))?;
        let inner = &mut self.inner;
        let filled = wait::interruptible(py, self.timeout, || {
            let Some(unique) = Arc::get_mut(&mut storage) else {
                return Err(gear_api::Error::Config("batch buffer is shared".into()));
            };
            let mut columns = unique.columns_mut();
            let rows = inner.sample_into(&mut columns)?;
            Ok(RowFacts::from_rows(&rows))
        });
        let facts = match filled {
            Ok(f) => f,
            Err(e) => {
                self.pool.keep(storage);
                return Err(e);
            }
        };
        let buffer = Bound::new(py, BatchBuffer { memory: BatchMemory::Pooled(storage.clone()) })?;
        self.pool.keep(storage);
        let columns = batch::column_arrays(py, &buffer, &self.infos, &self.descrs, self.rows, self.window)?;
        Batch::new(py, columns, facts, self.window, self.pad, self.infos.clone(), Some(buffer.unbind()))
    }

    fn sample_into_arrays(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> Result<Batch> {
        let outputs = batch::OutputArrays::parse(out, &self.infos, self.rows, self.window)?;
        let ranges = outputs.ranges.clone();
        let inner = &mut self.inner;
        let facts = wait::interruptible(py, self.timeout, || {
            let mut columns: Vec<&mut [u8]> = ranges
                .iter()
                // SAFETY: each range is the data of a live, writeable,
                // C-contiguous array of exactly that many bytes (checked
                // above), kept alive by `arrays` for this whole call; the
                // ranges are disjoint, so the slices do not alias.
                .map(|&(ptr, len)| unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) })
                .collect();
            let rows = inner.sample_into(&mut columns)?;
            Ok(RowFacts::from_rows(&rows))
        })?;
        let columns = outputs.columns(py, &self.infos)?;
        Batch::new(py, columns, facts, self.window, self.pad, self.infos.clone(), None)
    }

    fn names(&self) -> Vec<String> {
        batch::names(&self.infos)
    }
}

#[pymethods]
impl Sampler {
    /// Draws and gathers one batch into a buffer the batch owns. Waits
    /// (up to the sampler's timeout, interruptible by Ctrl-C, without the
    /// GIL) while the table is empty or the rate limiter holds samplers
    /// back.
    fn sample(&mut self, py: Python<'_>) -> PyResult<Batch> {
        Ok(self.sample_batch(py)?)
    }

    /// Like `sample`, but gathers into your arrays: `out` is a dict of
    /// column name -> array (or a list in column order), each C-contiguous,
    /// writeable, of the column's dtype and shape `[rows, window, *shape]`
    /// (NumPy arrays, or torch CPU tensors, pinned ones included). Returns
    /// a batch whose columns are those arrays.
    fn sample_into(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<Batch> {
        Ok(self.sample_into_arrays(py, out)?)
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.rows
    }

    /// Steps per row.
    #[getter]
    fn window(&self) -> usize {
        self.window
    }

    /// The columns gathered, in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.names()
    }

    /// `{column: (numpy dtype name, shape)}` of the arrays `sample_into`
    /// takes.
    fn output_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        Ok(batch::output_spec(py, &self.infos, self.rows, self.window)?)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; iteration stops when the table is closed.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        until_closed(self.sample_batch(py))
    }
}

/// A sampler's `__next__`: the batch, or the end of iteration once the
/// table is closed.
pub(crate) fn until_closed(sampled: Result<Batch>) -> PyResult<Option<Batch>> {
    match sampled {
        Ok(b) => Ok(Some(b)),
        Err(Error::Gear(gear_api::Error::Closed)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
