//! [`AsyncClusterClient`]: the cluster client itself, async; the blocking
//! [`ClusterClient`](super::ClusterClient) runs its futures on a runtime of
//! its own.
//!
//! Its futures run in any tokio runtime (current-thread included): a
//! method's calls to the shards are polled inside its own future, never
//! spawned, except inserts (one task per shard, aborted when the future is
//! dropped) and the byte-range data plane's blocking reads (one blocking
//! task that owns the data plane's lock until its reads have landed).
//! Dropping a future part way is therefore safe: its shard calls are
//! cancelled with it, no lock is held across a wait that could outlive it,
//! and the next call starts clean.
//!
//! Deadlines. Each method's whole work runs under one deadline,
//! `ClusterConfig::call_timeout` from its start (an insert: each stream
//! under its own): every shard call, from its request to its trailers, is
//! cut off there. A `sample` gives the `Info` round (when it needs one) a
//! quarter of the time left and each round of draws three quarters, so a
//! shard that stops mid-reply is cut off while there is still time to draw
//! its rows from the others; it is named in the batch's `lost`.

use super::assemble::{Assembly, Block, ColumnBase};
use super::data_plane::DataPlaneState;
use super::masses::ShardMasses;
use super::spread::FreeSpace;
use super::weights::WeightNorm;
use super::wire::{ReplyDecoder, ReplyMeta};
use super::{
    BatchRows, ClusterBatch, ClusterConfig, ClusterSample, LostShard, PriorityUpdates, RemoteKey, RemoteTrajectory,
    ShardInfo, ShardSpec, WriteTarget,
};
use crate::auth::TokenAttach;
use crate::channel::{ChannelSettings, ShardChannel};
use crate::error::{Error, Result};
use crate::proto::shard_client::ShardClient as GrpcShardClient;
use crate::proto::{self, InfoRequest, SampleRequest, SpecRequest, UpdateRequest};
use futures_util::stream::{FuturesUnordered, StreamExt};
use gear_core::{Pad, RandomSource, TableSpec, Transport, Xoshiro256};
use parking_lot::Mutex;
use std::future::Future;
use std::mem::MaybeUninit;
use std::sync::Arc;
use tokio::time::{Duration, Instant};
use tonic::codegen::http::HeaderValue;
use tonic::service::interceptor::InterceptedService;

/// The generated client of one shard, with the token attached.
pub(crate) type Grpc = GrpcShardClient<InterceptedService<ShardChannel, TokenAttach>>;

/// One shard's connection: the generated client for most calls, the
/// channel itself for `Sample` (decoded frame by frame: `call`).
pub(crate) struct ShardConn {
    pub(crate) grpc: Grpc,
    pub(crate) channel: ShardChannel,
}

/// What the client knows of one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardState {
    pub(crate) incarnation: Option<u64>,
    pub(crate) lost: bool,
    /// Its size and masses as last reported (`masses` module).
    pub(crate) mass: Option<super::masses::KnownMass>,
}

/// What one block of a cross-shard draw asked, for the rows it brings.
#[derive(Clone, Copy, Debug, Default)]
struct BlockAsk {
    shard: usize,
    rows: u64,
    /// The shard's mass and the total the split was made with.
    mass: f64,
    total: f64,
}

/// Buffers one `sample` call uses, kept between calls so that a trainer's
/// steady state allocates no batch-sized memory.
#[derive(Default)]
struct SampleScratch {
    row_bytes: Vec<usize>,
    bases: Vec<ColumnBase>,
    blocks: Vec<Block>,
    /// Per block (by tag): what it asked, and its reply's fields.
    asks: Vec<BlockAsk>,
    metas: Vec<ReplyMeta>,
    counts: Vec<u64>,
    /// The blocks of a round that ended, and whether each came whole.
    settled: Vec<(usize, bool)>,
    /// The shards' masses the split is made by.
    masses: ShardMasses,
}

/// The state every clone of an [`AsyncClusterClient`] shares.
pub(crate) struct ClientCore {
    pub(crate) shards: Vec<ShardConn>,
    pub(crate) config: ClusterConfig,
    /// `authorization: Bearer <token>`, for calls made by hand.
    token: HeaderValue,
    pub(crate) state: Mutex<Vec<ShardState>>,
    rng: Mutex<Xoshiro256>,
    pub(crate) next_writer: Mutex<usize>,
    /// What [`WriteTarget::MostFree`] knows of the shards' free slots.
    pub(crate) free_space: Mutex<FreeSpace>,
    /// The strategy's importance exponent, asked once (again after a
    /// shard rejoins).
    beta: Mutex<Option<f64>>,
    /// The table spec, asked once (every shard of a table has the same).
    spec: Mutex<Option<Arc<TableSpec>>>,
    /// The byte-range data plane; an async lock, because a blocking task
    /// holds it while reads land in its buffer.
    pub(crate) data_plane: Arc<tokio::sync::Mutex<DataPlaneState>>,
    /// Scratch of `sample` calls not running now.
    scratch: Mutex<Vec<SampleScratch>>,
    /// The byte-range transport's kind, once made (`None`: shard-gather).
    pub(crate) transport_kind: Mutex<Option<gear_core::TransportKind>>,
}

