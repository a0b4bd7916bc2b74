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
//! cancelled with it (a sample's `SampleStream` sessions in the middle of
//! an exchange are dropped, their streams reset, never kept for the next
//! batch), no lock is held across a wait that could outlive it, and the
//! next call starts clean.
//!
//! Deadlines. Each method's whole work runs under one deadline,
//! `ClusterConfig::call_timeout` from its start (an insert: each stream
//! under its own): every shard call, from its request to its trailers, is
//! cut off there. A `sample` gives the `Info` round (when it needs one) a
//! quarter of the time left and each round of draws three quarters, so a
//! shard that stops mid-reply is cut off while there is still time to draw
//! its rows from the others; it is named in the batch's `lost`.

mod gather;
mod priorities;
mod route;
mod sample;

pub(crate) use sample::{check_sample_reply, global_probability, refuses_the_request, sample_request};

use super::data_plane::DataPlaneState;
use super::spread::FreeSpace;
use super::{ClusterConfig, ShardInfo, ShardSpec};
use crate::auth::TokenAttach;
use crate::channel::{ChannelSettings, ShardChannel};
use crate::client::call::CallError;
use crate::client::session::SampleSession;
use crate::error::{Error, Result};
use crate::proto::shard_client::ShardClient as GrpcShardClient;
use crate::proto::{InfoRequest, SpecRequest};
use gather::SampleScratch;
use gear_core::{TableSpec, Transport, Xoshiro256};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use tokio::time::{Duration, Instant};
use tonic::codegen::http::HeaderValue;
use tonic::service::interceptor::InterceptedService;

/// The generated client of one shard, with the token attached.
pub(crate) type Grpc = GrpcShardClient<InterceptedService<ShardChannel, TokenAttach>>;

/// One shard's connection: the generated client for most calls, the
/// channel itself for `Sample` (decoded frame by frame: `call`), and the
/// `SampleStream` sessions kept between batches (`session`).
pub(crate) struct ShardConn {
    pub(crate) grpc: Grpc,
    pub(crate) channel: ShardChannel,
    pub(crate) sessions: parking_lot::Mutex<Vec<SampleSession>>,
    /// The shard refused `SampleStream` (`UNIMPLEMENTED`): its blocks are
    /// asked with `Sample` calls.
    pub(crate) calls_only: std::sync::atomic::AtomicBool,
}

/// `SampleStream` sessions kept per shard at most (one per batch drawn at
/// the same time); more are closed when their exchange ends.
const KEPT_SESSIONS: usize = 8;

impl ClientCore {
    /// A session with `shard`: a kept one (and `true`), else a new one.
    pub(crate) async fn sample_session(&self, shard: usize) -> std::result::Result<(SampleSession, bool), CallError> {
        let conn = &self.shards[shard];
        let kept = conn.sessions.lock().pop();
        match kept {
            Some(session) => Ok((session, true)),
            None => Ok((self.open_session(shard).await?, false)),
        }
    }

    /// A new session with `shard`.
    pub(crate) async fn open_session(&self, shard: usize) -> std::result::Result<SampleSession, CallError> {
        SampleSession::open(&self.shards[shard].channel, &self.token).await
    }

    /// Keeps `session` for the next batch if it ended its exchange in step.
    pub(crate) fn keep_session(&self, shard: usize, session: SampleSession) {
        if session.in_step() {
            let mut kept = self.shards[shard].sessions.lock();
            if kept.len() < KEPT_SESSIONS {
                kept.push(session);
            }
        }
    }
}

/// What the client knows of one shard.
#[derive(Debug, Default)]
pub(crate) struct ShardState {
    pub(crate) incarnation: Option<u64>,
    pub(crate) lost: bool,
    /// Its size and masses as last reported (`masses` module).
    pub(crate) mass: Option<super::masses::KnownMass>,
}

/// The state every clone of an [`AsyncClusterClient`] shares.
pub(crate) struct ClientCore {
    pub(crate) shards: Vec<ShardConn>,
    pub(crate) config: ClusterConfig,
    /// `authorization: Bearer <token>`, for calls made by hand.
    pub(crate) token: HeaderValue,
    pub(crate) state: Mutex<Vec<ShardState>>,
    rng: Mutex<Xoshiro256>,
    pub(crate) next_writer: Mutex<usize>,
    /// What [`WriteTarget::MostFree`](super::WriteTarget::MostFree) knows of the shards' free slots.
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
/// let request = ClusterSample { rows: 256, window: WindowSpec::last(1), columns: vec![], random_start: false  };
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
            shards.push(ShardConn {
                grpc,
                channel,
                sessions: parking_lot::Mutex::new(Vec::new()),
                calls_only: std::sync::atomic::AtomicBool::new(false),
            });
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
}

impl ClientCore {
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
}
