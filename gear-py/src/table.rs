//! `gear.Table` and `gear.RateLimiter`: creating a table (or attaching to
//! a shared one by name), counters, priorities, closing.

use crate::batch::ColumnInfo;
use crate::dtype;
use crate::error::{Error, Result};
use crate::items::{keys_of, ItemPattern, TransitionSampler};
use crate::sampler::Sampler;
use crate::wait;
use crate::writer::Writer;
use gear_api::{AttachOptions, NewItem, RateLimiterConfig, ReplayTable, SampleConfig};
use gear_core::{ColumnSpec, Pad, SlotKey, TableSpec, WindowSpec};
use gear_sampler::{StrategyKind, StrategyParams};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::sync::Arc;

/// `value` as a vector of `float64` (any array-like).
pub(crate) fn float_vec(value: &Bound<'_, PyAny>, what: &str) -> Result<Vec<f64>> {
    let np = value.py().import("numpy")?;
    let array = np
        .call_method1("asarray", (value, "float64"))
        .and_then(|a| a.call_method0("ravel"))
        .map_err(|e| Error::Step(format!("{what}: expected numbers ({e})")))?;
    Ok(array.call_method0("tolist")?.extract()?)
}

/// The window a sampler's `window`, `offset` and `pad` arguments describe
/// for trajectories of at most `max_len` steps, checked (a bad one is a
/// `SpecError`).
pub(crate) fn window_spec(
    max_len: u64,
    window: Option<u64>,
    offset: Option<i64>,
    pad: Option<&str>,
) -> Result<WindowSpec> {
    let mut w = match (window, offset) {
        (None, None) => WindowSpec::whole(max_len),
        (Some(l), None) => WindowSpec::last(l),
        (l, Some(o)) => WindowSpec { offset: o, len: l.unwrap_or(max_len), pad: Pad::Tail },
    };
    match pad {
        None => {}
        Some("head") => w.pad = Pad::Head,
        Some("tail") => w.pad = Pad::Tail,
        Some(other) => return Err(Error::Spec(format!("pad must be \"head\" or \"tail\", got {other:?}"))),
    }
    w.validate(max_len)?;
    Ok(w)
}

/// How the table paces writers and samplers (Reverb's rate limiters).
#[pyclass(module = "gear._gear", frozen, from_py_object)]
#[derive(Clone, Debug)]
pub struct RateLimiter {
    kind: LimiterKind,
}

#[derive(Clone, Debug)]
enum LimiterKind {
    Ratio(RateLimiterConfig),
    Queue(u64),
    Stack(u64),
}

#[pymethods]
impl RateLimiter {
    /// Sampling waits until the table holds `min_size` trajectories;
    /// writers never wait.
    #[staticmethod]
    fn min_size(min_size: u64) -> Self {
        RateLimiter { kind: LimiterKind::Ratio(RateLimiterConfig::min_size(min_size)) }
    }

    /// Keep `inserts * samples_per_insert - samples` within
    /// `min_size * samples_per_insert ± error_buffer`: whichever side would
    /// leave the range waits.
    #[staticmethod]
    fn sample_to_insert_ratio(samples_per_insert: f64, min_size_to_sample: u64, error_buffer: f64) -> PyResult<Self> {
        let c = RateLimiterConfig::sample_to_insert_ratio(samples_per_insert, min_size_to_sample, error_buffer)
            .map_err(Error::from)?;
        Ok(RateLimiter { kind: LimiterKind::Ratio(c) })
    }

    /// A queue of `size` trajectories: FIFO, each sampled exactly once,
    /// writers wait while `size` unsampled trajectories are stored.
    #[staticmethod]
    fn queue(size: u64) -> Self {
        RateLimiter { kind: LimiterKind::Queue(size) }
    }

    /// Like `queue`, newest first.
    #[staticmethod]
    fn stack(size: u64) -> Self {
        RateLimiter { kind: LimiterKind::Stack(size) }
    }

