//! A test implementation of [`Verbs`] inside one process, so the logic
//! above the verbs runs in CI where no RDMA device exists. It is not a
//! transport for production: bytes move by `memcpy` between regions of this
//! process, and "remote" nodes are other values on the same
//! [`InProcessFabric`].
//!
//! What it models, after the RC rules in [`crate::verbs`], loud wherever a
//! device would be: memory regions with lkeys and rkeys and access rights
//! checked on every request, and a locked-memory budget
//! ([`InProcessVerbs::set_memlock_limit`]) beyond which registrations fail
//! as `ibv_reg_mr` does under a low `RLIMIT_MEMLOCK`; queue pairs found by
//! (GID, QP number) that must be connected to each other, with matching
//! PSNs (each side's receive PSN is the other's send PSN), each side
//! naming the other's LID, and one path MTU no larger than either port's
//! (a mismatch ends in `RetryExceeded`, as packets that never match end on
//! hardware), so a connection descriptor that lost or garbled a field
//! fails its reads instead of passing; connect attributes beyond the
//! port's outstanding-read limits or a service level above 15 refused as
//! `ibv_modify_qp` refuses them; READs refused when the initiator's
//! `max_rd_atomic` is 0, and by the responder
//! (`RemoteInvalidRequest`) when more READs are in flight at once than its
//! `max_dest_rd_atomic` (a chain of `n` READs has `min(n, max_rd_atomic)`
//! in flight, as a NIC issues them); completions in order, signalled ones
//! only on success, errors always, the queue pair in the error state after
//! an error or a flush and everything after it flushed, the flush
//! completions reaching the completion queue one poll later than the error
//! (late enough that a transport which frees their room early overruns
//! the queue); a completion queue that reports overruns. Tests inject what
//! a network does: a READ that fails with a chosen status, a peer that
//! stops answering (requests held until released), and a post that takes
//! only a prefix of a chain. It records every posted chain so tests can
//! check how reads were split, and lets tests see queue pairs and their
//! connect attributes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::verbs::{
    CompletionStatus, ConnectAttributes, MemoryAccess, MemoryKeys, PortAttributes, PostError, QueuePairCaps,
    QueuePairId, ReadRequest, Verbs, WorkCompletion, MAX_SERVICE_LEVEL,
};

/// The raw `IBV_WC_LOC_QP_OP_ERR` status, reported for a READ posted on a
/// queue pair whose `max_rd_atomic` is 0.
pub const LOCAL_QP_OPERATION_ERROR: u32 = 2;

/// A set of in-process nodes that can reach each other by GID.
#[derive(Clone, Default)]
pub struct InProcessFabric {
    state: Arc<Mutex<FabricState>>,
}

/// One chain as it was posted, for tests to inspect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostedChain {
    /// GID of the node that posted it.
    pub gid: [u8; 16],
    /// The local queue pair.
    pub qp_number: u32,
    /// Each request's signalled flag, in order.
    pub signaled: Vec<bool>,
}

#[derive(Default)]
struct FabricState {
    nodes: HashMap<[u8; 16], Node>,
    next_key: u32,
    next_qp_number: u32,
    posted: Vec<PostedChain>,
}

struct Node {
    port: PortAttributes,
    regions: HashMap<u32, Region>,
    queue_pairs: HashMap<u32, QueuePair>,
    completions: VecDeque<WorkCompletion>,
    /// Flush completions not yet in the completion queue: they move there
    /// at the end of the next poll.
    late_flushes: VecDeque<WorkCompletion>,
    cq_entries: Option<usize>,
    cq_overrun: bool,
    /// Bytes registered now, and the most that may be (locked memory).
    registered_bytes: u64,
    memlock_limit: Option<u64>,
}

#[derive(Clone, Copy)]
struct Region {
    addr: u64,
    len: u64,
    access: MemoryAccess,
}

#[derive(Default)]
struct QueuePair {
    connected: Option<ConnectAttributes>,
    errored: bool,
    /// Requests posted while the peer does not answer.
    held_requests: VecDeque<ReadRequest>,
    holding: bool,
    /// Fail the READ after this many more succeed, with this status.
    fail_after: Option<(usize, CompletionStatus)>,
    /// Accept only this many requests of the next post.
    post_limit: Option<usize>,
}

