//! The cluster client: one table's distribution over many shards.
//!
//! [`AsyncClusterClient`] is the client itself, async (its futures run in
//! any tokio runtime and may be dropped at any point: `cluster` module);
//! [`ClusterClient`] is a thin blocking wrapper over it with a small
//! runtime of its own, for trainers and actors with no async code.
//!
//! A batch is drawn in two steps. First the client takes every shard's size
//! and priority mass (as the shard's last `Sample` or `UpdatePriorities`
//! reply reported it, or asked with `Info`: the `masses` module says
//! when) and draws how many rows come from each shard, each row
//! independently with probability `mass_s / M` (`M = sum of masses`). Then
//! each shard draws its rows with its own strategy and gathers their
//! windows. A row's global probability is
//! `mass_s / M * p_local`, which for a proportional strategy is
//! `mass_i / M`, exactly what one table holding every item would give. The
//! importance weight is `(P_norm / P)^beta`, where `P_norm` is the smallest
//! of the shards' smallest probabilities (from their freshest reports) and
//! of the batch's own probabilities: one table's weight when the reports
//! are current, and never above 1 when they are not (the `weights` module).
//! Between the report of a mass and the draw a shard may change (inserts,
//! updates by other clients): the reported probability is the one the row
//! was really drawn with (allocation from the reported masses, local
//! probability from the draw), so the bias of a stale total shows up in
//! the probabilities rather than hiding.
//!
//! Deterministic strategies (FIFO, LIFO, heaps) cannot be merged this way;
//! over more than one live shard they are refused.
//!
//! Every call has a deadline, to the last byte of its reply (`cluster`
//! module). A shard that fails (connection refused, deadline, unavailable,
//! stopped mid-reply) is left out of that batch and named in
//! [`ClusterBatch::lost`]; its rows are drawn from the others. While a
//! shard is lost every batch asks every shard (`Info`) first, so a
//! restarted shard rejoins on its own; its new incarnation makes keys from
//! its previous run stale.

use crate::error::{Error, Result};
use crate::proto;
use crate::rdma_settings::RdmaSettings;
use bytes::Bytes;
use gear_core::{TableSpec, Transport, WindowSpec};
use std::future::Future;
use std::mem::MaybeUninit;
use std::time::Duration;

mod assemble;
mod call;
mod cluster;
mod concurrent;
mod insert;
mod masses;
mod session;
mod spread;
mod stream;
mod tables;
mod weights;
mod wire;

pub use cluster::AsyncClusterClient;
pub use insert::{HELD_INSERT_SLICE, HELD_INSERT_SLICE_MAX, TRAJECTORIES_PER_STREAM};
pub use stream::TrajectoryStream;
pub use tables::{ShardTables, TableStatus};

mod data_plane;
pub use data_plane::{DataPlane, MAX_READ_ATTEMPTS};

/// A key of a cluster: the shard, the shard's incarnation, and the slot key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteKey {
    /// The shard's index in the cluster.
    pub shard: u32,
    /// The run of the shard server that made the key.
    pub incarnation: u64,
    /// Slot index inside the shard.
    pub slot: u32,
    /// Generation of the slot when the key was made.
    pub generation: u32,
}

impl RemoteKey {
    pub(crate) fn from_proto(k: &proto::Key) -> Self {
        RemoteKey { shard: k.shard, incarnation: k.incarnation, slot: k.slot, generation: k.generation }
    }

    pub(crate) fn to_proto(self) -> proto::Key {
        proto::Key { shard: self.shard, incarnation: self.incarnation, slot: self.slot, generation: self.generation }
    }
}

