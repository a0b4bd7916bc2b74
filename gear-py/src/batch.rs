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

use crate::dlpack::{self, DlDevice};
use crate::dtype;
use crate::error::{Error, Result};
use gear_api::TransitionBatch;
use gear_core::{DType, Pad};
use numpy::npyffi::{self, npy_intp, NPY_ARRAY_BEHAVED, NPY_ARRAY_CARRAY, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayMethods, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every column inside a batch buffer (a cache line; also
/// what SIMD loads of any dtype want).
const COLUMN_ALIGN: usize = 64;

/// Buffers a sampler keeps for reuse; batches still referenced beyond
/// these get fresh buffers that are freed with them.
const POOLED_BUFFERS: usize = 4;

/// The buffers a sampler reuses (the ownership rule above): a batch's
/// buffer is kept here after the batch is made, and handed out again only
/// once nothing else references it (its `Arc` is unique).
#[derive(Debug)]
pub(crate) struct BufferPool<T> {
    buffers: Vec<Arc<T>>,
}

impl<T> BufferPool<T> {
    /// An empty pool.
    pub(crate) fn new() -> Self {
        BufferPool { buffers: Vec::new() }
    }

    /// A buffer nothing else references: one of the pool's, taken out, or
    /// a new one from `make`.
    pub(crate) fn take_or(&mut self, make: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
        if let Some(i) = self.buffers.iter_mut().position(|b| Arc::get_mut(b).is_some()) {
            return Ok(self.buffers.swap_remove(i));
        }
        Ok(Arc::new(make()?))
    }

    /// Keeps `buffer` for reuse, unless the pool is full.
    pub(crate) fn keep(&mut self, buffer: Arc<T>) {
        if self.buffers.len() < POOLED_BUFFERS {
            self.buffers.push(buffer);
        }
    }
}

/// One batch's memory: every requested column, each aligned to 64 bytes,
/// zero-initialised.
#[derive(Debug)]
pub(crate) struct BatchStorage {
    /// Start of the allocation (never null, `layout`-sized and aligned).
    ptr: NonNull<u8>,
    layout: Layout,
    /// `(offset, len)` of each column inside the allocation.
    columns: Vec<(usize, usize)>,
}

// SAFETY: the storage is plain bytes owned by this value; Rust code only
// forms references into it through `&mut self` (`columns_mut`), and the raw
// pointers handed to NumPy and DLPack are used under their own rules.
unsafe impl Send for BatchStorage {}
// SAFETY: as above; `&self` methods only read addresses, never the bytes.
unsafe impl Sync for BatchStorage {}

impl BatchStorage {
    /// Allocates room for columns of these byte sizes.
    pub(crate) fn new(column_bytes: &[usize]) -> Result<Self> {
        let mut columns = Vec::with_capacity(column_bytes.len());
        let mut end = 0usize;
        for &len in column_bytes {
            let offset = end.checked_next_multiple_of(COLUMN_ALIGN).ok_or_else(too_large)?;
            columns.push((offset, len));
            end = offset.checked_add(len).ok_or_else(too_large)?;
        }
        let layout = Layout::from_size_align(end.max(COLUMN_ALIGN), COLUMN_ALIGN).map_err(|_| too_large())?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Spec(format!("cannot allocate a batch of {end} bytes")))?;
        Ok(BatchStorage { ptr, layout, columns })
    }

    /// Address of the first byte.
    pub(crate) fn address(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Bytes allocated.
    pub(crate) fn nbytes(&self) -> usize {
        self.layout.size()
    }

    /// Start of column `i`.
    pub(crate) fn column_ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: every column's offset lies inside the allocation.
        unsafe { self.ptr.as_ptr().add(self.columns[i].0) }
    }

    /// Every column as a mutable slice (for the sampler to fill).
    pub(crate) fn columns_mut(&mut self) -> Vec<&mut [u8]> {
        let base = self.ptr.as_ptr();
        self.columns
            .iter()
            // SAFETY: the columns are disjoint ranges inside the
            // allocation, and `&mut self` means no other Rust reference to
            // the bytes exists (callers only get here through
            // `Arc::get_mut`, so no NumPy or DLPack view exists either).
            .map(|&(offset, len)| unsafe { std::slice::from_raw_parts_mut(base.add(offset), len) })
            .collect()
    }
}

impl Drop for BatchStorage {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn too_large() -> Error {
    Error::Spec("batch buffer size overflows the address space".into())
}

/// A cluster batch's columns as the cluster client received them: one
/// allocation per column, which the batch adopts instead of copying.
#[derive(Debug)]
pub(crate) struct ReceivedColumns {
    columns: Vec<Vec<u8>>,
}

impl ReceivedColumns {
    /// Adopts `columns` if every one is aligned for `align[i]`-byte
    /// elements (allocations of the size of a batch column always are);
    /// gives them back otherwise.
    pub(crate) fn adopt(columns: Vec<Vec<u8>>, align: &[usize]) -> std::result::Result<Self, Vec<Vec<u8>>> {
        let aligned = columns.len() == align.len()
            && columns.iter().zip(align).all(|(c, &a)| c.is_empty() || (c.as_ptr() as usize).is_multiple_of(a.max(1)));
        if aligned {
            Ok(ReceivedColumns { columns })
        } else {
            Err(columns)
        }
    }
}

/// The memory of one batch: a buffer of the sampler's pool, the columns a
/// cluster batch arrived in, or a transition sampler's pooled batch.
#[derive(Clone, Debug)]
pub(crate) enum BatchMemory {
    /// One aligned allocation holding every column.
    Pooled(Arc<BatchStorage>),
    /// One allocation per column.
    Received(Arc<ReceivedColumns>),
    /// A transition batch's buffers (frames, step columns, per-row
    /// values): its arrays are strided views the transition sampler makes,
    /// not one `[rows, window, *shape]` column each. `address` (of the
    /// first observation column's frames) and `nbytes` (of the buffers the
    /// arrays view) are taken when the batch is made: reading them later
    /// through the batch would form references to memory NumPy may write.
    Transitions { batch: Arc<TransitionBatch>, address: usize, nbytes: usize },
}

impl BatchMemory {
    /// Start of column `i`, `[rows, window, *shape]` (`None` for a
    /// transition batch, which has no such columns).
    pub(crate) fn column_ptr(&self, i: usize) -> Option<*mut u8> {
        match self {
            BatchMemory::Pooled(s) => Some(s.column_ptr(i)),
            // Only ever read through this pointer while the `Arc` lives
            // (NumPy arrays and DLPack capsules keep it).
            BatchMemory::Received(r) => Some(r.columns[i].as_ptr() as *mut u8),
            BatchMemory::Transitions { .. } => None,
        }
    }

    fn address(&self) -> usize {
        match self {
            BatchMemory::Pooled(s) => s.address(),
            BatchMemory::Received(r) => r.columns.first().map_or(0, |c| c.as_ptr() as usize),
            BatchMemory::Transitions { address, .. } => *address,
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            BatchMemory::Pooled(s) => s.nbytes(),
            BatchMemory::Received(r) => r.columns.iter().map(Vec::len).sum(),
            BatchMemory::Transitions { nbytes, .. } => *nbytes,
        }
    }

    /// What keeps the memory alive for a DLPack consumer.
    fn keepalive(&self) -> dlpack::Keepalive {
        match self {
            BatchMemory::Pooled(s) => s.clone(),
            BatchMemory::Received(r) => r.clone(),
            BatchMemory::Transitions { batch, .. } => batch.clone(),
        }
    }
}

/// The Python object that keeps a batch buffer alive: the base object of
/// every NumPy array over it.
#[pyclass(module = "gear._gear", frozen)]
pub struct BatchBuffer {
    pub(crate) memory: BatchMemory,
}

#[pymethods]
impl BatchBuffer {
    /// Address of the buffer's first byte.
    #[getter]
    fn address(&self) -> usize {
        self.memory.address()
    }

    /// Size of the buffer in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.memory.nbytes()
    }
}

/// A writable NumPy array of `shape` and `descr` over `ptr`, whose base
/// object is `owner`: C-contiguous, or with these byte `strides`.
///
/// # Safety
/// `ptr` must point to memory, aligned for the dtype, that stays valid and
/// in place for as long as `owner` is alive, holds every element `shape`
/// and `strides` reach (`product(shape) * itemsize` bytes without
/// strides), and that nothing but NumPy arrays over `owner` reads or
/// writes meanwhile.
pub(crate) unsafe fn array_view<'py>(
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
    strides: Option<&[usize]>,
    ptr: *mut u8,
    owner: Bound<'py, PyAny>,
) -> Result<Bound<'py, PyAny>> {
    let py = descr.py();
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    let mut steps: Option<Vec<npy_intp>> = strides.map(|s| s.iter().map(|&b| b as npy_intp).collect());
    // Strided: NumPy works out contiguity and alignment from the strides.
    let flags = if strides.is_some() { NPY_ARRAY_BEHAVED } else { NPY_ARRAY_CARRAY };
    // SAFETY: the caller guarantees the memory; `dims` and `steps` have
    // one entry per axis and outlive the call, which copies them;
    // NewFromDescr steals the descriptor reference we pass (hence the
    // clone), and SetBaseObject steals the owner reference, so both
    // counts stay balanced.
    unsafe {
        let array_type = PY_ARRAY_API.get_type_object(py, npyffi::NpyTypes::PyArray_Type);
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            array_type,
            descr.clone().into_ptr().cast(),
            dims.len() as i32,
            dims.as_mut_ptr(),
            steps.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            ptr.cast(),
            flags,
            std::ptr::null_mut(),
        );
        if raw.is_null() {
            return Err(Error::Python(PyErr::fetch(py)));
        }
        let array = Bound::from_owned_ptr(py, raw);
        if strides.is_some() {
            PY_ARRAY_API.PyArray_UpdateFlags(py, raw.cast(), npyffi::NPY_ARRAY_UPDATE_ALL | npyffi::NPY_ARRAY_ALIGNED);
        }
        if PY_ARRAY_API.PyArray_SetBaseObject(py, raw.cast(), owner.into_ptr()) < 0 {
            return Err(Error::Python(PyErr::fetch(py)));
        }
        Ok(array)
    }
}

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
        // of the column's dtype (the sampler's layout sized a pooled
        // buffer, 64-byte aligned; a received column was checked against
        // the shape and adopted only if aligned for its dtype); `buffer`
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

