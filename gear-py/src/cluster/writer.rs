//! `gear.ClusterWriter` and `gear.ClusterTrajectory`: remote actors'
//! writes. A trajectory streams its steps to one shard in chunks as they
//! are appended (the actor holds one chunk at most); `insert_batch` sends
//! many small trajectories at once.

use super::{keys, partial_insert, Cluster, ClusterSpec};
use crate::batch::ColumnInfo;
use crate::error::{Error, Result};
use crate::wait;
use crate::writer::{array_bytes, arrays_by_name};
use bytes::Bytes;
use gear_net::{ClusterClient, RemoteKey, RemoteTrajectory, TrajectoryStream, WriteTarget};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of steps a trajectory sends per chunk unless told otherwise.
const CHUNK_BYTES: u64 = 1 << 20;

/// Writes to a cluster's shards. Get one with `cluster.writer(target=...)`.
#[pyclass(module = "gear._gear", frozen)]
pub struct ClusterWriter {
    client: Arc<ClusterClient>,
    target: WriteTarget,
    /// Longest wait for a shard to take a chunk (`None`: for ever).
    timeout: Option<Duration>,
    call_timeout: Duration,
    chunk_steps: u64,
    infos: Arc<[ColumnInfo]>,
    max_len: u64,
}

impl ClusterWriter {
    pub(super) fn new(
        cluster: &Cluster,
        spec: &ClusterSpec,
        target: WriteTarget,
        timeout: Option<Duration>,
        chunk_steps: Option<u64>,
    ) -> Result<Self> {
        let chunk_steps = match chunk_steps {
            Some(0) => return Err(Error::Spec("chunk_steps must be at least 1".into())),
            Some(n) => n,
            None => (CHUNK_BYTES / spec.spec.step_bytes().max(1)).max(1),
        };
        Ok(ClusterWriter {
            client: cluster.client().clone(),
            target,
            timeout,
            call_timeout: cluster.call_timeout(),
            chunk_steps,
            infos: spec.infos.clone(),
            max_len: spec.spec.max_len(),
        })
    }
}

#[pymethods]
impl ClusterWriter {
    /// Starts a trajectory on the shard the writer's target picks. Use it
    /// as a context manager: an exception inside abandons it (the shard
    /// stores none of it), a normal exit ends it. `priority`: its priority
    /// (`None`: the shard's strategy chooses).
    #[pyo3(signature = (priority=None))]
    fn trajectory(&self, priority: Option<f64>) -> PyResult<ClusterTrajectory> {
        if let Some(p) = priority {
            gear_core::check_priority(p).map_err(Error::from)?;
        }
        Ok(ClusterTrajectory {
            client: self.client.clone(),
            target: self.target,
            timeout: self.timeout,
            call_timeout: self.call_timeout,
            chunk_steps: self.chunk_steps,
            infos: self.infos.clone(),
            max_len: self.max_len,
            priority,
            stream: None,
            pending: self.infos.iter().map(|_| Vec::new()).collect(),
            pending_steps: 0,
            steps: 0,
            closed: false,
            key: None,
        })
    }

