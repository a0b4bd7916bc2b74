//! Items from Python: `gear.ItemPattern` (which items a trajectory's steps
//! give), and `gear.TransitionSampler`, the DQN batch over transition
//! items (`obs`, `next_obs`, the step columns, `reward`, `done`,
//! `discount`) with no window axis.

use crate::batch::{Batch, ColumnInfo, RowFacts};
use crate::dtype;
use crate::error::{Error, Result};
use crate::wait;
use gear_api::{TransitionConfig, Transitions};
use gear_core::{DType, Pad, SlotKey};
use pyo3::prelude::*;
use pyo3::types::PyDict;
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

/// One transition batch copied out of the Rust sampler: every buffer the
/// Python batch shows, owned.
struct Copied {
    /// Per observation column: the frames `[rows, k + n, *shape]`, and the
    /// separate next observations `[rows, k, *shape]` when the batch keeps
    /// them apart.
    frames: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Per observation column: (offset, row stride) of obs and next_obs in
    /// its buffer, in bytes.
    views: Vec<((usize, usize), (usize, usize))>,
    step_columns: Vec<Vec<u8>>,
    rewards: Vec<f32>,
    dones: Vec<bool>,
    discounts: Vec<f32>,
    n_steps: Vec<i64>,
    facts: RowFacts,
}

impl Copied {
    fn of(t: &Transitions<'_>, observations: &[String], step_columns: &[String]) -> gear_api::Result<Self> {
        let mut frames = Vec::with_capacity(observations.len());
        let mut views = Vec::with_capacity(observations.len());
        for name in observations {
            let (obs, next) = (t.obs(name)?.view, t.next_obs(name)?.view);
            let separate = !std::ptr::eq(obs.bytes.as_ptr(), next.bytes.as_ptr());
            frames.push((obs.bytes.to_vec(), separate.then(|| next.bytes.to_vec())));
            views.push(((obs.offset, obs.row_stride), (next.offset, next.row_stride)));
        }
        let step_columns =
            step_columns.iter().map(|n| t.column(n).map(|c| c.bytes.to_vec())).collect::<gear_api::Result<_>>()?;
        Ok(Copied {
            frames,
            views,
            step_columns,
            rewards: t.rewards().to_vec(),
            dones: t.dones().to_vec(),
            discounts: t.discounts().to_vec(),
            n_steps: t.n_steps().iter().map(|&n| n as i64).collect(),
            facts: RowFacts {
                keys: t.keys().iter().map(|k| k.to_u64()).collect(),
                lengths: vec![1; t.rows()],
                probabilities: t.probabilities().to_vec(),
                weights: t.weights().to_vec(),
                starts: t.starts().iter().map(|&s| s as i64).collect(),
            },
        })
    }
}

