//! The reading side: [`RdmaTransport`], `gear_core::Transport` over any
//! [`Verbs`].
//!
//! A batch of [`ReadOp`](gear_core::ReadOp)s becomes pieces (an op longer than
//! [`RdmaConfig::max_read_bytes`] is split), pieces become chains of at most
//! [`RdmaConfig::chain_len`] READs posted with one doorbell and only the
//! last signalled, and chains go round-robin to the connection's live
//! queue pairs, each holding at most [`RdmaConfig::send_queue_depth`]
//! requests. Every posted chain sits in its queue pair's in-flight FIFO: RC
//! queue pairs complete in order, so a signalled completion finishes every
//! chain before it in that FIFO, including unsignalled prefixes left by a
//! partial post.
//!
//! Errors: the first error completion on a queue pair finishes the chains
//! before the failing request, fails or retries the failing piece
//! (transport errors are retried on another queue pair up to
//! [`RdmaConfig::max_attempts`]; access and protection errors are not), and
//! retires the queue pair: chains not yet posted on it move to the live
//! ones at once; the queue pair is flushed (moved to the error state) and
//! given a signalled marker request, and only when the marker's
//! completion was polled (every completion of the queue pair is then in,
//! completions on one queue pair being in order) is it destroyed, its
//! completion-queue room released and the pieces it had in flight moved
//! to the live queue pairs. Until then nothing of those pieces is read
//! again (so no late byte of the retired queue pair lands over a retry)
//! and its room stays taken (so its flush completions cannot overrun the
//! completion queue). Every queue pair keeps one entry of the completion
//! queue for its marker. A post that takes nothing retires its queue pair
//! the same way. When a connection has no live queue pair left, its
//! remaining pieces fail; connect again through the control plane. A
//! ticket ends `Ok` only when every piece landed, else with
//! [`gear_core::Error::RemoteRead`] naming the failed ops.
//!
//! Connections: every queue pair's outstanding READs (`max_rd_atomic`) are
//! at most the shard's responder limit carried in its descriptor, and this
//! side's endpoint carries the transport's session (the same for every
//! connection it makes), so a shard replaces an earlier connection of this
//! transport instead of adding one.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gear_core::{MemoryRegion, RemoteHandle};

use crate::error::Result;
use crate::verbs::{MemoryKeys, QueuePairId, Verbs, WorkCompletion};

use crate::config::RdmaConfig;

type CoreResult<T> = gear_core::Result<T>;

mod progress;
mod transport;

