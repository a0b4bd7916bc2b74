//! Items from Python: `gear.ItemPattern` (which items a trajectory's steps
//! give), and `gear.TransitionSampler`, the DQN batch over transition
//! items (`obs`, `next_obs`, the step columns, `reward`, `done`,
//! `discount`) with no window axis.

use crate::batch::{array_view, Batch, BatchBuffer, BatchMemory, BufferPool, ColumnInfo, RowFacts};
use crate::dtype;
use crate::error::{Error, Result};
use crate::wait;
use gear_api::{TransitionBatch, TransitionConfig};
use gear_core::{DType, Pad, SlotKey};
use numpy::{PyArray1, PyArrayDescr};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::Duration;

/// Which items a trajectory's steps give: `whole()` (one item of all its
/// steps: rows are trajectories), `none()`, `windows(length, stride,
/// tail=False)` (R2D2: 80 every 40; with `tail`, the steps after the last
/// whole window get one shorter window), `transitions(n_step=1)` (one item
/// `[t, t + n_step]` per step that has a next step, for DQN).
#[pyclass(module = "gear._gear", frozen, eq, from_py_object)]
#[derive(Clone, Debug, PartialEq)]
pub struct ItemPattern {
    pub(crate) inner: gear_api::ItemPattern,
}

impl ItemPattern {
    fn checked(inner: gear_api::ItemPattern) -> Result<Self> {
        inner.validate().map_err(|e| Error::Spec(e.to_string()))?;
        Ok(ItemPattern { inner })
    }
}

#[pymethods]
impl ItemPattern {
    /// One item spanning the whole trajectory.
    #[staticmethod]
    fn whole() -> Self {
        ItemPattern { inner: gear_api::ItemPattern::Whole }
    }

    /// No item (items are added explicitly).
    #[staticmethod]
    fn none() -> Self {
        ItemPattern { inner: gear_api::ItemPattern::None }
    }

    /// Windows of `length` steps starting every `stride` steps.
    #[staticmethod]
    #[pyo3(signature = (length, stride, tail=false))]
    fn windows(length: u64, stride: u64, tail: bool) -> PyResult<Self> {
        Ok(Self::checked(gear_api::ItemPattern::Windows { len: length, stride, tail })?)
    }

    /// One item per transition: `[t, t + n_step]`, cut at the last step.
    #[staticmethod]
    #[pyo3(signature = (n_step=1))]
    fn transitions(n_step: u64) -> PyResult<Self> {
        Ok(Self::checked(gear_api::ItemPattern::Transitions { n_step })?)
    }

    /// How many items a trajectory of `steps` steps gets.
    fn count(&self, steps: u64) -> u64 {
        self.inner.count(steps)
    }

    /// The `(start, length)` of each item a trajectory of `steps` steps
    /// gets.
    fn windows_of(&self, steps: u64) -> Vec<(u64, u64)> {
        self.inner.windows(steps).collect()
    }

    fn __repr__(&self) -> String {
        match self.inner {
            gear_api::ItemPattern::None => "ItemPattern.none()".into(),
            gear_api::ItemPattern::Whole => "ItemPattern.whole()".into(),
            gear_api::ItemPattern::Windows { len, stride, tail } => {
                format!("ItemPattern.windows({len}, {stride}, tail={})", if tail { "True" } else { "False" })
            }
            gear_api::ItemPattern::Transitions { n_step } => format!("ItemPattern.transitions(n_step={n_step})"),
        }
    }
}

/// The keys `keys` (any array-like of `uint64`) as slot keys.
pub(crate) fn keys_of(py: Python<'_>, keys: &Bound<'_, PyAny>) -> Result<Vec<SlotKey>> {
    let np = py.import("numpy")?;
    let raw: Vec<u64> = np
        .call_method1("asarray", (keys, "uint64"))
        .and_then(|a| a.call_method0("ravel"))
        .and_then(|a| a.call_method0("tolist"))
        .and_then(|l| l.extract())
        .map_err(|e| Error::Step(format!("keys: expected unsigned 64-bit keys ({e})")))?;
    Ok(raw.into_iter().map(SlotKey::from_u64).collect())
}

