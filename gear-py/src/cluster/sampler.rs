//! `gear.ClusterSampler`: batches drawn across the shards, returned as the
//! same `Batch` a local sampler gives (plus the shards lost and rejoined);
//! with `prefetch=N` drawn ahead on a Rust thread (`crate::prefetch`).

use super::{keys, Cluster, ClusterSpec};
use crate::batch::{self, Batch, BatchBuffer, BatchShape, BatchStorage, BufferPool, RowFacts, ShardReport};
use crate::dtype;
use crate::error::{Error, Result};
use crate::prefetch::Prefetcher;
use crate::wait;
use gear_net::{BatchRows, ClusterClient, ClusterSample};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between asks of a cluster that holds nothing yet.
const EMPTY_RETRY: Duration = Duration::from_millis(50);

/// Draws batches across a cluster's shards. `sample()` returns a `Batch`
/// whose `lost` and `rejoined` name shards left out of it or back in it;
/// `sample_into(...)` fills your arrays or torch CPU tensors; iterating
/// gives batches for ever.
#[pyclass(module = "gear._gear")]
pub struct ClusterSampler {
    client: Arc<ClusterClient>,
    request: ClusterSample,
    /// How long a sample waits while no shard holds items (or none
    /// answers); `None`: for ever.
    timeout: Option<Duration>,
    shape: BatchShape,
    column_bytes: Vec<usize>,
    /// The per-row fields `sample_into` fills, reused across batches.
    rows_out: BatchRows,
    /// The buffers `sample()` decodes batches into, each reused once the
    /// batch made from it is gone (the ownership rule of `batch`).
    pool: BufferPool<BatchStorage>,
    /// The thread drawing batches ahead (`prefetch` > 0).
    ahead: Option<Prefetcher>,
}

