//! The shard server: one or several [`ReplayTable`]s, each under its name
//! ([`ServedTables`]), behind the `gear.v1.Shard` gRPC service. Every
//! request names its table (empty: the only one) and is checked against
//! that table's spec and the server's message limit before it touches the
//! table; table errors become gRPC statuses. Every call is timed for the
//! metrics (`crate::metrics`). Blocking table calls (rate-limiter waits) run on tokio's
//! blocking threads, or under `block_in_place` (a `Sample` draws while its
//! reply is encoded: `server/reply.rs`), so they never stall the reactor.

use crate::auth::{resolve_token, TokenCheck};
use crate::committed;
use crate::convert::{key_to_proto, table_status, Limits};
use crate::error::{Error, Result};
use crate::metrics::{Method, RpcTimer};
use crate::proto::shard_server::{Shard, ShardServer};
use crate::proto::{
    HealthReply, HealthRequest, InfoReply, InfoRequest, InsertChunk, InsertReply, ListTablesReply, ListTablesRequest,
    SampleRequest, SpecReply, SpecRequest, UpdateReply, UpdateRequest,
};
use crate::rdma_settings::RdmaSettings;
use gear_api::{ReplayTable, StepValue, Trajectory, Writer};
use gear_core::{check_priority, SlotKey, TransportServer};
use gear_sampler::{StrategyKind, StrategyParams};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

mod data_plane;
mod insert_route;
mod reply;
mod routes;
mod sample_route;
mod sample_stream;
mod tables;
pub use data_plane::DataPlaneServer;
use insert_route::ChunkSource;
pub use reply::SampleReplyOut;
use routes::HandRoutes;
use tables::ServedTable;
pub use tables::{check_table_name, NamedTable, ServedTables, DEFAULT_TABLE, MAX_TABLE_NAME};

/// Default limit on one message (a sample reply or an insert chunk).
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 256 << 20;

/// The `[grpc]` section of a `gear serve` config.
///
/// ```toml
/// [grpc]
/// listen = "0.0.0.0:50051"
/// shard = 0                 # this server's index in the cluster config
/// # token = "..."           # else the GEAR_TOKEN environment variable
/// # max_message_bytes = 268435456
/// # tls_cert = "server.pem" # TLS: this server's certificate chain (PEM)
/// # tls_key = "server.key"  # and its private key
/// # tls_client_ca = "ca.pem" # mutual TLS: clients need a certificate from this CA
///
/// [grpc.rdma]               # optional: the RDMA device (feature `rdma`)
/// # device = "mlx5_0"       # else the first device
/// # port = 1
/// # gid_index = 0           # RoCE v2: usually not 0 (see `show_gids`)
/// ```
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// This shard's index in the cluster.
    pub shard: u32,
    /// The cluster token (else `$GEAR_TOKEN`).
    pub token: Option<String>,
    /// Largest message accepted or sent.
    pub max_message_bytes: Option<u64>,
    /// Serve TLS with this certificate chain (PEM; needs `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// Ask clients for a certificate signed by this CA (PEM; mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
    /// The RDMA device port the data plane opens (default: the first
    /// device, port 1, GID index 0); unused when a transport server is
    /// injected with [`ServerHandle::start_with_transport`].
    #[serde(default)]
    pub rdma: RdmaSettings,
}

impl ServerConfig {
    /// Shard `shard` listening on `listen` with the cluster token `token`;
    /// the default message limit, no TLS, the default RDMA device settings.
    pub fn new(listen: SocketAddr, shard: u32, token: impl Into<String>) -> Self {
        ServerConfig {
            listen,
            shard,
            token: Some(token.into()),
            max_message_bytes: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            rdma: RdmaSettings::default(),
        }
    }
}

/// What the server tells clients about its sampling strategy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StrategyInfo {
    /// The strategy.
    pub kind: StrategyKind,
    /// Its parameters (alpha and beta matter for prioritized).
    pub params: StrategyParams,
}