/// How the client reaches the cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `host:port` of each shard server, index = shard id.
    pub shards: Vec<String>,
    /// The table every call of this client uses, by its name on the
    /// shards; empty: each shard's only table (refused, listing the
    /// tables, by a shard that serves several).
    pub table: String,
    /// The cluster token.
    pub token: String,
    /// Deadline of each call: everything one method does (every shard
    /// call, from its request to the last byte of its reply) ends within
    /// it; an insert gives each of its streams this long.
    pub call_timeout: Duration,
    /// Deadline of connecting.
    pub connect_timeout: Duration,
    /// How often each connection pings its shard (HTTP/2 PING), idle or
    /// not (default 10 s).
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed
    /// (default 10 s): a frozen or unreachable shard's connection is then
    /// dropped, and the next call connects anew.
    pub keepalive_timeout: Duration,
    /// Largest message received or sent.
    pub max_message_bytes: usize,
    /// Seed of the row allocation.
    pub seed: u64,
    /// How often [`WriteTarget::MostFree`] asks the shards' sizes again
    /// (between refreshes it counts what it sent).
    pub free_space_refresh: Duration,
    /// TLS towards the shards (`None`: plain TCP).
    pub tls: Option<crate::tls::ClientTls>,
    /// How long a shard's mass, as its last reply reported it, is used to
    /// split batches before every shard is asked again (`Info`); replies to
    /// `Sample` and `UpdatePriorities` renew it, so only a shard drawn no
    /// rows for this long is asked. `Duration::ZERO`: ask before every
    /// batch. Default 100 ms. See the `masses` module for the staleness
    /// this allows.
    pub mass_refresh: Duration,
    /// How sampled windows travel (default [`DataPlane::Auto`]).
    pub data_plane: DataPlane,
    /// The RDMA device port the byte-range data plane opens (default: the
    /// first device, port 1, GID index 0); unused when a transport is
    /// given to [`AsyncClusterClient::with_transport`].
    pub rdma: RdmaSettings,
}

impl ClusterConfig {
    /// Shards at `addresses`, 10 s call deadlines, 1 s connect deadline,
    /// pings every 10 s answered within 10 s, the default RDMA device
    /// settings.
    pub fn new(addresses: Vec<String>, token: impl Into<String>) -> Self {
        ClusterConfig {
            shards: addresses,
            table: String::new(),
            token: token.into(),
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
            max_message_bytes: crate::server::DEFAULT_MAX_MESSAGE_BYTES as usize,
            seed: 0,
            free_space_refresh: Duration::from_millis(500),
            mass_refresh: Duration::from_millis(100),
            tls: None,
            data_plane: DataPlane::default(),
            rdma: RdmaSettings::default(),
        }
    }
}

/// A shard left out of a call, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostShard {
    /// The shard's index.
    pub shard: usize,
    /// What failed.
    pub reason: String,
}

/// A batch drawn across shards. Rows are grouped by shard.
#[derive(Clone, Debug, Default)]
pub struct ClusterBatch {
    /// Per requested column, `rows x window x step bytes`.
    pub columns: Vec<Vec<u8>>,
    /// Key of each row.
    pub keys: Vec<RemoteKey>,
    /// Valid steps of each row.
    pub lengths: Vec<u64>,
    /// The stored step each row's window starts at.
    pub starts: Vec<u64>,
    /// Global probability of each row.
    pub probabilities: Vec<f64>,
    /// Global importance weight of each row (largest possible is 1).
    pub weights: Vec<f64>,
    /// Shards left out of this batch.
    pub lost: Vec<LostShard>,
    /// Shards that answered again after being lost, or with a new incarnation.
    pub rejoined: Vec<usize>,
}

/// What to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSample {
    /// Rows in the batch.
    pub rows: u64,
    /// The window of each row.
    pub window: WindowSpec,
    /// Columns by name; empty: all.
    pub columns: Vec<String>,
    /// Start each row's window at a uniformly random step of its trajectory
    /// (R2D2-style sequences; [`gear_api::SampleConfig::random_start`] on
    /// the shard) instead of at `window.offset`, which is then not used.
    /// [`BatchRows::starts`] says where each row begins.
    pub random_start: bool,
}

/// One trajectory to insert remotely.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteTrajectory {
    /// Steps.
    pub steps: u64,
    /// One buffer per column: `steps x step bytes`. [`Bytes`] so that
    /// sending (and resending the same data) never copies it; a `Vec<u8>`
    /// converts with `.into()` without a copy.
    pub columns: Vec<Bytes>,
    /// Priority (`None`: the strategy's default).
    pub priority: Option<f64>,
}

/// Where a writer's trajectories go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteTarget {
    /// This shard.
    Shard(usize),
    /// The next live shard, in turn.
    RoundRobin,
    /// The shard with the most free slots (capacity − size, from each
    /// shard's `Info` asked at most every
    /// [`ClusterConfig::free_space_refresh`]; ties to the lowest shard id).
    /// See the `spread` module.
    MostFree,
}