    fn __repr__(&self) -> String {
        match &self.kind {
            LimiterKind::Ratio(c) => format!(
                "RateLimiter(samples_per_insert={}, min_size_to_sample={}, min_diff={}, max_diff={})",
                c.samples_per_insert, c.min_size_to_sample, c.min_diff, c.max_diff
            ),
            LimiterKind::Queue(n) => format!("RateLimiter.queue({n})"),
            LimiterKind::Stack(n) => format!("RateLimiter.stack({n})"),
        }
    }
}

fn strategy(name: &str) -> Result<StrategyKind> {
    name.parse().map_err(|e: gear_sampler::Error| Error::Spec(e.to_string()))
}

/// A column name or a list of them (`None`: `default`).
fn names_of(value: Option<&Bound<'_, PyAny>>, default: &str) -> Result<Vec<String>> {
    match value {
        None => Ok(vec![default.to_owned()]),
        Some(v) if v.is_none() => Ok(vec![default.to_owned()]),
        Some(v) => match v.extract::<String>() {
            Ok(name) => Ok(vec![name]),
            Err(_) => v.extract::<Vec<String>>().map_err(|_| {
                Error::Spec(format!("{default}: expected a column name or a list of them, got {}", dtype::repr(v)))
            }),
        },
    }
}

/// Parses `columns`: a sequence of `(name, dtype)` or `(name, dtype, shape)`.
fn parse_columns(columns: &Bound<'_, PyAny>) -> Result<Vec<ColumnSpec>> {
    let mut out = Vec::new();
    for item in columns.try_iter().map_err(|_| Error::Spec("columns must be a list of (name, dtype, shape)".into()))? {
        let item = item?;
        let tuple = item.cast::<PyTuple>().map_err(|_| {
            Error::Spec(format!("column {}: expected a tuple (name, dtype, shape)", dtype::repr(&item)))
        })?;
        if !(2..=3).contains(&tuple.len()) {
            return Err(Error::Spec(format!(
                "column {}: expected (name, dtype) or (name, dtype, shape)",
                dtype::repr(&item)
            )));
        }
        let name: String = tuple
            .get_item(0)?
            .extract()
            .map_err(|_| Error::Spec(format!("column {}: name must be a string", dtype::repr(&item))))?;
        let dt = dtype::parse(&tuple.get_item(1)?)?;
        let shape: Vec<u64> = if tuple.len() == 3 {
            let s = tuple.get_item(2)?;
            if let Ok(n) = s.extract::<u64>() {
                vec![n]
            } else {
                s.extract().map_err(|_| {
                    Error::Spec(format!(
                        "column `{name}`: shape must be a tuple of non-negative ints, got {}",
                        dtype::repr(&s)
                    ))
                })?
            }
        } else {
            Vec::new()
        };
        out.push(ColumnSpec::new(name, dt, shape));
    }
    Ok(out)
}

pub(crate) fn infos_of(spec: &TableSpec) -> Arc<[ColumnInfo]> {
    spec.columns()
        .iter()
        .map(|c| ColumnInfo {
            name: c.name().to_owned(),
            dtype: c.dtype(),
            shape: c.shape().iter().map(|&d| d as usize).collect(),
        })
        .collect()
}

/// What `Table(...)` and `Table.restore(...)` take besides the columns
/// and sizes.
struct TableOptions<'a> {
    sampler: &'a str,
    remover: &'a str,
    alpha: f64,
    beta: f64,
    stratified: bool,
    max_times_sampled: Option<u64>,
    rate_limiter: Option<RateLimiter>,
    name: Option<String>,
    seed: u64,
    sample_while_writing: bool,
    collector_threads: Option<usize>,
    items_per_trajectory: u64,
    item_pattern: Option<ItemPattern>,
}

