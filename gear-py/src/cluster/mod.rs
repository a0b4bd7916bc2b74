//! `gear.Cluster`: the sharded tables that `gear serve` processes host,
//! from Python, through gear-net's cluster client (no second
//! implementation of the protocol). Trainers sample (`sampler.rs`) and
//! update priorities; actors write (`writer.rs`); keys are NumPy records
//! (`keys.rs`).
//!
//! Every call runs on a thread of its own while the calling thread waits
//! with the GIL released and Ctrl-C honoured (`wait::off_thread`); every
//! call has the client's deadline. This module is the one place that
//! knows gear-net's client API, so changes there stay local.

mod keys;
mod sampler;
mod writer;

pub(crate) use keys::key_dtype;
pub use sampler::ClusterSampler;
pub use writer::{ClusterTrajectory, ClusterWriter};

use crate::batch::ColumnInfo;
use crate::error::{Error, PartialInsertError, Result};
use crate::wait;
use gear_core::TableSpec;
use gear_net::cluster_file::ClusterFile;
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, DataPlane, RdmaSettings, WriteTarget};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a `Cluster` was made from: also what it pickles as.
#[derive(Clone, Debug)]
struct Settings {
    shards: Vec<String>,
    /// The table on the shards (`None`: each shard's only table).
    table: Option<String>,
    /// The token given (`None`: `$GEAR_TOKEN` of whichever process opens
    /// the cluster).
    token: Option<String>,
    call_timeout: f64,
    connect_timeout: f64,
    mass_refresh: f64,
    free_space_refresh: f64,
    seed: u64,
    data_plane: String,
    tls_ca: Option<String>,
    tls_domain: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    rdma_device: Option<String>,
    rdma_port: u8,
    rdma_gid_index: Option<u8>,
    rdma_traffic_class: u8,
    rdma_service_level: u8,
}

fn duration(seconds: f64, what: &str) -> Result<Duration> {
    match wait::seconds(Some(seconds), what)? {
        Some(d) if !d.is_zero() || what == "mass_refresh" => Ok(d),
        _ => Err(Error::Spec(format!("{what} must be above zero, got {seconds}"))),
    }
}

fn data_plane(name: &str) -> Result<DataPlane> {
    match name {
        "auto" => Ok(DataPlane::Auto),
        "shard_gather" => Ok(DataPlane::ShardGather),
        "byte_range" => Ok(DataPlane::ByteRange),
        "byte_range_tcp" => Ok(DataPlane::ByteRangeTcp),
        other => Err(Error::Spec(format!(
            "data_plane {other:?} is not one of \"auto\", \"shard_gather\", \"byte_range\", \"byte_range_tcp\""
        ))),
    }
}