/// The per-row fields of a batch written into the caller's buffers
/// ([`AsyncClusterClient::sample_into`]); its vectors are cleared and
/// refilled by each call, so one `BatchRows` reused across batches
/// allocates nothing once it has grown to the batch's size.
#[derive(Clone, Debug, Default)]
pub struct BatchRows {
    /// Key of each row.
    pub keys: Vec<RemoteKey>,
    /// Valid steps of each row.
    pub lengths: Vec<u64>,
    /// The stored step each row's window starts at.
    pub starts: Vec<u64>,
    /// Global probability of each row.
    pub probabilities: Vec<f64>,
    /// Global importance weight of each row, in (0, 1].
    pub weights: Vec<f64>,
    /// Shards left out of this batch.
    pub lost: Vec<LostShard>,
    /// Shards that answered again after being lost, or with a new incarnation.
    pub rejoined: Vec<usize>,
}

impl BatchRows {
    /// Empties every field, keeping the vectors' capacity.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.lengths.clear();
        self.starts.clear();
        self.probabilities.clear();
        self.weights.clear();
        self.lost.clear();
        self.rejoined.clear();
    }
}

impl ClusterBatch {
    /// A batch of `columns` whose rows `rows` describes.
    fn from_parts(columns: Vec<Vec<u8>>, rows: BatchRows) -> Self {
        let BatchRows { keys, lengths, starts, probabilities, weights, lost, rejoined } = rows;
        ClusterBatch { columns, keys, lengths, starts, probabilities, weights, lost, rejoined }
    }
}

/// What [`AsyncClusterClient::update_priorities`] did with the updates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriorityUpdates {
    /// Updates applied.
    pub applied: u64,
    /// Updates ignored because their key is stale: its item was evicted or
    /// replaced, or the key is from a previous run of its shard.
    pub stale: u64,
}

/// One shard's counters ([`AsyncClusterClient::info`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardInfo {
    /// The shard's id (its index in the cluster).
    pub shard: u32,
    /// The table's name on the shard.
    pub table: String,
    /// The table's run on the shard server (what its keys carry).
    pub incarnation: u64,
    /// Items stored.
    pub size: u64,
    /// Slots.
    pub capacity: u64,
    /// Trajectories inserted since the table was made (or restored).
    pub inserts: u64,
    /// Rows sampled.
    pub samples: u64,
    /// Items evicted.
    pub evictions: u64,
    /// Step bytes written.
    pub bytes_written: u64,
    /// Window bytes gathered for samples.
    pub bytes_gathered: u64,
    /// Sum of the items' selection masses (`p^alpha`, prioritized; else the
    /// size; 0 for deterministic strategies).
    pub total_mass: f64,
    /// Smallest selection mass of a stored item.
    pub min_mass: f64,
    /// Trajectories the shard refused because it could not begin them
    /// within their insert stream's begin wait (its rate limiter held
    /// them; a spreading writer sent them on to another shard).
    pub held_inserts: u64,
    /// Rows of replies the shard sent from its table's memory whose slots
    /// were reused while they were sent (the client asked again).
    pub rows_overwritten: u64,
}

impl ShardInfo {
    pub(crate) fn from_proto(r: &proto::InfoReply) -> Self {
        ShardInfo {
            shard: r.shard,
            table: r.table.clone(),
            incarnation: r.incarnation,
            size: r.size,
            capacity: r.capacity,
            inserts: r.inserts,
            samples: r.samples,
            evictions: r.evictions,
            bytes_written: r.bytes_written,
            bytes_gathered: r.bytes_gathered,
            total_mass: r.total_mass,
            min_mass: r.min_mass,
            held_inserts: r.held_inserts,
            rows_overwritten: r.rows_overwritten,
        }
    }
}

/// One shard's table and sampling strategy ([`AsyncClusterClient::spec`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardSpec {
    /// The shard's id.
    pub shard: u32,
    /// The table's name on the shard.
    pub name: String,
    /// The table's run on the shard server.
    pub incarnation: u64,
    /// The table's spec.
    pub table: TableSpec,
    /// The sampling strategy's name (`uniform`, `prioritized`, `fifo`, ...).
    pub sampler: String,
    /// The prioritized strategy's exponents (0 for other strategies).
    pub alpha: f64,
    /// See `alpha`.
    pub beta: f64,
    /// The shared-memory name of the shard's table region (empty for a
    /// table in private memory).
    pub region_name: String,
    /// The region's length in bytes.
    pub region_bytes: u64,
}

impl ShardSpec {
    pub(crate) fn from_proto(r: &proto::SpecReply) -> Result<Self> {
        let region = r.region.clone().unwrap_or_default();
        Ok(ShardSpec {
            shard: r.shard,
            name: r.table.clone(),
            incarnation: r.incarnation,
            table: crate::convert::spec_from_proto(r)?,
            sampler: r.sampler.clone(),
            alpha: r.alpha,
            beta: r.beta,
            region_name: region.name,
            region_bytes: region.len,
        })
    }
}