/// The gRPC service over a server's tables.
pub struct ShardService {
    tables: ServedTables,
    shard: u32,
    limits: Limits,
    /// The transport servers `Connect` and ranged samples use, if any.
    data_plane: Option<Arc<DataPlaneServer>>,
    /// Set when the server stops: `SampleStream` sessions, which a client
    /// keeps open between batches, then end after the exchange they are
    /// in (a graceful shutdown waits for every open stream).
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
}

impl ShardService {
    /// Serves `table` as shard `shard`, under the name [`DEFAULT_TABLE`].
    pub fn new(table: ReplayTable, shard: u32, strategy: StrategyInfo, max_message_bytes: u64) -> Self {
        Self::serving(ServedTables::single(table, strategy), shard, max_message_bytes)
    }

    /// Serves every table of `tables` as shard `shard`.
    pub fn serving(tables: ServedTables, shard: u32, max_message_bytes: u64) -> Self {
        tables.set_shard(shard);
        ShardService {
            tables,
            shard,
            limits: Limits::new(max_message_bytes),
            data_plane: None,
            stopping: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// This server process's incarnation (each table has its own:
    /// [`ServedTables::table_incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.tables.incarnation()
    }

    /// The tables served.
    pub fn tables(&self) -> &ServedTables {
        &self.tables
    }

    /// The table a request names, with the call's timer told which.
    fn find(&self, name: &str, timer: &mut RpcTimer) -> std::result::Result<&ServedTable, Status> {
        let (index, served) = self.tables.find(name)?;
        timer.table(index);
        Ok(served)
    }

    /// `served`'s counters as `Info` and `ListTables` report them.
    fn info_reply(&self, served: &ServedTable) -> std::result::Result<InfoReply, Status> {
        let i = served.table.info().map_err(table_status)?;
        let (total_mass, min_mass) = selection_masses(&served.table)?;
        let waits = served.table.wait_stats();
        Ok(InfoReply {
            shard: self.shard,
            incarnation: served.incarnation,
            size: i.size,
            capacity: i.capacity,
            inserts: i.inserts,
            samples: i.samples,
            evictions: i.evictions,
            bytes_written: i.bytes_written,
            bytes_gathered: i.bytes_gathered,
            total_mass,
            min_mass,
            table: served.name.clone(),
            retired: i.retired,
            insert_waits: waits.insert_waits,
            insert_wait_seconds: waits.insert_wait.as_secs_f64(),
            sample_waits: waits.sample_waits,
            sample_wait_seconds: waits.sample_wait.as_secs_f64(),
            lock_waits: waits.lock_waits,
            lock_wait_seconds: waits.lock_wait.as_secs_f64(),
            rpc_bytes_received: served.rpc_bytes_received.load(Ordering::Relaxed),
            rpc_bytes_sent: served.rpc_bytes_sent.load(Ordering::Relaxed),
            sampler: served.strategy.kind.name().to_owned(),
            held_inserts: served.held_inserts.load(Ordering::Relaxed),
            rows_overwritten: served.rows_overwritten.load(Ordering::Relaxed),
        })
    }

    async fn get_spec_of(
        &self,
        request: Request<SpecRequest>,
        timer: &mut RpcTimer,
    ) -> std::result::Result<Response<SpecReply>, Status> {
        let served = self.find(&request.get_ref().table, timer)?;
        let spec = served.table.spec();
        let strategy = served.strategy;
        let prioritized = strategy.kind == StrategyKind::Prioritized;
        Ok(Response::new(SpecReply {
            shard: self.shard,
            incarnation: served.incarnation,
            columns: crate::convert::columns_to_proto(spec),
            max_len: spec.max_len(),
            capacity: spec.capacity(),
            sampler: strategy.kind.name().to_owned(),
            region: Some(crate::proto::RegionDescriptor {
                name: served.table.name().unwrap_or_default().to_owned(),
                len: served.table.region_bytes(),
            }),
            alpha: if prioritized { strategy.params.alpha } else { 0.0 },
            beta: if prioritized { strategy.params.beta } else { 0.0 },
            table: served.name.clone(),
            items_per_trajectory: spec.items_per_trajectory(),
        }))
    }

    async fn info_of(
        &self,
        request: Request<InfoRequest>,
        timer: &mut RpcTimer,
    ) -> std::result::Result<Response<InfoReply>, Status> {
        let served = self.find(&request.get_ref().table, timer)?;
        Ok(Response::new(self.info_reply(served)?))
    }

    async fn sample_of(
        &self,
        request: Request<SampleRequest>,
        mut timer: RpcTimer,
    ) -> std::result::Result<Response<SampleReplyOut>, Status> {
        let (index, served) = self.tables.find(&request.get_ref().table)?;
        timer.table(index);
        check_incarnation(self.shard, served, request.get_ref().incarnation)?;
        if request.get_ref().ranges {
            let reply = self.sample_ranges((index, served), request.into_inner()).await;
            timer.finish(reply.is_ok());
            return Ok(reply?.map(SampleReplyOut::from));
        }
        let req = request.into_inner();
        let config = self.limits.sample_config(served.table.spec(), &req)?;
        let sampler = served.samplers.take(&served.table, &config)?;
        // Drawn and gathered as tonic encodes the reply (server/reply.rs),
        // which is when the call's timer stops.
        Ok(Response::new(SampleReplyOut::pending(self.tables.clone(), index, self.shard, sampler, config, timer)))
    }

    async fn update_priorities_of(
        &self,
        request: Request<UpdateRequest>,
        timer: &mut RpcTimer,
    ) -> std::result::Result<Response<UpdateReply>, Status> {
        let req = request.into_inner();
        let served = self.find(&req.table, timer)?;
        if req.updates.len() > self.limits.max_updates {
            return Err(Status::invalid_argument(format!(
                "{} priority updates in one call, at most {} allowed",
                req.updates.len(),
                self.limits.max_updates
            )));
        }
        let mut ours = Vec::with_capacity(req.updates.len());
        let mut stale = 0u64;
        for (i, u) in req.updates.iter().enumerate() {
            let key = u.key.as_ref().ok_or_else(|| Status::invalid_argument(format!("update {i} has no key")))?;
            check_priority(u.priority)
                .map_err(|_| Status::invalid_argument(format!("update {i}: priority {} is invalid", u.priority)))?;
            // Another shard, run, or table (each table has its own
            // incarnation): stale.
            if key.shard != self.shard || key.incarnation != served.incarnation {
                stale += 1;
                continue;
            }
            ours.push((SlotKey { slot: key.slot, generation: key.generation }, u.priority));
        }
        let table = served.table.clone();
        let applied = blocking(move || table.update_priorities(&ours).map_err(table_status)).await?;
        let (size, total_mass, min_mass) = table_masses(&served.table)?;
        Ok(Response::new(UpdateReply {
            applied: applied as u64,
            stale,
            incarnation: served.incarnation,
            size,
            total_mass,
            min_mass,
        }))
    }

    /// Appends the chunks of one insert stream (see `insert_route`), each
    /// trajectory committed by its `end` chunk; a failure lists the keys
    /// committed before it (`crate::committed`).
    async fn insert_into(
        &self,
        mut stream: impl ChunkSource,
        timer: &mut RpcTimer,
    ) -> std::result::Result<InsertReply, Status> {
        // The table and its writer (whose waits are the stream's begin
        // wait), from the first chunk.
        let mut target: Option<(&ServedTable, Writer)> = None;
        let mut begin_wait = INSERT_WAIT;
        let mut open: Option<Trajectory> = None;
        let mut keys = Vec::new();
        let mut steps = 0u64;
        while let Some(chunk) = stream.next_chunk().await.map_err(|s| committed::failed(s, &keys, steps))? {
            match &target {
                None => {
                    let served = self.find(&chunk.table, timer).map_err(|s| committed::failed(s, &keys, steps))?;
                    if let Some(ms) = chunk.begin_wait_ms {
                        begin_wait = Duration::from_millis(ms).min(INSERT_WAIT);
                    }
                    target = Some((served, served.table.writer().with_timeout(begin_wait)));
                }
                Some((served, _)) if !chunk.table.is_empty() && chunk.table != served.name => {
                    let e = Status::invalid_argument(format!(
                        "an insert chunk names table `{}`, the stream's first chunk named `{}`",
                        tables::shown(&chunk.table),
                        served.name
                    ));
                    return Err(committed::failed(e, &keys, steps));
                }
                Some(_) => {}
            }
            let Some((served, writer)) = &target else {
                return Err(Status::internal("an insert stream without a table"));
            };
            let spec = served.table.spec();
            self.limits
                .check_chunk(spec, &chunk, open.as_ref().map_or(0, |t| t.len()))
                .map_err(|s| committed::failed(s, &keys, steps))?;
            let priority = match chunk.priority {
                Some(p) => Some(check_priority(p).map_err(|_| {
                    committed::failed(Status::invalid_argument(format!("priority {p} is invalid")), &keys, steps)
                })?),
                None => None,
            };
            served.count_received(chunk.columns.iter().map(|c| c.len() as u64).sum());
            if open.is_none() {
                let begun = begin_trajectory(writer, priority, begin_wait).map_err(|e| match e {
                    gear_api::Error::Timeout { .. } => {
                        served.count_held();
                        committed::held(table_status(e), &keys, steps)
                    }
                    e => committed::failed(table_status(e), &keys, steps),
                })?;
                open = Some(begun);
            }
            let key = (|| -> std::result::Result<Option<SlotKey>, Status> {
                let Some(traj) = &mut open else {
                    return Err(Status::internal("an insert chunk without an open trajectory"));
                };
                if chunk.steps > 0 {
                    for (c, bytes) in chunk.columns.iter().enumerate() {
                        traj.append_column(c, chunk.steps, StepValue::bytes(bytes)).map_err(table_status)?;
                    }
                }
                if chunk.end {
                    let key = traj.end().map_err(table_status)?;
                    open = None;
                    return Ok(Some(key));
                }
                Ok(None)
            })()
            .map_err(|s| committed::failed(s, &keys, steps))?;
            steps += chunk.steps;
            keys.extend(key.map(|k| key_to_proto(self.shard, served.incarnation, k)));
        }
        // A trajectory left open by a stream that ended is abandoned on drop.
        Ok(InsertReply { keys, steps, held: false })
    }
}

/// How long a remote insert waits for the rate limiter or the table lock.
const INSERT_WAIT: Duration = Duration::from_secs(30);

/// Begins a trajectory with `writer`, whose waits last `wait` (the
/// stream's begin wait, at most [`INSERT_WAIT`]); its appends and commit
/// then wait at most [`INSERT_WAIT`]. A wait that runs out is
/// `Error::Timeout`, which the stream reports as a held trajectory
/// (`committed::held`).
///
/// Only `begin` waits for long (the rate limiter holds writers back); the
/// appends and the commit take the table lock for a moment. So the insert
/// stream runs them on its runtime thread, and `begin` too when the limiter
/// and the lock admit it at once; only a `begin` that would wait runs under
/// `block_in_place`, which moves the runtime's other tasks to another
/// thread meanwhile. Doing that for every chunk cost a fifth of a remote
/// insert's CPU (`gear bench --shards 3`: 0.55 against 0.45 CPU s/GB). A
/// `begin` that had to wait counts one extra, empty wait in the table's
/// wait counters (the try at once).
fn begin_trajectory(writer: &Writer, priority: Option<f64>, wait: Duration) -> gear_api::Result<Trajectory> {
    let mut trajectory = match writer.clone().with_timeout(Duration::ZERO).begin(priority) {
        Err(gear_api::Error::Timeout { .. }) if !wait.is_zero() => reply::run_blocking(|| writer.begin(priority))?,
        begun => begun?,
    };
    trajectory.set_timeout(Some(INSERT_WAIT));
    Ok(trajectory)
}

/// `table`'s size, total mass and smallest mass (see `selection_masses`).
fn table_masses(table: &ReplayTable) -> std::result::Result<(u64, f64, f64), Status> {
    let size = table.info().map_err(table_status)?.size;
    let (total, min) = selection_masses(table)?;
    Ok((size, total, min))
}

/// `table`'s total and smallest mass; deterministic strategies report a
/// total mass of zero (they cannot be spread over shards by mass).
fn selection_masses(table: &ReplayTable) -> std::result::Result<(f64, f64), Status> {
    Ok(table.selection_mass().map_err(table_status)?.map_or((0.0, 0.0), |m| (m.total, m.min)))
}

/// The fields of a `Sample` reply for rows drawn as byte ranges of the
/// table at run `incarnation` of shard `shard`, the table's `(size, total
/// mass, min mass)` after the draw given: everything but the windows
/// (`columns`, or `row_ranges`).
fn ranged_reply_fields(
    shard: u32,
    incarnation: u64,
    drawn: &[gear_api::table::ranges::RowRanges],
    (size, total_mass, min_mass): (u64, f64, f64),
) -> crate::proto::SampleReply {
    crate::proto::SampleReply {
        shard,
        incarnation,
        keys: drawn.iter().map(|r| key_to_proto(shard, incarnation, r.key)).collect(),
        lengths: drawn.iter().map(|r| r.window.steps).collect(),
        starts: drawn.iter().map(|r| r.window.src_step).collect(),
        probabilities: drawn.iter().map(|r| r.probability).collect(),
        weights: drawn.iter().map(|r| r.weight).collect(),
        columns: Vec::new(),
        size,
        total_mass,
        min_mass,
        row_ranges: Vec::new(),
        outcome: None,
    }
}

/// Refuses a sample split for another run of `served` than this one
/// (`expected`; 0 takes any run) with `ABORTED`.
fn check_incarnation(shard: u32, served: &ServedTable, expected: u64) -> std::result::Result<(), Status> {
    if expected != 0 && expected != served.incarnation {
        return Err(Status::aborted(format!(
            "shard {shard} table `{}` restarted: incarnation {:#x}, the batch was split for {expected:#x}",
            served.name, served.incarnation
        )));
    }
    Ok(())
}

/// Runs `f` on a blocking thread, turning a panic or cancellation into a status.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::result::Result<T, Status> + Send + 'static,
) -> std::result::Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