/// Draws batches of DQN transitions from a table of transition items
/// (`table.transition_sampler(...)`). Each `sample()` returns a `Batch`
/// whose columns are `obs` (`[B, k, *shape]`, `[B, *shape]` when
/// `frame_stack` is 1; one per observation column, by its name) and
/// `next_obs` (`next_<name>`), views of the same gathered frames (each
/// stored frame of a row read once), the step columns at `t` (`[B,
/// *shape]`), `reward` (the n-step discounted return, `float32`), `done`,
/// `discount` (`gamma^m`, 0 after a terminal step) and `n_step` (the `m`
/// steps each return sums); keys are the items'. The observation and step
/// column arrays view the batch's own buffers (no copy), valid for as long
/// as you keep them: the sampler reuses a batch's buffers only once no
/// array references them.
#[pyclass(module = "gear._gear")]
pub struct TransitionSampler {
    inner: gear_api::TransitionSampler,
    timeout: Option<Duration>,
    observations: Vec<(String, DType, Vec<usize>)>,
    step_columns: Vec<(String, DType, Vec<usize>)>,
    /// NumPy descriptors of the observation columns, then of the step
    /// columns.
    descrs: Vec<Py<PyArrayDescr>>,
    /// The batch's columns, in the order it shows them.
    infos: Arc<[ColumnInfo]>,
    frame_stack: usize,
    rows: usize,
    /// Batches whose buffers are reused once no array views them.
    pool: BufferPool<TransitionBatch>,
}

/// Where one observation view of a batch starts and how its rows step:
/// (offset into its buffer, row stride), in bytes.
type ViewPlace = (usize, usize);

