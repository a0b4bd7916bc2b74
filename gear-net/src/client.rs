//! The cluster client: one table's distribution over many shards.
//!
//! A batch is drawn in two steps. First the client takes every shard's size
//! and priority mass (as the shard's last `Sample` or `UpdatePriorities`
//! reply reported it, or asked with `Info`: the `masses` module says
//! when) and draws how many rows come from each shard, each row
//! independently with probability `mass_s / M` (`M = sum of masses`). Then
//! each shard draws its rows with its own strategy and gathers their
//! windows. A row's global probability is
//! `mass_s / M * p_local`, which for a proportional strategy is
//! `mass_i / M`, exactly what one table holding every item would give; the
//! importance weight is `(P / P_min)^-beta` with `P_min = min_s(min mass) / M`,
//! normalised as one table normalises it. Between the report of a mass and
//! the draw a shard may change (inserts, updates by other clients): the
//! reported probability is the one the row was really drawn with
//! (allocation from the reported masses, local probability from the draw),
//! so the bias of a stale total shows up in the probabilities rather than
//! hiding.
//!
//! Deterministic strategies (FIFO, LIFO, heaps) cannot be merged this way;
//! over more than one live shard they are refused.
//!
//! Every call has a deadline. A shard that fails (connection refused,
//! deadline, unavailable) is left out of that batch and named in
//! [`ClusterBatch::lost`]; its rows are drawn from the others. While a
//! shard is lost every batch asks every shard (`Info`) first, so a
//! restarted shard rejoins on its own; its new incarnation makes keys from
//! its previous run stale.

use crate::auth::TokenAttach;
use crate::channel::{ChannelSettings, ShardChannel};
use crate::convert::spec_from_proto;
use crate::error::{Error, Result};
use crate::proto::shard_client::ShardClient as GrpcShardClient;
use crate::proto::{self, InfoRequest, InsertChunk, SampleRequest, SpecRequest, UpdateRequest};
use crate::rdma_settings::RdmaSettings;
use bytes::Bytes;
use gear_core::{Pad, RandomSource, TableSpec, Transport, WindowSpec, Xoshiro256};
use parking_lot::Mutex;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;

mod assemble;
mod insert;
mod masses;
mod spread;
mod stream;
mod tables;

use assemble::Assembly;
use masses::ShardMasses;

pub use insert::TRAJECTORIES_PER_STREAM;
pub use stream::TrajectoryStream;
pub use tables::{ShardTables, TableStatus};

mod data_plane;
pub use data_plane::{DataPlane, MAX_READ_ATTEMPTS};

type Grpc = GrpcShardClient<InterceptedService<ShardChannel, TokenAttach>>;

/// What one shard's `Info` call came to.
pub(crate) type InfoOutcome =
    std::result::Result<std::result::Result<tonic::Response<proto::InfoReply>, tonic::Status>, tokio::task::JoinError>;

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

impl From<&proto::Key> for RemoteKey {
    fn from(k: &proto::Key) -> Self {
        RemoteKey { shard: k.shard, incarnation: k.incarnation, slot: k.slot, generation: k.generation }
    }
}

