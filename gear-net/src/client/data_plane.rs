//! Sampling through a transport: the shards draw (`Sample` with `ranges`)
//! and the client reads the windows itself with one-sided reads of byte
//! ranges of each shard's region, over gear-core's
//! [`Transport`](gear_core::Transport) (RDMA from gear-rdma where it can
//! run, else TCP from gear-tcp).
//!
//! Per batch: `Info` from every shard and the row allocation exactly as the
//! shard-gather path does ([`AsyncClusterClient::sample`]); a ranged `Sample` to
//! every shard at once; reads posted to every shard before waiting on any;
//! then a second post of the 8-byte generation word of every row, after
//! the window bytes landed (the seqlock rule: bytes first, then the
//! generation). A row whose generation changed was overwritten during the
//! read: it is dropped and drawn again from the same shard, at most
//! [`MAX_READ_ATTEMPTS`] times, then the batch fails. A shard whose call or
//! reads fail is left out and reported, its rows drawn from the others;
//! its connection is ended and made again on its next batch.
//!
//! A shard the client cannot connect to is not lost: its rows are drawn by
//! the shard-gather `Sample` and merged into the batch with the same
//! global probabilities and weights; the one ranged draw made before the
//! failure is discarded and the half-made connection aborted (its queue
//! pairs freed). A shard that does not serve the client's transport (it
//! answers `failed_precondition`, e.g. "this shard does not serve rdma")
//! is remembered as gather-only for its incarnation, so the client asks
//! again only after it restarted; any other failure (the shard has no room
//! for more queue pairs: `resource_exhausted`; a device error:
//! `unavailable`; a descriptor this side refuses) makes that shard
//! gather-only for [`RETRY_AFTER`].
//!
//! The batch buffers (every column of every row, then the generation
//! words) are registered with the transport once and reused; the finished
//! batch is copied out of them into the caller's buffers. A batch whose
//! buffer cannot be registered (a low `RLIMIT_MEMLOCK` refuses the
//! pinning) is gathered by the shards instead, and the registration is
//! tried again after [`RETRY_AFTER`].
//!
//! The transport's calls block (waits on reads), so a byte-range batch is
//! drawn and read on one of tokio's blocking threads, which holds the data
//! plane's (async) lock until every read into the buffer has finished or
//! been ended: a caller that drops its future part way leaves no read in
//! flight into a buffer the next batch uses. Its gRPC calls run on the
//! caller's runtime (`Handle::block_on`), each under the batch's deadline.

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gear_api::table::ranges::generation_of;
use gear_core::{HeapRegion, LocalBuffer, ReadOp, RemoteAccess, RemoteHandle, Transport};
use tokio::runtime::Handle;

use super::cluster::{
    check_sample_reply, global_probability, refuses_the_request, sample_request, status, within, AsyncClusterClient,
    ClientCore,
};
use super::weights::WeightNorm;
use super::{BatchRows, ClusterSample, LostShard, RemoteKey};
use crate::connect::{remote_from_reply, request_from_endpoint};
use crate::error::{Error, Result};
use crate::proto::{RowRange, SampleReply};

/// The batch's deadline, on tokio's clock.
type Deadline = tokio::time::Instant;

/// The largest batch read by byte ranges (its buffer is allocated whole).
pub const MAX_RANGE_BATCH_BYTES: u64 = 4 << 30;

/// Draws of a torn row before a batch gives up.
pub const MAX_READ_ATTEMPTS: usize = 8;

/// How long a shard that failed to connect, or a batch size whose buffer
/// failed to register, is gathered by the shards before the byte-range
/// path is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// How [`AsyncClusterClient::sample`] moves the window bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPlane {
    /// Each shard gathers its rows' windows and sends them in its `Sample`
    /// reply.
    ShardGather,
    /// The shards only draw; the client reads the windows as byte ranges
    /// over RDMA where it can run, else over TCP.
    ByteRange,
    /// As [`DataPlane::ByteRange`], over TCP even where RDMA could run.
    ByteRangeTcp,
    /// RDMA byte ranges where RDMA can run, else shard-gather over TCP:
    /// with the client's large HTTP/2 frames, gathering was as fast as TCP
    /// byte ranges or faster at every batch size measured, and takes two
    /// round trips per batch fewer (docs/PERFORMANCE.md, "Data plane:
    /// shard-gather vs byte-range over TCP").
    #[default]
    Auto,
}

struct Connection {
    incarnation: u64,
    handle: RemoteHandle,
}