/// Draws batches of DQN transitions from a table of transition items
/// (`table.transition_sampler(...)`). Each `sample()` returns a `Batch`
/// whose columns are `obs` (`[B, k, *shape]`, `[B, *shape]` when
/// `frame_stack` is 1; one per observation column, by its name) and
/// `next_obs` (`next_<name>`), views of the same gathered frames (each
/// stored frame of a row read once), the step columns at `t` (`[B,
/// *shape]`), `reward` (the n-step discounted return, `float32`), `done`,
/// `discount` (`gamma^m`, 0 after a terminal step) and `n_step` (the `m`
/// steps each return sums); keys are the items'.
#[pyclass(module = "gear._gear")]
pub struct TransitionSampler {
    inner: gear_api::TransitionSampler,
    timeout: Option<Duration>,
    observations: Vec<(String, DType, Vec<usize>)>,
    step_columns: Vec<(String, DType, Vec<usize>)>,
    frame_stack: usize,
    rows: usize,
}

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
        Ok(TransitionSampler {
            inner,
            timeout,
            observations: obs,
            step_columns: steps,
            frame_stack: frame_stack as usize,
            rows: batch_size,
        })
    }

    fn sample_batch<'py>(&mut self, py: Python<'py>) -> Result<Batch> {
        let obs_names: Vec<String> = self.observations.iter().map(|(n, ..)| n.clone()).collect();
        let step_names: Vec<String> = self.step_columns.iter().map(|(n, ..)| n.clone()).collect();
        let inner = &mut self.inner;
        let copied = wait::interruptible(py, self.timeout, || {
            let t = inner.sample()?;
            Copied::of(&t, &obs_names, &step_names)
        })?;
        let columns = PyDict::new(py);
        let np = py.import("numpy")?;
        let strided = np.getattr("lib")?.getattr("stride_tricks")?.getattr("as_strided")?;
        let k = self.frame_stack;
        let rows = copied.facts.lengths.len();
        let mut infos = Vec::new();
        let Copied { frames, views, step_columns, rewards, dones, discounts, n_steps, facts } = copied;
        for (i, ((name, dt, shape), (frames, next))) in self.observations.iter().zip(frames).enumerate() {
            let frames = owned_bytes(py, frames)?;
            let next = next.map(|n| owned_bytes(py, n)).transpose()?;
            let descr = dtype::numpy_descr(py, *dt)?;
            let size = dt.size() as usize;
            // Shape and strides of one view: rows, frames (when stacked),
            // then the frame's own axes in C order.
            let mut view_shape = vec![rows];
            if k > 1 {
                view_shape.push(k);
            }
            view_shape.extend(shape);
            let frame_bytes = shape.iter().product::<usize>() * size;
            let mut inner_strides: Vec<usize> = Vec::with_capacity(shape.len());
            let mut acc = size;
            for d in shape.iter().rev() {
                inner_strides.push(acc);
                acc *= d;
            }
            inner_strides.reverse();
            let ((obs_at, obs_stride), (next_at, next_stride)) = views[i];
            let make = |buffer: &Bound<'py, PyAny>, offset: usize, row_stride: usize| -> PyResult<Bound<'py, PyAny>> {
                let typed = buffer.call_method1("view", (&descr,))?;
                let from = typed.get_item(pyo3::types::PySlice::new(py, (offset / size) as isize, isize::MAX, 1))?;
                let mut strides = vec![row_stride];
                if k > 1 {
                    strides.push(frame_bytes);
                }
                strides.extend(&inner_strides);
                strided.call1((from, view_shape.clone(), strides))
            };
            columns.set_item(name, make(&frames, obs_at, obs_stride)?)?;
            let next_name = format!("next_{name}");
            columns.set_item(&next_name, make(next.as_ref().unwrap_or(&frames), next_at, next_stride)?)?;
            infos.push(ColumnInfo { name: name.clone(), dtype: *dt, shape: shape.clone() });
            infos.push(ColumnInfo { name: next_name, dtype: *dt, shape: shape.clone() });
        }
        for ((name, dt, shape), bytes) in self.step_columns.iter().zip(step_columns) {
            let bytes = owned_bytes(py, bytes)?;
            let mut full = vec![rows];
            full.extend(shape);
            let typed =
                bytes.call_method1("view", (dtype::numpy_descr(py, *dt)?,))?.call_method1("reshape", (full,))?;
            columns.set_item(name, typed)?;
            infos.push(ColumnInfo { name: name.clone(), dtype: *dt, shape: shape.clone() });
        }
        columns.set_item("reward", numpy::PyArray1::from_vec(py, rewards))?;
        columns.set_item("done", numpy::PyArray1::from_vec(py, dones))?;
        columns.set_item("discount", numpy::PyArray1::from_vec(py, discounts))?;
        columns.set_item("n_step", numpy::PyArray1::from_vec(py, n_steps))?;
        for (name, dt) in
            [("reward", DType::F32), ("done", DType::Bool), ("discount", DType::F32), ("n_step", DType::I64)]
        {
            infos.push(ColumnInfo { name: name.into(), dtype: dt, shape: Vec::new() });
        }
        Batch::new(py, columns, facts, 1, Pad::Tail, infos.into(), None)
    }
}

/// `bytes` as a 1-D `uint8` NumPy array that owns them (the base of the
/// views made over it).
fn owned_bytes<'py>(py: Python<'py>, bytes: Vec<u8>) -> Result<Bound<'py, PyAny>> {
    Ok(numpy::PyArray1::from_vec(py, bytes).into_any())
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