/// A scratch taken for one call, put back when the call ends or its
/// future is dropped.
struct ScratchGuard<'c> {
    core: &'c ClientCore,
    scratch: Option<SampleScratch>,
}

impl Drop for ScratchGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            self.core.scratch.lock().push(s);
        }
    }
}

/// The cluster client, async: each method is a future that works in any
/// tokio runtime and may be dropped at any point (the module doc says
/// what that leaves). Clones share the connections and the client's view
/// of the shards.
///
/// ```no_run
/// use gear_core::WindowSpec;
/// use gear_net::{AsyncClusterClient, BatchRows, ClusterConfig, ClusterSample};
///
/// # async fn trainer() -> gear_net::Result<()> {
/// let config = ClusterConfig::new(vec!["node0:50051".into(), "node1:50051".into()], "a-cluster-token-0123");
/// let cluster = AsyncClusterClient::new(config)?;
/// let request = ClusterSample { rows: 256, window: WindowSpec::last(1), columns: vec![] };
/// // Buffers the trainer owns (pinned memory, say), reused every batch.
/// let sizes = cluster.column_bytes(&request).await?;
/// let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
/// let mut rows = BatchRows::default();
/// for _step in 0..1000 {
///     let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
///     cluster.sample_into(&request, &mut views, &mut rows).await?;
///     // ... train on `columns`, weights in `rows.weights` ...
///     let updates: Vec<_> = rows.keys.iter().map(|&k| (k, 1.0)).collect();
///     cluster.update_priorities(&updates).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AsyncClusterClient {
    pub(crate) core: Arc<ClientCore>,
}

impl std::fmt::Debug for AsyncClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClusterClient").field("shards", &self.core.config.shards).finish()
    }
}

pub(crate) fn status(shard: usize, s: tonic::Status) -> Error {
    Error::Status { shard, status: Box::new(s) }
}

/// A shard address must be `host:port` with a port: a bare host would be
/// dialled on port 80 and fail only at the first call.
fn check_shard_address(shard: usize, addr: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::Config(format!("shard {shard} address `{addr}` {why}; expected host:port")));
    let Some((host, port)) = addr.rsplit_once(':') else {
        return bad("has no port");
    };
    if host.is_empty() || host.trim_matches(|c| c == '[' || c == ']').is_empty() {
        return bad("has no host");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => bad("has no valid port (1 to 65535)"),
        Ok(_) => Ok(()),
    }
}

/// Deadlines and ping intervals of zero would fail every call (or ping
/// without pause).
fn check_timeouts(config: &ClusterConfig) -> Result<()> {
    let zero = [config.call_timeout, config.connect_timeout, config.keepalive_interval, config.keepalive_timeout]
        .iter()
        .any(Duration::is_zero);
    if zero {
        return Err(Error::Config(format!(
            "call and connect deadlines and keepalive times must be above zero (call {:?}, connect {:?}, \
             keepalive every {:?}, answered within {:?})",
            config.call_timeout, config.connect_timeout, config.keepalive_interval, config.keepalive_timeout
        )));
    }
    Ok(())
}

/// The local probability of a shard's own draw, scaled to the cluster.
pub(crate) fn global_probability(local: f64, shard_mass: f64, total_mass: f64) -> f64 {
    if total_mass > 0.0 {
        local * shard_mass / total_mass
    } else {
        0.0
    }
}

/// A shard's call failed past `deadline`.
fn deadline_status(window: Duration) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!("no complete reply within the call's {window:?}"))
}

/// Runs a generated unary call to its trailers under `deadline`.
pub(crate) async fn within<T>(
    deadline: Instant,
    call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> std::result::Result<T, tonic::Status> {
    let window = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(deadline_status(window)),
    }
}

/// `now + fraction` of the time left before `deadline`.
fn share_of(deadline: Instant, numerator: u32, denominator: u32) -> Instant {
    let now = Instant::now();
    now + deadline.saturating_duration_since(now) * numerator / denominator
}