/// The client's transport state: the transport (made on first use), the
/// registered batch buffer, and a connection per shard.
#[derive(Default)]
pub(crate) struct DataPlaneState {
    /// The transport given to [`AsyncClusterClient::with_transport`], until
    /// the first sample takes it.
    supplied: Option<Box<dyn Transport>>,
    transport: Option<Box<dyn Transport>>,
    buffer: Option<(Arc<HeapRegion>, LocalBuffer)>,
    connections: Vec<Option<Connection>>,
    /// Whether a transport was tried (made once, on the first sample).
    tried: bool,
    /// Per shard, the incarnation that refused to connect over the
    /// transport: its rows are gathered until it restarts.
    gather_only: Vec<Option<u64>>,
    /// Per shard, until when its rows are gathered after a failed connect.
    connect_backoff: Vec<Option<Instant>>,
    /// A batch buffer of at least this many bytes failed to register:
    /// such batches are gathered until the instant given.
    register_backoff: Option<(u64, Instant)>,
    /// The transport's session (from its endpoints), sent with ranged
    /// draws so the shards keep this client's connections alive.
    session: u64,
}

impl DataPlaneState {
    /// A state whose byte-range transport will be `supplied` (else made
    /// from the config on first use).
    pub(crate) fn with_supplied(supplied: Option<Box<dyn Transport>>) -> Self {
        let mut state = DataPlaneState::default();
        state.supplied = supplied;
        state
    }
}

impl Drop for DataPlaneState {
    fn drop(&mut self) {
        // A transport may own a tokio runtime (gear-tcp's does), which
        // panics if dropped where blocking is not allowed; an async client
        // may be dropped anywhere, so the transport goes on a thread of
        // its own there.
        let parts =
            (self.transport.take(), self.supplied.take(), self.buffer.take(), std::mem::take(&mut self.connections));
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = std::thread::Builder::new().name("gear-data-plane-drop".into()).spawn(move || drop(parts));
        }
    }
}

/// Where a row's window bytes come from.
enum RowBytes {
    /// Read from the shard's region at these ranges.
    Remote(RowRange),
    /// Gathered by the shard (it does not serve the transport): each
    /// requested column's whole window, padding included.
    Gathered(Vec<Bytes>),
}

/// A shard and how many rows to draw from it.
type ShardRows = (usize, u64);

/// One row of the batch being read.
struct Row {
    shard: usize,
    key: RemoteKey,
    len: u64,
    start: u64,
    p_local: f64,
    mass: f64,
    total: f64,
    /// The shard's smallest and total mass its reply reported, just after
    /// the draw (the weights' normaliser: `weights` module).
    reported_min: f64,
    reported_total: f64,
    bytes: RowBytes,
}

impl Row {
    /// The ranges to read, for a row read from the shard's region.
    fn range(&self) -> Option<&RowRange> {
        match &self.bytes {
            RowBytes::Remote(range) => Some(range),
            RowBytes::Gathered(_) => None,
        }
    }
}

/// Where each column of row `r` and its generation word sit in the buffer.
struct Placement {
    step_bytes: Vec<u64>,
    window: u64,
    rows: u64,
}

impl Placement {
    fn column_base(&self, c: usize) -> u64 {
        self.step_bytes[..c].iter().map(|s| s * self.window * self.rows).sum()
    }
    fn generation_base(&self) -> u64 {
        self.column_base(self.step_bytes.len())
    }
    fn bytes(&self) -> u64 {
        self.generation_base() + 8 * self.rows
    }
    /// Read ops of row `r`'s windows (at `range`), checked against the
    /// window first (the ranges come from the network).
    fn window_ops(&self, r: usize, row: &Row, range: &RowRange) -> std::result::Result<Vec<ReadOp>, String> {
        let n = self.step_bytes.len();
        if range.offsets.len() != n || range.lens.len() != n {
            return Err(format!("{} ranges for {n} columns", range.offsets.len()));
        }
        if row.len.checked_add(range.dst_step).is_none_or(|e| e > self.window) {
            return Err(format!(
                "{} steps at row step {} overflow a window of {}",
                row.len, range.dst_step, self.window
            ));
        }
        (0..n)
            .map(|c| {
                let s = self.step_bytes[c];
                if range.lens[c] != row.len * s {
                    return Err(format!("column {c}: {} bytes for {} steps of {s}", range.lens[c], row.len));
                }
                let local = self.column_base(c) + (r as u64 * self.window + range.dst_step) * s;
                Ok(ReadOp { remote_offset: range.offsets[c], local_offset: local, len: range.lens[c] })
            })
            .collect()
    }

    /// Bytes of one row's window of every column.
    fn window_bytes(&self, c: usize) -> u64 {
        self.step_bytes[c] * self.window
    }
}

/// A byte-range batch drawn and read: its bytes still in the registered
/// buffer, to be copied out under the same lock.
pub(super) struct RangedDraw {
    place: Placement,
    rows: Vec<Row>,
    lost: Vec<LostShard>,
    rejoined: Vec<usize>,
    /// Each shard's mass and smallest mass as the split knew them.
    masses: Vec<f64>,
    mins: Vec<f64>,
    total: f64,
    beta: f64,
}