/// Ends `timer` with `reply`'s outcome and passes the reply on.
fn timed<T>(timer: RpcTimer, reply: std::result::Result<T, Status>) -> std::result::Result<T, Status> {
    timer.finish(reply.is_ok());
    reply
}

#[tonic::async_trait]
impl Shard for ShardService {
    async fn health(&self, _: Request<HealthRequest>) -> std::result::Result<Response<HealthReply>, Status> {
        let timer = RpcTimer::start(&self.tables, Method::Health);
        timed(timer, Ok(Response::new(HealthReply { shard: self.shard, incarnation: self.tables.incarnation() })))
    }

    async fn list_tables(
        &self,
        _: Request<ListTablesRequest>,
    ) -> std::result::Result<Response<ListTablesReply>, Status> {
        let timer = RpcTimer::start(&self.tables, Method::ListTables);
        let tables = self.tables.served().iter().map(|t| self.info_reply(t)).collect::<std::result::Result<_, _>>();
        let reply = tables.map(|tables| {
            Response::new(ListTablesReply { shard: self.shard, incarnation: self.tables.incarnation(), tables })
        });
        timed(timer, reply)
    }

    async fn get_spec(&self, request: Request<SpecRequest>) -> std::result::Result<Response<SpecReply>, Status> {
        let mut timer = RpcTimer::start(&self.tables, Method::GetSpec);
        let reply = self.get_spec_of(request, &mut timer).await;
        timed(timer, reply)
    }

