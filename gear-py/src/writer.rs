//! `gear.Writer` and `gear.Trajectory`: online trajectories step by step,
//! and whole batches of small trajectories from column arrays.

use crate::batch::ColumnInfo;
use crate::dtype;
use crate::error::{Error, Result};
use crate::wait;
use gear_api::StepValue;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

/// `value` as a C-contiguous NumPy array of column `info` with shape
/// `leading + info.shape`. Arrays of the column's dtype are taken as they
/// are; anything else goes through the one conversion rule
/// (`gear/_convert.py`): converted only when no value changes (no
/// rounding of integers, no overflow), else a `StepError` naming the
/// column and the value.
pub(crate) fn column_array<'py>(
    value: &Bound<'py, PyAny>,
    info: &ColumnInfo,
    leading: &[usize],
) -> Result<Bound<'py, PyUntypedArray>> {
    let py = value.py();
    let np = py.import("numpy")?;
    let exact = value.cast::<PyUntypedArray>().ok().filter(|a| dtype::accepts(info.dtype, &a.dtype()));
    let array = match exact {
        Some(a) => a.clone(),
        None => {
            let target = if info.dtype == gear_core::DType::BF16 { "bfloat16" } else { dtype::numpy_name(info.dtype) };
            let convert = py.import("gear._convert")?;
            let refused = convert.getattr("ConversionError")?;
            let converted = convert.getattr("to_column")?.call1((value, target, &info.name)).map_err(|e| {
                if e.is_instance(py, &refused) {
                    Error::Step(e.value(py).to_string())
                } else {
                    Error::Python(e)
                }
            })?;
            converted.cast_into::<PyUntypedArray>().map_err(|e| Error::Python(e.into()))?
        }
    };
    let mut want = leading.to_vec();
    want.extend(&info.shape);
    if array.shape() != want.as_slice() {
        return Err(Error::Step(format!("column `{}`: got shape {:?}, expected {want:?}", info.name, array.shape())));
    }
    if array.is_c_contiguous() {
        return Ok(array);
    }
    let contiguous = np.call_method1("ascontiguousarray", (&array,))?;
    contiguous.cast_into::<PyUntypedArray>().map_err(|e| Error::Python(e.into()))
}

/// The bytes of a C-contiguous array.
///
/// # Safety
/// `array` must be C-contiguous and must not be resized or written while
/// the returned slice is used.
pub(crate) unsafe fn array_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> &'a [u8] {
    let len = array.len() * array.dtype().itemsize();
    if len == 0 {
        return &[];
    }
    // SAFETY: a C-contiguous array's data pointer addresses `len` bytes;
    // the caller keeps them unchanged while the slice lives.
    unsafe { std::slice::from_raw_parts((*array.as_array_ptr()).data as *const u8, len) }
}

/// Arrays for every column from keyword arguments, in column order.
pub(crate) fn arrays_by_name<'py>(
    given: Option<&Bound<'py, PyDict>>,
    infos: &[ColumnInfo],
    leading: &[usize],
) -> Result<Vec<Bound<'py, PyUntypedArray>>> {
    let Some(given) = given else {
        return Err(Error::Step(format!("no columns given; the table has {:?}", names(infos))));
    };
    for key in given.keys() {
        let name: String = key.extract()?;
        if !infos.iter().any(|c| c.name == name) {
            return Err(Error::Step(format!("unknown column `{name}`; the table has {:?}", names(infos))));
        }
    }
    infos
        .iter()
        .map(|info| match given.get_item(&info.name)? {
            Some(v) => column_array(&v, info, leading),
            None => Err(Error::Step(format!("column `{}` is missing; every column needs a value", info.name))),
        })
        .collect()
}

fn names(infos: &[ColumnInfo]) -> Vec<&str> {
    infos.iter().map(|c| c.name.as_str()).collect()
}

/// Hands out trajectories and inserts batches. Get one with
/// `table.writer(timeout=...)`.
#[pyclass(module = "gear._gear", frozen)]
pub struct Writer {
    /// Waits one slice at a time (see `wait`).
    sliced: gear_api::Writer,
    table: gear_api::ReplayTable,
    infos: Arc<[ColumnInfo]>,
    timeout: Option<Duration>,
}

impl Writer {
    pub(crate) fn new(table: &gear_api::ReplayTable, infos: Arc<[ColumnInfo]>, timeout: Option<Duration>) -> Self {
        let sliced = table.writer().with_timeout(wait::slice_of(timeout));
        Writer { sliced, table: table.clone(), infos, timeout }
    }
}

#[pymethods]
impl Writer {
    /// Starts a trajectory (waits while the rate limiter holds writers
    /// back). `priority`: its priority; `None` lets the sampling strategy
    /// choose (prioritized replay: the largest seen). Use it as a context
    /// manager: an exception inside abandons the trajectory, a normal exit
    /// ends it.
    #[pyo3(signature = (priority=None))]
    fn trajectory(&self, py: Python<'_>, priority: Option<f64>) -> PyResult<Trajectory> {
        let sliced = &self.sliced;
        let mut inner = wait::interruptible(py, self.timeout, || sliced.begin(priority))?;
        inner.set_timeout(self.timeout);
        Ok(Trajectory {
            key: inner.key().to_u64(),
            inner: Some(inner),
            table: self.table.clone(),
            infos: self.infos.clone(),
        })
    }

