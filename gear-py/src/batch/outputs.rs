//! The caller's arrays a `sample_into` fills: their spec, and the checks
//! (dtype, batch shape, C-contiguous, writeable, no overlap) before a byte
//! is written.

use super::{names, ColumnInfo};
use crate::dtype;
use crate::error::{Error, Result};
use gear_core::DType;
use numpy::npyffi;
use numpy::PyUntypedArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;

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
