//! Batches as Python sees them, and the memory behind them.
//!
//! Ownership rule: **each batch owns its buffer**. A [`BatchStorage`] is
//! one allocation holding every column of one batch; the column arrays of
//! a [`Batch`] are NumPy views over it whose base object keeps it alive,
//! and DLPack exports hold it through their deleter (a transition batch's
//! arrays are strided views over its [`TransitionBatch`] the same way). A
//! sampler reuses a buffer ([`BufferPool`]) only once nothing references
//! it any more (its `Arc` is unique), so a view can never see a later
//! batch's data: keeping a batch, an array or a tensor simply makes the
//! sampler allocate another buffer.
//!
//! `memory.rs` holds the buffers (the pool, pooled storage,
//! the `BatchBuffer` base object, NumPy views over them); `outputs.rs`
//! checks the caller's arrays a `sample_into` fills; this module is the
//! `Batch` Python sees, its DLPack exports and the column arrays.

mod memory;
mod outputs;

pub(crate) use memory::{array_view, BatchBuffer, BatchMemory, BatchStorage, BufferPool};
pub(crate) use outputs::{output_spec, OutputArrays};

use crate::dlpack::{self, DlDevice};
use crate::error::{Error, Result};
use gear_core::{DType, Pad};
use numpy::{PyArrayDescr, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

/// What a batch says about each column: name, dtype, per-step shape.
#[derive(Clone, Debug)]
pub(crate) struct ColumnInfo {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

/// Per-row facts of a sampled batch, copied out of the sampler.
#[derive(Clone, Debug, Default)]
pub(crate) struct RowFacts {
    pub(crate) keys: Vec<u64>,
    pub(crate) lengths: Vec<i64>,
    pub(crate) probabilities: Vec<f64>,
    pub(crate) weights: Vec<f64>,
    pub(crate) starts: Vec<i64>,
}

impl RowFacts {
    pub(crate) fn from_rows(rows: &gear_api::SampledRows<'_>) -> Self {
        RowFacts {
            keys: rows.keys().iter().map(|k| k.to_u64()).collect(),
            lengths: rows.lengths().iter().map(|&l| l as i64).collect(),
            probabilities: rows.probabilities().to_vec(),
            weights: rows.weights().to_vec(),
            starts: rows.starts().iter().map(|&s| s as i64).collect(),
        }
    }
}

/// One sampled batch. `batch["obs"]` (or `batch.columns["obs"]`) is a
/// `[rows, window, *shape]` array; `keys`, `lengths`, `mask`,
/// `probabilities`, `weights` and `starts` describe the rows; `lost` and
/// `rejoined` list the shards a cluster batch left out or saw come back
/// (empty for a local table). The column arrays are views over the
/// batch's own buffer (no copy), valid for as long as you keep them: the
/// sampler never reuses a buffer something still references.
#[pyclass(module = "gear._gear", frozen)]
pub struct Batch {
    /// Column name -> array.
    #[pyo3(get)]
    columns: Py<PyDict>,
    /// Key of each row, for `update_priorities`: `uint64` for a local
    /// table, `gear.CLUSTER_KEY_DTYPE` records for a cluster.
    #[pyo3(get)]
    keys: Py<PyAny>,
    /// Valid steps of each row (`int64`).
    #[pyo3(get)]
    lengths: Py<PyAny>,
    /// `[rows, window]` booleans: which steps of each row hold data.
    #[pyo3(get)]
    mask: Py<PyAny>,
    /// Probability each row was drawn with (`float64`).
    #[pyo3(get)]
    probabilities: Py<PyAny>,
    /// Importance-sampling weight of each row (`float64`).
    #[pyo3(get)]
    weights: Py<PyAny>,
    /// Stored step each row's window starts at (`int64`).
    #[pyo3(get)]
    starts: Py<PyAny>,
    /// The buffer holding the columns (`None` for `Sampler.sample_into`,
    /// whose columns are the caller's arrays).
    #[pyo3(get)]
    buffer: Option<Py<BatchBuffer>>,
    /// Shards of a cluster left out of this batch (their rows came from
    /// the others); empty for a local table.
    #[pyo3(get)]
    lost: Vec<usize>,
    /// Why each shard in `lost` was left out: shard -> reason.
    #[pyo3(get)]
    lost_reasons: Py<PyDict>,
    /// Shards of a cluster that answered again (after being lost, or as a
    /// new run); keys of their earlier runs are stale.
    #[pyo3(get)]
    rejoined: Vec<usize>,
    infos: Arc<[ColumnInfo]>,
    window: usize,
}

/// What a cluster batch adds to a local one.
#[derive(Clone, Debug, Default)]
pub(crate) struct ShardReport {
    /// `(shard, reason)` of every shard left out.
    pub(crate) lost: Vec<(usize, String)>,
    /// Shards that rejoined.
    pub(crate) rejoined: Vec<usize>,
}

impl Batch {
    /// Builds a batch over `columns` (arrays already made) and `facts`.
    pub(crate) fn new(
        py: Python<'_>,
        columns: Bound<'_, PyDict>,
        mut facts: RowFacts,
        window: usize,
        pad: Pad,
        infos: Arc<[ColumnInfo]>,
        buffer: Option<Py<BatchBuffer>>,
    ) -> Result<Batch> {
        let keys = numpy::PyArray1::from_vec(py, std::mem::take(&mut facts.keys)).into_any();
        Self::with_keys(py, columns, keys, facts, window, pad, infos, buffer, ShardReport::default())
    }

    /// Builds a batch whose keys are `keys` (the `keys` of `facts` are
    /// not used), with a cluster's shard report.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_keys(
        py: Python<'_>,
        columns: Bound<'_, PyDict>,
        keys: Bound<'_, PyAny>,
        facts: RowFacts,
        window: usize,
        pad: Pad,
        infos: Arc<[ColumnInfo]>,
        buffer: Option<Py<BatchBuffer>>,
        report: ShardReport,
    ) -> Result<Batch> {
        let rows = facts.lengths.len();
        let mut mask = vec![false; rows * window];
        for (r, &n) in facts.lengths.iter().enumerate() {
            let n = (n.max(0) as usize).min(window);
            let row = &mut mask[r * window..(r + 1) * window];
            match pad {
                Pad::Tail => row[..n].fill(true),
                Pad::Head => row[window - n..].fill(true),
            }
        }
        let mask = numpy::PyArray1::from_vec(py, mask).reshape([rows, window])?;
        let lost_reasons = PyDict::new(py);
        for (shard, reason) in &report.lost {
            lost_reasons.set_item(shard, reason)?;
        }
        Ok(Batch {
            columns: columns.unbind(),
            keys: keys.unbind(),
            lengths: numpy::PyArray1::from_vec(py, facts.lengths).into_any().unbind(),
            mask: mask.into_any().unbind(),
            probabilities: numpy::PyArray1::from_vec(py, facts.probabilities).into_any().unbind(),
            weights: numpy::PyArray1::from_vec(py, facts.weights).into_any().unbind(),
            starts: numpy::PyArray1::from_vec(py, facts.starts).into_any().unbind(),
            buffer,
            lost: report.lost.iter().map(|(s, _)| *s).collect(),
            lost_reasons: lost_reasons.unbind(),
            rejoined: report.rejoined,
            infos,
            window,
        })
    }
}

#[pymethods]
impl Batch {
    /// The array of column `name`.
    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.columns.bind(py).get_item(name)? {
            Some(a) => Ok(a),
            None => Err(pyo3::exceptions::PyKeyError::new_err(format!("column `{name}` is not in this batch"))),
        }
    }

    fn __contains__(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        self.columns.bind(py).contains(name)
    }

    /// Number of rows.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.keys.bind(py).len()
    }

    /// Rows in the batch.
    #[getter]
    fn rows(&self, py: Python<'_>) -> PyResult<usize> {
        self.__len__(py)
    }

    /// Steps per row.
    #[getter]
    fn window(&self) -> usize {
        self.window
    }

    /// Column `name` as an object with `__dlpack__` and `__dlpack_device__`
    /// (`torch.from_dlpack(batch.dlpack("obs"))`), sharing the buffer.
    /// bf16 columns arrive as `torch.bfloat16`.
    fn dlpack(&self, py: Python<'_>, name: &str) -> PyResult<DlpackColumn> {
        let Some(buffer) = &self.buffer else {
            // Device batches hold their DLPack columns directly.
            if let Some(column) = self.columns.bind(py).get_item(name)? {
                if let Ok(column) = column.extract::<PyRef<'_, DlpackColumn>>() {
                    return Ok(column.clone_ref());
                }
            }
            return Err(Error::Spec(
                "this batch's columns are arrays of their own (sample_into's, or a transition batch's); \
                 export those"
                    .into(),
            )
            .into());
        };
        let (i, info) =
            self.infos.iter().enumerate().find(|(_, c)| c.name == name).ok_or_else(|| {
                pyo3::exceptions::PyKeyError::new_err(format!("column `{name}` is not in this batch"))
            })?;
        let memory = &buffer.bind(py).get().memory;
        let ptr =
            memory.column_ptr(i).ok_or_else(|| Error::Spec("this batch has no column buffers to export".into()))?;
        let mut shape = vec![self.rows(py)?, self.window];
        shape.extend(&info.shape);
        Ok(DlpackColumn::new(ptr as usize, shape, info.dtype, DlDevice::CPU, memory.keepalive()))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let names: Vec<&str> = self.infos.iter().map(|c| c.name.as_str()).collect();
        let shards = if self.lost.is_empty() && self.rejoined.is_empty() {
            String::new()
        } else {
            format!(", lost={:?}, rejoined={:?}", self.lost, self.rejoined)
        };
        Ok(format!("Batch(rows={}, window={}, columns={names:?}{shards})", self.rows(py)?, self.window))
    }
}

