//! The reading side: [`RdmaTransport`], `gear_core::Transport` over any
//! [`Verbs`].
//!
//! A batch of [`ReadOp`]s becomes pieces (an op longer than
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
use std::time::{Duration, Instant};

use gear_core::transport::check_read_ops;
use gear_core::{
    LocalBuffer, MemoryRegion, PeerEndpoint, PendingConnection, QueuePairEndpoint, RdmaEndpoint, ReadOp, RemoteAccess,
    RemoteHandle, RemoteRegion, Ticket, Transport, TransportKind,
};

use crate::error::Result;
use crate::verbs::{
    CompletionStatus, ConnectAttributes, MemoryAccess, MemoryKeys, QueuePairCaps, QueuePairId, ReadRequest, Verbs,
    WorkCompletion,
};

use crate::config::RdmaConfig;
use crate::config::INDEX_BITS;

type CoreResult<T> = gear_core::Result<T>;

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

    fn psn_for(id: u64, index: usize) -> u32 {
        // Any 24-bit value works; vary it per queue pair so a stale packet
        // of an earlier connection is unlikely to match.
        let mixed = (id ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        (mixed >> 40) as u32 & 0xff_ffff
    }

    /// Moves pieces of `ticket` to new chains on the connection's live
    /// queue pairs; fails them when none is left.
    fn requeue(&self, st: &mut ClientState, ticket_id: u64, mut pieces: Vec<usize>) {
        // Pieces that landed before their queue pair was retired stay done.
        match st.tickets.get(&ticket_id) {
            Some(t) => pieces.retain(|&p| t.states.get(p) == Some(&PieceState::InFlight)),
            None => pieces.clear(),
        }
        if pieces.is_empty() {
            return;
        }
        let Some(conn_id) = st.tickets.get(&ticket_id).map(|t| t.connection) else { return };
        let live: Vec<u32> = st
            .connections
            .get(&conn_id)
            .map(|c| c.queue_pairs.iter().copied().filter(|q| st.queue_pairs.get(q).is_some_and(|s| s.alive)).collect())
            .unwrap_or_default();
        if live.is_empty() {
            let reason = "no live queue pair left on the connection (reconnect through the control plane)";
            for p in pieces {
                self.fail_piece(st, ticket_id, p, reason);
            }
            return;
        }
        let start = st.connections.get(&conn_id).map_or(0, |c| c.next_queue_pair);
        for (n, group) in pieces.chunks(self.config.chain_len).enumerate() {
            let qp = live[(start + n) % live.len()];
            let chain_id = st.next_id;
            st.next_id += 1;
            st.chains.insert(chain_id, Chain { ticket: ticket_id, qp, pieces: group.to_vec(), posted: 0 });
            if let Some(q) = st.queue_pairs.get_mut(&qp) {
                q.waiting.push_back(chain_id);
            }
        }
        if let Some(c) = st.connections.get_mut(&conn_id) {
            c.next_queue_pair = start.wrapping_add(pieces.len().div_ceil(self.config.chain_len));
        }
    }

    fn finish_piece(st: &mut ClientState, ticket_id: u64, piece: usize, to: PieceState) {
        let Some(t) = st.tickets.get_mut(&ticket_id) else { return };
        if t.states.get(piece) != Some(&PieceState::InFlight) {
            return;
        }
        t.states[piece] = to;
        t.unfinished -= 1;
        if t.unfinished == 0 {
            let buffer = t.buffer;
            if let Some(b) = st.buffers.get_mut(&buffer) {
                b.tickets_in_flight = b.tickets_in_flight.saturating_sub(1);
            }
        }
    }

    fn fail_piece(&self, st: &mut ClientState, ticket_id: u64, piece: usize, reason: &str) {
        if let Some(t) = st.tickets.get_mut(&ticket_id) {
            if let Some(p) = t.pieces.get(piece) {
                if !t.failed_ops.contains(&p.op) {
                    t.failed_ops.push(p.op);
                }
                t.first_reason.get_or_insert_with(|| reason.to_string());
            }
        }
        Self::finish_piece(st, ticket_id, piece, PieceState::Failed);
    }

    /// Takes a queue pair out of service (module docs): chains waiting on
    /// it move to the live queue pairs at once; with requests in flight it
    /// is flushed and drains (destroyed when its marker completes), else
    /// it is destroyed now.
    fn retire_queue_pair(&self, st: &mut ClientState, qp_number: u32) {
        let Some(q) = st.queue_pairs.get_mut(&qp_number) else { return };
        if q.draining.is_some() {
            return;
        }
        q.alive = false;
        let id = q.id;
        let waiting: Vec<u64> = q.waiting.drain(..).collect();
        let idle = q.in_flight.is_empty() && q.outstanding == 0;
        if idle || !self.start_drain(st, qp_number, id) {
            self.destroy_now(st, qp_number);
        }
        for chain_id in waiting {
            if let Some(chain) = st.chains.remove(&chain_id) {
                self.requeue(st, chain.ticket, chain.pieces);
            }
        }
    }

    /// Flushes `qp` and posts its drain marker; false when the device
    /// refused either (the queue pair is then destroyed undrained: nothing
    /// better is left to do with it).
    fn start_drain(&self, st: &mut ClientState, qp_number: u32, id: QueuePairId) -> bool {
        if self.verbs.flush_queue_pair(id).is_err() {
            return false;
        }
        let marker = st.next_id;
        st.next_id += 1;
        // Never executed (the queue pair is in the error state): it only
        // completes, flushed, after every request posted before it.
        let request = ReadRequest {
            wr_id: marker << INDEX_BITS,
            local_addr: 0,
            lkey: 0,
            remote_addr: 0,
            rkey: 0,
            len: 0,
            signaled: true,
        };
        if self.verbs.post_reads(id, &[request]).is_err() {
            return false;
        }
        st.markers.insert(marker, qp_number);
        if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
            q.draining = Some(marker);
        }
        true
    }

    /// Destroys a queue pair that has nothing in flight (or could not be
    /// drained), releases its room and moves its unfinished pieces on.
    fn destroy_now(&self, st: &mut ClientState, qp_number: u32) {
        let Some(q) = st.queue_pairs.remove(&qp_number) else { return };
        st.total_outstanding = st.total_outstanding.saturating_sub(q.outstanding);
        if let Some(marker) = q.draining {
            st.markers.remove(&marker);
        }
        // Destroying may fail on a broken device; the queue pair is out of
        // service either way.
        let _ = self.verbs.destroy_queue_pair(q.id);
        for chain_id in q.in_flight.into_iter().chain(q.waiting) {
            if let Some(chain) = st.chains.remove(&chain_id) {
                self.requeue(st, chain.ticket, chain.pieces);
            }
        }
    }

    fn on_completion(&self, st: &mut ClientState, wc: WorkCompletion) {
        let chain_id = wc.wr_id >> INDEX_BITS;
        let index = (wc.wr_id & ((1 << INDEX_BITS) - 1)) as usize;
        if let Some(qp_number) = st.markers.remove(&chain_id) {
            // A retired queue pair's marker: every completion of it was
            // polled (they come in order), so its room is free and nothing
            // more lands from it.
            self.destroy_now(st, qp_number);
            return;
        }
        let Some(qp_number) = st.chains.get(&chain_id).map(|c| c.qp) else { return };
        let Some(q) = st.queue_pairs.get(&qp_number) else { return };
        if !q.in_flight.contains(&chain_id) {
            return;
        }
        // A draining queue pair's successes finish their chains as usual;
        // its errors and flushes say nothing new: what did not land is
        // moved on when the drain ends.
        if q.draining.is_some() && wc.status != CompletionStatus::Success {
            return;
        }
        // Chains posted before this one on the queue pair have completed.
        loop {
            let Some(q) = st.queue_pairs.get_mut(&qp_number) else { return };
            let Some(&front) = q.in_flight.front() else { return };
            if front == chain_id && wc.status != CompletionStatus::Success {
                break;
            }
            q.in_flight.pop_front();
            if let Some(chain) = st.chains.remove(&front) {
                if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                    q.outstanding = q.outstanding.saturating_sub(chain.posted as u32);
                }
                st.total_outstanding = st.total_outstanding.saturating_sub(chain.posted as u32);
                for &p in chain.pieces.iter().take(chain.posted) {
                    Self::finish_piece(st, chain.ticket, p, PieceState::Done);
                }
            }
            if front == chain_id {
                return;
            }
        }
        // An error: requests before `index` landed, the one at `index`
        // failed, and the queue pair is in the error state.
        let Some(chain) = st.chains.get(&chain_id) else { return };
        let (ticket, pieces) = (chain.ticket, chain.pieces.clone());
        let index = index.min(pieces.len().saturating_sub(1));
        let Some(&failing) = pieces.get(index) else {
            self.retire_queue_pair(st, qp_number);
            return;
        };
        for &p in &pieces[..index] {
            Self::finish_piece(st, ticket, p, PieceState::Done);
        }
        if let Some(chain) = st.chains.get_mut(&chain_id) {
            // Only the unfinished rest goes back out with the queue pair's
            // other chains when it is retired.
            chain.pieces = pieces[index..].to_vec();
            chain.posted = chain.posted.saturating_sub(index);
        }
        let status = wc.status;
        // A flush is not the piece's fault: it goes out again uncounted.
        let counted = status != CompletionStatus::Flushed;
        let attempts = st.tickets.get_mut(&ticket).and_then(|t| {
            let a = t.attempts.get_mut(failing)?;
            *a += u32::from(counted);
            Some(*a)
        });
        let retry = status == CompletionStatus::Flushed
            || (status.is_retryable() && attempts.is_some_and(|a| a < self.config.max_attempts));
        if !retry {
            let reason = format!("{status:?} on queue pair {qp_number:#x}");
            self.fail_piece(st, ticket, failing, &reason);
            if let Some(chain) = st.chains.get_mut(&chain_id) {
                chain.pieces.remove(0);
            }
        }
        self.retire_queue_pair(st, qp_number);
    }

    /// Posts waiting chains where queue pairs and the completion queue
    /// have room.
    fn pump(&self, st: &mut ClientState) {
        let qp_numbers: Vec<u32> = st.queue_pairs.iter().filter(|(_, q)| q.alive).map(|(n, _)| *n).collect();
        for qp_number in qp_numbers {
            while let Some(q) = st.queue_pairs.get(&qp_number) {
                if !q.alive {
                    break;
                }
                let Some(&chain_id) = q.waiting.front() else { break };
                let Some(chain) = st.chains.get(&chain_id) else {
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.pop_front();
                    }
                    continue;
                };
                let n = chain.pieces.len() as u32;
                if q.outstanding + n > self.config.send_queue_depth
                    || !st.room_for(n, self.config.completion_queue_entries)
                {
                    break;
                }
                let Some(requests) = self.requests(st, chain_id) else {
                    // Its connection or buffer is gone (neither should be
                    // while reads are in flight): fail the pieces rather
                    // than leave the ticket waiting for nothing.
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.pop_front();
                    }
                    if let Some(chain) = st.chains.remove(&chain_id) {
                        for p in chain.pieces {
                            self.fail_piece(st, chain.ticket, p, "connection or buffer released under the read");
                        }
                    }
                    continue;
                };
                let qp_id = q.id;
                let posted = match self.verbs.post_reads(qp_id, &requests) {
                    Ok(()) => requests.len(),
                    Err(e) if e.posted == 0 => {
                        self.retire_queue_pair(st, qp_number);
                        break;
                    }
                    Err(e) => e.posted.min(requests.len()),
                };
                let Some(q) = st.queue_pairs.get_mut(&qp_number) else { break };
                q.waiting.pop_front();
                q.in_flight.push_back(chain_id);
                q.outstanding += posted as u32;
                st.total_outstanding += posted as u32;
                if posted < requests.len() {
                    // A partial post: the prefix is in flight unsignalled
                    // and completes with the next signalled chain; the rest
                    // (ending with the signalled request) is tried again
                    // first on this queue pair.
                    let Some(chain) = st.chains.get_mut(&chain_id) else { break };
                    let rest = chain.pieces.split_off(posted);
                    chain.posted = posted;
                    let ticket = chain.ticket;
                    let rest_id = st.next_id;
                    st.next_id += 1;
                    st.chains.insert(rest_id, Chain { ticket, qp: qp_number, pieces: rest, posted: 0 });
                    if let Some(q) = st.queue_pairs.get_mut(&qp_number) {
                        q.waiting.push_front(rest_id);
                    }
                    break;
                }
                if let Some(chain) = st.chains.get_mut(&chain_id) {
                    chain.posted = posted;
                }
            }
        }
    }

    fn requests(&self, st: &ClientState, chain_id: u64) -> Option<Vec<ReadRequest>> {
        let chain = st.chains.get(&chain_id)?;
        let ticket = st.tickets.get(&chain.ticket)?;
        let conn = st.connections.get(&ticket.connection)?;
        let buffer = st.buffers.get(&ticket.buffer)?;
        let last = chain.pieces.len().checked_sub(1)?;
        chain
            .pieces
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let piece = ticket.pieces.get(p)?;
                Some(ReadRequest {
                    wr_id: (chain_id << INDEX_BITS) | i as u64,
                    local_addr: buffer.addr.checked_add(piece.local_offset)?,
                    lkey: buffer.keys.lkey,
                    remote_addr: conn.remote_addr.checked_add(piece.remote_offset)?,
                    rkey: conn.rkey,
                    len: piece.len,
                    signaled: i == last,
                })
            })
            .collect()
    }

    /// Polls the completion queue once and posts what now fits.
    fn progress(&self, st: &mut ClientState) -> CoreResult<()> {
        let mut completions = std::mem::take(&mut st.completions);
        completions.clear();
        let polled = self.verbs.poll_completions(&mut completions, 256);
        for wc in completions.drain(..) {
            self.on_completion(st, wc);
        }
        st.completions = completions;
        polled?;
        self.pump(st);
        Ok(())
    }

    /// The outcome of a finished ticket (retiring it), or `None`.
    fn take_outcome(st: &mut ClientState, ticket: &Ticket) -> CoreResult<Option<()>> {
        let t = st
            .tickets
            .get(&ticket.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("ticket {} is not in flight", ticket.id())))?;
        if t.unfinished > 0 {
            return Ok(None);
        }
        let Some(t) = st.tickets.remove(&ticket.id()) else { return Ok(None) };
        if t.failed_ops.is_empty() {
            return Ok(Some(()));
        }
        let mut failed = t.failed_ops;
        failed.sort_unstable();
        Err(gear_core::Error::RemoteRead {
            shard: t.shard,
            failed,
            total_ops: t.total_ops,
            reason: t.first_reason.unwrap_or_default(),
        })
    }
}