fn lock(state: &Mutex<FabricState>) -> MutexGuard<'_, FabricState> {
    // A panic while holding the lock cannot leave the maps half-updated in a
    // way that matters to a test double; keep going.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl InProcessFabric {
    /// An empty fabric.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node (one device port) with GID `gid`, RoCE-like (LID 0), a
    /// 4096-byte MTU and outstanding-read limits of 16.
    pub fn add_node(&self, gid: [u8; 16]) -> Result<InProcessVerbs> {
        let port =
            PortAttributes { gid, gid_index: 0, lid: 0, mtu: 4096, max_read_initiator: 16, max_read_responder: 16 };
        self.add_node_with(port)
    }

    /// Adds a node with the given port attributes.
    pub fn add_node_with(&self, port: PortAttributes) -> Result<InProcessVerbs> {
        let mut st = lock(&self.state);
        if st.nodes.contains_key(&port.gid) {
            return Err(Error::verbs("in-process add_node", format!("gid {:02x?} already on the fabric", port.gid)));
        }
        let node = Node {
            port,
            regions: HashMap::new(),
            queue_pairs: HashMap::new(),
            completions: VecDeque::new(),
            late_flushes: VecDeque::new(),
            cq_entries: None,
            cq_overrun: false,
            registered_bytes: 0,
            memlock_limit: None,
        };
        st.nodes.insert(port.gid, node);
        Ok(InProcessVerbs { fabric: self.clone(), gid: port.gid })
    }

    /// The node with GID `gid`, if it is on this fabric (tests look at a
    /// node another owner made).
    pub fn node(&self, gid: [u8; 16]) -> Option<InProcessVerbs> {
        lock(&self.state).nodes.contains_key(&gid).then(|| InProcessVerbs { fabric: self.clone(), gid })
    }

    /// Every chain posted so far, in order.
    pub fn posted_chains(&self) -> Vec<PostedChain> {
        lock(&self.state).posted.clone()
    }

    /// Forgets the recorded chains.
    pub fn clear_posted_chains(&self) {
        lock(&self.state).posted.clear();
    }
}

/// One node of an [`InProcessFabric`]: a test implementation of [`Verbs`].
#[derive(Clone)]
pub struct InProcessVerbs {
    fabric: InProcessFabric,
    gid: [u8; 16],
}

impl InProcessVerbs {
    fn with_queue_pair<T>(&self, qp_number: u32, f: impl FnOnce(&mut QueuePair) -> T) -> Result<T> {
        let mut st = lock(&self.fabric.state);
        let qp = st
            .nodes
            .get_mut(&self.gid)
            .and_then(|n| n.queue_pairs.get_mut(&qp_number))
            .ok_or_else(|| Error::verbs("in-process fault injection", format!("no queue pair {qp_number:#x}")))?;
        Ok(f(qp))
    }

    /// The READ on `qp_number` after the next `after` successful ones
    /// completes with `status` (and the queue pair enters the error state).
    pub fn fail_read_after(&self, qp_number: u32, after: usize, status: CompletionStatus) -> Result<()> {
        self.with_queue_pair(qp_number, |qp| qp.fail_after = Some((after, status)))
    }

    /// The peer of `qp_number` stops answering: requests posted on it wait
    /// until [`release`](Self::release).
    pub fn hold(&self, qp_number: u32) -> Result<()> {
        self.with_queue_pair(qp_number, |qp| qp.holding = true)
    }

    /// Runs the requests held on `qp_number` and answers again.
    pub fn release(&self, qp_number: u32) -> Result<()> {
        let mut st = lock(&self.fabric.state);
        let held: Vec<ReadRequest> = {
            let qp = st
                .nodes
                .get_mut(&self.gid)
                .and_then(|n| n.queue_pairs.get_mut(&qp_number))
                .ok_or_else(|| Error::verbs("in-process release", format!("no queue pair {qp_number:#x}")))?;
            qp.holding = false;
            qp.held_requests.drain(..).collect()
        };
        for (position, request) in held.into_iter().enumerate() {
            execute(&mut st, self.gid, qp_number, request, position);
        }
        Ok(())
    }

    /// The next post on `qp_number` takes only its first `posted` requests
    /// and refuses the rest.
    pub fn limit_next_post(&self, qp_number: u32, posted: usize) -> Result<()> {
        self.with_queue_pair(qp_number, |qp| qp.post_limit = Some(posted))
    }

    /// This node's queue pairs connected to the node with GID `peer`, in
    /// no particular order (tests pick one shard's connection to inject
    /// faults on).
    pub fn queue_pairs_to(&self, peer: [u8; 16]) -> Vec<u32> {
        let st = lock(&self.fabric.state);
        let Some(node) = st.nodes.get(&self.gid) else { return Vec::new() };
        node.queue_pairs
            .iter()
            .filter(|(_, qp)| qp.connected.is_some_and(|a| a.remote_gid == peer))
            .map(|(&n, _)| n)
            .collect()
    }