    async fn info(&self, request: Request<InfoRequest>) -> std::result::Result<Response<InfoReply>, Status> {
        let mut timer = RpcTimer::start(&self.tables, Method::Info);
        let reply = self.info_of(request, &mut timer).await;
        timed(timer, reply)
    }

    async fn sample(&self, request: Request<SampleRequest>) -> std::result::Result<Response<SampleReplyOut>, Status> {
        // The timer goes with the reply; an early error drops it (counted
        // as a failed call).
        self.sample_of(request, RpcTimer::start(&self.tables, Method::Sample)).await
    }

    type SampleStreamStream = futures_util::stream::Empty<std::result::Result<SampleReplyOut, Status>>;

    /// `UNIMPLEMENTED`: a shard server serves `SampleStream` in its hand
    /// routes (`server/sample_stream.rs`), in front of this service. A
    /// `Shard` service served without them (a wrapper of this one, say)
    /// refuses it so, and the cluster client then asks it with `Sample`
    /// calls instead.
    async fn sample_stream(
        &self,
        _: Request<Streaming<SampleRequest>>,
    ) -> std::result::Result<Response<Self::SampleStreamStream>, Status> {
        Err(Status::unimplemented(
            "SampleStream is served by the shard server's own routes, not by the Shard service alone",
        ))
    }