/// A client of every shard of a cluster whose methods block: a thin
/// wrapper that runs [`AsyncClusterClient`]'s futures on a small tokio
/// runtime of its own, so trainers and actors need no async code.
///
/// It is not for async code: called on a thread inside a tokio runtime's
/// context (its worker threads, its blocking threads, or under
/// `Runtime::enter`), where blocking would stall the runtime (tokio
/// refuses with a panic), every method returns [`Error::InsideRuntime`];
/// use [`ClusterClient::as_async`] (or an [`AsyncClusterClient`]) there.
/// Dropping it inside a runtime is fine (its runtime shuts down in the
/// background).
pub struct ClusterClient {
    inner: AsyncClusterClient,
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient").field("shards", &self.inner.config().shards).finish()
    }
}

/// Ends `runtime` without blocking when on a thread where blocking is not
/// allowed (inside another runtime), where dropping it would panic.
fn release(runtime: tokio::runtime::Runtime) {
    if tokio::runtime::Handle::try_current().is_ok() {
        runtime.shutdown_background();
    } else {
        drop(runtime);
    }
}

/// Armed while a task borrows from the caller's stack: dropped by an
/// unwind before the task is over, it ends the process rather than let the
/// task write into freed memory (`ClusterClient::run_as_task`).
struct TaskOutlivesCaller;

impl Drop for TaskOutlivesCaller {
    fn drop(&mut self) {
        tracing::error!("a cluster client call unwound while its task still borrowed the caller's buffers; aborting");
        std::process::abort();
    }
}

impl Drop for ClusterClient {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            release(runtime);
        }
    }
}

impl ClusterClient {
    /// Prepares channels to every shard (connections open lazily, so a
    /// shard that is down now can join later). The byte-range data plane
    /// opens the RDMA device `config.rdma` names, if it can.
    pub fn new(config: ClusterConfig) -> Result<Self> {
        Self::new_inner(config, None)
    }

    /// As [`ClusterClient::new`], with `transport` carrying the byte-range
    /// data plane (see [`AsyncClusterClient::with_transport`]).
    pub fn with_transport(config: ClusterConfig, transport: Box<dyn Transport>) -> Result<Self> {
        Self::new_inner(config, Some(transport))
    }

    fn new_inner(config: ClusterConfig, transport: Option<Box<dyn Transport>>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gear-cluster-client")
            .enable_all()
            .build()?;
        let inner = {
            let _entered = runtime.enter();
            AsyncClusterClient::new_inner(config, transport)
        };
        match inner {
            Ok(inner) => Ok(ClusterClient { inner, runtime: Some(runtime) }),
            Err(e) => {
                release(runtime);
                Err(e)
            }
        }
    }

    /// The async client this one wraps: for async code, and for calls from
    /// inside a runtime.
    pub fn as_async(&self) -> &AsyncClusterClient {
        &self.inner
    }