impl TableOptions<'_> {
    /// The builder of the table these options describe, and its columns.
    fn builder(
        self,
        columns: &Bound<'_, PyAny>,
        max_len: u64,
        capacity: u64,
    ) -> Result<(gear_api::TableBuilder, Arc<[ColumnInfo]>)> {
        let spec = TableSpec::new(parse_columns(columns)?, max_len, capacity)?
            .with_items_per_trajectory(self.items_per_trajectory)?;
        let infos = infos_of(&spec);
        let params = StrategyParams { alpha: self.alpha, beta: self.beta, stratified: self.stratified };
        let mut b = ReplayTable::builder(spec)
            .sampler_kind(strategy(self.sampler)?, params)
            .remover_kind(strategy(self.remover)?)
            .seed(self.seed)
            .sample_while_writing(self.sample_while_writing);
        if let Some(n) = self.max_times_sampled {
            b = b.max_times_sampled(n);
        }
        if let Some(n) = self.collector_threads {
            b = b.collector_threads(n);
        }
        if let Some(name) = self.name {
            b = b.shared_memory(name);
        }
        match (self.item_pattern, self.items_per_trajectory) {
            (Some(_), 0) => {
                return Err(Error::Spec(
                    "item_pattern needs items_per_trajectory (items the table keeps per trajectory)".into(),
                ))
            }
            (Some(p), _) => b = b.item_pattern(p.inner),
            (None, _) => {}
        }
        b = match self.rate_limiter.map(|r| r.kind) {
            None => b,
            Some(LimiterKind::Ratio(c)) => b.rate_limiter(c),
            Some(LimiterKind::Queue(n)) => b.queue(n)?,
            Some(LimiterKind::Stack(n)) => b.stack(n)?,
        };
        Ok((b, infos))
    }
}

/// A checkpoint report as a dict.
fn checkpoint_report<'py>(py: Python<'py>, r: &gear_api::CheckpointReport) -> Result<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path", &r.path)?;
    d.set_item("trajectories", r.trajectories)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item("data_bytes", r.data_bytes)?;
    d.set_item("file_bytes", r.file_bytes)?;
    d.set_item("pause_s", r.pause.as_secs_f64())?;
    d.set_item("elapsed_s", r.elapsed.as_secs_f64())?;
    Ok(d)
}

/// A replay table: columns of trajectories, a sampling and an eviction
/// strategy, a rate limiter; process-private, or in shared memory under
/// `name` so other processes can `Table.attach(name)`.
#[pyclass(module = "gear._gear", frozen)]
pub struct Table {
    pub(crate) inner: ReplayTable,
    infos: Arc<[ColumnInfo]>,
}