    async fn connect_data_plane(
        &self,
        request: Request<crate::proto::ConnectRequest>,
    ) -> std::result::Result<Response<crate::proto::ConnectReply>, Status> {
        let mut timer = RpcTimer::start(&self.tables, Method::ConnectDataPlane);
        let reply = self.accept_data_plane(request, &mut timer).await;
        timed(timer, reply)
    }

    async fn update_priorities(
        &self,
        request: Request<UpdateRequest>,
    ) -> std::result::Result<Response<UpdateReply>, Status> {
        let mut timer = RpcTimer::start(&self.tables, Method::UpdatePriorities);
        let reply = self.update_priorities_of(request, &mut timer).await;
        timed(timer, reply)
    }

    async fn insert(
        &self,
        request: Request<Streaming<InsertChunk>>,
    ) -> std::result::Result<Response<InsertReply>, Status> {
        let mut timer = RpcTimer::start(&self.tables, Method::Insert);
        let reply = self.insert_into(request.into_inner(), &mut timer).await.map(Response::new);
        timed(timer, reply)
    }
}

/// A shard server running on its own threads, for callers with no async
/// runtime (`gear serve`). Stops when dropped.
pub struct ServerHandle {
    local_addr: SocketAddr,
    tables: ServedTables,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").field("local_addr", &self.local_addr).field("tables", &self.tables).finish()
    }
}

