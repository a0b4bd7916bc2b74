//! Cluster keys in NumPy: one record per key, `gear.CLUSTER_KEY_DTYPE`.
//!
//! A cluster key names the shard, the shard server's run (incarnation),
//! the slot and its generation: 20 bytes, more than a `uint64`. Batches
//! hold them as records of 24 bytes; `gear.torch` hands them to torch as
//! an `int64` tensor of shape `[rows, 3]`, `[shard, incarnation, slot <<
//! 32 | generation]` (the record's words, read with its padding ignored),
//! and `update_priorities` takes either form back.

use crate::error::{Error, Result};
use gear_net::RemoteKey;
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyDict};

/// Bytes of one key record.
const RECORD_BYTES: usize = 24;

static KEY_DTYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The NumPy dtype of cluster keys.
pub(crate) fn key_dtype(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    let dtype = KEY_DTYPE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        let fields = PyDict::new(py);
        fields.set_item("names", ["shard", "incarnation", "slot", "generation"])?;
        fields.set_item("formats", ["<u4", "<u8", "<u4", "<u4"])?;
        // Generation below slot, so the last word is slot << 32 | generation.
        fields.set_item("offsets", [0usize, 8, 20, 16])?;
        fields.set_item("itemsize", RECORD_BYTES)?;
        Ok(py.import("numpy")?.call_method1("dtype", (fields,))?.unbind())
    })?;
    Ok(dtype.bind(py))
}

/// `keys` as an array of key records.
pub(crate) fn to_array<'py>(py: Python<'py>, keys: &[RemoteKey]) -> Result<Bound<'py, PyAny>> {
    let mut bytes = Vec::with_capacity(keys.len() * RECORD_BYTES);
    for k in keys {
        bytes.extend_from_slice(&u64::from(k.shard).to_le_bytes());
        bytes.extend_from_slice(&k.incarnation.to_le_bytes());
        bytes.extend_from_slice(&k.generation.to_le_bytes());
        bytes.extend_from_slice(&k.slot.to_le_bytes());
    }
    let np = py.import("numpy")?;
    // A bytearray: writeable, and the array's own (no second copy, which
    // would also leave the record's padding bytes undefined).
    let owned = PyByteArray::new(py, &bytes);
    Ok(np.call_method1("frombuffer", (owned, key_dtype(py)?))?)
}

fn u32_field(value: u64, what: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| Error::Step(format!("keys: {what} {value} does not fit 32 bits")))
}

/// Keys given back: records of `CLUSTER_KEY_DTYPE` (any field order), or
/// integers of shape `[n, 3]` (`[shard, incarnation, slot << 32 |
/// generation]`, as `gear.torch` hands them out; signed is fine).
pub(crate) fn from_object(keys: &Bound<'_, PyAny>) -> Result<Vec<RemoteKey>> {
    let py = keys.py();
    let np = py.import("numpy")?;
    let array = np.call_method1("asarray", (keys,))?;
    let array = array.cast_into::<PyUntypedArray>().map_err(|e| Error::Python(e.into()))?;
    let names = array.dtype().getattr("names")?;
    let words = |a: &Bound<'_, PyAny>| -> Result<Vec<u64>> {
        Ok(a.call_method1("astype", ("<u8",))?.call_method0("ravel")?.call_method0("tolist")?.extract()?)
    };
    if !names.is_none() {
        let field = |name: &str| -> Result<Vec<u64>> {
            let column = array.get_item(name).map_err(|_| {
                Error::Step(format!("keys: records without a `{name}` field; pass a cluster batch's keys"))
            })?;
            words(&column)
        };
        let (shard, incarnation, slot, generation) =
            (field("shard")?, field("incarnation")?, field("slot")?, field("generation")?);
        return (0..shard.len())
            .map(|i| {
                Ok(RemoteKey {
                    shard: u32_field(shard[i], "shard")?,
                    incarnation: incarnation[i],
                    slot: u32_field(slot[i], "slot")?,
                    generation: u32_field(generation[i], "generation")?,
                })
            })
            .collect();
    }
    let kind: String = array.dtype().getattr("kind")?.extract()?;
    let shape = array.shape().to_vec();
    if !matches!(kind.as_str(), "i" | "u") || shape.len() != 2 || shape[1] != 3 {
        return Err(Error::Step(format!(
            "keys: expected a cluster batch's keys (records of gear.CLUSTER_KEY_DTYPE, or integers of shape [n, 3]), \
             got dtype {} shape {shape:?}",
            crate::dtype::describe(&array.dtype())
        )));
    }
    let flat = words(array.as_any())?;
    flat.chunks_exact(3)
        .map(|w| {
            Ok(RemoteKey {
                // The record's padding bytes (above the shard) are not
                // defined once NumPy has copied the records.
                shard: w[0] as u32,
                incarnation: w[1],
                slot: (w[2] >> 32) as u32,
                generation: w[2] as u32,
            })
        })
        .collect()
}