/// The request for `rows` rows of `table` from a shard the client knows as
/// `incarnation` (`None`: any run), answered before `deadline`.
pub(crate) fn sample_request(
    table: &str,
    request: &ClusterSample,
    rows: u64,
    deadline: Instant,
    incarnation: Option<u64>,
) -> SampleRequest {
    let window = deadline.saturating_duration_since(Instant::now());
    SampleRequest {
        table: table.to_owned(),
        rows,
        window_offset: request.window.offset,
        window_len: request.window.len,
        pad: match request.window.pad {
            Pad::Tail => proto::Pad::Tail as i32,
            Pad::Head => proto::Pad::Head as i32,
        },
        columns: request.columns.clone(),
        // The shard gives up waiting (for data, its rate limiter) a little
        // before the call's deadline, so its answer still arrives.
        timeout_ms: (window.as_millis() as u64).saturating_mul(3) / 4,
        ranges: false,
        incarnation: incarnation.unwrap_or(0),
        data_plane_session: 0,
    }
}

/// A shard's reply must have one entry per row in every per-row field.
pub(crate) fn check_sample_reply(shard: usize, rows: u64, r: &proto::SampleReply) -> Result<()> {
    let n = rows as usize;
    let counts = [r.keys.len(), r.lengths.len(), r.starts.len(), r.probabilities.len(), r.weights.len()];
    if counts.iter().any(|&c| c != n) {
        return Err(Error::Malformed { shard, what: format!("per-row fields have {counts:?} entries for {n} rows") });
    }
    if r.shard as usize != shard || r.keys.iter().any(|k| k.shard as usize != shard || k.incarnation != r.incarnation) {
        return Err(Error::Malformed { shard, what: "keys name another shard or run".into() });
    }
    if r.columns.iter().any(|c| c.len() % n.max(1) != 0) {
        return Err(Error::Malformed { shard, what: "a column buffer is not a whole number of rows".into() });
    }
    Ok(())
}

/// Whether a failed shard call must end the whole call: the request is
/// invalid or too large for the shard (every shard would refuse it).
pub(crate) fn refuses_the_request(s: &tonic::Status) -> bool {
    matches!(s.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted)
}

/// Views of `u8` buffers as possibly uninitialised bytes, for the writers
/// that take either.
pub(crate) fn as_uninit<'a>(columns: &'a mut [&mut [u8]]) -> Vec<&'a mut [MaybeUninit<u8>]> {
    columns
        .iter_mut()
        .map(|c| {
            // SAFETY: `MaybeUninit<u8>` has `u8`'s size and alignment, the
            // borrow carries over, and every writer here writes only
            // initialised bytes (copies of received or read bytes), so the
            // caller's buffers stay initialised.
            unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast::<MaybeUninit<u8>>(), c.len()) }
        })
        .collect()
}

impl AsyncClusterClient {
    /// Prepares channels to every shard (connections open on first use, so
    /// a shard that is down now can join later). Must be called inside a
    /// tokio runtime: a TLS channel's background task starts on it, and
    /// every channel's connections run on the runtime that first uses
    /// them. The byte-range data plane opens the RDMA device `config.rdma`
    /// names, if it can, at the first `sample`.
    pub fn new(config: ClusterConfig) -> Result<Self> {
        Self::new_inner(config, None)
    }

    /// As [`AsyncClusterClient::new`], with `transport` carrying the
    /// byte-range data plane instead of the RDMA device (`config.rdma` is
    /// not used and no device is opened): [`DataPlane::ByteRange`] and
    /// [`DataPlane::Auto`] read through it, whatever its kind;
    /// [`DataPlane::ByteRangeTcp`] still makes its own TCP transport and
    /// [`DataPlane::ShardGather`] uses none. This is how a caller brings its
    /// own RDMA verbs (gear-rdma's `RdmaTransport` over any `Verbs`, the
    /// in-process test fabric included).
    ///
    /// [`DataPlane::ByteRange`]: super::DataPlane::ByteRange
    /// [`DataPlane::Auto`]: super::DataPlane::Auto
    /// [`DataPlane::ByteRangeTcp`]: super::DataPlane::ByteRangeTcp
    /// [`DataPlane::ShardGather`]: super::DataPlane::ShardGather
    pub fn with_transport(config: ClusterConfig, transport: Box<dyn Transport>) -> Result<Self> {
        Self::new_inner(config, Some(transport))
    }