impl ServerHandle {
    /// Binds `config.listen` (port 0 picks a free port) and serves `table`
    /// (as [`DEFAULT_TABLE`]) on a background runtime. The data plane
    /// serves TCP, and RDMA where the device `config.rdma` names can be
    /// opened.
    pub fn start(table: ReplayTable, config: &ServerConfig, strategy: StrategyInfo) -> Result<Self> {
        Self::start_inner(ServedTables::single(table, strategy), config, None)
    }

    /// As [`ServerHandle::start`], for every table of `tables`, each
    /// reached by its name.
    pub fn serve(tables: ServedTables, config: &ServerConfig) -> Result<Self> {
        Self::start_inner(tables, config, None)
    }

    /// As [`ServerHandle::start`], with `transport_server` serving the data
    /// plane's non-TCP transport (its [`kind`](TransportServer::kind))
    /// instead of the RDMA device: `config.rdma` is not used and no device
    /// is opened. TCP is served as always. This is how a caller brings its
    /// own RDMA verbs (gear-rdma's `RdmaServer` over any `Verbs`, the
    /// in-process test fabric included).
    pub fn start_with_transport(
        table: ReplayTable,
        config: &ServerConfig,
        strategy: StrategyInfo,
        transport_server: Box<dyn TransportServer>,
    ) -> Result<Self> {
        Self::start_inner(ServedTables::single(table, strategy), config, Some(transport_server))
    }