    /// Runs `call` to its end on the client's runtime; refused inside a
    /// runtime (see the type's doc).
    fn block_on<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        self.runtime()?.block_on(call)
    }

    /// The client's runtime, to block on from this thread; refused inside
    /// a runtime (see the type's doc).
    fn runtime(&self) -> Result<&tokio::runtime::Runtime> {
        match &self.runtime {
            Some(runtime) if tokio::runtime::Handle::try_current().is_err() => Ok(runtime),
            _ => Err(Error::InsideRuntime),
        }
    }

    /// Runs `call` to its end as a task on one of the client's runtime
    /// threads, while the caller's thread waits; refused inside a runtime
    /// (see the type's doc).
    ///
    /// For the sampling calls: a reply's frames are read by the runtime's
    /// threads, so decoding them on one of those threads (often the one
    /// that has just read the frame, with its bytes still in that core's
    /// cache) spares a thread wake-up per frame and a trip through memory.
    /// Measured in docs/PERFORMANCE.md ("Sampling calls decoded on the
    /// runtime's threads").
    ///
    /// `call` may borrow from the caller (its buffers), which a spawned
    /// task may not; this returns only once the task is over, so no
    /// borrow outlives it.
    fn run_as_task<'a, T: Send + 'static>(&'a self, call: impl Future<Output = Result<T>> + Send + 'a) -> Result<T> {
        let runtime = self.runtime()?;
        let call: std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>> = Box::pin(call);
        // SAFETY: only the lifetime changes. The task borrows from the
        // caller for `'a`, and this function does not return (nor unwind:
        // `TaskOutlivesCaller` aborts the process first) until the task's
        // future is gone. `block_on` of its join handle ends only when the
        // task has finished (tokio drops the future as it stores the
        // output), panicked or been cancelled (tokio drops the future
        // before it wakes the handle). The runtime cannot shut down
        // meanwhile: it is dropped only with `self`, which `'a` borrows.
        let call: std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'static>> =
            unsafe { std::mem::transmute(call) };
        let guard = TaskOutlivesCaller;
        let joined = runtime.block_on(runtime.spawn(call));
        std::mem::forget(guard);
        match joined {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Config(format!("the client's runtime ended a call: {e}"))),
        }
    }

    /// The client's runtime, for work that outlives one call (a
    /// trajectory's stream); refused inside a runtime.
    fn handle(&self) -> Result<tokio::runtime::Handle> {
        Ok(self.runtime()?.handle().clone())
    }

    /// Number of shards in the config.
    pub fn shards(&self) -> usize {
        self.inner.shards()
    }

    /// The spec of shard `shard` (every shard of a table has the same).
    pub fn spec(&self, shard: usize) -> Result<ShardSpec> {
        self.block_on(self.inner.spec(shard))
    }

    /// Counters of shard `shard`.
    pub fn info(&self, shard: usize) -> Result<ShardInfo> {
        self.block_on(self.inner.info(shard))
    }

    /// The tables shard `shard` serves, with their counters (see
    /// [`AsyncClusterClient::tables`]).
    pub fn tables(&self, shard: usize) -> Result<ShardTables> {
        self.block_on(self.inner.tables(shard))
    }

    /// Bytes of each column buffer a batch of `request` fills (see
    /// [`AsyncClusterClient::column_bytes`]).
    pub fn column_bytes(&self, request: &ClusterSample) -> Result<Vec<usize>> {
        self.block_on(self.inner.column_bytes(request))
    }

    /// Draws one batch across every live shard with one table's
    /// distribution (see the module doc).
    pub fn sample(&self, request: &ClusterSample) -> Result<ClusterBatch> {
        self.run_as_task(self.inner.sample(request))
    }

    /// Draws one batch into the caller's buffers, reused across batches
    /// (see [`AsyncClusterClient::sample_into`]).
    pub fn sample_into(&self, request: &ClusterSample, columns: &mut [&mut [u8]], rows: &mut BatchRows) -> Result<()> {
        self.run_as_task(self.inner.sample_into(request, columns, rows))
    }

    /// [`ClusterClient::sample_into`] into possibly uninitialised buffers
    /// (see [`AsyncClusterClient::sample_into_uninit`]).
    pub fn sample_into_uninit(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        rows: &mut BatchRows,
    ) -> Result<()> {
        self.run_as_task(self.inner.sample_into_uninit(request, columns, rows))
    }

    /// Draws a batch from one shard only (its own probabilities and
    /// weights; for deterministic strategies).
    pub fn sample_shard(&self, shard: usize, request: &ClusterSample) -> Result<ClusterBatch> {
        self.run_as_task(self.inner.sample_shard(shard, request))
    }

    /// Sends each update to the shard that owns its key; returns how many
    /// were applied and how many were stale (see
    /// [`AsyncClusterClient::update_priorities`]).
    pub fn update_priorities(&self, updates: &[(RemoteKey, f64)]) -> Result<PriorityUpdates> {
        self.block_on(self.inner.update_priorities(updates))
    }

    /// Inserts whole trajectories into `target` (see
    /// [`AsyncClusterClient::insert`]).
    pub fn insert(
        &self,
        target: WriteTarget,
        trajectories: Vec<RemoteTrajectory>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        self.block_on(self.inner.insert(target, trajectories, chunk_steps))
    }

    /// How `sample(request)` moves the windows: `Some(kind)` when by byte
    /// ranges over that transport, `None` when the shards gather them.
    pub fn data_plane_for(&self, request: &ClusterSample) -> Result<Option<gear_core::TransportKind>> {
        self.block_on(self.inner.data_plane_for(request))
    }

    /// The kind of the transport byte-range sampling uses, once the first
    /// `sample` made it (`None`: shard-gather only).
    pub fn data_plane_kind(&self) -> Option<gear_core::TransportKind> {
        self.inner.data_plane_kind()
    }
}

// Documented behaviour: a `ClusterClient` (its runtime, its channels) may
// move between threads and be shared by them.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<ClusterClient>();
    send_and_sync::<AsyncClusterClient>();
};