    /// Whether `qp_number` is in the error state.
    pub fn is_errored(&self, qp_number: u32) -> Result<bool> {
        self.with_queue_pair(qp_number, |qp| qp.errored)
    }

    /// How many queue pairs this node has (created and not destroyed).
    pub fn queue_pair_count(&self) -> usize {
        lock(&self.fabric.state).nodes.get(&self.gid).map_or(0, |n| n.queue_pairs.len())
    }

    /// The attributes `qp_number` was connected with (`None` while it is
    /// not connected).
    pub fn connect_attributes(&self, qp_number: u32) -> Result<Option<ConnectAttributes>> {
        self.with_queue_pair(qp_number, |qp| qp.connected)
    }

    /// Limits the bytes this node may have registered at once, as
    /// `RLIMIT_MEMLOCK` limits a process: a registration beyond it fails
    /// (`ibv_reg_mr`: cannot allocate memory). `None` lifts the limit.
    pub fn set_memlock_limit(&self, limit: Option<u64>) {
        if let Some(node) = lock(&self.fabric.state).nodes.get_mut(&self.gid) {
            node.memlock_limit = limit;
        }
    }
}

fn complete(node: &mut Node, wc: WorkCompletion) {
    match node.cq_entries {
        Some(cap) if node.completions.len() >= cap => node.cq_overrun = true,
        _ => node.completions.push_back(wc),
    }
}

/// Runs one READ posted on (`gid`, `qp_number`) to its completion;
/// `position` is how many READs were posted before it in the same
/// doorbell (they are in flight with it).
fn execute(st: &mut FabricState, gid: [u8; 16], qp_number: u32, request: ReadRequest, position: usize) {
    let status = read_status(st, gid, qp_number, &request, position);
    let Some(node) = st.nodes.get_mut(&gid) else { return };
    if status != CompletionStatus::Success {
        if let Some(qp) = node.queue_pairs.get_mut(&qp_number) {
            qp.errored = true;
        }
    }
    let wc = WorkCompletion { wr_id: request.wr_id, status, qp_number };
    match status {
        // Flushes reach the completion queue late (module docs).
        CompletionStatus::Flushed => node.late_flushes.push_back(wc),
        CompletionStatus::Success if !request.signaled => {}
        _ => complete(node, wc),
    }
}

/// Checks every rule a READ must pass, then copies the bytes.
fn read_status(
    st: &mut FabricState,
    gid: [u8; 16],
    qp_number: u32,
    request: &ReadRequest,
    position: usize,
) -> CompletionStatus {
    let Some(node) = st.nodes.get_mut(&gid) else { return CompletionStatus::Flushed };
    let local_port = node.port;
    let Some(qp) = node.queue_pairs.get_mut(&qp_number) else { return CompletionStatus::Flushed };
    if qp.errored {
        return CompletionStatus::Flushed;
    }
    let Some(attrs) = qp.connected else { return CompletionStatus::Flushed };
    if let Some((after, status)) = qp.fail_after {
        if after == 0 {
            qp.fail_after = None;
            return status;
        }
        qp.fail_after = Some((after - 1, status));
    }
    if attrs.max_rd_atomic == 0 {
        return CompletionStatus::Other(LOCAL_QP_OPERATION_ERROR);
    }
    let local = node.regions.get(&request.lkey).copied();
    // The responder: must exist and be connected back to this queue pair.
    let Some(peer) = st.nodes.get(&attrs.remote_gid) else { return CompletionStatus::RetryExceeded };
    let Some(peer_qp) = peer.queue_pairs.get(&attrs.remote_qp_number) else {
        return CompletionStatus::RetryExceeded;
    };
    let Some(peer_attrs) = peer_qp.connected else { return CompletionStatus::RetryExceeded };
    if peer_attrs.remote_gid != gid || peer_attrs.remote_qp_number != qp_number || peer_qp.errored {
        return CompletionStatus::RetryExceeded;
    }
    if !path_agrees(&attrs, &peer_attrs, &local_port, &peer.port) {
        return CompletionStatus::RetryExceeded;
    }
    // The initiator has up to `max_rd_atomic` READs of the doorbell in
    // flight; a responder with fewer resources refuses the excess.
    let in_flight = (position + 1).min(usize::from(attrs.max_rd_atomic));
    if in_flight > usize::from(peer_attrs.max_dest_rd_atomic) {
        return CompletionStatus::RemoteInvalidRequest;
    }
    let len = u64::from(request.len);
    let inside = |r: &Region, addr: u64| addr >= r.addr && addr.checked_add(len).is_some_and(|e| e <= r.addr + r.len);
    let Some(remote) = peer.regions.get(&request.rkey).copied() else { return CompletionStatus::RemoteAccessError };
    if remote.access != MemoryAccess::RemoteRead || !inside(&remote, request.remote_addr) {
        return CompletionStatus::RemoteAccessError;
    }
    let Some(local) = local else { return CompletionStatus::LocalProtectionError };
    if local.access != MemoryAccess::LocalWrite || !inside(&local, request.local_addr) {
        return CompletionStatus::LocalProtectionError;
    }
    // SAFETY: both ranges were just checked to lie inside regions whose
    // registration promised (`Verbs::register_memory`'s contract) that they
    // stay allocated and are accessed only through raw pointers while
    // registered; `copy` tolerates overlap (loopback reads of one buffer).
    unsafe {
        std::ptr::copy(request.remote_addr as usize as *const u8, request.local_addr as usize as *mut u8, len as usize)
    };
    CompletionStatus::Success
}