/// One column exported through DLPack: host memory of a batch buffer, or
/// (CUDA samplers) device memory of its own.
#[pyclass(module = "gear._gear", frozen)]
pub struct DlpackColumn {
    ptr: usize,
    shape: Vec<usize>,
    dtype: DType,
    device: DlDevice,
    keepalive: dlpack::Keepalive,
}

impl DlpackColumn {
    /// A column of `shape` elements of `dtype` at `ptr` on `device`, whose
    /// memory `keepalive` owns.
    pub(crate) fn new(
        ptr: usize,
        shape: Vec<usize>,
        dtype: DType,
        device: DlDevice,
        keepalive: dlpack::Keepalive,
    ) -> Self {
        DlpackColumn { ptr, shape, dtype, device, keepalive }
    }

    fn clone_ref(&self) -> Self {
        DlpackColumn::new(self.ptr, self.shape.clone(), self.dtype, self.device, self.keepalive.clone())
    }
}

#[pymethods]
impl DlpackColumn {
    /// A DLPack capsule of the column (DLPack 0.8, unversioned). Every
    /// keyword of the array API's `__dlpack__` is accepted; no stream is
    /// needed (device columns are complete before they are returned).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version, dl_device);
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err("gear exports without copying (copy=True refused)"));
        }
        // SAFETY: `ptr` is memory `keepalive` owns, holding exactly
        // `shape` elements of `dtype` (a batch buffer's column, or a CUDA
        // column's own allocation); the capsule keeps a clone of
        // `keepalive` until the consumer's tensor dies.
        let capsule = unsafe {
            dlpack::export(py, self.ptr as *mut u8, &self.shape, self.dtype, self.device, self.keepalive.clone())?
        };
        Ok(capsule)
    }

    /// `(device type, device id)`: `(1, 0)` for host memory, `(2, n)` for
    /// CUDA device `n`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type, self.device.device_id)
    }
}