impl Settings {
    /// The client config these settings describe (reads `$GEAR_TOKEN`
    /// when no token was given, and the TLS files).
    fn client_config(&self) -> Result<ClusterConfig> {
        let token = gear_net::auth::resolve_token(self.token.as_deref())?;
        let mut config = ClusterConfig::new(self.shards.clone(), token);
        if let Some(table) = &self.table {
            gear_net::server::check_table_name(table).map_err(|e| match e {
                gear_net::Error::Config(what) => Error::Spec(format!("table: {what}")),
                e => e.into(),
            })?;
            config.table = table.clone();
        }
        config.call_timeout = duration(self.call_timeout, "call_timeout")?;
        config.connect_timeout = duration(self.connect_timeout, "connect_timeout")?;
        config.mass_refresh = duration(self.mass_refresh, "mass_refresh")?;
        config.free_space_refresh = duration(self.free_space_refresh, "free_space_refresh")?;
        config.seed = self.seed;
        config.data_plane = data_plane(&self.data_plane)?;
        config.rdma = RdmaSettings {
            device: self.rdma_device.clone(),
            port: self.rdma_port,
            gid_index: self.rdma_gid_index,
            traffic_class: self.rdma_traffic_class,
            service_level: self.rdma_service_level,
            ..RdmaSettings::default()
        };
        config.tls = match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) => None,
            (None, _, _) => return Err(Error::Spec("tls_cert and tls_key need tls_ca (the cluster's CA)".into())),
            (Some(ca), cert, key) => {
                let tls = gear_net::cluster_file::ClusterTls {
                    ca: ca.into(),
                    domain: self.tls_domain.clone(),
                    cert: cert.as_ref().map(Into::into),
                    key: key.as_ref().map(Into::into),
                };
                Some(tls.client_tls()?)
            }
        };
        Ok(config)
    }

    fn from_file(file: &ClusterFile) -> Result<Self> {
        let ms = |v: Option<u64>, default: f64| v.map_or(default, |ms| ms as f64 / 1000.0);
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let tls = file.tls.as_ref();
        Ok(Settings {
            shards: file.shards.clone(),
            table: file.table.clone(),
            token: file.token.clone(),
            call_timeout: ms(file.call_timeout_ms, 10.0),
            connect_timeout: ms(file.connect_timeout_ms, 1.0),
            mass_refresh: ms(file.mass_refresh_ms, 0.1),
            free_space_refresh: ms(file.free_space_refresh_ms, 0.5),
            seed: 0,
            data_plane: "auto".into(),
            // Absolute, so a process started elsewhere finds them too.
            tls_ca: tls.map(|t| path(&absolute(&t.ca))),
            tls_domain: tls.and_then(|t| t.domain.clone()),
            tls_cert: tls.and_then(|t| t.cert.as_deref().map(|p| path(&absolute(p)))),
            tls_key: tls.and_then(|t| t.key.as_deref().map(|p| path(&absolute(p)))),
            rdma_device: file.rdma.device.clone(),
            rdma_port: file.rdma.port,
            rdma_gid_index: file.rdma.gid_index,
            rdma_traffic_class: file.rdma.traffic_class,
            rdma_service_level: file.rdma.service_level,
        })
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shards", &self.shards)?;
        d.set_item("table", &self.table)?;
        d.set_item("token", &self.token)?;
        d.set_item("call_timeout", self.call_timeout)?;
        d.set_item("connect_timeout", self.connect_timeout)?;
        d.set_item("mass_refresh", self.mass_refresh)?;
        d.set_item("free_space_refresh", self.free_space_refresh)?;
        d.set_item("seed", self.seed)?;
        d.set_item("data_plane", &self.data_plane)?;
        d.set_item("tls_ca", &self.tls_ca)?;
        d.set_item("tls_domain", &self.tls_domain)?;
        d.set_item("tls_cert", &self.tls_cert)?;
        d.set_item("tls_key", &self.tls_key)?;
        d.set_item("rdma_device", &self.rdma_device)?;
        d.set_item("rdma_port", self.rdma_port)?;
        d.set_item("rdma_gid_index", self.rdma_gid_index)?;
        d.set_item("rdma_traffic_class", self.rdma_traffic_class)?;
        d.set_item("rdma_service_level", self.rdma_service_level)?;
        Ok(d)
    }

    fn from_dict(d: &Bound<'_, PyDict>) -> Result<Self> {
        fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> Result<T> {
            let value = d.get_item(key)?.ok_or_else(|| Error::Spec(format!("cluster state has no `{key}`")))?;
            value.extract().map_err(|_| Error::Spec(format!("cluster state `{key}` has the wrong type")))
        }
        Ok(Settings {
            shards: get(d, "shards")?,
            table: get(d, "table")?,
            token: get(d, "token")?,
            call_timeout: get(d, "call_timeout")?,
            connect_timeout: get(d, "connect_timeout")?,
            mass_refresh: get(d, "mass_refresh")?,
            free_space_refresh: get(d, "free_space_refresh")?,
            seed: get(d, "seed")?,
            data_plane: get(d, "data_plane")?,
            tls_ca: get(d, "tls_ca")?,
            tls_domain: get(d, "tls_domain")?,
            tls_cert: get(d, "tls_cert")?,
            tls_key: get(d, "tls_key")?,
            rdma_device: get(d, "rdma_device")?,
            rdma_port: get(d, "rdma_port")?,
            rdma_gid_index: get(d, "rdma_gid_index")?,
            rdma_traffic_class: get(d, "rdma_traffic_class")?,
            rdma_service_level: get(d, "rdma_service_level")?,
        })
    }
}