    /// Inserts many small trajectories in one call. `columns` maps every
    /// column name to an array of shape `[count, *shape]` (one-step
    /// trajectories, e.g. DQN transitions) or, with `steps=k`,
    /// `[count, k, *shape]`. `priorities`: one per trajectory, or `None`.
    /// Returns the keys (`uint64`). Everything is checked before anything
    /// is written; the copy runs without the GIL.
    #[pyo3(signature = (columns, priorities=None, steps=None))]
    fn insert_batch<'py>(
        &self,
        py: Python<'py>,
        columns: &Bound<'py, PyDict>,
        priorities: Option<&Bound<'py, PyAny>>,
        steps: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let first = self.infos.first().ok_or_else(|| Error::Spec("the table has no columns".into()))?;
        let Some(probe) = columns.get_item(&first.name)? else {
            return Err(Error::Step(format!("column `{}` is missing; every column needs a value", first.name)).into());
        };
        let count: usize =
            probe.getattr("shape").ok().and_then(|s| s.get_item(0).ok()).and_then(|c| c.extract().ok()).ok_or_else(
                || {
                    Error::Step(format!(
                        "column `{}`: expected an array whose first dimension counts trajectories",
                        first.name
                    ))
                },
            )?;
        let leading: Vec<usize> = match steps {
            None => vec![count],
            Some(k) => vec![count, k],
        };
        let arrays = arrays_by_name(Some(columns), &self.infos, &leading)?;
        let priorities: Option<Vec<f64>> = match priorities {
            None => None,
            Some(p) if p.is_none() => None,
            Some(p) => Some(crate::table::float_vec(p, "priorities")?),
        };
        // SAFETY: `column_array` made every array C-contiguous; they are
        // held by `arrays` until the call returns and no Python code runs
        // on them meanwhile (only this thread has them).
        let bytes: Vec<&[u8]> = arrays.iter().map(|a| unsafe { array_bytes(a) }).collect();
        let values: Vec<StepValue<'_>> = bytes.iter().map(|b| StepValue::bytes(b)).collect();
        let steps = steps.unwrap_or(1) as u64;
        let mut keys: Vec<u64> = Vec::with_capacity(count);
        while keys.len() < count {
            let done = keys.len();
            let (sliced, values, priorities) = (&self.sliced, &values, priorities.as_deref());
            let round = wait::interruptible(py, self.timeout, || {
                sliced.insert_batch_round(done, count, steps, values, priorities)
            })?;
            keys.extend(round.iter().map(|k| k.to_u64()));
        }
        Ok(numpy::PyArray1::from_vec(py, keys).into_any())
    }
}

/// A trajectory being written. `append(obs=..., action=...)` adds one
/// step of every column; `end()` commits it. Dropped (or left by an
/// exception in a `with` block) without `end`, it is abandoned.
#[pyclass(module = "gear._gear")]
pub struct Trajectory {
    inner: Option<gear_api::Trajectory>,
    table: gear_api::ReplayTable,
    infos: Arc<[ColumnInfo]>,
    key: u64,
}

impl Trajectory {
    fn open(&mut self) -> Result<&mut gear_api::Trajectory> {
        let key = self.key_text();
        self.inner.as_mut().ok_or_else(|| Error::Step(format!("trajectory {key} already ended or abandoned")))
    }

    fn key_text(&self) -> String {
        gear_core::SlotKey::from_u64(self.key).to_string()
    }

    fn finish(&mut self, py: Python<'_>, priority: Option<f64>) -> Result<u64> {
        let traj = self.open()?;
        if let Some(p) = priority {
            gear_core::check_priority(p)?;
        }
        let key = py.detach(|| traj.end())?;
        self.inner = None;
        if let Some(p) = priority {
            // Committed with the strategy's priority; set the given one
            // now (a sampler may have drawn it in between).
            let table = &self.table;
            py.detach(|| table.update_priorities(&[(key, p)]))?;
        }
        Ok(key.to_u64())
    }
}

#[pymethods]
impl Trajectory {
    /// Appends one step: a value for every column, by name (arrays of the
    /// column's dtype and shape, or Python numbers and lists). Nothing is
    /// written unless every column checks out.
    #[pyo3(signature = (**columns))]
    fn append(&mut self, py: Python<'_>, columns: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let arrays = arrays_by_name(columns, &self.infos, &[])?;
        // SAFETY: contiguous (column_array), alive in `arrays` for the call.
        let bytes: Vec<&[u8]> = arrays.iter().map(|a| unsafe { array_bytes(a) }).collect();
        let values: Vec<StepValue<'_>> = bytes.iter().map(|b| StepValue::bytes(b)).collect();
        let traj = self.open()?;
        let values = &values;
        py.detach(|| traj.append_step(values)).map_err(Error::from)?;
        Ok(())
    }

    /// Commits the trajectory and returns its key. `priority`, when given,
    /// is set right after the commit.
    #[pyo3(signature = (priority=None))]
    fn end(&mut self, py: Python<'_>, priority: Option<f64>) -> PyResult<u64> {
        Ok(self.finish(py, priority)?)
    }

    /// Gives the slot back; nothing of the trajectory stays.
    fn abandon(&mut self, py: Python<'_>) {
        if let Some(traj) = self.inner.take() {
            py.detach(|| drop(traj));
        }
    }

    /// The key the trajectory is stored under (`uint64`).
    #[getter]
    fn key(&self) -> u64 {
        self.key
    }

    /// Whether it was ended or abandoned.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    /// Steps appended so far.
    fn __len__(&self) -> usize {
        self.inner.as_ref().map_or(0, |t| t.len() as usize)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Abandons on an exception; ends (if not ended yet) otherwise.
    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let failed = exc_type.is_some_and(|t| !t.is_none());
        if failed {
            self.abandon(py);
        } else if self.inner.is_some() {
            self.finish(py, None)?;
        }
        Ok(false)
    }
}
