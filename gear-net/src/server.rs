//! The shard server: one [`ReplayTable`] behind the `gear.v1.Shard` gRPC
//! service. Every request is checked against the table's spec and the
//! server's message limit before it touches the table; table errors become
//! gRPC statuses. Blocking table calls (rate-limiter waits) run on tokio's
//! blocking threads, or under `block_in_place` (a `Sample` draws while its
//! reply is encoded: `server/reply.rs`), so they never stall the reactor.

use crate::auth::{resolve_token, TokenCheck};
use crate::committed;
use crate::convert::{key_to_proto, table_status, Limits};
use crate::error::{Error, Result};
use crate::proto::shard_server::{Shard, ShardServer};
use crate::proto::{
    HealthReply, HealthRequest, InfoReply, InfoRequest, InsertChunk, InsertReply, SampleRequest, SpecReply,
    SpecRequest, UpdateReply, UpdateRequest,
};
use crate::rdma_settings::RdmaSettings;
use gear_api::{ReplayTable, StepValue, Trajectory};
use gear_core::{check_priority, SlotKey, TransportServer};
use gear_sampler::{StrategyKind, StrategyParams};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

mod data_plane;
mod reply;
pub use data_plane::DataPlaneServer;
pub use reply::SampleReplyOut;
use reply::SamplerCache;

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

/// The gRPC service over one table.
pub struct ShardService {
    table: ReplayTable,
    shard: u32,
    incarnation: u64,
    strategy: StrategyInfo,
    limits: Limits,
    /// Samplers kept between calls, by request shape.
    samplers: Arc<SamplerCache>,
    /// The transport servers `Connect` and ranged samples use, if any.
    data_plane: Option<Arc<DataPlaneServer>>,
}

/// A number that differs between two runs of a server: a restarted shard's
/// keys are then recognisably stale.
fn new_incarnation() -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mut s = nanos ^ (u64::from(std::process::id()) << 32);
    gear_core::rng::splitmix64(&mut s) | 1
}

impl ShardService {
    /// Serves `table` as shard `shard`.
    pub fn new(table: ReplayTable, shard: u32, strategy: StrategyInfo, max_message_bytes: u64) -> Self {
        ShardService {
            table,
            shard,
            incarnation: new_incarnation(),
            strategy,
            limits: Limits::new(max_message_bytes),
            samplers: Arc::new(SamplerCache::default()),
            data_plane: None,
        }
    }

    /// This run's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Size, total mass and smallest mass; deterministic strategies report
    /// a total mass of zero (they cannot be spread over shards by mass).
    fn masses(&self) -> std::result::Result<(u64, f64, f64), Status> {
        table_masses(&self.table)
    }
}

/// `table`'s size, total mass and smallest mass (see `ShardService::masses`).
fn table_masses(table: &ReplayTable) -> std::result::Result<(u64, f64, f64), Status> {
    let size = table.info().map_err(table_status)?.size;
    match table.selection_mass().map_err(table_status)? {
        Some(m) => Ok((size, m.total, m.min)),
        None => Ok((size, 0.0, 0.0)),
    }
}

/// Runs `f` on a blocking thread, turning a panic or cancellation into a status.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::result::Result<T, Status> + Send + 'static,
) -> std::result::Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

#[tonic::async_trait]
impl Shard for ShardService {
    async fn health(&self, _: Request<HealthRequest>) -> std::result::Result<Response<HealthReply>, Status> {
        Ok(Response::new(HealthReply { shard: self.shard, incarnation: self.incarnation }))
    }

    async fn get_spec(&self, _: Request<SpecRequest>) -> std::result::Result<Response<SpecReply>, Status> {
        let spec = self.table.spec();
        let prioritized = self.strategy.kind == StrategyKind::Prioritized;
        Ok(Response::new(SpecReply {
            shard: self.shard,
            incarnation: self.incarnation,
            columns: crate::convert::columns_to_proto(spec),
            max_len: spec.max_len(),
            capacity: spec.capacity(),
            sampler: self.strategy.kind.name().to_owned(),
            region: Some(crate::proto::RegionDescriptor {
                name: self.table.name().unwrap_or_default().to_owned(),
                len: self.table.region_bytes(),
            }),
            alpha: if prioritized { self.strategy.params.alpha } else { 0.0 },
            beta: if prioritized { self.strategy.params.beta } else { 0.0 },
            items_per_trajectory: spec.items_per_trajectory(),
        }))
    }

    async fn info(&self, _: Request<InfoRequest>) -> std::result::Result<Response<InfoReply>, Status> {
        let i = self.table.info().map_err(table_status)?;
        let (_, total_mass, min_mass) = self.masses()?;
        Ok(Response::new(InfoReply {
            shard: self.shard,
            incarnation: self.incarnation,
            size: i.size,
            capacity: i.capacity,
            inserts: i.inserts,
            samples: i.samples,
            evictions: i.evictions,
            bytes_written: i.bytes_written,
            bytes_gathered: i.bytes_gathered,
            total_mass,
            min_mass,
        }))
    }