fn absolute(p: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// The table every shard holds, as the first shard to answer described it.
#[derive(Debug)]
pub(crate) struct ClusterSpec {
    pub(crate) spec: TableSpec,
    pub(crate) infos: Arc<[ColumnInfo]>,
    /// The sampling strategy's name.
    pub(crate) sampler: String,
}

/// A sharded table served by `gear serve` processes (one shard each),
/// reached over gRPC. `shards`: `host:port` of each server, in shard order.
/// `token`: the cluster token (`None`: the `GEAR_TOKEN` environment
/// variable). Deadlines in seconds. `tls_ca` (the cluster's CA, PEM),
/// `tls_domain` (the name in the servers' certificates), `tls_cert` and
/// `tls_key` (mutual TLS). A `Cluster` pickles as this configuration, so
/// DataLoader workers, `multiprocessing` children and Ray actors each open
/// their own connections (a token given here travels in the pickle; one
/// from `GEAR_TOKEN` is read again where it is unpickled).
#[pyclass(module = "gear._gear", frozen)]
pub struct Cluster {
    client: Arc<ClusterClient>,
    settings: Settings,
    spec: Mutex<Option<Arc<ClusterSpec>>>,
}

impl Cluster {
    fn open(settings: Settings) -> Result<Self> {
        let client = ClusterClient::new(settings.client_config()?)?;
        Ok(Cluster { client: Arc::new(client), settings, spec: Mutex::new(None) })
    }

    /// The shards' table spec, asked once (of the first shard that answers).
    pub(crate) fn spec(&self, py: Python<'_>) -> Result<Arc<ClusterSpec>> {
        if let Some(spec) = self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(spec);
        }
        let client = self.client.clone();
        let answer = wait::off_thread(py, move || {
            let mut last = None;
            for s in 0..client.shards() {
                match client.spec(s) {
                    Ok(spec) => return Ok((spec.table, spec.sampler)),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| gear_net::Error::NoShard("the cluster has no shards".into())))
        })?;
        let (spec, sampler) = answer?;
        let infos = crate::table::infos_of(&spec);
        let spec = Arc::new(ClusterSpec { spec, infos, sampler });
        *self.spec.lock().unwrap_or_else(|e| e.into_inner()) = Some(spec.clone());
        Ok(spec)
    }

    pub(crate) fn client(&self) -> &Arc<ClusterClient> {
        &self.client
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.settings.call_timeout)
    }
}

/// A `PartialInsertError` carrying what was committed: `committed` as a
/// list of `(index, key)`, and `indices` / `keys` as arrays.
pub(crate) fn partial_insert(py: Python<'_>, e: gear_net::Error) -> PyErr {
    let gear_net::Error::PartialInsert { committed, .. } = &e else {
        return Error::Net(e).into();
    };
    let build = || -> PyResult<PyErr> {
        let err = PartialInsertError::new_err(e.to_string());
        let value = err.value(py);
        let indices: Vec<i64> = committed.iter().map(|(i, _)| *i as i64).collect();
        let remote: Vec<gear_net::RemoteKey> = committed.iter().map(|(_, k)| *k).collect();
        let keys = keys::to_array(py, &remote)?;
        let list = PyList::empty(py);
        for (n, &i) in indices.iter().enumerate() {
            list.append((i, keys.get_item(n)?))?;
        }
        value.setattr("committed", list)?;
        value.setattr("indices", numpy::PyArray1::from_vec(py, indices))?;
        value.setattr("keys", keys)?;
        Ok(err)
    };
    build().unwrap_or_else(|e| e)
}