/// Whether two queue pairs connected to each other agree on the path as
/// hardware needs: each one's receive PSN is the other's send PSN, each
/// names the other's LID, and both use one MTU no larger than either port's.
fn path_agrees(
    ours: &ConnectAttributes,
    theirs: &ConnectAttributes,
    our_port: &PortAttributes,
    their_port: &PortAttributes,
) -> bool {
    ours.remote_psn == theirs.local_psn
        && theirs.remote_psn == ours.local_psn
        && ours.remote_lid == their_port.lid
        && theirs.remote_lid == our_port.lid
        && ours.mtu == theirs.mtu
        && ours.mtu <= our_port.mtu.min(their_port.mtu)
}

impl Verbs for InProcessVerbs {
    fn port(&self) -> PortAttributes {
        let st = lock(&self.fabric.state);
        // A node is never removed from its fabric, so it is always there.
        st.nodes.get(&self.gid).map(|n| n.port).unwrap_or(PortAttributes {
            gid: self.gid,
            gid_index: 0,
            lid: 0,
            mtu: 4096,
            max_read_initiator: 0,
            max_read_responder: 0,
        })
    }

    unsafe fn register_memory(&self, addr: *mut u8, len: usize, access: MemoryAccess) -> Result<MemoryKeys> {
        let mut st = lock(&self.fabric.state);
        st.next_key = st.next_key.wrapping_add(1).max(1);
        let key = st.next_key;
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_reg_mr", "node not on fabric"))?;
        let region = Region { addr: addr as usize as u64, len: len as u64, access };
        if region.addr.checked_add(region.len).is_none() {
            return Err(Error::verbs("ibv_reg_mr", "range wraps the address space"));
        }
        let locked = node.registered_bytes.saturating_add(region.len);
        if let Some(limit) = node.memlock_limit.filter(|&limit| locked > limit) {
            return Err(Error::verbs(
                "ibv_reg_mr",
                format!(
                    "cannot allocate memory: {} more bytes would lock {locked}, above the locked-memory limit of {limit} (RLIMIT_MEMLOCK)",
                    region.len
                ),
            ));
        }
        node.registered_bytes = locked;
        node.regions.insert(key, region);
        Ok(MemoryKeys { handle: u64::from(key), lkey: key, rkey: key })
    }

    fn deregister_memory(&self, keys: MemoryKeys) -> Result<()> {
        let mut st = lock(&self.fabric.state);
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_dereg_mr", "node not on fabric"))?;
        let region = node.regions.remove(&keys.lkey).ok_or_else(|| Error::verbs("ibv_dereg_mr", "unknown region"))?;
        node.registered_bytes = node.registered_bytes.saturating_sub(region.len);
        Ok(())
    }

    fn create_completion_queue(&self, entries: u32) -> Result<()> {
        let mut st = lock(&self.fabric.state);
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_create_cq", "node not on fabric"))?;
        node.cq_entries.get_or_insert(entries as usize);
        Ok(())
    }

    fn create_queue_pair(&self, _caps: QueuePairCaps) -> Result<QueuePairId> {
        let mut st = lock(&self.fabric.state);
        st.next_qp_number = (st.next_qp_number + 1) & 0xff_ffff;
        let qp_number = st.next_qp_number.max(1);
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_create_qp", "node not on fabric"))?;
        if node.cq_entries.is_none() {
            return Err(Error::verbs("ibv_create_qp", "no completion queue"));
        }
        node.queue_pairs.insert(qp_number, QueuePair::default());
        Ok(QueuePairId { handle: u64::from(qp_number), qp_number })
    }