    async fn sample(&self, request: Request<SampleRequest>) -> std::result::Result<Response<SampleReplyOut>, Status> {
        let expected = request.get_ref().incarnation;
        if expected != 0 && expected != self.incarnation {
            return Err(Status::aborted(format!(
                "shard {} restarted: incarnation {:#x}, the batch was split for {expected:#x}",
                self.shard, self.incarnation
            )));
        }
        if request.get_ref().ranges {
            return Ok(self.sample_ranges(request.into_inner()).await?.map(SampleReplyOut::from));
        }
        let req = request.into_inner();
        let config = self.limits.sample_config(self.table.spec(), &req)?;
        let sampler = self.samplers.take(&self.table, &config)?;
        // Drawn and gathered as tonic encodes the reply (server/reply.rs).
        Ok(Response::new(SampleReplyOut::pending(
            self.table.clone(),
            sampler,
            config,
            (self.shard, self.incarnation),
            self.samplers.clone(),
        )))
    }

    async fn connect_data_plane(
        &self,
        request: Request<crate::proto::ConnectRequest>,
    ) -> std::result::Result<Response<crate::proto::ConnectReply>, Status> {
        self.accept_data_plane(request).await
    }

    async fn update_priorities(
        &self,
        request: Request<UpdateRequest>,
    ) -> std::result::Result<Response<UpdateReply>, Status> {
        let req = request.into_inner();
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
            if key.shard != self.shard || key.incarnation != self.incarnation {
                stale += 1;
                continue;
            }
            ours.push((SlotKey { slot: key.slot, generation: key.generation }, u.priority));
        }
        let table = self.table.clone();
        let applied = blocking(move || table.update_priorities(&ours).map_err(table_status)).await?;
        let (size, total_mass, min_mass) = self.masses()?;
        Ok(Response::new(UpdateReply {
            applied: applied as u64,
            stale,
            incarnation: self.incarnation,
            size,
            total_mass,
            min_mass,
        }))
    }

    async fn insert(
        &self,
        request: Request<Streaming<InsertChunk>>,
    ) -> std::result::Result<Response<InsertReply>, Status> {
        let mut stream = request.into_inner();
        let writer = self.table.writer().with_timeout(Duration::from_secs(30));
        let spec = self.table.spec().clone();
        let mut open: Option<Trajectory> = None;
        let mut keys = Vec::new();
        let mut steps = 0u64;
        while let Some(chunk) = stream.message().await.map_err(|s| committed::failed(s, &keys, steps))? {
            self.limits
                .check_chunk(&spec, &chunk, open.as_ref().map_or(0, |t| t.len()))
                .map_err(|s| committed::failed(s, &keys, steps))?;
            let priority = match chunk.priority {
                Some(p) => Some(check_priority(p).map_err(|_| {
                    committed::failed(Status::invalid_argument(format!("priority {p} is invalid")), &keys, steps)
                })?),
                None => None,
            };
            // Writer calls wait on the table lock and the rate limiter.
            let key = tokio::task::block_in_place(|| -> std::result::Result<Option<SlotKey>, Status> {
                let traj = match &mut open {
                    Some(t) => t,
                    None => open.insert(writer.begin(priority).map_err(table_status)?),
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
            })
            .map_err(|s| committed::failed(s, &keys, steps))?;
            steps += chunk.steps;
            keys.extend(key.map(|k| key_to_proto(self.shard, self.incarnation, k)));
        }
        // A trajectory left open by a stream that ended is abandoned on drop.
        Ok(Response::new(InsertReply { keys, steps }))
    }
}

/// A shard server running on its own threads, for callers with no async
/// runtime (`gear serve`). Stops when dropped.
pub struct ServerHandle {
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").field("local_addr", &self.local_addr).finish()
    }
}

impl ServerHandle {
    /// Binds `config.listen` (port 0 picks a free port) and serves `table`
    /// on a background runtime. The data plane serves TCP, and RDMA where
    /// the device `config.rdma` names can be opened.
    pub fn start(table: ReplayTable, config: &ServerConfig, strategy: StrategyInfo) -> Result<Self> {
        Self::start_inner(table, config, strategy, None)
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
        Self::start_inner(table, config, strategy, Some(transport_server))
    }

    fn start_inner(
        table: ReplayTable,
        config: &ServerConfig,
        strategy: StrategyInfo,
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
        let service = ShardService::new(table.clone(), config.shard, strategy, max);
        let (shard, incarnation, address) = (config.shard, service.incarnation(), local_addr.to_string());
        let data_plane = Arc::new(match transport_server {
            None => DataPlaneServer::start(&table, shard, incarnation, address, &config.rdma)?,
            Some(server) => DataPlaneServer::with_transport_server(&table, shard, incarnation, address, server)?,
        });
        let data_service = data_plane.tcp_service();
        let service = service.with_data_plane(data_plane);
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
                let server = ShardServer::new(service)
                    .max_decoding_message_size(max as usize)
                    .max_encoding_message_size(max as usize);
                builder
                    .tcp_nodelay(true)
                    .initial_stream_window_size(Some(8 << 20))
                    .initial_connection_window_size(Some(32 << 20))
                    // Large frames: fewer HTTP/2 frames per inserted trajectory.
                    .max_frame_size(Some((1 << 24) - 1))
                    .add_service(InterceptedService::new(server, TokenCheck::new(&token)))
                    .add_service(InterceptedService::new(data_service, TokenCheck::new(&token)))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await?;
                Ok(())
            })
        })?;
        Ok(ServerHandle { local_addr, stop: Some(stop), thread: Some(thread) })
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