impl ClusterSampler {
    /// A sampler of `request` (its `columns` empty: every column).
    pub(super) fn new(
        py: Python<'_>,
        cluster: &Cluster,
        spec: &ClusterSpec,
        mut request: ClusterSample,
        timeout: Option<Duration>,
        prefetch: usize,
        transform: Option<Py<PyAny>>,
    ) -> Result<Self> {
        if spec.sampler != "uniform" && spec.sampler != "prioritized" {
            return Err(Error::Spec(format!(
                "the shards sample with `{}`, which cannot be merged across shards (uniform and prioritized can)",
                spec.sampler
            )));
        }
        let (batch_size, window) = (request.rows as usize, request.window);
        if batch_size == 0 {
            return Err(Error::Spec("batch_size must be at least 1".into()));
        }
        if request.columns.is_empty() {
            request.columns = batch::names(&spec.infos);
        }
        let names = &request.columns;
        let mut infos = Vec::with_capacity(names.len());
        for name in names {
            let info = spec.infos.iter().find(|c| &c.name == name).ok_or_else(|| {
                Error::Spec(format!("unknown column `{name}`; the table has {:?}", batch::names(&spec.infos)))
            })?;
            infos.push(info.clone());
        }
        let mut descrs = Vec::with_capacity(infos.len());
        for c in &infos {
            descrs.push(dtype::numpy_descr(py, c.dtype)?.unbind());
        }
        // The client's own check of a request (rows, window, columns, the
        // message limit), before `sample()` sizes a buffer from it: a batch
        // of 3e7 rows would otherwise be zeroed (10 GB) before the client
        // refused it.
        let (client, asked) = (cluster.client().clone(), request.clone());
        let column_bytes = wait::off_thread(py, move || client.column_bytes(&asked))??;
        let shape =
            BatchShape { infos: infos.into(), descrs, rows: batch_size, window: window.len as usize, pad: window.pad };
        let ahead = match (prefetch, transform) {
            (0, None) => None,
            (0, Some(_)) => return Err(crate::sampler::no_transform_without_prefetch()),
            (depth, transform) => {
                let shape = shape.clone_ref(py);
                let make = move |py: Python<'_>, storage, drawn: BatchRows| {
                    let (columns, buffer) = shape.arrays(py, storage)?;
                    let batch = cluster_batch(py, &shape, columns, &drawn, Some(buffer))?;
                    Ok(Py::new(py, batch)?.into_any())
                };
                let draw = draw_ahead(cluster.client().clone(), request.clone(), timeout);
                Some(Prefetcher::start(depth, column_bytes.clone(), draw, make, transform)?)
            }
        };
        Ok(ClusterSampler {
            client: cluster.client().clone(),
            request,
            timeout,
            shape,
            column_bytes,
            rows_out: BatchRows::default(),
            pool: BufferPool::new(),
            ahead,
        })
    }

    /// One batch from the client decoded into `storage` (which nothing
    /// else references), waiting (interruptibly) while the cluster holds
    /// nothing or no shard answers, up to the sampler's timeout. The call
    /// runs on a call thread that owns the buffer and the row fields while
    /// it runs, so Ctrl-C can leave it behind (the buffer goes with it);
    /// otherwise both come back, and on an error the buffer returns to
    /// the pool.
    fn draw_into(&mut self, py: Python<'_>, mut storage: Arc<BatchStorage>) -> Result<Arc<BatchStorage>> {
        let started = Instant::now();
        loop {
            let (client, request) = (self.client.clone(), self.request.clone());
            let mut rows = std::mem::take(&mut self.rows_out);
            let (back, rows_back, answer) = wait::off_thread(py, move || {
                let answer = match Arc::get_mut(&mut storage) {
                    Some(unique) => client.sample_into(&request, &mut unique.columns_mut(), &mut rows),
                    None => Err(gear_net::Error::Config("a pooled batch buffer is still shared".into())),
                };
                (storage, rows, answer)
            })?;
            storage = back;
            self.rows_out = rows_back;
            let waited = match answer {
                Ok(()) => return Ok(storage),
                Err(gear_net::Error::NoShard(why)) => self.wait_for_items(py, why, started),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = waited {
                self.pool.keep(storage);
                return Err(e);
            }
        }
    }

    /// After a sample that found no shard holding items: waits a little
    /// (interruptibly), or fails once the sampler's timeout has passed.
    fn wait_for_items(&self, py: Python<'_>, why: String, started: Instant) -> Result<()> {
        if self.timeout.is_some_and(|t| started.elapsed() + EMPTY_RETRY >= t) {
            return Err(self.nothing_to_sample(py, why, started.elapsed()));
        }
        wait::sleep(py, EMPTY_RETRY)
    }

    /// The error of a sample that found nothing for its whole timeout: a
    /// timeout if every shard answers (they hold nothing), else the shards
    /// are lost.
    fn nothing_to_sample(&self, py: Python<'_>, why: String, waited: Duration) -> Error {
        let client = self.client.clone();
        match wait::off_thread(py, move || silent_shards(&client)) {
            Ok(silent) => nothing_drawn(why, waited, silent),
            Err(e) => e,
        }
    }

    /// One batch into a pooled buffer the batch then owns: decoded there
    /// straight from the sockets, as `sample_into` does into the caller's
    /// arrays, so no batch-sized allocation (and its page faults) per call.
    fn sample_batch(&mut self, py: Python<'_>) -> Result<Batch> {
        let column_bytes = &self.column_bytes;
        let storage = self.pool.take_or(|| BatchStorage::new(column_bytes))?;
        let storage = self.draw_into(py, storage)?;
        self.pool.keep(storage.clone());
        let (arrays, buffer) = self.shape.arrays(py, storage)?;
        self.finish(py, arrays, &self.rows_out, Some(buffer))
    }

    fn finish(
        &self,
        py: Python<'_>,
        columns: Bound<'_, PyDict>,
        drawn: &BatchRows,
        buffer: Option<Py<BatchBuffer>>,
    ) -> Result<Batch> {
        cluster_batch(py, &self.shape, columns, drawn, buffer)
    }

    /// The next batch: drawn now, or taken from those drawn ahead (then
    /// whatever the sampler's `transform` made of it).
    fn next_batch(&mut self, py: Python<'_>) -> Result<Py<PyAny>> {
        match &self.ahead {
            Some(ahead) => ahead.next(py),
            None => Ok(Py::new(py, self.sample_batch(py)?)?.into_any()),
        }
    }

    /// A batch decoded by the client straight into the caller's arrays (no
    /// batch of its own, no copy after the socket's), its per-row fields in
    /// the sampler's reused `BatchRows`.
    ///
    /// The call runs on this thread with the GIL released (not
    /// `wait::off_thread`, whose abandoned calls finish later: this one
    /// writes into the caller's memory, so it must be over when this
    /// returns); every cluster call has a deadline, so Ctrl-C waits at most
    /// the call timeout, and is checked between the retries of an empty
    /// cluster.
    fn sample_into_arrays(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> Result<Batch> {
        if self.ahead.is_some() {
            return Err(crate::sampler::sample_into_while_prefetching());
        }
        let outputs = batch::OutputArrays::parse(out, &self.shape.infos, self.shape.rows, self.shape.window)?;
        let started = Instant::now();
        loop {
            let (client, request, rows) = (&self.client, &self.request, &mut self.rows_out);
            let ranges = &outputs.ranges;
            let answer = py.detach(|| {
                let mut columns: Vec<&mut [u8]> = ranges
                    .iter()
                    .map(|&(ptr, len)| {
                        // SAFETY: each range is the data of a live,
                        // writeable, C-contiguous array of exactly `len`
                        // bytes (checked by `OutputArrays::parse`, which
                        // `outputs` keeps alive for this call, and its
                        // size is the batch's column size); the ranges are
                        // disjoint, and nothing else in this process
                        // writes them while the GIL is released here
                        // (the caller hands them over for the call).
                        unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
                    })
                    .collect();
                client.sample_into(request, &mut columns, rows)
            });
            match answer {
                Ok(()) => break,
                Err(gear_net::Error::NoShard(why)) => self.wait_for_items(py, why, started)?,
                Err(e) => return Err(e.into()),
            }
        }
        let columns = outputs.columns(py, &self.shape.infos)?;
        self.finish(py, columns, &self.rows_out, None)
    }
}

#[pymethods]
impl ClusterSampler {
    /// Draws one batch across the shards into memory the batch owns (the
    /// windows as they arrived, no further copy).
    fn sample(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.next_batch(py)?)
    }

    /// Like `sample`, but into your arrays: `out` is a dict of column name
    /// -> array (or a list in column order), each C-contiguous, writeable,
    /// of the column's dtype and shape `[rows, window, *shape]` (NumPy
    /// arrays, or torch CPU tensors, pinned and bfloat16 ones included).
    /// Each shard's reply is decoded straight into them as it arrives (no
    /// other copy of the batch is made); reuse the same arrays batch after
    /// batch. On an error their contents are unspecified.
    fn sample_into(&mut self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<Batch> {
        Ok(self.sample_into_arrays(py, out)?)
    }

    /// Stops drawing ahead (a prefetching sampler's thread ends, at most
    /// one cluster call later; batches not taken are dropped, the ones you
    /// hold stay valid); later samples raise. Nothing to do for a sampler
    /// without prefetch.
    fn close(&self, py: Python<'_>) {
        if let Some(ahead) = &self.ahead {
            ahead.close(py);
        }
    }

    /// Batches drawn ahead (the `prefetch` it was made with; 0: none).
    #[getter]
    fn prefetch(&self) -> usize {
        self.ahead.as_ref().map_or(0, Prefetcher::depth)
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
        batch::names(&self.shape.infos)
    }

    /// `{column: (numpy dtype name, shape)}` of the arrays `sample_into`
    /// takes.
    fn output_spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        Ok(batch::output_spec(py, &self.shape.infos, self.shape.rows, self.shape.window)?)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (a cluster's batches do not end).
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(self.next_batch(py)?)
    }
}

/// The per-row facts of a drawn cluster batch (its keys apart).
fn row_facts(drawn: &BatchRows) -> RowFacts {
    RowFacts {
        keys: Vec::new(),
        lengths: drawn.lengths.iter().map(|&l| l as i64).collect(),
        probabilities: drawn.probabilities.clone(),
        weights: drawn.weights.clone(),
        starts: drawn.starts.iter().map(|&s| s as i64).collect(),
    }
}

/// The shards a drawn cluster batch left out or saw come back.
fn shard_report(drawn: &BatchRows) -> ShardReport {
    ShardReport {
        lost: drawn.lost.iter().map(|l| (l.shard, l.reason.clone())).collect(),
        rejoined: drawn.rejoined.clone(),
    }
}

/// A cluster batch over `columns` (a prefetching sampler's thread makes
/// it; `ClusterSampler::finish` the same for a direct sample).
fn cluster_batch(
    py: Python<'_>,
    shape: &BatchShape,
    columns: Bound<'_, PyDict>,
    drawn: &BatchRows,
    buffer: Option<Py<BatchBuffer>>,
) -> Result<Batch> {
    let keys = keys::to_array(py, &drawn.keys)?;
    let (facts, report) = (row_facts(drawn), shard_report(drawn));
    Batch::with_keys(py, columns, keys, facts, shape.window, shape.pad, shape.infos.clone(), buffer, report)
}

/// How many of the cluster's shards do not answer.
fn silent_shards(client: &ClusterClient) -> usize {
    (0..client.shards()).filter(|&s| client.info(s).is_err()).count()
}

/// The error of a sample that found nothing for `waited`: a timeout if
/// every shard answers (they hold nothing), else the shards are lost.
fn nothing_drawn(why: String, waited: Duration, silent: usize) -> Error {
    match silent {
        0 => Error::Timeout(format!("timed out after {waited:?} waiting for the cluster to hold items ({why})")),
        n => Error::Net(gear_net::Error::NoShard(format!("{n} shards do not answer: {why}"))),
    }
}

/// The draw of a prefetching sampler's thread: one batch decoded into
/// `columns`, asking again every [`EMPTY_RETRY`] while no shard holds
/// items, until `timeout` has passed since the draw began (then the error
/// a direct sample gives) or `stop` is set (then `None`).
fn draw_ahead(
    client: Arc<ClusterClient>,
    request: ClusterSample,
    timeout: Option<Duration>,
) -> impl FnMut(&mut [&mut [u8]], &AtomicBool) -> Result<Option<BatchRows>> + Send + 'static {
    move |columns, stop| {
        let started = Instant::now();
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            let mut rows = BatchRows::default();
            match client.sample_into(&request, columns, &mut rows) {
                Ok(()) => return Ok(Some(rows)),
                Err(gear_net::Error::NoShard(why)) => {
                    if timeout.is_some_and(|t| started.elapsed() + EMPTY_RETRY >= t) {
                        return Err(nothing_drawn(why, started.elapsed(), silent_shards(&client)));
                    }
                    std::thread::sleep(EMPTY_RETRY);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