/// A failed blocking task as the client's error.
fn worker_failed(e: tokio::task::JoinError) -> Error {
    Error::Io(std::io::Error::other(format!("the byte-range data plane's worker failed: {e}")))
}

impl AsyncClusterClient {
    /// Draws `request` by byte ranges into `columns` if the data plane
    /// reads that way (see [`DataPlane`]); `Ok(false)`: the shards are to
    /// gather it instead.
    pub(super) async fn sample_by_ranges_into(
        &self,
        request: &ClusterSample,
        columns: &mut [&mut [MaybeUninit<u8>]],
        out: &mut BatchRows,
        deadline: Deadline,
    ) -> Result<bool> {
        let Some(st) = self.ranged_plane(request, deadline).await? else { return Ok(false) };
        let (core, rt, request_owned) = (self.core.clone(), Handle::current(), request.clone());
        let (st, drawn) = tokio::task::spawn_blocking(move || {
            let mut st = st;
            let drawn = core.sample_by_ranges(&rt, &mut st, &request_owned, deadline);
            (st, drawn)
        })
        .await
        .map_err(worker_failed)?;
        let drawn = drawn?;
        self.core.assemble_into(&st, &drawn, columns, out)?;
        Ok(true)
    }

    /// The data plane's lock if `sample(request)` reads byte ranges, making
    /// the transport on first use.
    async fn ranged_plane(
        &self,
        request: &ClusterSample,
        deadline: Deadline,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<DataPlaneState>>> {
        if self.core.config.data_plane == DataPlane::ShardGather {
            return Ok(None);
        }
        let mut st = self.core.data_plane.clone().lock_owned().await;
        if !st.tried {
            // Opening a device may block.
            let core = self.core.clone();
            st = tokio::task::spawn_blocking(move || {
                core.make_transport(&mut st);
                st
            })
            .await
            .map_err(worker_failed)?;
        }
        if st.transport.is_none() {
            return Ok(None);
        }
        // A request the table cannot serve goes the gather way, which
        // refuses it naming what was wrong (and sizes no buffer here).
        let Some(bytes) = self.core.batch_bytes(request, deadline).await else { return Ok(None) };
        // The batch buffer must be registered (pinned) first; where that
        // fails, the shards gather. Registering may block.
        let bytes = bytes + 8 * request.rows;
        if st.buffer.as_ref().is_some_and(|(_, b)| b.len() >= bytes) {
            return Ok(Some(st));
        }
        let core = self.core.clone();
        let (st, registered) = tokio::task::spawn_blocking(move || {
            let registered = core.register_batch_buffer(&mut st, bytes);
            (st, registered)
        })
        .await
        .map_err(worker_failed)?;
        Ok(registered.then_some(st))
    }

    /// How `sample(request)` moves the windows: `Some(kind)` when by byte
    /// ranges over that transport, `None` when the shards gather them.
    pub async fn data_plane_for(&self, request: &ClusterSample) -> Result<Option<gear_core::TransportKind>> {
        let deadline = Deadline::now() + self.core.config.call_timeout;
        Ok(self.ranged_plane(request, deadline).await?.and_then(|st| st.transport.as_ref().map(|t| t.kind())))
    }

    /// The kind of the transport byte-range sampling uses, once the first
    /// `sample` made it (`None`: shard-gather only, or not decided yet).
    pub fn data_plane_kind(&self) -> Option<gear_core::TransportKind> {
        *self.core.transport_kind.lock()
    }
}

impl ClientCore {
    /// Makes the byte-range transport the config asks for, once.
    fn make_transport(&self, st: &mut DataPlaneState) {
        st.tried = true;
        st.transport = match self.config.data_plane {
            DataPlane::ShardGather => None,
            DataPlane::ByteRangeTcp => self.tcp_transport(),
            DataPlane::ByteRange => {
                st.supplied.take().or_else(|| self.rdma_transport()).or_else(|| self.tcp_transport())
            }
            // Without RDMA, Auto gathers on the shards: no TCP transport is
            // made.
            DataPlane::Auto => st.supplied.take().or_else(|| self.rdma_transport()),
        };
        st.connections = (0..self.shards.len()).map(|_| None).collect();
        st.gather_only = vec![None; self.shards.len()];
        st.connect_backoff = vec![None; self.shards.len()];
        *self.transport_kind.lock() = st.transport.as_ref().map(|t| t.kind());
    }