impl From<RemoteKey> for proto::Key {
    fn from(k: RemoteKey) -> Self {
        proto::Key { shard: k.shard, incarnation: k.incarnation, slot: k.slot, generation: k.generation }
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
    /// Deadline of each call.
    pub call_timeout: Duration,
    /// Deadline of connecting.
    pub connect_timeout: Duration,
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
    /// given to [`ClusterClient::with_transport`].
    pub rdma: RdmaSettings,
}

impl ClusterConfig {
    /// Shards at `addresses`, 10 s call deadlines, 1 s connect deadline,
    /// the default RDMA device settings.
    pub fn new(addresses: Vec<String>, token: impl Into<String>) -> Self {
        ClusterConfig {
            shards: addresses,
            table: String::new(),
            token: token.into(),
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
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

#[derive(Debug, Default)]
struct ShardState {
    incarnation: Option<u64>,
    lost: bool,
    /// Its size and masses as last reported (`masses` module).
    mass: Option<masses::KnownMass>,
}

/// A client of every shard of a cluster. Its methods block (it owns a small
/// tokio runtime), so trainers and actors need no async code.
pub struct ClusterClient {
    runtime: tokio::runtime::Runtime,
    shards: Vec<Grpc>,
    config: ClusterConfig,
    state: Mutex<Vec<ShardState>>,
    rng: Mutex<Xoshiro256>,
    next_writer: Mutex<usize>,
    /// What [`WriteTarget::MostFree`] knows of the shards' free slots.
    free_space: Mutex<spread::FreeSpace>,
    /// The strategy's importance exponent, asked once (again after a
    /// shard rejoins).
    beta: Mutex<Option<f64>>,
    /// The transport of the byte-range data plane, once made.
    data_plane: Mutex<data_plane::DataPlaneState>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient").field("shards", &self.config.shards).finish()
    }
}

fn status(shard: usize, s: tonic::Status) -> Error {
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

/// Deadlines of zero would fail every call before it is sent.
fn check_timeouts(config: &ClusterConfig) -> Result<()> {
    if config.call_timeout.is_zero() || config.connect_timeout.is_zero() {
        return Err(Error::Config(format!(
            "call and connect deadlines must be above zero (call {:?}, connect {:?})",
            config.call_timeout, config.connect_timeout
        )));
    }
    Ok(())
}

/// The local probability of a shard's own draw, scaled to the cluster.
fn global_probability(local: f64, shard_mass: f64, total_mass: f64) -> f64 {
    if total_mass > 0.0 {
        local * shard_mass / total_mass
    } else {
        0.0
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
    /// data plane instead of the RDMA device (`config.rdma` is not used and
    /// no device is opened): [`DataPlane::ByteRange`] and
    /// [`DataPlane::Auto`] read through it, whatever its kind;
    /// [`DataPlane::ByteRangeTcp`] still makes its own TCP transport and
    /// [`DataPlane::ShardGather`] uses none. This is how a caller brings its
    /// own RDMA verbs (gear-rdma's `RdmaTransport` over any `Verbs`, the
    /// in-process test fabric included).
    pub fn with_transport(config: ClusterConfig, transport: Box<dyn Transport>) -> Result<Self> {
        Self::new_inner(config, Some(transport))
    }

    fn new_inner(config: ClusterConfig, transport: Option<Box<dyn Transport>>) -> Result<Self> {
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
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let attach = TokenAttach::new(&config.token)?;
        let _guard = runtime.enter();
        let mut shards = Vec::with_capacity(config.shards.len());
        for addr in &config.shards {
            let settings =
                ChannelSettings { connect_timeout: config.connect_timeout, call_timeout: config.call_timeout };
            let channel = ShardChannel::new(addr, config.tls.as_ref(), settings)?;
            shards.push(
                GrpcShardClient::with_interceptor(channel, attach.clone())
                    .max_decoding_message_size(config.max_message_bytes)
                    .max_encoding_message_size(config.max_message_bytes),
            );
        }
        let state = (0..shards.len()).map(|_| ShardState::default()).collect();
        let rng = Xoshiro256::seed_from_u64(config.seed);
        Ok(ClusterClient {
            runtime,
            shards,
            config,
            state: Mutex::new(state),
            rng: Mutex::new(rng),
            next_writer: Mutex::new(0),
            free_space: Mutex::new(spread::FreeSpace::default()),
            beta: Mutex::new(None),
            data_plane: Mutex::new(data_plane::DataPlaneState::with_supplied(transport)),
        })
    }

    /// Number of shards in the config.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The spec of shard `shard` (every shard of a table has the same).
    pub fn spec(&self, shard: usize) -> Result<(TableSpec, proto::SpecReply)> {
        let mut c = self.client(shard)?;
        let reply = self
            .runtime
            .block_on(c.get_spec(SpecRequest { table: self.config.table.clone() }))
            .map_err(|s| status(shard, s))?
            .into_inner();
        Ok((spec_from_proto(&reply)?, reply))
    }

    /// Counters of shard `shard`.
    pub fn info(&self, shard: usize) -> Result<proto::InfoReply> {
        let mut c = self.client(shard)?;
        Ok(self
            .runtime
            .block_on(c.info(InfoRequest { table: self.config.table.clone() }))
            .map_err(|s| status(shard, s))?
            .into_inner())
    }

    fn client(&self, shard: usize) -> Result<Grpc> {
        self.shards.get(shard).cloned().ok_or_else(|| Error::Config(format!("no shard {shard}")))
    }

    /// Records that `shard` answered with `incarnation`; returns whether it
    /// rejoined (was lost, or restarted).
    fn mark_alive(&self, shard: usize, incarnation: u64) -> bool {
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
    fn incarnation_of(&self, shard: usize) -> Option<u64> {
        self.state.lock().get(shard).and_then(|s| s.incarnation)
    }

    fn mark_lost(&self, shard: usize, reason: &str) {
        let mut st = self.state.lock();
        if !st[shard].lost {
            tracing::warn!("shard {shard} ({}) left out: {reason}", self.config.shards[shard]);
        }
        st[shard].lost = true;
        st[shard].mass = None;
    }

    /// Draws one batch across every live shard with one table's
    /// distribution (see the module doc).
    pub fn sample(&self, request: &ClusterSample) -> Result<ClusterBatch> {
        if request.rows == 0 {
            return Err(Error::Config("a batch needs at least 1 row".into()));
        }
        if self.byte_range_plane(request) {
            return self.sample_by_ranges(request);
        }
        let mut batch = ClusterBatch::default();
        let ShardMasses { mut masses, min_mass, deterministic } = self.shard_masses(&mut batch)?;
        let stocked = masses.iter().filter(|&&m| m > 0.0).count() + deterministic;
        if deterministic > 0 && stocked > 1 {
            return Err(Error::Unsupported(
                "a deterministic strategy (FIFO, LIFO, heap) cannot be merged exactly across shards; \
                 sample one shard with `sample_shard`"
                    .into(),
            ));
        }
        if deterministic == 1 {
            let s = (0..self.shards.len()).find(|&s| masses[s] == 0.0 && !batch.lost.iter().any(|l| l.shard == s));
            if let Some(s) = s {
                let mut one = self.sample_shard(s, request)?;
                one.lost = batch.lost;
                one.rejoined = batch.rejoined;
                return Ok(one);
            }
        }
        let beta = self.beta()?;
        let mut remaining = request.rows;
        // Each reply's rows are copied in as soon as it is decoded (the
        // `assemble` module); the rest of the reply rides along with them.
        let expected_row_bytes = self.cached_spec().ok().and_then(|spec| assemble::row_bytes(&spec, request));
        let mut assembly = Assembly::new(request.rows as usize, expected_row_bytes);
        // A shard failing mid-draw gives its rows to the others.
        for _round in 0..self.shards.len() {
            let total: f64 = masses.iter().sum();
            if remaining == 0 {
                break;
            }
            if total <= 0.0 {
                return Err(Error::NoShard(format!(
                    "no shard holds items ({} lost: {:?})",
                    batch.lost.len(),
                    batch.lost
                )));
            }
            let counts = self.allocate(&masses, remaining);
            self.runtime.block_on(async {
                let mut calls = tokio::task::JoinSet::new();
                let mut blocks = std::collections::HashMap::new();
                let mut start = assembly.placed();
                for (s, &n) in counts.iter().enumerate() {
                    if n == 0 {
                        continue;
                    }
                    let mut c = self.shards[s].clone();
                    let req = sample_request(
                        &self.config.table,
                        request,
                        n,
                        self.config.call_timeout,
                        self.incarnation_of(s),
                    );
                    let id = calls.spawn(async move { c.sample(req).await }).id();
                    blocks.insert(id, (s, n, start));
                    start += n as usize;
                }
                // In the order the replies come.
                while let Some(joined) = calls.join_next_with_id().await {
                    let id = match &joined {
                        Ok((id, _)) => *id,
                        Err(e) => e.id(),
                    };
                    let (s, n, start) = blocks[&id];
                    match joined {
                        Ok((_, Ok(reply))) => {
                            let mut reply = reply.into_inner();
                            check_sample_reply(s, n, &reply)?;
                            if self.mark_alive(s, reply.incarnation) {
                                batch.rejoined.push(s);
                            }
                            self.note_sample_mass(s, &reply);
                            let columns = std::mem::take(&mut reply.columns);
                            assembly
                                .place(start, n as usize, &columns, (masses[s], total, reply))
                                .map_err(|what| Error::Malformed { shard: s, what })?;
                            remaining -= n;
                        }
                        Ok((_, Err(e)))
                            if matches!(e.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted) =>
                        {
                            return Err(status(s, e));
                        }
                        Ok((_, Err(e))) => {
                            self.mark_lost(s, e.message());
                            batch.lost.push(LostShard { shard: s, reason: format!("{}: {}", e.code(), e.message()) });
                            masses[s] = 0.0;
                        }
                        Err(e) => {
                            batch.lost.push(LostShard { shard: s, reason: format!("call failed: {e}") });
                            masses[s] = 0.0;
                        }
                    }
                }
                Ok(())
            })?;
            assembly.close_holes();
        }
        if remaining > 0 {
            return Err(Error::NoShard(format!("{remaining} rows could not be drawn; lost: {:?}", batch.lost)));
        }
        let (columns, replies) = assembly.finish();
        batch.columns = columns;
        for (shard_mass, total, reply) in replies {
            batch.keys.extend(reply.keys.iter().map(RemoteKey::from));
            batch.lengths.extend(reply.lengths);
            batch.starts.extend(reply.starts);
            for p in reply.probabilities {
                let p = global_probability(p, shard_mass, total);
                let p_min = min_mass / total;
                let w = if beta == 0.0 || p <= 0.0 { 1.0 } else { (p_min / p).powf(beta) };
                batch.probabilities.push(p);
                batch.weights.push(w);
            }
        }
        Ok(batch)
    }

    /// Every shard's `Info`, asked at once: one outcome per shard, in order.
    pub(crate) fn all_infos(&self) -> Vec<InfoOutcome> {
        self.runtime.block_on(async {
            let calls = self.shards.iter().cloned().map(|mut c| {
                let table = self.config.table.clone();
                tokio::spawn(async move { c.info(InfoRequest { table }).await })
            });
            let mut out = Vec::new();
            for call in calls.collect::<Vec<_>>() {
                out.push(call.await);
            }
            out
        })
    }

    /// The importance exponent every shard's strategy uses (0 unless prioritized).
    fn beta(&self) -> Result<f64> {
        if let Some(b) = *self.beta.lock() {
            return Ok(b);
        }
        let mut beta = None;
        let mut last_err = None;
        for s in 0..self.shards.len() {
            if self.state.lock()[s].lost {
                continue;
            }
            match self.spec(s) {
                Ok((_, reply)) => {
                    beta = Some(reply.beta);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let beta = beta.ok_or_else(|| last_err.unwrap_or_else(|| Error::NoShard("every shard is lost".into())))?;
        *self.beta.lock() = Some(beta);
        Ok(beta)
    }

    /// Rows per shard: each row independently from shard `s` with
    /// probability `masses[s] / sum`.
    fn allocate(&self, masses: &[f64], rows: u64) -> Vec<u64> {
        let total: f64 = masses.iter().sum();
        let mut counts = vec![0u64; masses.len()];
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
        counts
    }

    /// Draws a batch from one shard only (its own probabilities and
    /// weights; for deterministic strategies).
    pub fn sample_shard(&self, shard: usize, request: &ClusterSample) -> Result<ClusterBatch> {
        let mut c = self.client(shard)?;
        let req = sample_request(
            &self.config.table,
            request,
            request.rows,
            self.config.call_timeout,
            self.incarnation_of(shard),
        );
        let reply = match self.runtime.block_on(c.sample(req)) {
            Ok(r) => r.into_inner(),
            Err(e) => {
                self.mark_lost(shard, e.message());
                return Err(status(shard, e));
            }
        };
        check_sample_reply(shard, request.rows, &reply)?;
        let rejoined = self.mark_alive(shard, reply.incarnation);
        self.note_sample_mass(shard, &reply);
        Ok(ClusterBatch {
            keys: reply.keys.iter().map(RemoteKey::from).collect(),
            columns: reply.columns.into_iter().map(Vec::from).collect(),
            lengths: reply.lengths,
            starts: reply.starts,
            probabilities: reply.probabilities,
            weights: reply.weights,
            lost: Vec::new(),
            rejoined: if rejoined { vec![shard] } else { Vec::new() },
        })
    }

    /// Sends each update to the shard that owns its key. Returns how many
    /// were applied; stale keys (evicted, or from a previous run of the
    /// shard) are ignored. A shard that cannot be reached is an error.
    pub fn update_priorities(&self, updates: &[(RemoteKey, f64)]) -> Result<u64> {
        let mut per_shard: Vec<Vec<proto::PriorityUpdate>> = vec![Vec::new(); self.shards.len()];
        for &(key, priority) in updates {
            let s = key.shard as usize;
            let list = per_shard
                .get_mut(s)
                .ok_or_else(|| Error::Config(format!("key names shard {s}, the cluster has {}", self.shards.len())))?;
            list.push(proto::PriorityUpdate { key: Some(key.into()), priority });
        }
        let mut applied = 0;
        for (s, list) in per_shard.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let mut c = self.shards[s].clone();
            let reply = self
                .runtime
                .block_on(c.update_priorities(UpdateRequest { updates: list, table: self.config.table.clone() }))
                .map_err(|e| status(s, e))?
                .into_inner();
            self.note_mass(s, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
            applied += reply.applied;
        }
        Ok(applied)
    }

    /// The shard for each of `n` trajectories written round-robin: the
    /// next live shard in turn (every shard when none is known live).
    fn round_robin(&self, n: usize) -> Vec<usize> {
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

    /// Inserts whole trajectories, each sent in chunks of at most
    /// `chunk_steps` steps (0: one chunk each), into `target`. Returns the
    /// keys in the order of `trajectories`. A failure after some
    /// trajectories were committed is [`Error::PartialInsert`], which lists
    /// them; a trajectory is never stored in part.
    pub fn insert(
        &self,
        target: WriteTarget,
        trajectories: Vec<RemoteTrajectory>,
        chunk_steps: u64,
    ) -> Result<Vec<RemoteKey>> {
        let n = self.shards.len();
        let mut per_shard: Vec<Vec<(usize, RemoteTrajectory)>> = vec![Vec::new(); n];
        match target {
            WriteTarget::Shard(s) if s < n => per_shard[s] = trajectories.into_iter().enumerate().collect(),
            WriteTarget::Shard(s) => return Err(Error::Config(format!("no shard {s}; the cluster has {n}"))),
            WriteTarget::RoundRobin => {
                let shards = self.round_robin(trajectories.len());
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
            WriteTarget::MostFree => {
                let shards = self.spread_by_free_space(trajectories.len())?;
                for ((i, t), s) in trajectories.into_iter().enumerate().zip(shards) {
                    per_shard[s].push((i, t));
                }
            }
        }
        for (s, list) in per_shard.iter().enumerate() {
            if !list.is_empty() {
                self.forget_mass(s);
            }
        }
        self.send_routed(per_shard, chunk_steps)
    }
}

/// The request for `rows` rows of `table` from a shard the client knows as
/// `incarnation` (`None`: any run).
fn sample_request(
    table: &str,
    request: &ClusterSample,
    rows: u64,
    timeout: Duration,
    incarnation: Option<u64>,
) -> SampleRequest {
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
        // The shard gives up waiting a little before the client's deadline.
        timeout_ms: (timeout.as_millis() as u64).saturating_mul(3) / 4,
        ranges: false,
        incarnation: incarnation.unwrap_or(0),
        data_plane_session: 0,
    }
}

/// A shard's reply must have one entry per row in every per-row field.
fn check_sample_reply(shard: usize, rows: u64, r: &proto::SampleReply) -> Result<()> {
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

/// The insert stream of `trajectories` into `table`: chunks of at most
/// `chunk_steps`, the first naming the table.
fn chunks_of(table: &str, trajectories: impl Iterator<Item = RemoteTrajectory>, chunk_steps: u64) -> Vec<InsertChunk> {
    let mut out = Vec::new();
    for t in trajectories {
        if chunk_steps == 0 || chunk_steps >= t.steps {
            // One chunk: the buffers move, no copy.
            out.push(InsertChunk {
                steps: t.steps,
                columns: t.columns,
                priority: t.priority,
                end: true,
                table: String::new(),
            });
            continue;
        }
        let step_bytes: Vec<usize> = t.columns.iter().map(|c| c.len() / t.steps as usize).collect();
        let mut done = 0u64;
        while done < t.steps {
            let steps = chunk_steps.min(t.steps - done);
            let columns = t
                .columns
                .iter()
                .zip(&step_bytes)
                .map(|(c, &b)| {
                    let range = done as usize * b..(done + steps) as usize * b;
                    if range.end <= c.len() {
                        c.slice(range)
                    } else {
                        Bytes::new()
                    }
                })
                .collect();
            let priority = if done == 0 { t.priority } else { None };
            done += steps;
            out.push(InsertChunk { steps, columns, priority, end: done >= t.steps, table: String::new() });
        }
    }
    if let Some(first) = out.first_mut() {
        first.table = table.to_owned();
    }
    out
}