impl<V: Verbs> Transport for RdmaTransport<V> {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn register_local(&self, region: Arc<dyn MemoryRegion>) -> CoreResult<LocalBuffer> {
        let ptr =
            region.host_ptr().ok_or(gear_core::Error::Unsupported("rdma reads land in host-addressable memory"))?;
        let len = usize::try_from(region.len())
            .map_err(|_| gear_core::Error::Region(format!("region of {} bytes is too large", region.len())))?;
        // SAFETY: the registration keeps `region` (an `Arc`) alive until
        // `release_local` deregisters it, which is refused while reads into
        // it are in flight; `MemoryRegion`'s contract makes its bytes
        // writable from this process and accessed only through raw pointers.
        let keys = unsafe { self.verbs.register_memory(ptr.as_ptr(), len, MemoryAccess::LocalWrite) }?;
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.buffers.insert(
            id,
            Registration { _region: region, keys, addr: ptr.as_ptr() as usize as u64, tickets_in_flight: 0 },
        );
        Ok(LocalBuffer::new(id, len as u64))
    }

    fn release_local(&self, buffer: &LocalBuffer) -> CoreResult<()> {
        let mut st = self.lock();
        let reg = st.buffers.get(&buffer.id()).ok_or_else(|| {
            gear_core::Error::InvalidHandle(format!("local buffer {} is not registered", buffer.id()))
        })?;
        if reg.tickets_in_flight > 0 {
            return Err(gear_core::Error::Busy(format!(
                "local buffer {} has {} tickets in flight",
                buffer.id(),
                reg.tickets_in_flight
            )));
        }
        let keys = reg.keys;
        self.verbs.deregister_memory(keys)?;
        st.buffers.remove(&buffer.id());
        Ok(())
    }