    /// As [`ServerHandle::serve`], with `transport_server` as in
    /// [`ServerHandle::start_with_transport`].
    pub fn serve_with_transport(
        tables: ServedTables,
        config: &ServerConfig,
        transport_server: Box<dyn TransportServer>,
    ) -> Result<Self> {
        Self::start_inner(tables, config, Some(transport_server))
    }

    fn start_inner(
        tables: ServedTables,
        config: &ServerConfig,
        transport_server: Option<Box<dyn TransportServer>>,
    ) -> Result<Self> {
        crate::alloc::keep_message_buffers();
        config.rdma.validate()?;
        let token = resolve_token(config.token.as_deref())?;
        let max = config.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);
        if !(4096..=u64::from(u32::MAX)).contains(&max) {
            return Err(Error::Config(format!("max_message_bytes {max} must be between 4096 and 2^32 - 1")));
        }
        let builder = crate::tls::server_builder(config)?;
        let listener = std::net::TcpListener::bind(config.listen)
            .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", config.listen)))?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
        let service = ShardService::serving(tables.clone(), config.shard, max);
        let (shard, address) = (config.shard, local_addr.to_string());
        let data_plane = Arc::new(match transport_server {
            None => DataPlaneServer::start(&tables, shard, address, &config.rdma)?,
            Some(server) => DataPlaneServer::with_transport_server(&tables, shard, address, server)?,
        });
        let data_service = data_plane.tcp_service();
        let service = service.with_data_plane(data_plane);
        let sessions_stop = service.stopping.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("gear-grpc".into()).spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                // `Server::tcp_nodelay` only reaches sockets it accepts
                // itself; set it on ours (small replies otherwise wait on
                // delayed ACKs).
                let incoming =
                    tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |socket| {
                        if let Ok(s) = &socket {
                            let _ = s.set_nodelay(true);
                        }
                        socket
                    });
                let service = Arc::new(service);
                let server = ShardServer::from_arc(service.clone())
                    .max_decoding_message_size(max as usize)
                    .max_encoding_message_size(max as usize);
                // `Insert` is served without tonic's decode buffer, and the
                // `Sample` calls that allow it straight from table memory
                // (server/routes.rs).
                let server = HandRoutes::new(
                    InterceptedService::new(server, TokenCheck::new(&token)),
                    service,
                    TokenCheck::new(&token),
                    max as usize,
                );
                builder
                    .tcp_nodelay(true)
                    .initial_stream_window_size(Some(8 << 20))
                    .initial_connection_window_size(Some(32 << 20))
                    // Large frames: fewer HTTP/2 frames per inserted trajectory.
                    .max_frame_size(Some((1 << 24) - 1))
                    .add_service(server)
                    .add_service(InterceptedService::new(data_service, TokenCheck::new(&token)))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                        sessions_stop.send_replace(true);
                    })
                    .await?;
                Ok(())
            })
        })?;
        Ok(ServerHandle { local_addr, tables, stop: Some(stop), thread: Some(thread) })
    }

    /// The tables served (for a [`MetricsServer`](crate::metrics::MetricsServer)).
    pub fn tables(&self) -> &ServedTables {
        &self.tables
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the server thread has stopped (an error ended it).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops serving and returns how the server ended.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Config("the gRPC server thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