    /// Inserts many small trajectories. `columns` maps every column name
    /// to an array of shape `[count, *shape]` (one-step trajectories, e.g.
    /// DQN transitions) or, with `steps=k`, `[count, k, *shape]`.
    /// `priorities`: one per trajectory, or `None`. Returns the keys.
    /// Everything is checked before anything is sent; a shard may commit
    /// some trajectories and then fail: that raises `PartialInsertError`,
    /// whose `committed` lists `(index, key)` of each one stored, so the
    /// rest can be sent again.
    #[pyo3(signature = (columns, priorities=None, steps=None))]
    fn insert_batch<'py>(
        &self,
        py: Python<'py>,
        columns: &Bound<'py, PyDict>,
        priorities: Option<&Bound<'py, PyAny>>,
        steps: Option<u64>,
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
        let k = steps.unwrap_or(1);
        if k == 0 || k > self.max_len {
            return Err(Error::Step(format!("steps must be between 1 and max_len {}, got {k}", self.max_len)).into());
        }
        let leading: Vec<usize> = match steps {
            None => vec![count],
            Some(k) => vec![count, k as usize],
        };
        let arrays = arrays_by_name(Some(columns), &self.infos, &leading)?;
        let priorities: Option<Vec<f64>> = match priorities {
            None => None,
            Some(p) if p.is_none() => None,
            Some(p) => Some(crate::table::float_vec(p, "priorities")?),
        };
        if let Some(p) = &priorities {
            if p.len() != count {
                return Err(Error::Step(format!("{} priorities for {count} trajectories", p.len())).into());
            }
            for &v in p {
                gear_core::check_priority(v).map_err(Error::from)?;
            }
        }
        // One copy of each column into shared bytes; each trajectory's
        // column is a slice of it.
        // SAFETY: `column_array` made every array C-contiguous; they are
        // held by `arrays` until the copies are made, and no Python code
        // runs on them meanwhile.
        let shared: Vec<Bytes> = arrays.iter().map(|a| Bytes::copy_from_slice(unsafe { array_bytes(a) })).collect();
        let trajectories: Vec<RemoteTrajectory> = (0..count)
            .map(|i| RemoteTrajectory {
                steps: k,
                columns: shared
                    .iter()
                    .map(|b| {
                        let per = b.len() / count.max(1);
                        b.slice(i * per..(i + 1) * per)
                    })
                    .collect(),
                priority: priorities.as_ref().map(|p| p[i]),
            })
            .collect();
        let (client, target) = (self.client.clone(), self.target);
        let inserted = wait::off_thread(py, move || client.insert(target, trajectories, 0))?;
        match inserted {
            Ok(keys) => Ok(keys::to_array(py, &keys)?),
            Err(e @ gear_net::Error::PartialInsert { .. }) => Err(partial_insert(py, e)),
            Err(e) => Err(Error::from(e).into()),
        }
    }

    /// Steps a trajectory sends per chunk.
    #[getter]
    fn chunk_steps(&self) -> u64 {
        self.chunk_steps
    }
}

/// A trajectory being written to a shard: `append(obs=..., ...)` adds one
/// step of every column (sent in chunks of `chunk_steps`), `end()`
/// commits it and returns its key. Dropped (or left by an exception in a
/// `with` block) without `end`, it is abandoned: the shard stores none of
/// it, nor does it if the actor dies first.
#[pyclass(module = "gear._gear")]
pub struct ClusterTrajectory {
    client: Arc<ClusterClient>,
    target: WriteTarget,
    timeout: Option<Duration>,
    call_timeout: Duration,
    chunk_steps: u64,
    infos: Arc<[ColumnInfo]>,
    max_len: u64,
    priority: Option<f64>,
    /// Opened when the first chunk is sent.
    stream: Option<TrajectoryStream>,
    /// Steps appended and not sent yet, per column.
    pending: Vec<Vec<u8>>,
    pending_steps: u64,
    steps: u64,
    closed: bool,
    key: Option<RemoteKey>,
}