    fn prepare_connection(&self, shard: u32) -> CoreResult<PendingConnection> {
        let port = self.verbs.port();
        {
            // Every queue pair keeps a completion-queue entry for its drain
            // marker; leave room for at least one chain besides.
            let st = self.lock();
            let needed = st.queue_pairs.len() + self.config.queue_pairs + self.config.chain_len;
            if needed > self.config.completion_queue_entries as usize {
                return Err(gear_core::Error::Exhausted(format!(
                    "rdma: {} more queue pairs (beside {}) would leave a completion queue of {} entries no room for a chain of {}; raise completion_queue_entries or disconnect",
                    self.config.queue_pairs,
                    st.queue_pairs.len(),
                    self.config.completion_queue_entries,
                    self.config.chain_len
                )));
            }
        }
        let caps = QueuePairCaps { max_send_wr: self.config.send_queue_depth };
        let mut created = Vec::with_capacity(self.config.queue_pairs);
        for _ in 0..self.config.queue_pairs {
            match self.verbs.create_queue_pair(caps) {
                Ok(qp) => created.push(qp),
                Err(e) => {
                    for qp in created {
                        let _ = self.verbs.destroy_queue_pair(qp);
                    }
                    return Err(e.into());
                }
            }
        }
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        let mut endpoints = Vec::with_capacity(created.len());
        for (i, qp) in created.iter().enumerate() {
            let psn = Self::psn_for(id, i);
            endpoints.push(QueuePairEndpoint { qp_number: qp.qp_number, psn });
            st.queue_pairs.insert(
                qp.qp_number,
                QueuePairState {
                    id: *qp,
                    connection: id,
                    psn,
                    alive: false,
                    draining: None,
                    outstanding: 0,
                    in_flight: VecDeque::new(),
                    waiting: VecDeque::new(),
                },
            );
        }
        st.pending.insert(id, Pending { shard, queue_pairs: created.iter().map(|q| q.qp_number).collect() });
        let endpoint = RdmaEndpoint {
            gid: port.gid,
            gid_index: port.gid_index,
            lid: port.lid,
            mtu: port.mtu,
            queue_pairs: endpoints,
            session: self.session,
            max_read_initiator: read_limit(port.max_read_initiator),
            max_read_responder: read_limit(port.max_read_responder),
        };
        Ok(PendingConnection { id, endpoint: PeerEndpoint::Rdma(endpoint) })
    }