    fn connect_queue_pair(&self, qp: QueuePairId, attrs: &ConnectAttributes) -> Result<()> {
        // What `ibv_modify_qp` refuses with EINVAL: limits beyond the
        // device's (a port that reports none still allows 1) and a service
        // level wider than 4 bits.
        let port = self.port();
        if attrs.max_rd_atomic > port.max_read_initiator.max(1) {
            return Err(Error::verbs(
                "ibv_modify_qp(RTS)",
                format!("max_rd_atomic {} is above the device's {}", attrs.max_rd_atomic, port.max_read_initiator),
            ));
        }
        if attrs.max_dest_rd_atomic > port.max_read_responder.max(1) {
            return Err(Error::verbs(
                "ibv_modify_qp(RTR)",
                format!(
                    "max_dest_rd_atomic {} is above the device's {}",
                    attrs.max_dest_rd_atomic, port.max_read_responder
                ),
            ));
        }
        if attrs.service_level > MAX_SERVICE_LEVEL {
            return Err(Error::verbs(
                "ibv_modify_qp(RTR)",
                format!("service level {} does not fit in 4 bits", attrs.service_level),
            ));
        }
        self.with_queue_pair(qp.qp_number, |q| q.connected = Some(*attrs))
            .map_err(|e| Error::verbs("ibv_modify_qp(RTR)", e))
    }

    fn flush_queue_pair(&self, qp: QueuePairId) -> Result<()> {
        let mut st = lock(&self.fabric.state);
        let node =
            st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_modify_qp(ERR)", "node not on fabric"))?;
        let q = node
            .queue_pairs
            .get_mut(&qp.qp_number)
            .ok_or_else(|| Error::verbs("ibv_modify_qp(ERR)", "unknown queue pair"))?;
        q.errored = true;
        // A queue pair in the error state answers nothing, held or not.
        q.holding = false;
        let held: Vec<ReadRequest> = q.held_requests.drain(..).collect();
        for request in held {
            node.late_flushes.push_back(WorkCompletion {
                wr_id: request.wr_id,
                status: CompletionStatus::Flushed,
                qp_number: qp.qp_number,
            });
        }
        Ok(())
    }

    fn destroy_queue_pair(&self, qp: QueuePairId) -> Result<()> {
        let mut st = lock(&self.fabric.state);
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_destroy_qp", "node not on fabric"))?;
        // Flushes already generated still reach the completion queue, as
        // they may on hardware when a queue pair is destroyed undrained.
        node.queue_pairs.remove(&qp.qp_number).map(|_| ()).ok_or_else(|| Error::verbs("ibv_destroy_qp", "unknown qp"))
    }

    fn post_reads(&self, qp: QueuePairId, chain: &[ReadRequest]) -> std::result::Result<(), PostError> {
        let mut st = lock(&self.fabric.state);
        let refuse = |reason: &str| PostError { posted: 0, reason: reason.to_string() };
        let q = st
            .nodes
            .get_mut(&self.gid)
            .and_then(|n| n.queue_pairs.get_mut(&qp.qp_number))
            .ok_or_else(|| refuse("unknown queue pair"))?;
        if q.connected.is_none() {
            return Err(refuse("queue pair is not connected (not in ready-to-send)"));
        }
        let accepted = q.post_limit.take().unwrap_or(chain.len()).min(chain.len());
        let holding = q.holding && !q.errored;
        if holding {
            q.held_requests.extend(chain[..accepted].iter().copied());
        }
        let gid = self.gid;
        st.posted.push(PostedChain {
            gid,
            qp_number: qp.qp_number,
            signaled: chain[..accepted].iter().map(|r| r.signaled).collect(),
        });
        if !holding {
            for (position, request) in chain[..accepted].iter().enumerate() {
                execute(&mut st, gid, qp.qp_number, *request, position);
            }
        }
        if accepted < chain.len() {
            return Err(PostError { posted: accepted, reason: "send queue full (injected)".into() });
        }
        Ok(())
    }

    fn poll_completions(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        let mut st = lock(&self.fabric.state);
        let node = st.nodes.get_mut(&self.gid).ok_or_else(|| Error::verbs("ibv_poll_cq", "node not on fabric"))?;
        if node.cq_overrun {
            return Err(Error::verbs("ibv_poll_cq", "completion queue overrun"));
        }
        let n = max.min(node.completions.len());
        out.extend(node.completions.drain(..n));
        // Flushes generated so far arrive now, after this poll: a caller
        // that counted their room free when it saw the error has posted
        // into it meanwhile.
        while let Some(wc) = node.late_flushes.pop_front() {
            complete(node, wc);
        }
        Ok(n)
    }
}
