//! `gear.Sampler`: batches into buffers the batch owns (`sample`), or into
//! the caller's arrays (`sample_into`), and iteration; with `prefetch=N`
//! drawn ahead on a Rust thread (`prefetch`).

use crate::batch::{self, Batch, BatchShape, BatchStorage, BufferPool, ColumnInfo, RowFacts};
use crate::dtype;
use crate::error::{Error, Result};
use crate::prefetch::Prefetcher;
use crate::wait;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Draws batches of windows from a table. Create one per thread
/// (`table.sampler(...)`); a sampler used by two threads at once raises.
/// Made with `prefetch=N`, a Rust thread draws up to N batches ahead
/// while you train: `sample()` and iteration take a ready one.
#[pyclass(module = "gear._gear")]
pub struct Sampler {
    source: Source,
    timeout: Option<Duration>,
    shape: BatchShape,
}

/// Where a sampler's batches come from.
enum Source {
    /// Drawn by each call, into the pool's buffers (of columns of
    /// `column_bytes`).
    Direct { sampler: Box<gear_api::Sampler>, column_bytes: Vec<usize>, pool: BufferPool<BatchStorage> },
    /// Drawn ahead by a thread.
    Ahead(Prefetcher),
}

impl Sampler {
    /// A sampler of `config`, drawing `prefetch` batches ahead (0: none),
    /// each passed through `transform` there if given.
    pub(crate) fn new(
        py: Python<'_>,
        table: &gear_api::ReplayTable,
        config: gear_api::SampleConfig,
        prefetch: usize,
        transform: Option<Py<PyAny>>,
    ) -> Result<Self> {
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
        let shape = BatchShape { infos: infos.into(), descrs, rows, window, pad };
        let source = match (prefetch, transform) {
            (0, None) => Source::Direct { sampler: Box::new(inner), column_bytes, pool: BufferPool::new() },
            (0, Some(_)) => return Err(no_transform_without_prefetch()),
            (depth, transform) => {
                let made = shape.clone_ref(py);
                let make =
                    move |py: Python<'_>, storage, facts| Ok(Py::new(py, made.batch(py, storage, facts)?)?.into_any());
                Source::Ahead(Prefetcher::start(depth, column_bytes, draw_ahead(inner, timeout), make, transform)?)
            }
        };
        Ok(Sampler { source, timeout, shape })
    }

    /// The next batch: drawn now, or taken from those drawn ahead (then
    /// whatever the sampler's `transform` made of it).
    fn next_batch(&mut self, py: Python<'_>) -> Result<Py<PyAny>> {
        match &self.source {
            Source::Ahead(ahead) => ahead.next(py),
            Source::Direct { .. } => Ok(Py::new(py, self.sample_batch(py)?)?.into_any()),
        }
    }

    fn sample_batch(&mut self, py: Python<'_>) -> Result<Batch> {
        let Source::Direct { sampler: inner, column_bytes, pool } = &mut self.source else {
            return Err(Error::Spec("sample_batch of a prefetching sampler".into()));
        };
        let mut storage = pool.take_or(|| BatchStorage::new(column_bytes))?;
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
                pool.keep(storage);
                return Err(e);
            }
        };
        pool.keep(storage.clone());
        self.shape.batch(py, storage, facts)
    }

    fn sample_into_arrays(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> Result<Batch> {
        let Source::Direct { sampler: inner, .. } = &mut self.source else {
            return Err(sample_into_while_prefetching());
        };
        let outputs = batch::OutputArrays::parse(out, &self.shape.infos, self.shape.rows, self.shape.window)?;
        let ranges = outputs.ranges.clone();
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
        let columns = outputs.columns(py, &self.shape.infos)?;
        Batch::new(py, columns, facts, self.shape.window, self.shape.pad, self.shape.infos.clone(), None)
    }

    fn names(&self) -> Vec<String> {
        batch::names(&self.shape.infos)
    }
}

#[pymethods]
impl Sampler {
    /// Draws and gathers one batch into a buffer the batch owns. Waits
    /// (up to the sampler's timeout, interruptible by Ctrl-C, without the
    /// GIL) while the table is empty or the rate limiter holds samplers
    /// back. A prefetching sampler returns the next batch drawn ahead (what
    /// its `transform` made of it, if it has one).
    fn sample(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.next_batch(py)?)
    }

    /// Like `sample`, but gathers into your arrays: `out` is a dict of
    /// column name -> array (or a list in column order), each C-contiguous,
    /// writeable, of the column's dtype and shape `[rows, window, *shape]`
    /// (NumPy arrays, or torch CPU tensors, pinned ones included). Returns
    /// a batch whose columns are those arrays.
    fn sample_into(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<Batch> {
        Ok(self.sample_into_arrays(py, out)?)
    }

    /// Stops drawing ahead (a prefetching sampler's thread ends, at most
    /// one draw later; batches not taken are dropped, the ones you hold
    /// stay valid); later samples raise. Nothing to do for a sampler
    /// without prefetch.
    fn close(&self, py: Python<'_>) {
        if let Source::Ahead(ahead) = &self.source {
            ahead.close(py);
        }
    }

    /// Batches drawn ahead (the `prefetch` it was made with; 0: none).
    #[getter]
    fn prefetch(&self) -> usize {
        match &self.source {
            Source::Direct { .. } => 0,
            Source::Ahead(ahead) => ahead.depth(),
        }
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.shape.rows
    }

    /// Steps per row.
    #[getter]
    fn window(&self) -> usize {
        self.shape.window
    }

    /// The columns gathered, in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.names()
    }

    /// `{column: (numpy dtype name, shape)}` of the arrays `sample_into`
    /// takes.
    fn output_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        Ok(batch::output_spec(py, &self.shape.infos, self.shape.rows, self.shape.window)?)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; iteration stops when the table is closed.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        until_closed(self.next_batch(py))
    }
}

/// The error of `sample_into` on a prefetching sampler.
pub(crate) fn sample_into_while_prefetching() -> Error {
    Error::Spec(
        "sample_into needs a sampler without prefetch: a prefetching sampler gathers into its own buffers ahead \
         of time; use sample() or iterate"
            .into(),
    )
}

/// The error of a `transform` given without `prefetch`.
pub(crate) fn no_transform_without_prefetch() -> Error {
    Error::Spec("transform is applied on the prefetch thread: give prefetch=N (N >= 1) with it".into())
}

/// The draw of a prefetching sampler's thread: one batch into `columns`,
/// retrying the sampler's wait slices until `timeout` has passed since the
/// draw began (then a timeout error) or `stop` is set (then `None`).
fn draw_ahead(
    mut inner: gear_api::Sampler,
    timeout: Option<Duration>,
) -> impl FnMut(&mut [&mut [u8]], &AtomicBool) -> Result<Option<RowFacts>> + Send + 'static {
    move |columns, stop| {
        let started = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            match inner.sample_into(columns) {
                Ok(rows) => return Ok(Some(RowFacts::from_rows(&rows))),
                Err(gear_api::Error::Timeout { op, holder, .. }) => {
                    let waited = started.elapsed();
                    if timeout.is_some_and(|t| waited + Duration::from_millis(1) >= t) {
                        return Err(gear_api::Error::Timeout { op, waited, holder }.into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A sampler's `__next__`: the batch, or the end of iteration once the
/// table is closed.
pub(crate) fn until_closed<T>(sampled: Result<T>) -> PyResult<Option<T>> {
    match sampled {
        Ok(b) => Ok(Some(b)),
        Err(Error::Gear(gear_api::Error::Closed)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
