//! Batches as Python sees them, and the memory behind them.
//!
//! Ownership rule: **each batch owns its buffer**. A [`BatchStorage`] is
//! one allocation holding every column of one batch; the column arrays of
//! a [`Batch`] are NumPy views over it whose base object keeps it alive,
//! and DLPack exports hold it through their deleter. A sampler reuses a
//! buffer only once nothing references it any more (its `Arc` is unique),
//! so a view can never see a later batch's data: keeping a batch, an array
//! or a tensor simply makes the sampler allocate another buffer.

use crate::dlpack::{self, DlDevice};
use crate::dtype;
use crate::error::{Error, Result};
use gear_core::{DType, Pad};
use numpy::npyffi::{self, npy_intp, NPY_ARRAY_CARRAY, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayMethods, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every column inside a batch buffer (a cache line; also
/// what SIMD loads of any dtype want).
const COLUMN_ALIGN: usize = 64;

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

/// The Python object that keeps a batch buffer alive: the base object of
/// every NumPy array over it.
#[pyclass(module = "gear._gear", frozen)]
pub struct BatchBuffer {
    pub(crate) storage: Arc<BatchStorage>,
}

#[pymethods]
impl BatchBuffer {
    /// Address of the buffer's first byte.
    #[getter]
    fn address(&self) -> usize {
        self.storage.address()
    }

    /// Size of the buffer in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.storage.nbytes()
    }
}

/// A NumPy array of `shape` and `descr` over `ptr`, whose base object is
/// `owner`.
///
/// # Safety
/// `ptr` must point to `product(shape) * itemsize` bytes, aligned for the
/// dtype, that stay valid and in place for as long as `owner` is alive.
pub(crate) unsafe fn array_view<'py>(
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
    ptr: *mut u8,
    owner: Bound<'py, PyAny>,
) -> Result<Bound<'py, PyAny>> {
    let py = descr.py();
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: the caller guarantees the memory; NewFromDescr steals the
    // descriptor reference we pass (hence the clone), and SetBaseObject
    // steals the owner reference, so both counts stay balanced.
    unsafe {
        let array_type = PY_ARRAY_API.get_type_object(py, npyffi::NpyTypes::PyArray_Type);
        let raw = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            array_type,
            descr.clone().into_ptr().cast(),
            dims.len() as i32,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            ptr.cast(),
            NPY_ARRAY_CARRAY,
            std::ptr::null_mut(),
        );
        if raw.is_null() {
            return Err(Error::Python(PyErr::fetch(py)));
        }
        let array = Bound::from_owned_ptr(py, raw);
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
/// `probabilities`, `weights` and `starts` describe the rows. The column
/// arrays are views over the batch's own buffer (no copy), valid for as
/// long as you keep them: the sampler never reuses a buffer something
/// still references.
#[pyclass(module = "gear._gear", frozen)]
pub struct Batch {
    /// Column name -> array.
    #[pyo3(get)]
    columns: Py<PyDict>,
    /// Key of each row (`uint64`), for `Table.update_priorities`.
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
    infos: Arc<[ColumnInfo]>,
    window: usize,
}

impl Batch {
    /// Builds a batch over `columns` (arrays already made) and `facts`.
    pub(crate) fn new(
        py: Python<'_>,
        columns: Bound<'_, PyDict>,
        facts: RowFacts,
        window: usize,
        pad: Pad,
        infos: Arc<[ColumnInfo]>,
        buffer: Option<Py<BatchBuffer>>,
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
        Ok(Batch {
            columns: columns.unbind(),
            keys: numpy::PyArray1::from_vec(py, facts.keys).into_any().unbind(),
            lengths: numpy::PyArray1::from_vec(py, facts.lengths).into_any().unbind(),
            mask: mask.into_any().unbind(),
            probabilities: numpy::PyArray1::from_vec(py, facts.probabilities).into_any().unbind(),
            weights: numpy::PyArray1::from_vec(py, facts.weights).into_any().unbind(),
            starts: numpy::PyArray1::from_vec(py, facts.starts).into_any().unbind(),
            buffer,
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
            return Err(Error::Spec("a batch from sample_into holds your own arrays; export those".into()).into());
        };
        let (i, info) =
            self.infos.iter().enumerate().find(|(_, c)| c.name == name).ok_or_else(|| {
                pyo3::exceptions::PyKeyError::new_err(format!("column `{name}` is not in this batch"))
            })?;
        let storage = buffer.bind(py).get().storage.clone();
        let mut shape = vec![self.rows(py)?, self.window];
        shape.extend(&info.shape);
        Ok(DlpackColumn::new(storage.column_ptr(i) as usize, shape, info.dtype, DlDevice::CPU, storage))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let names: Vec<&str> = self.infos.iter().map(|c| c.name.as_str()).collect();
        Ok(format!("Batch(rows={}, window={}, columns={names:?})", self.rows(py)?, self.window))
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
    let storage = &buffer.get().storage;
    for (i, info) in infos.iter().enumerate() {
        let mut shape = vec![rows, window];
        shape.extend(&info.shape);
        // SAFETY: column `i` of the storage holds exactly `shape` elements
        // of the column's dtype (the sampler's layout sized it), aligned to
        // 64 bytes; `buffer` owns the storage and becomes the array's base.
        let array =
            unsafe { array_view(descrs[i].bind(py), &shape, storage.column_ptr(i), buffer.clone().into_any())? };
        dict.set_item(&info.name, array)?;
    }
    Ok(dict)
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