    fn abort(&self, pending: PendingConnection) -> CoreResult<()> {
        let mut st = self.lock();
        let p = st.pending.remove(&pending.id).ok_or_else(|| {
            gear_core::Error::InvalidHandle(format!("connection {} was not prepared here", pending.id))
        })?;
        // Never connected, so nothing was posted on them.
        for qp in &p.queue_pairs {
            if let Some(q) = st.queue_pairs.remove(qp) {
                let _ = self.verbs.destroy_queue_pair(q.id);
            }
        }
        Ok(())
    }

    fn connect(&self, pending: PendingConnection, remote: &RemoteRegion) -> CoreResult<RemoteHandle> {
        let mut st = self.lock();
        let p = st.pending.remove(&pending.id).ok_or_else(|| {
            gear_core::Error::InvalidHandle(format!("connection {} was not prepared here", pending.id))
        })?;
        let outcome = self.connect_queue_pairs(&mut st, pending.id, &p, remote);
        if outcome.is_err() {
            for qp in &p.queue_pairs {
                if let Some(q) = st.queue_pairs.remove(qp) {
                    let _ = self.verbs.destroy_queue_pair(q.id);
                }
            }
        }
        outcome
    }

    fn disconnect(&self, remote: &RemoteHandle) -> CoreResult<()> {
        let mut st = self.lock();
        let conn = st
            .connections
            .remove(&remote.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("connection {} is not open", remote.id())))?;
        // Retiring requeues onto the connection, which is gone: the pieces
        // fail (those in flight once their queue pair drained), and the
        // tickets finish with an error.
        for qp in &conn.queue_pairs {
            self.retire_queue_pair(&mut st, *qp);
        }
        Ok(())
    }

    fn post_reads(&self, remote: &RemoteHandle, local: &LocalBuffer, ops: &[ReadOp]) -> CoreResult<Ticket> {
        let mut st = self.lock();
        let conn = st
            .connections
            .get(&remote.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("connection {} is not open", remote.id())))?;
        let shard = conn.shard;
        let remote_len = conn.len;
        if !st.buffers.contains_key(&local.id()) {
            return Err(gear_core::Error::InvalidHandle(format!("local buffer {} is not registered", local.id())));
        }
        let local_len = local.len();
        check_read_ops(remote_len, local_len, ops)?;
        let max = u64::from(self.config.max_read_bytes);
        let mut pieces = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let mut done = 0;
            while done < op.len {
                let len = (op.len - done).min(max);
                pieces.push(Piece {
                    op: i as u32,
                    remote_offset: op.remote_offset + done,
                    local_offset: op.local_offset + done,
                    len: len as u32,
                });
                done += len;
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        let n = pieces.len();
        st.tickets.insert(
            id,
            TicketState {
                shard,
                connection: remote.id(),
                buffer: local.id(),
                total_ops: ops.len() as u64,
                pieces,
                states: vec![PieceState::InFlight; n],
                attempts: vec![0; n],
                unfinished: n,
                failed_ops: Vec::new(),
                first_reason: None,
            },
        );
        if n > 0 {
            if let Some(b) = st.buffers.get_mut(&local.id()) {
                b.tickets_in_flight += 1;
            }
            self.requeue(&mut st, id, (0..n).collect());
            self.pump(&mut st);
        }
        Ok(Ticket::new(id, shard))
    }

    fn poll(&self, ticket: &Ticket) -> CoreResult<bool> {
        let mut st = self.lock();
        if !st.tickets.contains_key(&ticket.id()) {
            return Err(gear_core::Error::InvalidHandle(format!("ticket {} is not in flight", ticket.id())));
        }
        self.progress(&mut st)?;
        Ok(Self::take_outcome(&mut st, ticket)?.is_some())
    }

    fn wait(&self, ticket: &Ticket, deadline: Instant) -> CoreResult<()> {
        let mut spins = 0u32;
        loop {
            if self.poll(ticket)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(gear_core::Error::Timeout(format!(
                    "rdma reads of ticket {} from shard {} still in flight at the deadline",
                    ticket.id(),
                    ticket.shard()
                )));
            }
            // Spin briefly (completions of small reads take microseconds),
            // then sleep a little so a stalled peer does not burn a core.
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl<V: Verbs> RdmaTransport<V> {
    fn connect_queue_pairs(
        &self,
        st: &mut ClientState,
        id: u64,
        pending: &Pending,
        remote: &RemoteRegion,
    ) -> CoreResult<RemoteHandle> {
        remote.validate()?;
        let RemoteAccess::Rdma { addr, rkey, peer } = &remote.access else {
            return Err(gear_core::Error::Descriptor(format!(
                "shard {} answered with a {} descriptor to an rdma connection",
                remote.shard,
                remote.kind().name()
            )));
        };
        if remote.shard != pending.shard {
            return Err(gear_core::Error::Descriptor(format!(
                "connection was prepared for shard {}, the descriptor is of shard {}",
                pending.shard, remote.shard
            )));
        }
        if peer.queue_pairs.len() != pending.queue_pairs.len() {
            return Err(gear_core::Error::Descriptor(format!(
                "shard {} answered with {} queue pairs for our {}",
                remote.shard,
                peer.queue_pairs.len(),
                pending.queue_pairs.len()
            )));
        }
        let port = self.verbs.port();
        // READs in flight per queue pair: at most what this device issues
        // and what the shard's queue pairs serve (its descriptor says).
        let max_rd_atomic = read_limit(port.max_read_initiator).min(peer.max_read_responder);
        for (local, theirs) in pending.queue_pairs.iter().zip(&peer.queue_pairs) {
            let Some(q) = st.queue_pairs.get(local) else {
                return Err(gear_core::Error::InvalidHandle(format!("queue pair {local:#x} is gone")));
            };
            let attrs = ConnectAttributes {
                remote_gid: peer.gid,
                remote_lid: peer.lid,
                remote_qp_number: theirs.qp_number,
                remote_psn: theirs.psn,
                local_psn: q.psn,
                mtu: port.mtu.min(peer.mtu),
                // Never 0: a queue pair with no outstanding READs allowed
                // fails every READ (sideway's examples leave both at 0).
                max_rd_atomic,
                max_dest_rd_atomic: read_limit(port.max_read_responder),
                timeout: self.config.ack_timeout,
                retry_count: self.config.retry_count,
                traffic_class: self.config.traffic_class,
                service_level: self.config.service_level,
            };
            self.verbs.connect_queue_pair(q.id, &attrs)?;
        }
        for qp in &pending.queue_pairs {
            if let Some(q) = st.queue_pairs.get_mut(qp) {
                q.alive = true;
                q.connection = id;
            }
        }
        st.connections.insert(
            id,
            Connection {
                shard: remote.shard,
                remote_addr: *addr,
                rkey: *rkey,
                len: remote.len,
                queue_pairs: pending.queue_pairs.clone(),
                next_queue_pair: 0,
            },
        );
        Ok(RemoteHandle::new(id, remote.shard, remote.len))
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