    pub(crate) fn new_inner(config: ClusterConfig, transport: Option<Box<dyn Transport>>) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Config(
                "AsyncClusterClient::new must be called inside a tokio runtime (or use the blocking ClusterClient)"
                    .into(),
            ));
        }
        config.rdma.validate()?;
        if config.shards.is_empty() {
            return Err(Error::Config("a cluster needs at least one shard".into()));
        }
        crate::auth::check_token(&config.token)?;
        check_timeouts(&config)?;
        for (s, addr) in config.shards.iter().enumerate() {
            check_shard_address(s, addr)?;
        }
        crate::alloc::keep_message_buffers();
        let attach = TokenAttach::new(&config.token)?;
        let token = HeaderValue::from_str(&format!("Bearer {}", config.token))
            .map_err(|_| Error::Config("cluster token must be printable ASCII without spaces".into()))?;
        let settings = ChannelSettings {
            connect_timeout: config.connect_timeout,
            keepalive_interval: config.keepalive_interval,
            keepalive_timeout: config.keepalive_timeout,
        };
        let mut shards = Vec::with_capacity(config.shards.len());
        for addr in &config.shards {
            let channel = ShardChannel::new(addr, config.tls.as_ref(), settings)?;
            let grpc = GrpcShardClient::with_interceptor(channel.clone(), attach.clone())
                .max_decoding_message_size(config.max_message_bytes)
                .max_encoding_message_size(config.max_message_bytes);
            shards.push(ShardConn { grpc, channel });
        }
        let state = (0..shards.len()).map(|_| ShardState::default()).collect();
        let rng = Xoshiro256::seed_from_u64(config.seed);
        let core = ClientCore {
            shards,
            config,
            token,
            state: Mutex::new(state),
            rng: Mutex::new(rng),
            next_writer: Mutex::new(0),
            free_space: Mutex::new(FreeSpace::default()),
            beta: Mutex::new(None),
            spec: Mutex::new(None),
            data_plane: Arc::new(tokio::sync::Mutex::new(DataPlaneState::with_supplied(transport))),
            scratch: Mutex::new(Vec::new()),
            transport_kind: Mutex::new(None),
        };
        Ok(AsyncClusterClient { core: Arc::new(core) })
    }

    /// Number of shards in the config.
    pub fn shards(&self) -> usize {
        self.core.shards.len()
    }

    /// The config the client was made with.
    pub fn config(&self) -> &ClusterConfig {
        &self.core.config
    }

    /// The spec of shard `shard` (every shard of a table has the same).
    pub async fn spec(&self, shard: usize) -> Result<ShardSpec> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        self.core.spec_of(shard, deadline).await
    }

    /// Counters of shard `shard`.
    pub async fn info(&self, shard: usize) -> Result<ShardInfo> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let mut c = self.core.grpc(shard)?;
        let request = InfoRequest { table: self.core.config.table.clone() };
        let reply = within(deadline, c.info(request)).await.map_err(|s| status(shard, s))?;
        Ok(ShardInfo::from_proto(&reply))
    }

    /// Bytes of each column buffer a batch of `request` fills (rows ×
    /// window × step bytes, in the request's column order): what
    /// [`AsyncClusterClient::sample_into`] needs. Refused, naming what was
    /// wrong, for a request the table cannot serve.
    pub async fn column_bytes(&self, request: &ClusterSample) -> Result<Vec<usize>> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let spec = self.core.cached_spec(deadline).await?;
        let mut row_bytes = Vec::new();
        self.core.check_request(&spec, request, &mut row_bytes)?;
        Ok(row_bytes.into_iter().map(|rb| rb * request.rows as usize).collect())
    }

    /// Draws one batch across every live shard with one table's
    /// distribution (see the `client` module doc), into new buffers.
    pub async fn sample(&self, request: &ClusterSample) -> Result<ClusterBatch> {
        let sizes = self.column_bytes(request).await?;
        let mut columns = Vec::with_capacity(sizes.len());
        for &n in &sizes {
            let mut c: Vec<u8> = Vec::new();
            c.try_reserve_exact(n).map_err(|e| Error::Config(format!("a batch column of {n} bytes: {e}")))?;
            columns.push(c);
        }
        let mut rows = BatchRows::default();
        {
            let mut views: Vec<&mut [MaybeUninit<u8>]> = columns.iter_mut().map(|c| c.spare_capacity_mut()).collect();
            self.sample_into_uninit(request, &mut views, &mut rows).await?;
        }
        for (c, &n) in columns.iter_mut().zip(&sizes) {
            // SAFETY: a successful `sample_into_uninit` wrote every byte of
            // the batch's rows, the first `n` bytes of each buffer (its
            // capacity is `n`).
            unsafe { c.set_len(n) };
        }
        Ok(ClusterBatch::from_parts(columns, rows))
    }

    /// Draws one batch as [`AsyncClusterClient::sample`] does, into the
    /// caller's buffers: column `c` of the request (every column of the
    /// spec when it names none) goes to the first
    /// [`column_bytes`](AsyncClusterClient::column_bytes)`()[c]` bytes of
    /// `columns[c]` (longer buffers are fine), rows in the order of
    /// `rows.keys`; each shard's reply is decoded straight into them as it
    /// arrives. `rows` is cleared and refilled, its vectors reused. Any
    /// `&mut [u8]` will do: pinned or registered memory included. On an
    /// error the buffers hold whatever had arrived.
    pub async fn sample_into(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [u8]],
        rows: &mut BatchRows,
    ) -> Result<()> {
        let mut views = as_uninit(columns);
        self.sample_into_uninit(request, &mut views, rows).await
    }

    /// [`AsyncClusterClient::sample_into`] into possibly uninitialised
    /// buffers; on success the batch's bytes of every buffer are
    /// initialised (only initialised bytes are ever written).
    pub async fn sample_into_uninit(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        rows: &mut BatchRows,
    ) -> Result<()> {
        rows.clear();
        if request.rows == 0 {
            return Err(Error::Config("a batch needs at least 1 row".into()));
        }
        let deadline = Instant::now() + self.core.config.call_timeout;
        if self.sample_by_ranges_into(request, columns, rows, deadline).await? {
            return Ok(());
        }
        self.core.sample_gathered(request, columns, rows, deadline).await
    }

    /// Draws a batch from one shard only (its own probabilities and
    /// weights; for deterministic strategies).
    pub async fn sample_shard(&self, shard: usize, request: &ClusterSample) -> Result<ClusterBatch> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let mut c = self.core.grpc(shard)?;
        let table = &self.core.config.table;
        let req = sample_request(table, request, request.rows, deadline, self.core.incarnation_of(shard));
        let reply = match within(deadline, c.sample(req)).await {
            Ok(r) => r,
            Err(e) => {
                self.core.mark_lost(shard, e.message());
                return Err(status(shard, e));
            }
        };
        check_sample_reply(shard, request.rows, &reply)?;
        let rejoined = self.core.mark_alive(shard, reply.incarnation);
        self.core.note_mass(shard, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
        Ok(ClusterBatch {
            keys: reply.keys.iter().map(RemoteKey::from_proto).collect(),
            columns: reply.columns.into_iter().map(Vec::from).collect(),
            lengths: reply.lengths,
            starts: reply.starts,
            probabilities: reply.probabilities,
            weights: reply.weights,
            lost: Vec::new(),
            rejoined: if rejoined { vec![shard] } else { Vec::new() },
        })
    }

    /// Sends each update to the shard that owns its key, every shard at
    /// once. Returns how many were applied and how many were stale (the
    /// key's item was evicted or replaced, or the key is from a previous
    /// run of its shard): `applied + stale == updates.len()`. A shard that
    /// cannot be reached is an error (the other shards' updates may have
    /// been applied).
    pub async fn update_priorities(&self, updates: &[(RemoteKey, f64)]) -> Result<PriorityUpdates> {
        let deadline = Instant::now() + self.core.config.call_timeout;
        let n = self.core.shards.len();
        let mut per_shard: Vec<Vec<proto::PriorityUpdate>> = vec![Vec::new(); n];
        for &(key, priority) in updates {
            let s = key.shard as usize;
            let list = per_shard
                .get_mut(s)
                .ok_or_else(|| Error::Config(format!("key names shard {s}, the cluster has {n}")))?;
            list.push(proto::PriorityUpdate { key: Some(key.to_proto()), priority });
        }
        let calls = per_shard.into_iter().enumerate().filter(|(_, l)| !l.is_empty()).map(|(s, list)| {
            let mut c = self.core.shards[s].grpc.clone();
            let sent = list.len() as u64;
            let request = UpdateRequest { updates: list, table: self.core.config.table.clone() };
            async move { (s, sent, within(deadline, c.update_priorities(request)).await) }
        });
        let mut total = PriorityUpdates::default();
        for (s, sent, reply) in futures_util::future::join_all(calls).await {
            let reply = reply.map_err(|e| status(s, e))?;
            if reply.applied > sent {
                let what = format!("{} updates applied of {sent} sent", reply.applied);
                return Err(Error::Malformed { shard: s, what });
            }
            self.core.note_mass(s, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
            total.applied += reply.applied;
            total.stale += sent - reply.applied;
        }
        Ok(total)
    }

    /// Inserts whole trajectories, each sent in chunks of at most
    /// `chunk_steps` steps (0: one chunk each), into `target`. Returns the
    /// keys in the order of `trajectories`. A failure after some
    /// trajectories were committed is [`Error::PartialInsert`], which lists
    /// them; a trajectory is never stored in part. Each insert stream (at
    /// most [`TRAJECTORIES_PER_STREAM`](super::TRAJECTORIES_PER_STREAM)
    /// trajectories) has `call_timeout` to finish.
    pub async fn insert(
        &self,
        target: WriteTarget,
        trajectories: Vec<RemoteTrajectory>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let n = self.core.shards.len();
        let mut per_shard: Vec<Vec<(usize, RemoteTrajectory)>> = vec![Vec::new(); n];
        match target {
            WriteTarget::Shard(s) if s < n => per_shard[s] = trajectories.into_iter().enumerate().collect(),
            WriteTarget::Shard(s) => return Err(Error::Config(format!("no shard {s}; the cluster has {n}"))),
            WriteTarget::RoundRobin => {
                let shards = self.core.round_robin(trajectories.len());
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
            WriteTarget::MostFree => {
                let shards = self.core.spread_by_free_space(trajectories.len()).await?;
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
        }
        for (s, list) in per_shard.iter().enumerate() {
            if !list.is_empty() {
                self.core.forget_mass(s);
            }
        }
        self.core.send_routed(per_shard, chunk_steps).await
    }
}

impl ClientCore {
    /// The shard for each of `n` trajectories written round-robin: the
    /// next live shard in turn (every shard when none is known live).
    pub(crate) fn round_robin(&self, n: usize) -> Vec<usize> {
        let live: Vec<usize> = {
            let st = self.state.lock();
            (0..self.shards.len()).filter(|&s| !st[s].lost).collect()
        };
        let live = if live.is_empty() { (0..self.shards.len()).collect() } else { live };
        let mut next = self.next_writer.lock();
        (0..n)
            .map(|_| {
                let s = live[*next % live.len()];
                *next = next.wrapping_add(1);
                s
            })
            .collect()
    }

    pub(crate) fn grpc(&self, shard: usize) -> Result<Grpc> {
        self.shards.get(shard).map(|c| c.grpc.clone()).ok_or_else(|| Error::Config(format!("no shard {shard}")))
    }

    /// Records that `shard` answered with `incarnation`; returns whether it
    /// rejoined (was lost, or restarted).
    pub(crate) fn mark_alive(&self, shard: usize, incarnation: u64) -> bool {
        let mut st = self.state.lock();
        let s = &mut st[shard];
        let rejoined = s.lost || s.incarnation.is_some_and(|i| i != incarnation);
        if rejoined {
            *self.beta.lock() = None;
            tracing::info!("shard {shard} ({}) is back (incarnation {incarnation:#x})", self.config.shards[shard]);
        }
        s.lost = false;
        s.incarnation = Some(incarnation);
        rejoined
    }

    /// The run `shard` last answered from, if any.
    pub(crate) fn incarnation_of(&self, shard: usize) -> Option<u64> {
        self.state.lock().get(shard).and_then(|s| s.incarnation)
    }

    pub(crate) fn mark_lost(&self, shard: usize, reason: &str) {
        let mut st = self.state.lock();
        if !st[shard].lost {
            tracing::warn!("shard {shard} ({}) left out: {reason}", self.config.shards[shard]);
        }
        st[shard].lost = true;
        st[shard].mass = None;
    }

    /// The spec of shard `shard`, asked now.
    pub(crate) async fn spec_of(&self, shard: usize, deadline: Instant) -> Result<ShardSpec> {
        let mut c = self.grpc(shard)?;
        let request = SpecRequest { table: self.config.table.clone() };
        let reply = within(deadline, c.get_spec(request)).await.map_err(|s| status(shard, s))?;
        ShardSpec::from_proto(&reply)
    }

    /// The spec, from the first shard that answers.
    pub(crate) async fn spec_of_any(&self, deadline: Instant) -> Result<ShardSpec> {
        let mut last = None;
        for s in 0..self.shards.len() {
            match self.spec_of(s, deadline).await {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::NoShard("no shard".into())))
    }

    /// The table spec, asked once (shared, so that a batch copies none of it).
    pub(crate) async fn cached_spec(&self, deadline: Instant) -> Result<Arc<TableSpec>> {
        if let Some(spec) = self.spec.lock().clone() {
            return Ok(spec);
        }
        let spec = Arc::new(self.spec_of_any(deadline).await?.table);
        *self.spec.lock() = Some(spec.clone());
        Ok(spec)
    }

    /// The bytes per row of each column `request` asks for, into
    /// `row_bytes`; refused, naming what was wrong, when the table cannot
    /// serve it or its reply would not fit a message.
    pub(crate) fn check_request(
        &self,
        spec: &TableSpec,
        request: &ClusterSample,
        row_bytes: &mut Vec<usize>,
    ) -> Result<()> {
        if request.rows == 0 || request.rows > crate::convert::MAX_SAMPLE_ROWS {
            return Err(Error::Config(format!(
                "a batch of {} rows; between 1 and {} may be asked for",
                request.rows,
                crate::convert::MAX_SAMPLE_ROWS
            )));
        }
        request.window.validate(spec.max_len())?;
        row_bytes.clear();
        let mut add = |c: usize| -> Result<()> {
            let step = spec.columns()[c].step_bytes()?;
            let bytes = step.checked_mul(request.window.len).and_then(|b| usize::try_from(b).ok());
            row_bytes.push(bytes.ok_or_else(|| Error::Config(format!("column {c}: a window's bytes overflow")))?);
            Ok(())
        };
        if request.columns.is_empty() {
            (0..spec.columns().len()).try_for_each(&mut add)?;
        } else {
            for name in &request.columns {
                add(spec.column_index(name)?)?;
            }
        }
        let total = row_bytes
            .iter()
            .try_fold(0u64, |sum, &rb| (rb as u64).checked_mul(request.rows)?.checked_add(sum))
            .filter(|&t| t <= self.config.max_message_bytes as u64);
        if total.is_none() {
            return Err(Error::Config(format!(
                "a batch of {} rows of {:?} bytes exceeds the message limit of {} bytes; ask for fewer rows",
                request.rows, row_bytes, self.config.max_message_bytes
            )));
        }
        Ok(())
    }

    /// The importance exponent every shard's strategy uses (0 unless prioritized).
    pub(crate) async fn beta(&self, deadline: Instant) -> Result<f64> {
        if let Some(b) = *self.beta.lock() {
            return Ok(b);
        }
        let mut beta = None;
        let mut last_err = None;
        for s in 0..self.shards.len() {
            if self.state.lock()[s].lost {
                continue;
            }
            match self.spec_of(s, deadline).await {
                Ok(spec) => {
                    beta = Some(spec.beta);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let beta = beta.ok_or_else(|| last_err.unwrap_or_else(|| Error::NoShard("every shard is lost".into())))?;
        *self.beta.lock() = Some(beta);
        Ok(beta)
    }

    /// Rows per shard into `counts`: each row independently from shard `s`
    /// with probability `masses[s] / sum`.
    pub(crate) fn allocate(&self, masses: &[f64], rows: u64, counts: &mut Vec<u64>) {
        let total: f64 = masses.iter().sum();
        counts.clear();
        counts.resize(masses.len(), 0);
        let last = masses.iter().rposition(|&m| m > 0.0).unwrap_or(0);
        let mut rng = self.rng.lock();
        for _ in 0..rows {
            let mut u = rng.next_f64() * total;
            let mut pick = last;
            for (s, &m) in masses.iter().enumerate() {
                if m > 0.0 && u < m {
                    pick = s;
                    break;
                }
                u -= m;
            }
            counts[pick] += 1;
        }
    }

    fn take_scratch(&self) -> ScratchGuard<'_> {
        let scratch = self.scratch.lock().pop().unwrap_or_default();
        ScratchGuard { core: self, scratch: Some(scratch) }
    }

    /// The shard-gather draw (the shards gather their rows' windows and
    /// send them in their replies) into `columns` (see the module doc).
    async fn sample_gathered(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        out: &mut BatchRows,
        deadline: Instant,
    ) -> Result<()> {
        let spec = self.cached_spec(deadline).await?;
        let mut guard = self.take_scratch();
        let scratch = guard.scratch.as_mut().ok_or_else(|| Error::Config("no scratch".into()))?;
        self.check_request(&spec, request, &mut scratch.row_bytes)?;
        let info_deadline = share_of(deadline, 1, 4);
        self.shard_masses(&mut scratch.masses, &mut out.lost, &mut out.rejoined, info_deadline).await?;
        let SampleScratch { row_bytes, bases, blocks, asks, metas, counts, settled, masses } = scratch;
        let ShardMasses { masses, mins, deterministic } = masses;
        let deterministic = *deterministic;
        let stocked = masses.iter().filter(|&&m| m > 0.0).count() + deterministic;
        if deterministic > 0 && stocked > 1 {
            return Err(Error::Unsupported(
                "a deterministic strategy (FIFO, LIFO, heap) cannot be merged exactly across shards; \
                 sample one shard with `sample_shard`"
                    .into(),
            ));
        }
        let one_shard = if deterministic == 1 {
            (0..self.shards.len()).find(|&s| masses[s] == 0.0 && !out.lost.iter().any(|l| l.shard == s))
        } else {
            None
        };
        // A deterministic strategy's own order and weights: the whole batch
        // from its shard.
        let beta = if one_shard.is_some() { 0.0 } else { self.beta(deadline).await? };
        let rows = request.rows as usize;
        let mut assembly = Assembly::new(columns, row_bytes, rows, bases, blocks).map_err(Error::Config)?;
        asks.clear();
        let mut remaining = request.rows;
        let mut norm = WeightNorm::default();
        let first_total: f64 = masses.iter().sum();
        if let Some(s) = one_shard {
            masses[s] = 1.0;
        }
        let masses: &mut Vec<f64> = masses;
        // A shard failing mid-draw gives its rows to the others.
        for _round in 0..self.shards.len() {
            let total: f64 = masses.iter().sum();
            if remaining == 0 {
                break;
            }
            if total <= 0.0 {
                return Err(Error::NoShard(format!("no shard holds items ({} lost: {:?})", out.lost.len(), out.lost)));
            }
            match one_shard {
                Some(s) => {
                    counts.clear();
                    counts.resize(masses.len(), 0);
                    counts[s] = remaining;
                }
                None => self.allocate(masses, remaining, counts),
            }
            let first_tag = asks.len();
            for (s, &n) in counts.iter().enumerate() {
                if n > 0 {
                    assembly.add_block(asks.len(), n as usize).map_err(|what| Error::Malformed { shard: s, what })?;
                    asks.push(BlockAsk { shard: s, rows: n, mass: masses[s], total });
                }
            }
            if metas.len() < asks.len() {
                metas.resize_with(asks.len(), ReplyMeta::default);
            }
            // Three quarters of the time left: a shard cut off at its
            // deadline leaves time to draw its rows from the others.
            let round_deadline = share_of(deadline, 3, 4);
            let window = round_deadline.saturating_duration_since(Instant::now());
            let mut calls = FuturesUnordered::new();
            for ((tag, rows_mut), meta) in assembly.targets().zip(metas[first_tag..].iter_mut()) {
                let ask = asks[tag];
                let table = &self.config.table;
                let req = sample_request(table, request, ask.rows, round_deadline, self.incarnation_of(ask.shard));
                let decoder = ReplyDecoder::new(rows_mut, meta, self.config.max_message_bytes);
                let channel = &self.shards[ask.shard].channel;
                let token = &self.token;
                calls.push(async move {
                    let call = super::call::sample(channel, token, &req, decoder);
                    let outcome = match tokio::time::timeout_at(round_deadline, call).await {
                        Ok(r) => r,
                        Err(_) => Err(super::call::CallError::Status(deadline_status(window))),
                    };
                    (tag, outcome)
                });
            }
            settled.clear();
            while let Some((tag, outcome)) = calls.next().await {
                let ask = asks[tag];
                let s = ask.shard;
                let failure = match outcome {
                    Ok(()) => {
                        settled.push((tag, true));
                        continue;
                    }
                    Err(super::call::CallError::Malformed(what)) => return Err(Error::Malformed { shard: s, what }),
                    Err(super::call::CallError::Status(e)) if refuses_the_request(&e) => return Err(status(s, e)),
                    Err(super::call::CallError::Status(e)) => e,
                };
                self.mark_lost(s, failure.message());
                out.lost.push(LostShard { shard: s, reason: format!("{}: {}", failure.code(), failure.message()) });
                masses[s] = 0.0;
                settled.push((tag, false));
            }
            drop(calls);
            // The replies that came whole (their fields are free to read
            // now that the calls are over).
            for &(tag, done) in settled.iter() {
                if done {
                    let (s, meta) = (asks[tag].shard, &metas[tag]);
                    self.check_meta(s, meta)?;
                    if self.mark_alive(s, meta.incarnation) {
                        out.rejoined.push(s);
                    }
                    self.note_mass(s, meta.incarnation, meta.size, meta.total_mass, meta.min_mass);
                    remaining -= asks[tag].rows;
                }
                assembly.settle(tag, done);
            }
            assembly.close_holes();
        }
        if remaining > 0 {
            return Err(Error::NoShard(format!("{remaining} rows could not be drawn; lost: {:?}", out.lost)));
        }
        // The normaliser: every shard's smallest probability, from its
        // reply where it was drawn from, else from its last report.
        for (s, (&mass, &min)) in masses.iter().zip(mins.iter()).enumerate() {
            if mass > 0.0 && !asks.iter().any(|a| a.shard == s) && first_total > 0.0 {
                norm.smallest_probability(min / first_total);
            }
        }
        for (tag, _) in assembly.placed_blocks() {
            let (ask, meta) = (asks[tag], &metas[tag]);
            if meta.total_mass > 0.0 {
                norm.smallest_probability(meta.min_mass / meta.total_mass * ask.mass / ask.total);
            }
        }
        for (tag, _) in assembly.placed_blocks() {
            let (ask, meta) = (asks[tag], &metas[tag]);
            out.keys.extend_from_slice(&meta.keys);
            out.lengths.extend_from_slice(&meta.lengths);
            out.starts.extend_from_slice(&meta.starts);
            if one_shard.is_some() {
                out.probabilities.extend_from_slice(&meta.probabilities);
                out.weights.extend_from_slice(&meta.weights);
                continue;
            }
            for &p in &meta.probabilities {
                let p = global_probability(p, ask.mass, ask.total);
                norm.row(p);
                out.probabilities.push(p);
            }
        }
        if one_shard.is_none() {
            out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, beta)));
        }
        Ok(())
    }

    /// A decoded reply must come from the shard asked, its keys from the
    /// run it reports.
    fn check_meta(&self, shard: usize, meta: &ReplyMeta) -> Result<()> {
        if meta.shard as usize != shard
            || meta.keys.iter().any(|k| k.shard as usize != shard || k.incarnation != meta.incarnation)
        {
            return Err(Error::Malformed { shard, what: "keys name another shard or run".into() });
        }
        Ok(())
    }
}