#[pymethods]
impl Cluster {
    #[new]
    #[pyo3(signature = (
        shards, token=None, *, table=None, call_timeout=10.0, connect_timeout=1.0, tls_ca=None, tls_domain=None,
        tls_cert=None, tls_key=None, mass_refresh=0.1, free_space_refresh=0.5, seed=0, data_plane="auto"
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        shards: Vec<String>,
        token: Option<String>,
        table: Option<String>,
        call_timeout: f64,
        connect_timeout: f64,
        tls_ca: Option<std::path::PathBuf>,
        tls_domain: Option<String>,
        tls_cert: Option<std::path::PathBuf>,
        tls_key: Option<std::path::PathBuf>,
        mass_refresh: f64,
        free_space_refresh: f64,
        seed: u64,
        data_plane: &str,
    ) -> PyResult<Self> {
        let path = |p: Option<std::path::PathBuf>| p.map(|p| absolute(&p).to_string_lossy().into_owned());
        let settings = Settings {
            shards,
            table,
            token,
            call_timeout,
            connect_timeout,
            mass_refresh,
            free_space_refresh,
            seed,
            data_plane: data_plane.to_owned(),
            tls_ca: path(tls_ca),
            tls_domain,
            tls_cert: path(tls_cert),
            tls_key: path(tls_key),
            rdma_device: None,
            rdma_port: RdmaSettings::default().port,
            rdma_gid_index: RdmaSettings::default().gid_index,
            rdma_traffic_class: RdmaSettings::default().traffic_class,
            rdma_service_level: RdmaSettings::default().service_level,
        };
        Ok(Cluster::open(settings)?)
    }

    /// Opens the cluster a cluster file describes (the file `gear
    /// cluster-info --cluster` reads: `shards`, `token`, deadlines,
    /// `[tls]`, `[rdma]`).
    #[staticmethod]
    fn from_file(path: std::path::PathBuf) -> PyResult<Self> {
        let file = ClusterFile::load(&path).map_err(Error::from)?;
        Ok(Cluster::open(Settings::from_file(&file)?)?)
    }

    /// Reopens a cluster from its pickled configuration.
    #[staticmethod]
    fn _from_state(state: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(Cluster::open(Settings::from_dict(state)?)?)
    }

    /// Pickles as the configuration (see the class doc).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        let state = slf.get().settings.to_dict(slf.py())?;
        Ok((slf.get_type().getattr("_from_state")?, (state,)))
    }

    /// The same configuration with another seed (of the client's row
    /// split), as a new connection: what DataLoader workers use.
    fn with_seed(&self, seed: u64) -> PyResult<Self> {
        Ok(Cluster::open(Settings { seed, ..self.settings.clone() })?)
    }

    /// `host:port` of each shard, in shard order.
    #[getter]
    fn shards(&self) -> Vec<String> {
        self.settings.shards.clone()
    }

    /// `[(name, dtype name, shape), ...]` of the shards' table.
    #[getter]
    fn columns(&self, py: Python<'_>) -> PyResult<Vec<(String, String, Vec<usize>)>> {
        let spec = self.spec(py)?;
        Ok(spec.infos.iter().map(|c| (c.name.clone(), c.dtype.name().to_owned(), c.shape.clone())).collect())
    }

    /// Steps per trajectory at most.
    #[getter]
    fn max_len(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.spec(py)?.spec.max_len())
    }

    /// Every shard's counters, in shard order: a dict per shard (`shard`,
    /// `address`, `incarnation`, `size`, `capacity`, `inserts`,
    /// `samples`, `evictions`, `bytes_written`, `bytes_gathered`,
    /// `total_mass`, `min_mass`, `held_inserts`: trajectories it refused
    /// because its rate limiter held them past their begin wait,
    /// `rows_overwritten`: rows of replies sent from its table's memory
    /// whose slots were reused meanwhile, so asked again), or for
    /// a shard that did not answer
    /// `shard`, `address` and `error`.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let client = self.client.clone();
        let answers = wait::off_thread(py, move || {
            (0..client.shards()).map(|s| client.info(s).map_err(|e| e.to_string())).collect::<Vec<_>>()
        })?;
        let out = PyList::empty(py);
        for (s, answer) in answers.into_iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("shard", s)?;
            d.set_item("address", &self.settings.shards[s])?;
            match answer {
                Ok(i) => {
                    d.set_item("incarnation", i.incarnation)?;
                    d.set_item("size", i.size)?;
                    d.set_item("capacity", i.capacity)?;
                    d.set_item("inserts", i.inserts)?;
                    d.set_item("samples", i.samples)?;
                    d.set_item("evictions", i.evictions)?;
                    d.set_item("bytes_written", i.bytes_written)?;
                    d.set_item("bytes_gathered", i.bytes_gathered)?;
                    d.set_item("total_mass", i.total_mass)?;
                    d.set_item("min_mass", i.min_mass)?;
                    d.set_item("held_inserts", i.held_inserts)?;
                    d.set_item("rows_overwritten", i.rows_overwritten)?;
                }
                Err(e) => d.set_item("error", e)?,
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// Sets priorities by key (a cluster batch's `keys`), each update sent
    /// to the shard that holds it. Returns `(applied, stale)`: stale keys
    /// (evicted, or from an earlier run of their shard) are ignored. A NaN,
    /// negative or infinite priority refuses the whole call; a shard that
    /// cannot be reached raises.
    fn update_priorities(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        priorities: &Bound<'_, PyAny>,
    ) -> PyResult<(u64, u64)> {
        let keys = keys::from_object(keys)?;
        let priorities = crate::table::float_vec(priorities, "priorities")?;
        if keys.len() != priorities.len() {
            return Err(Error::Step(format!("{} keys but {} priorities", keys.len(), priorities.len())).into());
        }
        for &p in &priorities {
            gear_core::check_priority(p).map_err(Error::from)?;
        }
        let updates: Vec<(gear_net::RemoteKey, f64)> = keys.into_iter().zip(priorities).collect();
        let client = self.client.clone();
        let done = wait::off_thread(py, move || client.update_priorities(&updates))?.map_err(Error::from)?;
        Ok((done.applied, done.stale))
    }

    /// A sampler of `batch_size` rows drawn across the shards with one
    /// table's distribution (uniform or prioritized). Arguments as for
    /// `Table.sampler`; `timeout`: how long `sample()` waits while no
    /// shard holds items (or every shard is lost) before it raises.
    /// `prefetch`, `transform`: batches a Rust thread draws ahead, and
    /// what it makes of each (as for `Table.sampler`).
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
    ) -> PyResult<ClusterSampler> {
        let spec = self.spec(py)?;
        let window = crate::table::window_spec(spec.spec.max_len(), window, offset, pad)?;
        let request =
            ClusterSample { rows: batch_size as u64, window, columns: columns.unwrap_or_default(), random_start };
        Ok(ClusterSampler::new(py, self, &spec, request, wait::seconds(timeout, "timeout")?, prefetch, transform)?)
    }

    /// A writer for remote actors. `target`: `"round_robin"` (the next
    /// live shard for each trajectory), `"most_free"` (the shard with the
    /// most free slots) or a shard index. `timeout`: longest wait, in
    /// seconds, for a shard to take a chunk (`None`: as long as it takes;
    /// Ctrl-C still interrupts). `chunk_steps`: steps sent per chunk of a
    /// `trajectory()` (`None`: as many as fit 1 MiB).
    #[pyo3(signature = (target=None, *, timeout=None, chunk_steps=None))]
    fn writer(
        &self,
        py: Python<'_>,
        target: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
        chunk_steps: Option<u64>,
    ) -> PyResult<ClusterWriter> {
        let target = match target {
            None => WriteTarget::RoundRobin,
            Some(t) => write_target(t, self.settings.shards.len())?,
        };
        let spec = self.spec(py)?;
        Ok(ClusterWriter::new(self, &spec, target, wait::seconds(timeout, "timeout")?, chunk_steps)?)
    }

    fn __repr__(&self) -> String {
        format!("Cluster(shards={:?})", self.settings.shards)
    }
}

fn write_target(target: &Bound<'_, PyAny>, shards: usize) -> Result<WriteTarget> {
    if let Ok(name) = target.extract::<String>() {
        return match name.as_str() {
            "round_robin" => Ok(WriteTarget::RoundRobin),
            "most_free" => Ok(WriteTarget::MostFree),
            other => {
                Err(Error::Spec(format!("target {other:?} is not \"round_robin\", \"most_free\" or a shard index")))
            }
        };
    }
    match target.extract::<usize>() {
        Ok(s) if s < shards => Ok(WriteTarget::Shard(s)),
        Ok(s) => Err(Error::Spec(format!("no shard {s}: the cluster has {shards}"))),
        Err(_) => Err(Error::Spec(format!(
            "target {} is not \"round_robin\", \"most_free\" or a shard index",
            crate::dtype::repr(target)
        ))),
    }
}