impl ClusterTrajectory {
    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Step("the trajectory already ended or was abandoned".into()));
        }
        Ok(())
    }

    /// The stream, opened on the shard the target picks (`MostFree` asks
    /// the shards, so off the calling thread).
    fn stream(&mut self, py: Python<'_>) -> Result<&mut TrajectoryStream> {
        if self.stream.is_none() {
            let (client, target) = (self.client.clone(), self.target);
            let stream = wait::off_thread(py, move || client.open_trajectory(target))??;
            self.stream = Some(stream);
        }
        Ok(self.stream.as_mut().expect("opened above"))
    }

    /// Sends the pending steps (the last chunk when `end`), waiting for
    /// room one slice at a time up to the writer's timeout.
    fn flush(&mut self, py: Python<'_>, end: bool) -> Result<()> {
        let columns: Vec<Bytes> = self.pending.iter_mut().map(|c| Bytes::from(std::mem::take(c))).collect();
        let (steps, priority, timeout) = (self.pending_steps, self.priority, self.timeout);
        let stream = self.stream(py)?;
        let started = Instant::now();
        loop {
            let chunk = columns.clone();
            let sent = py.detach(|| {
                if end {
                    stream.send_end(steps, chunk, priority, wait::slice_of(timeout))
                } else {
                    stream.send(steps, chunk, priority, wait::slice_of(timeout))
                }
            })?;
            if sent {
                break;
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                return Err(Error::Timeout(format!(
                    "timed out after {:?} waiting for shard {} to take a chunk",
                    started.elapsed(),
                    stream.shard()
                )));
            }
            py.check_signals()?;
        }
        self.pending_steps = 0;
        Ok(())
    }

    fn finish(&mut self, py: Python<'_>, priority: Option<f64>) -> Result<RemoteKey> {
        self.check_open()?;
        if let Some(p) = priority {
            gear_core::check_priority(p)?;
        }
        if self.steps == 0 {
            return Err(Error::Step("a trajectory needs at least one step before end()".into()));
        }
        let late = priority.is_some() && self.stream.as_ref().is_some_and(|s| s.started());
        if let (Some(p), false) = (priority, late) {
            self.priority = Some(p);
        }
        let result = self.commit(py);
        self.closed = true;
        self.stream = None;
        let key = result?;
        self.key = Some(key);
        if let (Some(p), true) = (priority, late) {
            // The first chunk left without it: set it now (a sampler may
            // have drawn the trajectory in between).
            let client = self.client.clone();
            wait::off_thread(py, move || client.update_priorities(&[(key, p)]))??;
        }
        Ok(key)
    }

    fn commit(&mut self, py: Python<'_>) -> Result<RemoteKey> {
        self.flush(py, true)?;
        let call_timeout = self.call_timeout;
        let stream = self.stream.as_mut().expect("flush opened it");
        let started = Instant::now();
        loop {
            if let Some(key) = py.detach(|| stream.key(wait::WAIT_SLICE))? {
                return Ok(key);
            }
            if started.elapsed() >= call_timeout {
                return Err(Error::Timeout(format!(
                    "shard {} did not confirm the trajectory within {call_timeout:?}",
                    stream.shard()
                )));
            }
            py.check_signals()?;
        }
    }

    fn abandon_now(&mut self, py: Python<'_>) {
        self.closed = true;
        self.pending.iter_mut().for_each(Vec::clear);
        if let Some(stream) = self.stream.take() {
            py.detach(|| drop(stream));
        }
    }
}

#[pymethods]
impl ClusterTrajectory {
    /// Appends one step: a value for every column, by name (arrays of the
    /// column's dtype and shape, or Python numbers and lists converted
    /// without loss). Sent to the shard once `chunk_steps` steps are
    /// pending. Nothing is kept unless every column checks out.
    #[pyo3(signature = (**columns))]
    fn append(&mut self, py: Python<'_>, columns: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        self.check_open()?;
        if self.steps >= self.max_len {
            return Err(
                Error::Step(format!("trajectory would exceed the maximum length of {} steps", self.max_len)).into()
            );
        }
        let arrays = arrays_by_name(columns, &self.infos, &[])?;
        for (pending, array) in self.pending.iter_mut().zip(&arrays) {
            // SAFETY: contiguous (column_array), alive in `arrays` for the copy.
            pending.extend_from_slice(unsafe { array_bytes(array) });
        }
        self.pending_steps += 1;
        self.steps += 1;
        if self.pending_steps >= self.chunk_steps {
            if let Err(e) = self.flush(py, false) {
                // A chunk the shard did not take loses the trajectory.
                self.abandon_now(py);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Commits the trajectory and returns its key (a record of
    /// `gear.CLUSTER_KEY_DTYPE`). `priority`, when given, replaces the one
    /// the trajectory began with.
    #[pyo3(signature = (priority=None))]
    fn end<'py>(&mut self, py: Python<'py>, priority: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let key = self.finish(py, priority)?;
        Ok(keys::to_array(py, &[key])?.get_item(0).map_err(Error::from)?)
    }

    /// Abandons the trajectory: the shard stores none of it.
    fn abandon(&mut self, py: Python<'_>) {
        self.abandon_now(py);
    }

    /// The shard it is written to (`None` until its first chunk is sent).
    #[getter]
    fn shard(&self) -> Option<usize> {
        self.stream.as_ref().map(TrajectoryStream::shard).or(self.key.map(|k| k.shard as usize))
    }

    /// Whether it was ended or abandoned.
    #[getter]
    fn closed(&self) -> bool {
        self.closed
    }

    /// Steps appended so far.
    fn __len__(&self) -> usize {
        self.steps as usize
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
            self.abandon_now(py);
        } else if !self.closed {
            self.finish(py, None)?;
        }
        Ok(false)
    }
}