#[pymethods]
impl Table {
    /// Creates a table. `columns`: `[(name, dtype, shape), ...]` with dtype
    /// a NumPy dtype or name (`"float32"`, `np.uint8`, `"bfloat16"`) and
    /// shape the per-step shape (`()` for scalars). `max_len`: steps per
    /// trajectory at most; `capacity`: trajectories. `sampler`/`remover`:
    /// `"uniform"`, `"prioritized"` (with `alpha`, `beta`), `"fifo"`,
    /// `"lifo"`, `"max-heap"`, `"min-heap"`. `name`: shared memory in
    /// `/dev/shm` (`None`: process-private). `items_per_trajectory`: with
    /// more than 0, the rows the strategies select are items, windows of
    /// the stored trajectories with priorities of their own, up to this
    /// many per trajectory; `item_pattern` (a `gear.ItemPattern`) is what
    /// a trajectory committed without items of its own gets (default:
    /// one item of all its steps). Times sampled, `max_times_sampled` and
    /// the rate limiter then count items; evicting a trajectory removes
    /// its items.
    #[new]
    #[pyo3(signature = (
        columns, max_len, capacity, *, sampler="uniform", remover="fifo", alpha=0.6, beta=0.4,
        stratified=true, max_times_sampled=None, rate_limiter=None, name=None, seed=0,
        sample_while_writing=false, collector_threads=None, items_per_trajectory=0, item_pattern=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        columns: &Bound<'_, PyAny>,
        max_len: u64,
        capacity: u64,
        sampler: &str,
        remover: &str,
        alpha: f64,
        beta: f64,
        stratified: bool,
        max_times_sampled: Option<u64>,
        rate_limiter: Option<RateLimiter>,
        name: Option<String>,
        seed: u64,
        sample_while_writing: bool,
        collector_threads: Option<usize>,
        items_per_trajectory: u64,
        item_pattern: Option<ItemPattern>,
    ) -> PyResult<Self> {
        let options = TableOptions {
            sampler,
            remover,
            alpha,
            beta,
            stratified,
            max_times_sampled,
            rate_limiter,
            name,
            seed,
            sample_while_writing,
            collector_threads,
            items_per_trajectory,
            item_pattern,
        };
        let (b, infos) = options.builder(columns, max_len, capacity)?;
        let inner = py.detach(|| b.build()).map_err(Error::from)?;
        Ok(Table { inner, infos })
    }

    /// Creates a table as `Table(...)` does (the same arguments) and fills
    /// it from a checkpoint: `path` is a checkpoint file, or a directory
    /// written by `checkpoint_into` (its newest checkpoint is read). The
    /// spec must be the checkpoint's; a truncated, corrupted,
    /// other-version or other-spec checkpoint raises `CheckpointError` and
    /// no table is made. Every committed trajectory comes back with its
    /// key, priority, times sampled and insertion order, with the rate
    /// limiter's counters and the strategies' state.
    #[staticmethod]
    #[pyo3(signature = (
        path, columns, max_len, capacity, *, sampler="uniform", remover="fifo", alpha=0.6, beta=0.4,
        stratified=true, max_times_sampled=None, rate_limiter=None, name=None, seed=0,
        sample_while_writing=false, collector_threads=None, items_per_trajectory=0, item_pattern=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn restore(
        py: Python<'_>,
        path: std::path::PathBuf,
        columns: &Bound<'_, PyAny>,
        max_len: u64,
        capacity: u64,
        sampler: &str,
        remover: &str,
        alpha: f64,
        beta: f64,
        stratified: bool,
        max_times_sampled: Option<u64>,
        rate_limiter: Option<RateLimiter>,
        name: Option<String>,
        seed: u64,
        sample_while_writing: bool,
        collector_threads: Option<usize>,
        items_per_trajectory: u64,
        item_pattern: Option<ItemPattern>,
    ) -> PyResult<Self> {
        let options = TableOptions {
            sampler,
            remover,
            alpha,
            beta,
            stratified,
            max_times_sampled,
            rate_limiter,
            name,
            seed,
            sample_while_writing,
            collector_threads,
            items_per_trajectory,
            item_pattern,
        };
        let (b, infos) = options.builder(columns, max_len, capacity)?;
        let inner = py.detach(|| b.restore(&path)).map_err(Error::from)?;
        Ok(Table { inner, infos })
    }

    /// Writes a checkpoint of every committed trajectory to `path`
    /// (under a temporary name, fsynced, then renamed: a process killed
    /// meanwhile leaves the previous file intact). Writers and samplers
    /// keep working while it is written. Returns a report: `path`,
    /// `trajectories`, `dropped` (evicted before their bytes were copied),
    /// `data_bytes`, `file_bytes`, `pause_s` (how long the table lock was
    /// held), `elapsed_s`.
    fn checkpoint<'py>(&self, py: Python<'py>, path: std::path::PathBuf) -> PyResult<Bound<'py, PyDict>> {
        let table = &self.inner;
        let report = py.detach(|| table.checkpoint(&path)).map_err(Error::from)?;
        Ok(checkpoint_report(py, &report)?)
    }

    /// Writes a checkpoint into directory `dir` (created if missing) under
    /// the next number, then removes the oldest beyond the newest `keep`.
    /// `Table.restore(dir, ...)` reads the newest. Returns the report of
    /// `checkpoint`.
    #[pyo3(signature = (dir, keep=3))]
    fn checkpoint_into<'py>(
        &self,
        py: Python<'py>,
        dir: std::path::PathBuf,
        keep: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let table = &self.inner;
        let report = py.detach(|| table.checkpoint_into(&dir, keep)).map_err(Error::from)?;
        Ok(checkpoint_report(py, &report)?)
    }

    /// Attaches to the shared table `name` another process created.
    /// `timeout`: longest wait for the table lock, in seconds.
    #[staticmethod]
    #[pyo3(signature = (name, *, timeout=30.0, dir=None))]
    fn attach(py: Python<'_>, name: &str, timeout: Option<f64>, dir: Option<std::path::PathBuf>) -> PyResult<Self> {
        let options = AttachOptions { dir, timeout: wait::seconds(timeout, "timeout")?, ..AttachOptions::default() };
        let inner = py.detach(|| ReplayTable::attach(name, options)).map_err(Error::from)?;
        let infos = infos_of(inner.spec());
        Ok(Table { inner, infos })
    }

    /// Pickles a shared table as "attach by name", so `multiprocessing`
    /// children and DataLoader workers get the same table.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let name = slf.get().inner.name().map(str::to_owned).ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(
                "a process-private table cannot be sent to another process; create it with name=... to share it",
            )
        })?;
        Ok((slf.get_type().getattr("attach")?, (name,)))
    }

    /// A writer for actors; `timeout`: longest wait for the rate limiter,
    /// in seconds (`None`: as long as it takes; Ctrl-C still interrupts).
    #[pyo3(signature = (timeout=None))]
    fn writer(&self, timeout: Option<f64>) -> PyResult<Writer> {
        Ok(Writer::new(&self.inner, self.infos.clone(), wait::seconds(timeout, "timeout")?))
    }

    /// A sampler of `batch_size` rows. `window`: steps per row (`None`:
    /// whole trajectories, `max_len` steps); by default the last `window`
    /// steps, padded at the head. `offset`: the first step instead
    /// (negative: from the end), padded at the tail unless `pad="head"`.
    /// `columns`: only these. `timeout`: longest wait in seconds.
    /// `random_start`: each row starts at a random step (R2D2-style).
    /// `prefetch`: batches a Rust thread draws ahead while you train (0:
    /// none; `sample_into` needs 0); a sample then takes a ready one, and
    /// the thread's timeout or error is raised by the sample in its turn.
    /// `transform`: a callable the thread applies to each batch (with the
    /// GIL, e.g. to make tensors); samples return what it returns.
    #[pyo3(signature = (batch_size, window=None, *, offset=None, pad=None, columns=None, timeout=10.0, random_start=false, prefetch=0, transform=None))]
    #[allow(clippy::too_many_arguments)]
    fn sampler(
        &self,
        py: Python<'_>,
        batch_size: usize,
        window: Option<u64>,
        offset: Option<i64>,
        pad: Option<&str>,
        columns: Option<Vec<String>>,
        timeout: Option<f64>,
        random_start: bool,
        prefetch: usize,
        transform: Option<Py<PyAny>>,
    ) -> PyResult<Sampler> {
        let config = self.sample_config(batch_size, window, offset, pad, columns, timeout, random_start)?;
        Ok(Sampler::new(py, &self.inner, config, prefetch, transform)?)
    }

    /// A sampler that gathers on CUDA device `device` (wheels built with
    /// the `cuda` feature): arguments as for `sampler`, plus `ring`, the
    /// batches gathered ahead. Raises `GearError` where no GPU is usable.
    #[cfg(feature = "cuda")]
    #[pyo3(signature = (batch_size, window=None, *, offset=None, pad=None, columns=None, timeout=10.0, random_start=false, device=0, ring=2))]
    #[allow(clippy::too_many_arguments)]
    fn cuda_sampler(
        &self,
        py: Python<'_>,
        batch_size: usize,
        window: Option<u64>,
        offset: Option<i64>,
        pad: Option<&str>,
        columns: Option<Vec<String>>,
        timeout: Option<f64>,
        random_start: bool,
        device: usize,
        ring: usize,
    ) -> PyResult<crate::cuda::CudaSampler> {
        let config = self.sample_config(batch_size, window, offset, pad, columns, timeout, random_start)?;
        let table = &self.inner;
        let infos = &self.infos;
        Ok(py.detach(|| crate::cuda::CudaSampler::new(table, infos, config, device, ring))?)
    }

    /// Sets priorities by key (arrays or lists; trajectories' or items'
    /// keys). Keys of evicted trajectories (and of their items) are ignored; a NaN, negative or infinite priority
    /// refuses the whole call. Returns how many were applied.
    fn update_priorities(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        priorities: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let keys = keys_of(py, keys)?;
        let priorities = float_vec(priorities, "priorities")?;
        if keys.len() != priorities.len() {
            return Err(Error::Step(format!("{} keys but {} priorities", keys.len(), priorities.len())).into());
        }
        let updates: Vec<(SlotKey, f64)> = keys.into_iter().zip(priorities).collect();
        let table = &self.inner;
        Ok(py.detach(|| table.update_priorities(&updates)).map_err(Error::from)?)
    }

    /// Adds items to the committed trajectory `key`: item `i` is steps
    /// `starts[i] .. starts[i] + lengths[i]`, with `priorities[i]` (`None`:
    /// the strategy chooses). They are selectable when this returns. A
    /// stale key raises `StaleKeyError`; a window past the trajectory's
    /// steps or more items than it has room for raise and add nothing.
    /// Returns the items' keys (`uint64`).
    #[pyo3(signature = (key, starts, lengths, priorities=None))]
    fn add_items<'py>(
        &self,
        py: Python<'py>,
        key: u64,
        starts: &Bound<'py, PyAny>,
        lengths: &Bound<'py, PyAny>,
        priorities: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let starts = keys_of(py, starts).map_err(|_| Error::Step("starts: expected non-negative ints".into()))?;
        let lengths = keys_of(py, lengths).map_err(|_| Error::Step("lengths: expected non-negative ints".into()))?;
        let priorities = match priorities {
            Some(p) if !p.is_none() => Some(float_vec(p, "priorities")?),
            _ => None,
        };
        if starts.len() != lengths.len() || priorities.as_ref().is_some_and(|p| p.len() != starts.len()) {
            return Err(Error::Step(format!(
                "{} starts, {} lengths and {} priorities: one each per item",
                starts.len(),
                lengths.len(),
                priorities.as_ref().map_or(starts.len(), Vec::len)
            ))
            .into());
        }
        let items: Vec<NewItem> = (0..starts.len())
            .map(|i| NewItem {
                start: starts[i].to_u64(),
                len: lengths[i].to_u64(),
                priority: priorities.as_ref().map(|p| p[i]),
            })
            .collect();
        let table = &self.inner;
        let keys = py.detach(|| table.add_items(SlotKey::from_u64(key), &items)).map_err(Error::from)?;
        Ok(numpy::PyArray1::from_vec(py, keys.iter().map(|k| k.to_u64()).collect()).into_any())
    }

    /// Adds to the committed trajectory `key` the items `pattern` (a
    /// `gear.ItemPattern`) gives its steps, each with `priority`. Returns
    /// their keys.
    #[pyo3(signature = (key, pattern, priority=None))]
    fn add_pattern_items<'py>(
        &self,
        py: Python<'py>,
        key: u64,
        pattern: ItemPattern,
        priority: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let table = &self.inner;
        let keys = py
            .detach(|| table.add_pattern_items(SlotKey::from_u64(key), pattern.inner, priority))
            .map_err(Error::from)?;
        Ok(numpy::PyArray1::from_vec(py, keys.iter().map(|k| k.to_u64()).collect()).into_any())
    }

    /// The live items of the stored trajectory `key`, as a dict of arrays
    /// (`keys`, `starts`, `lengths`, `priorities`, `times_sampled`); empty
    /// arrays when the key is stale.
    fn items_of<'py>(&self, py: Python<'py>, key: u64) -> PyResult<Bound<'py, PyDict>> {
        let table = &self.inner;
        let items = py.detach(|| table.items_of(SlotKey::from_u64(key))).map_err(Error::from)?;
        let d = PyDict::new(py);
        d.set_item("keys", numpy::PyArray1::from_vec(py, items.iter().map(|i| i.key.to_u64()).collect()))?;
        d.set_item("starts", numpy::PyArray1::from_vec(py, items.iter().map(|i| i.start as i64).collect()))?;
        d.set_item("lengths", numpy::PyArray1::from_vec(py, items.iter().map(|i| i.len as i64).collect()))?;
        d.set_item("priorities", numpy::PyArray1::from_vec(py, items.iter().map(|i| i.priority).collect()))?;
        d.set_item("times_sampled", numpy::PyArray1::from_vec(py, items.iter().map(|i| i.times_sampled).collect()))?;
        Ok(d)
    }

    /// A sampler of DQN transitions over this table's transition items
    /// (see `gear.TransitionSampler`): `obs`, one observation column or a
    /// list of them (frame-stacked, `next_<name>` beside each); `action`,
    /// one step column or a list (read at `t`); `reward`: the reward
    /// column; `done`: the done column (non-zero after an episode's last
    /// action), if any; `frame_stack`: frames per observation (stacks
    /// reaching before an episode's first step repeat that frame);
    /// `n_step`, `gamma`: the return.
    #[pyo3(signature = (
        batch_size, *, obs=None, action=None, reward="reward".to_owned(),
        done=None, frame_stack=1, n_step=1, gamma=0.99, timeout=10.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn transition_sampler(
        &self,
        py: Python<'_>,
        batch_size: usize,
        obs: Option<&Bound<'_, PyAny>>,
        action: Option<&Bound<'_, PyAny>>,
        reward: String,
        done: Option<String>,
        frame_stack: u64,
        n_step: u64,
        gamma: f64,
        timeout: Option<f64>,
    ) -> PyResult<TransitionSampler> {
        Ok(TransitionSampler::new(
            py,
            &self.inner,
            batch_size,
            names_of(obs, "obs")?,
            names_of(action, "action")?,
            reward,
            done,
            frame_stack,
            n_step,
            gamma,
            wait::seconds(timeout, "timeout")?,
        )?)
    }

    /// Items each trajectory may hold (0: the rows are trajectories).
    #[getter]
    fn items_per_trajectory(&self) -> u64 {
        self.inner.spec().items_per_trajectory()
    }

    /// Counters and rate-limiter state, as a dict; `waiting` lists the
    /// writers and samplers waiting now (in any process), each a dict of
    /// `role` (`writer`, `sampler`), `reason` (`min size`, `samples per
    /// insert`, `full table`, `table lock`, `empty table`), `pid`,
    /// `waited_s` and `since` (Unix time), longest first.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let table = &self.inner;
        let i = py.detach(|| table.info()).map_err(Error::from)?;
        let d = PyDict::new(py);
        d.set_item("size", i.size)?;
        d.set_item("capacity", i.capacity)?;
        d.set_item("inserts", i.inserts)?;
        d.set_item("samples", i.samples)?;
        d.set_item("evictions", i.evictions)?;
        d.set_item("retired", i.retired)?;
        d.set_item("reclaimed", i.reclaimed)?;
        d.set_item("limiter_error", i.limiter_error)?;
        d.set_item("insert_wait_s", i.insert_wait.as_secs_f64())?;
        d.set_item("sample_wait_s", i.sample_wait.as_secs_f64())?;
        d.set_item("bytes_written", i.bytes_written)?;
        d.set_item("bytes_gathered", i.bytes_gathered)?;
        d.set_item("slots_free", i.slots.free)?;
        d.set_item("slots_writing", i.slots.writing)?;
        d.set_item("slots_committed", i.slots.committed)?;
        // Who waits now, in every process of the table, longest first: a
        // hang has a name (the limit) and an age.
        let waiting = pyo3::types::PyList::empty(py);
        for w in &i.waiting {
            let e = PyDict::new(py);
            e.set_item("role", w.role.name())?;
            e.set_item("reason", w.reason.name())?;
            e.set_item("pid", w.pid)?;
            e.set_item("waited_s", w.waited.as_secs_f64())?;
            e.set_item("since", w.since.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()))?;
            waiting.append(e)?;
        }
        d.set_item("waiting_writers", i.waiting_writers())?;
        d.set_item("waiting_samplers", i.waiting_samplers())?;
        d.set_item("waiting", waiting)?;
        Ok(d)
    }

    /// Trajectories that can be sampled now.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let table = &self.inner;
        Ok(py.detach(|| table.info()).map_err(Error::from)?.size as usize)
    }

    /// Trajectories committed since creation, read without the table
    /// lock (a cheap progress counter; `info()` takes the lock).
    #[getter]
    fn inserts(&self) -> u64 {
        self.inner.inserts()
    }

    /// The shared-memory name (`None`: process-private).
    #[getter]
    fn name(&self) -> Option<String> {
        self.inner.name().map(str::to_owned)
    }

    /// Steps per trajectory at most.
    #[getter]
    fn max_len(&self) -> u64 {
        self.inner.spec().max_len()
    }

    /// Trajectories the table holds at most.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.spec().capacity()
    }

    /// `[(name, dtype name, shape), ...]`.
    #[getter]
    fn columns(&self) -> Vec<(String, String, Vec<usize>)> {
        self.infos.iter().map(|c| (c.name.clone(), c.dtype.name().to_owned(), c.shape.clone())).collect()
    }

    /// Closes the table for every process: waiting writers and samplers
    /// raise `ClosedError`, later waits fail at once.
    fn close(&self) {
        self.inner.close();
    }

    /// Reclaims the slots of writers that died; returns how many.
    fn reclaim_dead(&self, py: Python<'_>) -> PyResult<u64> {
        let table = &self.inner;
        Ok(py.detach(|| table.reclaim_dead()).map_err(Error::from)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "Table(name={:?}, columns={:?}, max_len={}, capacity={})",
            self.inner.name(),
            self.columns(),
            self.max_len(),
            self.capacity()
        )
    }
}

impl Table {
    /// The sampler configuration `sampler` and `cuda_sampler` share.
    #[allow(clippy::too_many_arguments)]
    fn sample_config(
        &self,
        batch_size: usize,
        window: Option<u64>,
        offset: Option<i64>,
        pad: Option<&str>,
        columns: Option<Vec<String>>,
        timeout: Option<f64>,
        random_start: bool,
    ) -> Result<SampleConfig> {
        let w = window_spec(self.inner.spec().max_len(), window, offset, pad)?;
        let mut config = SampleConfig::new(batch_size, w).timeout(wait::seconds(timeout, "timeout")?);
        if let Some(cols) = columns {
            for c in &cols {
                if self.inner.spec().column_index(c).is_err() {
                    return Err(Error::Spec(format!("unknown column `{c}`; the table has {:?}", self.column_names())));
                }
            }
            config = config.columns(cols);
        }
        if random_start {
            config = config.random_start();
        }
        Ok(config)
    }

    fn column_names(&self) -> Vec<String> {
        self.infos.iter().map(|c| c.name.clone()).collect()
    }
}