/// `{column: (numpy dtype name, shape)}` of the arrays `sample_into` takes.
pub(crate) fn output_spec<'py>(
    py: Python<'py>,
    infos: &[ColumnInfo],
    rows: usize,
    window: usize,
) -> Result<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for c in infos {
        let mut shape = vec![rows, window];
        shape.extend(&c.shape);
        d.set_item(&c.name, (dtype::numpy_name(c.dtype), pyo3::types::PyTuple::new(py, shape)?))?;
    }
    Ok(d)
}

/// The caller's arrays a `sample_into` fills, checked: one per column,
/// each of the column's dtype and batch shape, C-contiguous, writeable,
/// none overlapping another.
pub(crate) struct OutputArrays<'py> {
    /// The objects given, in column order (returned as the batch's columns).
    given: Vec<Bound<'py, PyAny>>,
    /// NumPy arrays over the same memory (kept alive while it is filled).
    _arrays: Vec<Bound<'py, PyUntypedArray>>,
    /// `(address, bytes)` of each column's memory.
    pub(crate) ranges: Vec<(usize, usize)>,
}

impl<'py> OutputArrays<'py> {
    /// Checks `out`: a dict of column name -> array, or a list in column
    /// order; arrays, or objects NumPy views without a copy (torch CPU
    /// tensors, pinned ones and `torch.bfloat16` ones included).
    pub(crate) fn parse(out: &Bound<'py, PyAny>, infos: &[ColumnInfo], rows: usize, window: usize) -> Result<Self> {
        use pyo3::types::{PyList, PyTuple};
        let py = out.py();
        let np = py.import("numpy")?;
        let given: Vec<Bound<'py, PyAny>> = if let Ok(d) = out.cast::<PyDict>() {
            for key in d.keys() {
                let name: String = key.extract()?;
                if !infos.iter().any(|c| c.name == name) {
                    return Err(Error::Step(format!(
                        "unknown column `{name}`: this sampler gathers {:?}",
                        names(infos)
                    )));
                }
            }
            let mut v = Vec::new();
            for c in infos {
                v.push(
                    d.get_item(&c.name)?
                        .ok_or_else(|| Error::Step(format!("no output array for column `{}`", c.name)))?,
                );
            }
            v
        } else if out.is_instance_of::<PyList>() || out.is_instance_of::<PyTuple>() {
            out.try_iter()?.collect::<PyResult<_>>()?
        } else {
            return Err(Error::Step(
                "sample_into takes a dict of column name -> array, or a list in column order".into(),
            ));
        };
        if given.len() != infos.len() {
            return Err(Error::Step(format!(
                "{} output arrays given, the sampler gathers {} columns",
                given.len(),
                infos.len()
            )));
        }
        let mut arrays = Vec::with_capacity(given.len());
        let mut ranges = Vec::with_capacity(given.len());
        for (obj, info) in given.iter().zip(infos) {
            // Tensors and other array-likes: NumPy views of their memory
            // (torch CPU tensors share it); a copy would be filled in vain,
            // so the view must share memory with the object.
            let array = match obj.cast::<PyUntypedArray>() {
                Ok(a) => a.clone(),
                Err(_) => {
                    let bits = bf16_bits(obj, info)?;
                    let a = match &bits {
                        Some(bits) => np.call_method1("asarray", (bits,))?.call_method1("view", ("uint16",))?,
                        None => np.call_method1("asarray", (obj,))?,
                    };
                    let a = a.cast_into::<PyUntypedArray>().map_err(|e| Error::Python(e.into()))?;
                    // (NumPy cannot read a bfloat16 tensor to compare with;
                    // its int16 view shares the tensor's memory.)
                    let source = bits.as_ref().unwrap_or(obj);
                    if !np
                        .call_method1("shares_memory", (&a, source))
                        .and_then(|r| r.extract::<bool>())
                        .unwrap_or(false)
                    {
                        return Err(Error::Step(format!(
                            "output for column `{}` is not an array whose memory NumPy can write in place",
                            info.name
                        )));
                    }
                    a
                }
            };
            ranges.push(check_output(&array, info, rows, window)?);
            arrays.push(array);
        }
        let mut sorted = ranges.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(Error::Step("output arrays overlap".into()));
        }
        Ok(OutputArrays { given, _arrays: arrays, ranges })
    }

    /// The batch's columns: the objects given, by name.
    pub(crate) fn columns(&self, py: Python<'py>, infos: &[ColumnInfo]) -> Result<Bound<'py, PyDict>> {
        let columns = PyDict::new(py);
        for (info, obj) in infos.iter().zip(&self.given) {
            columns.set_item(&info.name, obj)?;
        }
        Ok(columns)
    }
}

