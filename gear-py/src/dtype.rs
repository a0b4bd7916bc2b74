//! Element types between Python and the table: parsing the dtype a user
//! names for a column, and checking the dtype of arrays written or filled.
//!
//! `bf16` has no NumPy dtype: its columns read as `uint16` arrays holding
//! the raw bfloat16 bits (DLPack hands them to PyTorch as `bfloat16`), and
//! accept `uint16` arrays or any 2-byte dtype named `bfloat16`
//! (`ml_dtypes.bfloat16`).

use crate::error::{Error, Result};
use gear_core::DType;
use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::prelude::*;

/// The NumPy dtype name arrays of a `dtype` column have: NumPy's own
/// name of it, except for `bf16` (NumPy has none), whose arrays hold the
/// raw bits as `uint16`.
pub(crate) fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "uint16",
        d => d.long_name(),
    }
}

/// The NumPy descriptor of arrays of a `dtype` column.
pub(crate) fn numpy_descr(py: Python<'_>, dtype: DType) -> Result<Bound<'_, PyArrayDescr>> {
    Ok(PyArrayDescr::new(py, numpy_name(dtype))?)
}

/// The table dtype a NumPy descriptor stands for, if any.
pub(crate) fn from_descr(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    if descr.is_native_byteorder() == Some(false) {
        return None;
    }
    let dtype = match (descr.kind(), descr.itemsize()) {
        (b'b', 1) => DType::Bool,
        (b'u', 1) => DType::U8,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (_, 2) if descr_name(descr).as_deref() == Some("bfloat16") => DType::BF16,
        _ => return None,
    };
    Some(dtype)
}

fn descr_name(descr: &Bound<'_, PyArrayDescr>) -> Option<String> {
    descr.getattr("name").ok()?.extract().ok()
}

/// Whether arrays of `descr` may be written to (or filled from) a column
/// of `dtype`: the same dtype, or `uint16` bits for a `bf16` column.
pub(crate) fn accepts(dtype: DType, descr: &Bound<'_, PyArrayDescr>) -> bool {
    match from_descr(descr) {
        Some(d) => d == dtype,
        None => dtype == DType::BF16 && descr.kind() == b'u' && descr.itemsize() == 2,
    }
}

/// A readable name of a NumPy descriptor for error messages.
pub(crate) fn describe(descr: &Bound<'_, PyArrayDescr>) -> String {
    descr.str().map(|s| s.to_string()).unwrap_or_else(|_| "an unknown dtype".into())
}

/// Parses a column dtype: one of our names (`f32`, `bf16`, ...), a NumPy
/// name (`float32`, `bfloat16`), or anything `numpy.dtype` accepts
/// (`np.float32`, `np.dtype("u1")`).
pub(crate) fn parse(obj: &Bound<'_, PyAny>) -> Result<DType> {
    if let Ok(name) = obj.extract::<String>() {
        if let Ok(d) = DType::from_name(&name) {
            return Ok(d);
        }
        if name == "bfloat16" {
            return Ok(DType::BF16);
        }
    }
    let descr = PyArrayDescr::new(obj.py(), obj)
        .map_err(|e| Error::Spec(format!("dtype {}: not a dtype NumPy knows ({e})", repr(obj))))?;
    from_descr(&descr).ok_or_else(|| {
        Error::Spec(format!(
            "dtype {} is not supported (expected one of bool, uint8, int8, int16, int32, int64, float16, bfloat16, \
             float32, float64 in native byte order)",
            describe(&descr)
        ))
    })
}

/// `repr(obj)`, for messages.
pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|s| s.to_string()).unwrap_or_else(|_| "<unprintable>".into())
}