    /// Registers a batch buffer of at least `bytes` unless a registration
    /// of as much failed less than [`RETRY_AFTER`] ago; whether it is
    /// there (else the shards gather such batches).
    fn register_batch_buffer(&self, st: &mut DataPlaneState, bytes: u64) -> bool {
        if st.register_backoff.is_some_and(|(failed, until)| bytes >= failed && Instant::now() < until) {
            return false;
        }
        match self.ensure_buffer(st, bytes) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "a batch buffer of {bytes} bytes cannot be registered with the data plane ({e}); the shards \
                     gather such batches for {RETRY_AFTER:?}"
                );
                st.register_backoff = Some((bytes, Instant::now() + RETRY_AFTER));
                false
            }
        }
    }

    /// Bytes of one batch of `request`; `None` if the spec cannot be had or
    /// the request is not valid for it (rows, window, column names).
    async fn batch_bytes(&self, request: &ClusterSample, deadline: Deadline) -> Option<u64> {
        let spec = self.cached_spec(deadline).await.ok()?;
        if request.rows == 0 || request.rows > crate::convert::MAX_SAMPLE_ROWS {
            return None;
        }
        let row = super::assemble::row_bytes(&spec, request)?
            .into_iter()
            .try_fold(0u64, |sum, bytes| sum.checked_add(u64::try_from(bytes).ok()?))?;
        // Larger batches go the gather way, whose message limit refuses them.
        row.checked_mul(request.rows).filter(|&b| b <= MAX_RANGE_BATCH_BYTES)
    }

    fn rdma_transport(&self) -> Option<Box<dyn Transport>> {
        match self.config.rdma.device_transport() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::info!("rdma data plane unavailable ({e})");
                None
            }
        }
    }

    fn tcp_transport(&self) -> Option<Box<dyn Transport>> {
        let config = gear_tcp::TcpConfig {
            connect_timeout: self.config.connect_timeout,
            call_timeout: self.config.call_timeout,
            headers: vec![("authorization".into(), format!("Bearer {}", self.config.token))],
            ..gear_tcp::TcpConfig::default()
        };
        match gear_tcp::TcpTransport::new(config) {
            Ok(t) => Some(Box::new(t)),
            Err(e) => {
                tracing::warn!("tcp data plane unavailable ({e})");
                None
            }
        }
    }

    /// Connects to `shard` (again after it restarted).
    fn connection(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        shard: usize,
        incarnation: u64,
        deadline: Deadline,
    ) -> Result<()> {
        if st.connections[shard].as_ref().is_some_and(|c| c.incarnation == incarnation) {
            return Ok(());
        }
        let transport = st.transport.as_ref().ok_or_else(|| Error::Config("no transport".into()))?;
        if let Some(old) = st.connections[shard].take() {
            let _ = transport.disconnect(&old.handle);
        }
        let pending = transport.prepare_connection(shard as u32)?;
        let session = pending.endpoint.session();
        let answer = (|| {
            let mut c = self.shards[shard].grpc.clone();
            let mut request = request_from_endpoint(&pending.endpoint);
            request.table = self.config.table.clone();
            let reply = rt.block_on(within(deadline, c.connect_data_plane(request))).map_err(|s| status(shard, s))?;
            let mut remote = remote_from_reply(&reply).map_err(|what| Error::Malformed { shard, what })?;
            if let RemoteAccess::Tcp { peer, .. } = &mut remote.access {
                // The data service shares the shard's gRPC port: dial the
                // address this client reaches the shard at, not the one the
                // shard listens on (0.0.0.0, a private name).
                peer.address = self.config.shards[shard].clone();
            }
            Ok::<_, Error>((reply.incarnation, remote))
        })();
        let (incarnation, remote) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // No answer to connect with: free what was prepared.
                let _ = transport.abort(pending);
                return Err(e);
            }
        };
        let handle = transport.connect(pending, &remote)?;
        st.connections[shard] = Some(Connection { incarnation, handle });
        st.session = session;
        Ok(())
    }

    /// Draws of `counts[s]` rows from each shard `s`, at once: ranged
    /// (`ranges`: the shards reply with where the windows are) or gathered
    /// (the shards reply with the windows' bytes).
    /// `session` is the transport's (0 before the first connection), sent
    /// with ranged draws.
    #[allow(clippy::too_many_arguments)]
    fn draw(
        &self,
        rt: &Handle,
        request: &ClusterSample,
        counts: &[(usize, u64)],
        ranges: bool,
        session: u64,
        deadline: Deadline,
    ) -> Vec<(usize, u64, std::result::Result<SampleReply, Error>)> {
        if counts.is_empty() {
            return Vec::new();
        }
        // Three quarters of the time left, as the gather path's rounds.
        let now = Deadline::now();
        let round = now + deadline.saturating_duration_since(now) * 3 / 4;
        rt.block_on(async {
            let calls = counts.iter().map(|&(s, n)| {
                let mut c = self.shards[s].grpc.clone();
                let mut req = sample_request(&self.config.table, request, n, round, self.incarnation_of(s));
                req.ranges = ranges;
                req.data_plane_session = if ranges { session } else { 0 };
                async move { (s, n, within(round, c.sample(req)).await) }
            });
            let mut out = Vec::new();
            for (s, n, reply) in futures_util::future::join_all(calls).await {
                let r = match reply {
                    Ok(reply) => match check_sample_reply(s, n, &reply) {
                        Ok(()) if !ranges || reply.row_ranges.len() == n as usize => Ok(reply),
                        Ok(()) => Err(Error::Malformed { shard: s, what: "row ranges missing".into() }),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(status(s, e)),
                };
                out.push((s, n, r));
            }
            out
        })
    }

    /// [`AsyncClusterClient::sample`] over the transport (module docs), on
    /// a blocking thread; the batch's bytes stay in the buffer.
    pub(super) fn sample_by_ranges(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        request: &ClusterSample,
        deadline: Deadline,
    ) -> Result<RangedDraw> {
        let (mut lost, mut rejoined) = (Vec::new(), Vec::new());
        let spec = rt.block_on(self.cached_spec(deadline))?;
        let columns: Vec<usize> = if request.columns.is_empty() {
            (0..spec.columns().len()).collect()
        } else {
            request.columns.iter().map(|n| spec.column_index(n)).collect::<gear_core::Result<_>>()?
        };
        request.window.validate(spec.max_len())?;
        let place = Placement {
            step_bytes: columns.iter().map(|&c| spec.columns()[c].step_bytes()).collect::<gear_core::Result<_>>()?,
            window: request.window.len,
            rows: request.rows,
        };
        let info_deadline = {
            let now = Deadline::now();
            now + deadline.saturating_duration_since(now) / 4
        };
        let mut m = super::masses::ShardMasses::default();
        rt.block_on(self.shard_masses(&mut m, &mut lost, &mut rejoined, info_deadline))?;
        if m.deterministic > 0 {
            return Err(Error::Unsupported(
                "byte-range sampling needs a random strategy; use the shard-gather data plane".into(),
            ));
        }
        let (first_masses, mins) = (m.masses.clone(), m.mins);
        let mut masses = m.masses;
        let first_total: f64 = masses.iter().sum();
        let beta = rt.block_on(self.beta(deadline))?;
        self.ensure_buffer(st, place.bytes())?;
        let mut counts = Vec::new();
        let mut rows: Vec<Row> = Vec::with_capacity(request.rows as usize);
        let mut remaining = request.rows;
        // Set when a lost shard's rows were taken out: the rows after them
        // moved to other places in the buffer and are read again.
        let mut shifted = false;
        for _round in 0..self.shards.len() {
            let total: f64 = masses.iter().sum();
            if remaining == 0 {
                break;
            }
            if total <= 0.0 {
                return Err(Error::NoShard(format!("no shard holds items (lost: {lost:?})")));
            }
            self.allocate(&masses, remaining, &mut counts);
            let (ranged, mut gathered): (Vec<ShardRows>, Vec<ShardRows>) = counts
                .iter()
                .copied()
                .enumerate()
                .filter(|&(_, n)| n > 0)
                .partition(|&(s, _)| !self.is_gather_only(st, s));
            let first = if std::mem::take(&mut shifted) { 0 } else { rows.len() };
            let lose = |s: usize, reason: String, masses: &mut Vec<f64>, lost: &mut Vec<LostShard>| {
                self.mark_lost(s, &reason);
                lost.push(LostShard { shard: s, reason });
                masses[s] = 0.0;
            };
            let session = st.session;
            for (s, n, reply) in self.draw(rt, request, &ranged, true, session, deadline) {
                let connected = reply.map(|r| match self.connection(rt, st, s, r.incarnation, deadline) {
                    Ok(()) => Some(r),
                    // No connection: gather its rows.
                    Err(e) => {
                        self.note_connect_failure(st, s, r.incarnation, &e);
                        None
                    }
                });
                match connected {
                    Ok(Some(reply)) => {
                        remaining -= n;
                        self.note_sample_mass(s, &reply);
                        push_rows(&mut rows, s, masses[s], total, reply);
                    }
                    Ok(None) => gathered.push((s, n)),
                    Err(e) => lose(s, refusal(s, e)?, &mut masses, &mut lost),
                }
            }
            for (s, n, reply) in self.draw(rt, request, &gathered, false, 0, deadline) {
                match reply {
                    Ok(reply) => {
                        self.note_sample_mass(s, &reply);
                        push_gathered(&mut rows, s, masses[s], total, reply, &place)?;
                        remaining -= n;
                    }
                    Err(e) => lose(s, refusal(s, e)?, &mut masses, &mut lost),
                }
            }
            // Read the new rows; a shard whose reads fail gives its rows back.
            let failed = self.read_rows(rt, st, request, &place, &mut rows, first, deadline)?;
            for (s, reason) in failed {
                let before = rows.len();
                rows.retain(|r| r.shard != s);
                remaining += (before - rows.len()) as u64;
                shifted = true;
                lose(s, reason, &mut masses, &mut lost);
            }
        }
        if remaining > 0 {
            return Err(Error::NoShard(format!("{remaining} rows could not be drawn; lost: {lost:?}")));
        }
        Ok(RangedDraw { place, rows, lost, rejoined, masses: first_masses, mins, total: first_total, beta })
    }

    /// Records the masses a `Sample` reply from `shard` carries.
    fn note_sample_mass(&self, shard: usize, reply: &SampleReply) {
        self.note_mass(shard, reply.incarnation, reply.size, reply.total_mass, reply.min_mass);
    }

    /// Whether `shard`'s rows are gathered: it refused to connect over the
    /// transport in the incarnation it answered `Info` with this batch, or
    /// a connect failed less than [`RETRY_AFTER`] ago.
    fn is_gather_only(&self, st: &DataPlaneState, shard: usize) -> bool {
        if st.connect_backoff[shard].is_some_and(|until| Instant::now() < until) {
            return true;
        }
        let known = self.state.lock()[shard].incarnation;
        st.gather_only[shard].is_some_and(|refused| known == Some(refused))
    }

    /// A connect to `shard` failed with `e`: gather its rows, for its
    /// incarnation when it does not serve the transport, else for
    /// [`RETRY_AFTER`].
    fn note_connect_failure(&self, st: &mut DataPlaneState, shard: usize, incarnation: u64, e: &Error) {
        let kind = st.transport.as_ref().map_or("the transport", |t| t.kind().name());
        let address = &self.config.shards[shard];
        match e {
            Error::Status { status, .. } if status.code() == tonic::Code::FailedPrecondition => {
                tracing::info!(
                    "shard {shard} ({address}) does not serve {kind} ({}); its rows are gathered by the shard",
                    status.message()
                );
                st.gather_only[shard] = Some(incarnation);
            }
            e => {
                tracing::warn!(
                    "shard {shard} ({address}): {kind} connect failed ({e}); its rows are gathered by the shard for \
                     {RETRY_AFTER:?}"
                );
                st.connect_backoff[shard] = Some(Instant::now() + RETRY_AFTER);
            }
        }
    }

    /// Registers a batch buffer of at least `bytes`, once (again only when
    /// a larger batch needs more).
    fn ensure_buffer(&self, st: &mut DataPlaneState, bytes: u64) -> Result<()> {
        if st.buffer.as_ref().is_some_and(|(_, b)| b.len() >= bytes) {
            return Ok(());
        }
        let transport = st.transport.as_ref().ok_or_else(|| Error::Config("no transport".into()))?;
        if let Some((_, old)) = st.buffer.take() {
            transport.release_local(&old)?;
        }
        let len = usize::try_from(bytes.max(1))
            .map_err(|_| Error::Config(format!("a batch of {bytes} bytes is too large")))?;
        let region = Arc::new(HeapRegion::zeroed(len));
        let local = transport.register_local(region.clone())?;
        st.buffer = Some((region, local));
        Ok(())
    }

    /// Reads rows `first..` (windows, then generations), redrawing torn
    /// rows from their shard. Returns the shards whose reads failed.
    #[allow(clippy::too_many_arguments)]
    fn read_rows(
        &self,
        rt: &Handle,
        st: &mut DataPlaneState,
        request: &ClusterSample,
        place: &Placement,
        rows: &mut [Row],
        first: usize,
        deadline: Deadline,
    ) -> Result<Vec<(usize, String)>> {
        // Gathered rows are complete already.
        let mut pending: Vec<usize> = (first..rows.len()).filter(|&r| rows[r].range().is_some()).collect();
        let mut failed: Vec<(usize, String)> = Vec::new();
        for attempt in 1..=MAX_READ_ATTEMPTS {
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            if pending.is_empty() {
                return Ok(failed);
            }
            // Windows first, to every shard before waiting on any.
            let mut window_ops: Vec<(usize, Vec<ReadOp>)> = Vec::new();
            for &r in &pending {
                let Some(range) = rows[r].range() else { continue };
                let ops = place
                    .window_ops(r, &rows[r], range)
                    .map_err(|what| Error::Malformed { shard: rows[r].shard, what })?;
                match window_ops.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, list)) => list.extend(ops),
                    None => window_ops.push((rows[r].shard, ops)),
                }
            }
            failed.extend(self.post_and_wait(st, &window_ops, deadline));
            // Then every row's generation word.
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            let mut gen_ops: Vec<(usize, Vec<ReadOp>)> = Vec::new();
            for &r in &pending {
                let Some(range) = rows[r].range() else { continue };
                let op = ReadOp {
                    remote_offset: range.generation_offset,
                    local_offset: place.generation_base() + 8 * r as u64,
                    len: 8,
                };
                match gen_ops.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, list)) => list.push(op),
                    None => gen_ops.push((rows[r].shard, vec![op])),
                }
            }
            failed.extend(self.post_and_wait(st, &gen_ops, deadline));
            pending.retain(|&r| !failed.iter().any(|(s, _)| *s == rows[r].shard));
            let Some((region, _)) = &st.buffer else { return Err(Error::Config("no batch buffer".into())) };
            let torn: Vec<usize> = pending
                .iter()
                .copied()
                .filter(|&r| {
                    let at = (place.generation_base() + 8 * r as u64) as usize;
                    let word = u64::from_le_bytes(buffer_bytes(region)[at..at + 8].try_into().unwrap_or([0; 8]));
                    generation_of(word) != rows[r].key.generation
                })
                .collect();
            if torn.is_empty() {
                return Ok(failed);
            }
            if attempt == MAX_READ_ATTEMPTS {
                break;
            }
            // Draw the torn rows again from the same shards.
            let mut counts: Vec<(usize, u64)> = Vec::new();
            for &r in &torn {
                match counts.iter_mut().find(|(s, _)| *s == rows[r].shard) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((rows[r].shard, 1)),
                }
            }
            for (s, _, reply) in self.draw(rt, request, &counts, true, st.session, deadline) {
                let targets: Vec<usize> = torn.iter().copied().filter(|&r| rows[r].shard == s).collect();
                match reply {
                    Ok(reply) => {
                        for (i, &r) in targets.iter().enumerate() {
                            let (mass, total) = (rows[r].mass, rows[r].total);
                            rows[r] = row_of(&reply, i, s, mass, total, RowBytes::Remote(reply.row_ranges[i].clone()));
                        }
                    }
                    Err(e) => failed.push((s, e.to_string())),
                }
            }
            pending = torn;
        }
        Err(Error::NoShard(format!("rows were overwritten during {MAX_READ_ATTEMPTS} reads in a row")))
    }

    /// Posts each shard's ops, then waits for all with one deadline.
    /// Returns the shards whose reads failed.
    fn post_and_wait(
        &self,
        st: &mut DataPlaneState,
        ops: &[(usize, Vec<ReadOp>)],
        deadline: Deadline,
    ) -> Vec<(usize, String)> {
        let mut failed = Vec::new();
        let (Some(transport), Some((_, local))) = (st.transport.as_ref(), st.buffer.as_ref()) else {
            return ops.iter().map(|(s, _)| (*s, "no transport".to_owned())).collect();
        };
        let mut tickets = Vec::new();
        let mut shards = Vec::new();
        for (s, list) in ops {
            let Some(conn) = st.connections[*s].as_ref() else {
                failed.push((*s, "not connected".to_owned()));
                continue;
            };
            match transport.post_reads(&conn.handle, local, list) {
                Ok(t) => {
                    tickets.push(t);
                    shards.push(*s);
                }
                Err(e) => failed.push((*s, format!("reads refused: {e}"))),
            }
        }
        // Three quarters of the time left, as for the draws: a shard whose
        // reads hang leaves time to draw its rows from the others.
        let now = Deadline::now();
        let deadline = (now + deadline.saturating_duration_since(now) * 3 / 4).into_std();
        for ((s, t), r) in shards.iter().zip(&tickets).zip(transport.wait_all(&tickets, deadline)) {
            if let Err(e) = r {
                // End the connection and connect again next time: after a
                // timeout its reads are still in flight (end them before
                // the buffer is reused); after a failed read it may have
                // no live queue pair left.
                if let Some(conn) = st.connections[*s].take() {
                    let _ = transport.disconnect(&conn.handle);
                }
                if matches!(e, gear_core::Error::Timeout(_)) {
                    let _ = transport.wait(t, Instant::now() + Duration::from_secs(1));
                }
                failed.push((*s, format!("reads failed: {e}")));
            }
        }
        failed
    }

    /// Copies the rows of `drawn` out of the buffer into `columns`
    /// (zeroing padding) and their fields into `out`, with probabilities
    /// and weights as the shard-gather path computes them.
    pub(super) fn assemble_into(
        &self,
        st: &DataPlaneState,
        drawn: &RangedDraw,
        columns: &mut [&mut [MaybeUninit<u8>]],
        out: &mut BatchRows,
    ) -> Result<()> {
        let RangedDraw { place, rows, lost, rejoined, masses, mins, total, beta } = drawn;
        let Some((region, _)) = &st.buffer else { return Err(Error::Config("no batch buffer".into())) };
        let bytes = buffer_bytes(region);
        if columns.len() != place.step_bytes.len() {
            return Err(Error::Config(format!(
                "{} column buffers for the {} columns requested",
                columns.len(),
                place.step_bytes.len()
            )));
        }
        for (c, (buf, &s)) in columns.iter().zip(&place.step_bytes).enumerate() {
            let need = (s * place.window) as usize * rows.len();
            if buf.len() < need {
                return Err(Error::Config(format!("column {c}: a buffer of {} bytes for {need}", buf.len())));
            }
        }
        let mut norm = WeightNorm::default();
        for (s, (&mass, &min)) in masses.iter().zip(mins).enumerate() {
            if mass > 0.0 && *total > 0.0 && !rows.iter().any(|r| r.shard == s) {
                norm.smallest_probability(min / total);
            }
        }
        for row in rows {
            if row.reported_total > 0.0 {
                norm.smallest_probability(row.reported_min / row.reported_total * row.mass / row.total);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            for (c, &s) in place.step_bytes.iter().enumerate() {
                let w = (place.window * s) as usize;
                let dst = &mut columns[c][r * w..(r + 1) * w];
                let range = match &row.bytes {
                    RowBytes::Remote(range) => range,
                    RowBytes::Gathered(gathered) => {
                        write_bytes(dst, &gathered[c]);
                        continue;
                    }
                };
                let base = (place.column_base(c) + r as u64 * place.window * s) as usize;
                let (lo, hi) = ((range.dst_step * s) as usize, ((range.dst_step + row.len) * s) as usize);
                write_zeros(&mut dst[..lo]);
                write_bytes(&mut dst[lo..hi], &bytes[base + lo..base + hi]);
                write_zeros(&mut dst[hi..]);
            }
            out.keys.push(row.key);
            out.lengths.push(row.len);
            out.starts.push(row.start);
            let p = global_probability(row.p_local, row.mass, row.total);
            norm.row(p);
            out.probabilities.push(p);
        }
        out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, *beta)));
        out.lost.extend_from_slice(lost);
        out.rejoined.extend_from_slice(rejoined);
        Ok(())
    }
}