impl TransitionSampler {
    /// A sampler over `table`'s transition items.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        py: Python<'_>,
        table: &gear_api::ReplayTable,
        batch_size: usize,
        observations: Vec<String>,
        step_columns: Vec<String>,
        reward: String,
        done: Option<String>,
        frame_stack: u64,
        n_step: u64,
        gamma: f64,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let spec = table.spec();
        let describe = |names: &[String]| -> Result<Vec<(String, DType, Vec<usize>)>> {
            names
                .iter()
                .map(|n| {
                    let c = &spec.columns()[spec.column_index(n)?];
                    Ok((n.clone(), c.dtype(), c.shape().iter().map(|&d| d as usize).collect()))
                })
                .collect()
        };
        let (obs, steps) = (describe(&observations)?, describe(&step_columns)?);
        let config = TransitionConfig {
            batch_size,
            observations,
            step_columns,
            reward,
            done,
            frame_stack,
            n_step,
            gamma,
            timeout: Some(wait::slice_of(timeout)),
        };
        let inner = py.detach(|| table.transition_sampler(config))?;
        let descrs = obs
            .iter()
            .chain(&steps)
            .map(|(_, dt, _)| Ok(dtype::numpy_descr(py, *dt)?.unbind()))
            .collect::<Result<_>>()?;
        let column = |name: String, dtype: DType, shape: Vec<usize>| ColumnInfo { name, dtype, shape };
        let mut infos = Vec::new();
        for (name, dt, shape) in &obs {
            infos.push(column(name.clone(), *dt, shape.clone()));
            infos.push(column(format!("next_{name}"), *dt, shape.clone()));
        }
        for (name, dt, shape) in &steps {
            infos.push(column(name.clone(), *dt, shape.clone()));
        }
        for (name, dt) in
            [("reward", DType::F32), ("done", DType::Bool), ("discount", DType::F32), ("n_step", DType::I64)]
        {
            infos.push(column(name.into(), dt, Vec::new()));
        }
        Ok(TransitionSampler {
            inner,
            timeout,
            observations: obs,
            step_columns: steps,
            descrs,
            infos: infos.into(),
            frame_stack: frame_stack as usize,
            rows: batch_size,
            pool: BufferPool::new(),
        })
    }

    fn sample_batch(&mut self, py: Python<'_>) -> Result<Batch> {
        let sampler = &mut self.inner;
        let mut batch = self.pool.take_or(|| Ok(sampler.new_batch()?))?;
        let drawn = wait::interruptible(py, self.timeout, || {
            let Some(unique) = Arc::get_mut(&mut batch) else {
                return Err(gear_api::Error::Config("transition batch is shared".into()));
            };
            let t = sampler.sample_into(unique)?;
            Ok(RowFacts {
                keys: t.keys().iter().map(|k| k.to_u64()).collect(),
                lengths: vec![1; t.rows()],
                probabilities: t.probabilities().to_vec(),
                weights: t.weights().to_vec(),
                starts: t.starts().iter().map(|&s| s as i64).collect(),
            })
        });
        let facts = match drawn {
            Ok(f) => f,
            Err(e) => {
                self.pool.keep(batch);
                return Err(e);
            }
        };
        let columns = PyDict::new(py);
        let Some(filled) = Arc::get_mut(&mut batch) else {
            return Err(Error::Spec("transition batch is shared".into()));
        };
        // Everything read through shared references first: the writable
        // addresses below must be the last Rust access to the buffers
        // before NumPy gets them.
        let rows = filled.rows();
        let n_steps: Vec<i64> = filled.n_steps().iter().map(|&n| n as i64).collect();
        let per_row = [
            ("reward", PyArray1::from_slice(py, filled.rewards()).into_any()),
            ("done", PyArray1::from_slice(py, filled.dones()).into_any()),
            ("discount", PyArray1::from_slice(py, filled.discounts()).into_any()),
            ("n_step", PyArray1::from_vec(py, n_steps).into_any()),
        ];
        let separate = filled.next_is_separate();
        let places: Vec<(ViewPlace, ViewPlace)> = (0..self.observations.len())
            .map(|i| {
                let (obs, next) = (filled.observation(i), filled.next_observation(i));
                ((obs.offset, obs.row_stride), (next.offset, next.row_stride))
            })
            .collect();
        let mut nbytes = 0;
        let mut frames = Vec::with_capacity(places.len());
        for i in 0..places.len() {
            let obs = filled.frames_mut(i);
            nbytes += obs.len();
            let obs = obs.as_mut_ptr();
            let next = match filled.next_frames_mut(i) {
                Some(next) if separate => {
                    nbytes += next.len();
                    next.as_mut_ptr()
                }
                _ => obs,
            };
            frames.push((obs, next));
        }
        let steps: Vec<*mut u8> = (0..self.step_columns.len())
            .map(|j| {
                let column = filled.column_mut(j);
                nbytes += column.len();
                column.as_mut_ptr()
            })
            .collect();
        let address = frames[0].0 as usize;
        let memory = BatchMemory::Transitions { batch: batch.clone(), address, nbytes };
        let buffer = Bound::new(py, BatchBuffer { memory })?;
        self.pool.keep(batch);
        let k = self.frame_stack;
        for (i, (name, dt, shape)) in self.observations.iter().enumerate() {
            let descr = self.descrs[i].bind(py);
            let frame_bytes = shape.iter().product::<usize>() * dt.size() as usize;
            // Rows, frames (when stacked), then the frame's own axes in C
            // order.
            let mut view_shape = vec![rows];
            let mut strides = vec![0];
            if k > 1 {
                view_shape.push(k);
                strides.push(frame_bytes);
            }
            view_shape.extend(shape);
            strides.extend(c_strides(dt.size() as usize, shape));
            let ((obs_at, obs_stride), (next_at, next_stride)) = places[i];
            let (obs_ptr, next_ptr) = frames[i];
            strides[0] = obs_stride;
            // SAFETY: the pointer and strides are the gathered batch's own
            // view of observation column `i` (`TransitionBatch::observation`:
            // `rows` rows of `k` frames, `obs_stride` bytes apart from
            // `obs_at`, inside the frames buffer of `[rows, k + n, *shape]`),
            // aligned for the dtype (buffers start 64-byte aligned, offsets
            // are whole frames), so `add` stays inside the buffer; the
            // pointers were taken through `&mut` after the last Rust read;
            // `buffer` holds the batch, becomes the array's base, and the
            // pool reuses the batch only once no array references it.
            let obs = unsafe {
                array_view(descr, &view_shape, Some(&strides), obs_ptr.add(obs_at), buffer.clone().into_any())?
            };
            strides[0] = next_stride;
            // SAFETY: as above, for `TransitionBatch::next_observation`:
            // positions `n..n + k` of the frames buffer, or the batch's
            // separate next buffer (`[rows, k, *shape]`) when it uses one.
            let next = unsafe {
                array_view(descr, &view_shape, Some(&strides), next_ptr.add(next_at), buffer.clone().into_any())?
            };
            columns.set_item(name, obs)?;
            columns.set_item(format!("next_{name}"), next)?;
        }
        for (j, (name, _, shape)) in self.step_columns.iter().enumerate() {
            let mut full = vec![rows];
            full.extend(shape);
            let descr = self.descrs[self.observations.len() + j].bind(py);
            // SAFETY: step column `j` of the batch is `[rows, *shape]`
            // elements of the column's dtype, 64-byte aligned; ownership
            // as for the observations above.
            let column = unsafe { array_view(descr, &full, None, steps[j], buffer.clone().into_any())? };
            columns.set_item(name, column)?;
        }
        for (name, values) in per_row {
            columns.set_item(name, values)?;
        }
        Batch::new(py, columns, facts, 1, Pad::Tail, self.infos.clone(), None)
    }
}

/// Byte strides of a C-ordered array of `shape` with `item`-byte
/// elements.
fn c_strides(item: usize, shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = item;
    for (s, d) in strides.iter_mut().zip(shape).rev() {
        *s = step;
        step *= d;
    }
    strides
}

#[pymethods]
impl TransitionSampler {
    /// Draws one batch of transitions (see the class doc). Waits (up to
    /// the sampler's timeout, interruptible by Ctrl-C, without the GIL)
    /// while the table is empty or the rate limiter holds samplers back.
    fn sample(&mut self, py: Python<'_>) -> PyResult<Batch> {
        Ok(self.sample_batch(py)?)
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.rows
    }

    /// Frames per observation.
    #[getter]
    fn frame_stack(&self) -> usize {
        self.frame_stack
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; iteration stops when the table is closed.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        crate::sampler::until_closed(self.sample_batch(py))
    }
}