/// A `torch.bfloat16` tensor for a bf16 column, viewed as `torch.int16`
/// (NumPy has no bfloat16, and torch refuses to hand one to NumPy): the
/// same memory, the same two bytes per element, which the caller views as
/// `uint16`, the column's raw bits. `None` for anything else.
fn bf16_bits<'py>(obj: &Bound<'py, PyAny>, info: &ColumnInfo) -> Result<Option<Bound<'py, PyAny>>> {
    if info.dtype != DType::BF16 {
        return Ok(None);
    }
    let Ok(dtype) = obj.getattr("dtype") else { return Ok(None) };
    if dtype.str().map(|s| s.to_string()).ok().as_deref() != Some("torch.bfloat16") {
        return Ok(None);
    }
    let torch = obj.py().import("torch")?;
    Ok(Some(obj.call_method1("view", (torch.getattr("int16")?,))?))
}

/// Checks that `array` can receive column `info` of a batch of `rows`
/// rows of `window` steps, and returns its data pointer and byte length.
pub(crate) fn check_output(
    array: &Bound<'_, PyUntypedArray>,
    info: &ColumnInfo,
    rows: usize,
    window: usize,
) -> Result<(usize, usize)> {
    use numpy::PyUntypedArrayMethods;
    let mut want = vec![rows, window];
    want.extend(&info.shape);
    let descr = array.dtype();
    if !dtype::accepts(info.dtype, &descr) {
        return Err(Error::Step(format!(
            "output for column `{}` has dtype {}, the column is {}",
            info.name,
            dtype::describe(&descr),
            info.dtype
        )));
    }
    if array.shape() != want.as_slice() {
        return Err(Error::Step(format!(
            "output for column `{}` has shape {:?}, the batch needs {want:?}",
            info.name,
            array.shape()
        )));
    }
    // SAFETY: `array` is a live NumPy array; reading its flags and data
    // pointer has no other requirement.
    let (flags, data) = unsafe {
        let raw = array.as_array_ptr();
        ((*raw).flags, (*raw).data as usize)
    };
    if flags & npyffi::NPY_ARRAY_C_CONTIGUOUS == 0 || flags & npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Err(Error::Step(format!("output for column `{}` must be C-contiguous and writeable", info.name)));
    }
    let len = want.iter().product::<usize>() * info.dtype.size() as usize;
    Ok((data, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_disjoint_and_zeroed() {
        let mut storage = BatchStorage::new(&[3, 100, 0, 64]).unwrap();
        assert_eq!(storage.columns, vec![(0, 3), (64, 100), (192, 0), (192, 64)]);
        assert_eq!(storage.nbytes(), 256);
        for i in 0..4 {
            assert_eq!(storage.column_ptr(i) as usize % COLUMN_ALIGN, 0);
        }
        let columns = storage.columns_mut();
        assert!(columns.iter().all(|c| c.iter().all(|&b| b == 0)));
        assert_eq!(columns.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![3, 100, 0, 64]);
    }

    #[test]
    fn an_empty_batch_still_allocates_and_sizes_that_overflow_are_refused() {
        assert_eq!(BatchStorage::new(&[]).unwrap().nbytes(), COLUMN_ALIGN);
        assert!(matches!(BatchStorage::new(&[usize::MAX - 10, 100]), Err(Error::Spec(_))));
    }
}