/// What a sampler's batches over pooled buffers are made of besides the
/// buffer and the row facts: the columns, their NumPy dtypes, and the
/// batch's rows, window and padding.
pub(crate) struct BatchShape {
    pub(crate) infos: Arc<[ColumnInfo]>,
    pub(crate) descrs: Vec<Py<PyArrayDescr>>,
    pub(crate) rows: usize,
    pub(crate) window: usize,
    pub(crate) pad: Pad,
}

impl BatchShape {
    /// A copy (for a prefetching sampler's thread).
    pub(crate) fn clone_ref(&self, py: Python<'_>) -> Self {
        BatchShape {
            infos: self.infos.clone(),
            descrs: self.descrs.iter().map(|d| d.clone_ref(py)).collect(),
            rows: self.rows,
            window: self.window,
            pad: self.pad,
        }
    }

    /// The columns of a batch in `storage`, as NumPy views over it.
    pub(crate) fn arrays<'py>(
        &self,
        py: Python<'py>,
        storage: Arc<BatchStorage>,
    ) -> Result<(Bound<'py, PyDict>, Py<BatchBuffer>)> {
        let buffer = Bound::new(py, BatchBuffer { memory: BatchMemory::Pooled(storage) })?;
        let columns = column_arrays(py, &buffer, &self.infos, &self.descrs, self.rows, self.window)?;
        Ok((columns, buffer.unbind()))
    }

    /// A local table's batch in `storage` with `facts`.
    pub(crate) fn batch(&self, py: Python<'_>, storage: Arc<BatchStorage>, facts: RowFacts) -> Result<Batch> {
        let (columns, buffer) = self.arrays(py, storage)?;
        Batch::new(py, columns, facts, self.window, self.pad, self.infos.clone(), Some(buffer))
    }
}

/// Makes the column arrays of a freshly filled `storage`.
pub(crate) fn column_arrays<'py>(
    py: Python<'py>,
    buffer: &Bound<'py, BatchBuffer>,
    infos: &[ColumnInfo],
    descrs: &[Py<PyArrayDescr>],
    rows: usize,
    window: usize,
) -> Result<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    let memory = &buffer.get().memory;
    for (i, info) in infos.iter().enumerate() {
        let mut shape = vec![rows, window];
        shape.extend(&info.shape);
        let ptr = memory.column_ptr(i).ok_or_else(|| Error::Spec("a transition batch has no column buffers".into()))?;
        // SAFETY: column `i` of the memory holds exactly `shape` elements
        // of the column's dtype (the sampler sized the pooled buffer from
        // the same rows, window and column shapes, 64-byte aligned); `buffer`
        // owns the memory and becomes the array's base, and the sampler
        // touches it again only once no array references it.
        let array = unsafe { array_view(descrs[i].bind(py), &shape, None, ptr, buffer.clone().into_any())? };
        dict.set_item(&info.name, array)?;
    }
    Ok(dict)
}

/// Column names, in order.
pub(crate) fn names(infos: &[ColumnInfo]) -> Vec<String> {
    infos.iter().map(|c| c.name.clone()).collect()
}