/// The part of one op one READ moves.
#[derive(Clone, Copy, Debug)]
struct Piece {
    op: u32,
    remote_offset: u64,
    local_offset: u64,
    len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PieceState {
    InFlight,
    Done,
    Failed,
}

struct TicketState {
    shard: u32,
    connection: u64,
    buffer: u64,
    total_ops: u64,
    pieces: Vec<Piece>,
    states: Vec<PieceState>,
    attempts: Vec<u32>,
    unfinished: usize,
    failed_ops: Vec<u32>,
    first_reason: Option<String>,
}

struct Chain {
    ticket: u64,
    qp: u32,
    pieces: Vec<usize>,
    /// How many of `pieces` are posted (all but a partial post's rest).
    posted: usize,
}

struct QueuePairState {
    id: QueuePairId,
    connection: u64,
    psn: u32,
    /// Connected and taking new chains. False while prepared and once
    /// retired.
    alive: bool,
    /// Set once retired with requests in flight: the id of the marker
    /// posted after the flush; the queue pair is drained when its
    /// completion is polled.
    draining: Option<u64>,
    /// Requests posted and not known complete (completion-queue room
    /// taken), markers aside.
    outstanding: u32,
    in_flight: VecDeque<u64>,
    waiting: VecDeque<u64>,
}

struct Connection {
    shard: u32,
    remote_addr: u64,
    rkey: u32,
    len: u64,
    queue_pairs: Vec<u32>,
    next_queue_pair: usize,
}

struct Registration {
    _region: Arc<dyn MemoryRegion>,
    keys: MemoryKeys,
    addr: u64,
    tickets_in_flight: usize,
}

struct Pending {
    shard: u32,
    queue_pairs: Vec<u32>,
}

#[derive(Default)]
struct ClientState {
    next_id: u64,
    buffers: HashMap<u64, Registration>,
    pending: HashMap<u64, Pending>,
    connections: HashMap<u64, Connection>,
    /// Every queue pair not yet destroyed: prepared, alive or draining.
    queue_pairs: HashMap<u32, QueuePairState>,
    chains: HashMap<u64, Chain>,
    tickets: HashMap<u64, TicketState>,
    /// Requests posted and not known complete, over all queue pairs.
    total_outstanding: u32,
    /// Drain markers in flight: marker id → its queue pair.
    markers: HashMap<u64, u32>,
    completions: Vec<WorkCompletion>,
}

impl ClientState {
    /// Completion-queue room a chain of `n` requests may take now: the
    /// queue's entries less the requests outstanding and one entry per
    /// queue pair for its drain marker.
    fn room_for(&self, n: u32, entries: u32) -> bool {
        let reserved = u64::from(self.total_outstanding) + self.queue_pairs.len() as u64;
        reserved + u64::from(n) <= u64::from(entries)
    }
}

/// A random session id (never 0) for a transport: the same for every
/// connection it makes, different from every other transport's.
pub(crate) fn new_session() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    // `RandomState` is seeded from the OS once per process and varied per
    // instance; the pid, the time and a counter keep sessions apart across
    // processes and within one.
    let session = std::collections::hash_map::RandomState::new().hash_one((
        nanos,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    ));
    session.max(1)
}

/// `gear_core::Transport` over one-sided RDMA READs (see the module docs).
/// All state sits behind one lock; a caller that wants reads driven from
/// several threads at once gives each its own transport.
pub struct RdmaTransport<V: Verbs> {
    verbs: V,
    config: RdmaConfig,
    session: u64,
    state: Mutex<ClientState>,
}

impl<V: Verbs> RdmaTransport<V> {
    /// A transport over `verbs` (creates its completion queue).
    pub fn new(verbs: V, config: RdmaConfig) -> Result<Self> {
        config.validate()?;
        verbs.create_completion_queue(config.completion_queue_entries)?;
        Ok(RdmaTransport {
            verbs,
            config,
            session: new_session(),
            state: Mutex::new(ClientState { next_id: 1, ..Default::default() }),
        })
    }

    /// The verbs underneath (tests inject faults through them).
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// This transport's session, carried in every endpoint it prepares.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// How many queue pairs this transport holds (prepared, connected or
    /// draining), to check that none leaks.
    pub fn queue_pair_count(&self) -> usize {
        self.lock().queue_pairs.len()
    }

    /// How many queue pairs are retired and still draining.
    pub fn draining_queue_pairs(&self) -> usize {
        self.lock().queue_pairs.values().filter(|q| q.draining.is_some()).count()
    }

    /// The queue pair numbers of a connection that are still alive.
    pub fn live_queue_pairs(&self, remote: &RemoteHandle) -> Vec<u32> {
        let st = self.lock();
        let Some(conn) = st.connections.get(&remote.id()) else { return Vec::new() };
        conn.queue_pairs.iter().copied().filter(|q| st.queue_pairs.get(q).is_some_and(|s| s.alive)).collect()
    }

    fn lock(&self) -> MutexGuard<'_, ClientState> {
        // Every update below keeps the maps consistent between statements
        // that could panic (none should); a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An outstanding-read limit a queue pair may be given: the device's,
/// never 0 (a device that reports none still serves one; at 0 every READ
/// fails) and at most 16, what the common NICs report.
pub(crate) fn read_limit(device: u8) -> u8 {
    device.clamp(1, 16)
}

impl<V: Verbs> Drop for RdmaTransport<V> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (_, q) in st.queue_pairs.drain() {
            let _ = self.verbs.destroy_queue_pair(q.id);
        }
        for (_, b) in st.buffers.drain() {
            let _ = self.verbs.deregister_memory(b.keys);
        }
    }
}
