//! The memory behind batches: the sampler's pool of reusable buffers,
//! pooled and received column storage, the `BatchBuffer` object NumPy
//! arrays and DLPack capsules keep as their base, and NumPy views over it.

use crate::dlpack;
use crate::error::{Error, Result};
use gear_api::TransitionBatch;
use numpy::npyffi::{self, npy_intp, NPY_ARRAY_BEHAVED, NPY_ARRAY_CARRAY, PY_ARRAY_API};
use numpy::PyArrayDescr;
use pyo3::prelude::*;
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
    /// Most buffers kept.
    holds: usize,
}

impl<T> BufferPool<T> {
    /// An empty pool.
    pub(crate) fn new() -> Self {
        Self::holding(POOLED_BUFFERS)
    }

    /// An empty pool that keeps at most `holds` buffers.
    pub(crate) fn holding(holds: usize) -> Self {
        BufferPool { buffers: Vec::new(), holds }
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
        if self.buffers.len() < self.holds {
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

/// The memory of one batch: a buffer of the sampler's pool (local and
/// cluster samplers), or a transition sampler's pooled batch.
#[derive(Clone, Debug)]
pub(crate) enum BatchMemory {
    /// One aligned allocation holding every column.
    Pooled(Arc<BatchStorage>),
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
            BatchMemory::Transitions { .. } => None,
        }
    }

    fn address(&self) -> usize {
        match self {
            BatchMemory::Pooled(s) => s.address(),
            BatchMemory::Transitions { address, .. } => *address,
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            BatchMemory::Pooled(s) => s.nbytes(),
            BatchMemory::Transitions { nbytes, .. } => *nbytes,
        }
    }

    /// What keeps the memory alive for a DLPack consumer.
    pub(crate) fn keepalive(&self) -> dlpack::Keepalive {
        match self {
            BatchMemory::Pooled(s) => s.clone(),
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
