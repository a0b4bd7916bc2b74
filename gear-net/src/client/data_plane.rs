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

mod copy_out;
mod draw;
mod read;
mod transport;

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gear_core::{HeapRegion, LocalBuffer, ReadOp, RemoteHandle, Transport};
use tokio::runtime::Handle;

use super::cluster::AsyncClusterClient;
use super::{BatchRows, ClusterSample, LostShard, RemoteKey};
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

/// The buffer's bytes, read once every ticket into it finished.
fn buffer_bytes(region: &HeapRegion) -> &[u8] {
    // SAFETY: callers read only after every ticket writing into the buffer
    // has finished (or been ended by `disconnect`), so nothing writes it now.
    unsafe { region.bytes() }
}