/// Copies `src` into `dst` (the same length).
fn write_bytes(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        d.write(b);
    }
}

/// Zeroes `dst` (padding).
fn write_zeros(dst: &mut [MaybeUninit<u8>]) {
    dst.fill(MaybeUninit::new(0));
}

/// Row `i` of a checked `Sample` reply, its window bytes from `bytes`.
fn row_of(reply: &SampleReply, i: usize, shard: usize, mass: f64, total: f64, bytes: RowBytes) -> Row {
    Row {
        shard,
        key: RemoteKey::from_proto(&reply.keys[i]),
        len: reply.lengths[i],
        start: reply.starts[i],
        p_local: reply.probabilities[i],
        mass,
        total,
        reported_min: reply.min_mass,
        reported_total: reply.total_mass,
        bytes,
    }
}

/// A failed call's error if it must end the batch (the request is invalid
/// or too large for the shard: every shard would refuse it), else the
/// reason to report the shard lost with.
fn refusal(shard: usize, e: Error) -> Result<String> {
    match e {
        Error::Status { status: e, .. } if refuses_the_request(&e) => Err(status(shard, *e)),
        e => Ok(e.to_string()),
    }
}

/// Adds the rows of a gathered `Sample` reply (checked by
/// `check_sample_reply`), each column cut into its rows' windows without
/// copying.
fn push_gathered(
    rows: &mut Vec<Row>,
    shard: usize,
    mass: f64,
    total: f64,
    reply: SampleReply,
    place: &Placement,
) -> Result<()> {
    let n = reply.keys.len();
    let sizes: Vec<usize> = reply.columns.iter().map(Bytes::len).collect();
    let expected: Vec<usize> = (0..place.step_bytes.len()).map(|c| n * place.window_bytes(c) as usize).collect();
    if sizes != expected {
        return Err(Error::Malformed {
            shard,
            what: format!("gathered columns have {sizes:?} bytes for {n} rows, expected {expected:?}"),
        });
    }
    for i in 0..n {
        let columns = reply
            .columns
            .iter()
            .enumerate()
            .map(|(c, bytes)| {
                let w = place.window_bytes(c) as usize;
                bytes.slice(i * w..(i + 1) * w)
            })
            .collect();
        rows.push(row_of(&reply, i, shard, mass, total, RowBytes::Gathered(columns)));
    }
    Ok(())
}

fn push_rows(rows: &mut Vec<Row>, shard: usize, mass: f64, total: f64, reply: SampleReply) {
    for i in 0..reply.keys.len() {
        rows.push(row_of(&reply, i, shard, mass, total, RowBytes::Remote(reply.row_ranges[i].clone())));
    }
}

/// The buffer's bytes, read once every ticket into it finished.
fn buffer_bytes(region: &HeapRegion) -> &[u8] {
    // SAFETY: callers read only after every ticket writing into the buffer
    // has finished (or been ended by `disconnect`), so nothing writes it now.
    unsafe { region.bytes() }
}
