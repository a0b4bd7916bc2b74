//! The verbs interface the transport logic is written against: the few
//! ibverbs operations one-sided reads need (memory registration, a
//! completion queue, reliable-connection queue pairs connected by GID,
//! chains of READ work requests, polling completions), as plain data.
//!
//! Two implementations: `sideway_verbs::SidewayVerbs` (feature
//! `rdma`) over rdma-core, and [`crate::in_process::InProcessVerbs`], a test
//! implementation in one process used by the tests, which run where no RDMA
//! device exists. The semantics both keep are the ones of RC queue pairs in
//! the InfiniBand spec (and `ibv_post_send(3)`, `ibv_poll_cq(3)`):
//!
//! * work requests on one queue pair complete in order; a signalled
//!   completion therefore also completes every unsignalled request posted
//!   before it on that queue pair;
//! * a request that fails always produces a completion (signalled or not),
//!   its queue pair enters the error state, and every request after it on
//!   that queue pair completes with [`CompletionStatus::Flushed`];
//! * a post may fail after a prefix of the chain was posted
//!   ([`PostError::posted`]);
//! * a queue pair moved to the error state
//!   ([`Verbs::flush_queue_pair`]) completes every request not yet
//!   executed with [`CompletionStatus::Flushed`], later posts included,
//!   and those completions may reach the completion queue some time after
//!   the error: a queue pair is drained (and its completion-queue room
//!   free) only once the completion of the last request posted on it was
//!   polled, which is why a retired queue pair gets a marker request
//!   after the flush (as Linux's `ib_drain_sq` does);
//! * a reader's queue pair must not have more READs outstanding
//!   (`max_rd_atomic`) than the responder's queue pair serves
//!   (`max_dest_rd_atomic`): the responder refuses the excess
//!   ([`CompletionStatus::RemoteInvalidRequest`]).

use crate::error::Result;

/// Access a memory registration grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryAccess {
    /// Destination of local operations (READ responses land here).
    LocalWrite,
    /// Readable by remote peers with the rkey (a shard's table); nothing
    /// remote can write it.
    RemoteRead,
}

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryKeys {
    /// The implementation's handle for deregistration.
    pub handle: u64,
    /// Key for local scatter entries.
    pub lkey: u32,
    /// Key remote peers read with.
    pub rkey: u32,
}

/// What the local port looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttributes {
    /// GID at `gid_index` (peers address this side by it).
    pub gid: [u8; 16],
    /// Which GID table entry is used.
    pub gid_index: u8,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Active path MTU in bytes.
    pub mtu: u32,
    /// The device's limit on outstanding READs a queue pair may initiate
    /// (`max_qp_init_rd_atom`).
    pub max_read_initiator: u8,
    /// The device's limit on outstanding READs a queue pair may serve
    /// (`max_qp_rd_atom`).
    pub max_read_responder: u8,
}

/// Sizes of a queue pair to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePairCaps {
    /// Send queue depth (work requests outstanding at once).
    pub max_send_wr: u32,
}

/// A created queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueuePairId {
    /// The implementation's handle.
    pub handle: u64,
    /// The queue pair number peers connect to.
    pub qp_number: u32,
}

/// Everything needed to take a queue pair from reset to ready-to-send
/// against one remote queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectAttributes {
    /// The peer's GID: the address on RoCE and InfiniBand alike (a global
    /// route header is always used).
    pub remote_gid: [u8; 16],
    /// The peer's LID (used on InfiniBand; 0 on RoCE).
    pub remote_lid: u16,
    /// The peer's queue pair number.
    pub remote_qp_number: u32,
    /// The first PSN the peer sends with (our receive PSN).
    pub remote_psn: u32,
    /// The first PSN this side sends with.
    pub local_psn: u32,
    /// Path MTU in bytes (the smaller of both sides').
    pub mtu: u32,
    /// Outstanding READs this side may have in flight as initiator
    /// (`max_rd_atomic`). Must be at least 1: at 0 every READ fails.
    pub max_rd_atomic: u8,
    /// Outstanding READs this side serves for the peer
    /// (`max_dest_rd_atomic`). Must be at least 1 on a side that is read.
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Transport retries before `RetryExceeded`.
    pub retry_count: u8,
    /// Traffic class of the global route header (on RoCE v2 the IP
    /// header's DSCP and ECN bits: DSCP 26 is 104).
    pub traffic_class: u8,
    /// Service level of the address vector (0 to 15; on InfiniBand it
    /// picks the virtual lane, on RoCE the priority where the fabric maps
    /// it).
    pub service_level: u8,
}

/// The highest InfiniBand service level (4 bits).
pub const MAX_SERVICE_LEVEL: u8 = 15;

/// One READ work request: `len` bytes at `remote_addr` (under `rkey`) into
/// `local_addr` (under `lkey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Local destination address (inside the region `lkey` names).
    pub local_addr: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote source address (inside the region `rkey` names).
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Bytes.
    pub len: u32,
    /// Whether a successful completion is reported.
    pub signaled: bool,
}

/// A post that did not go through whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostError {
    /// How many requests of the chain, from its start, were posted (and will
    /// complete); the rest were not.
    pub posted: usize,
    /// Why the rest were refused.
    pub reason: String,
}

/// How a work request ended (`ibv_wc_status`, the cases the transport
/// treats differently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionStatus {
    /// The bytes landed.
    Success,
    /// The peer refused the access (bad rkey, range outside its region,
    /// region deregistered): `IBV_WC_REM_ACCESS_ERR`.
    RemoteAccessError,
    /// The peer refused the request as malformed (for READs, typically a
    /// responder with no outstanding-read resources):
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemoteInvalidRequest,
    /// The local scatter entry is outside its region or the lkey is bad:
    /// `IBV_WC_LOC_PROT_ERR`, `IBV_WC_LOC_LEN_ERR`.
    LocalProtectionError,
    /// No acknowledgement after the retries (peer gone, link down):
    /// `IBV_WC_RETRY_EXC_ERR`.
    RetryExceeded,
    /// Not executed because its queue pair was already in the error state:
    /// `IBV_WC_WR_FLUSH_ERR`.
    Flushed,
    /// Anything else, with the raw status.
    Other(u32),
}

impl CompletionStatus {
    /// Whether trying the same read again (on a healthy queue pair) can
    /// succeed: transport failures and flushes can; access and protection
    /// errors cannot.
    pub fn is_retryable(self) -> bool {
        matches!(self, CompletionStatus::RetryExceeded | CompletionStatus::Flushed | CompletionStatus::Other(_))
    }
}

/// One entry of the completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// How it ended.
    pub status: CompletionStatus,
    /// The local queue pair it ran on.
    pub qp_number: u32,
}

/// The verbs one-sided reads need. One value is one opened device port
/// with one protection domain. Implementations must not panic on any
/// argument; everything refused is an error.
pub trait Verbs: Send + Sync + 'static {
    /// The port's address and limits.
    fn port(&self) -> PortAttributes;

    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr+len` must stay allocated (and, for
    /// [`MemoryAccess::LocalWrite`], writable by this process without
    /// violating Rust's aliasing rules, i.e. accessed only through raw
    /// pointers) until [`deregister_memory`](Verbs::deregister_memory)
    /// returned and no request using its keys is in flight.
    unsafe fn register_memory(&self, addr: *mut u8, len: usize, access: MemoryAccess) -> Result<MemoryKeys>;

    /// Deregisters a region; later requests naming its keys fail.
    fn deregister_memory(&self, keys: MemoryKeys) -> Result<()>;

    /// Creates the completion queue of this value (one per value, shared by
    /// all its queue pairs) if not yet made, with room for `entries`.
    fn create_completion_queue(&self, entries: u32) -> Result<()>;

    /// Creates an RC queue pair in the init state, bound to the completion
    /// queue.
    fn create_queue_pair(&self, caps: QueuePairCaps) -> Result<QueuePairId>;

    /// Takes a queue pair through ready-to-receive to ready-to-send,
    /// connected to one remote queue pair by GID.
    fn connect_queue_pair(&self, qp: QueuePairId, attrs: &ConnectAttributes) -> Result<()>;

    /// Moves a queue pair to the error state (`ibv_modify_qp` to
    /// `IBV_QPS_ERR`): every request on it not yet executed, and every
    /// request posted later, completes with [`CompletionStatus::Flushed`]
    /// (signalled or not). The completions may arrive later; see the
    /// module docs for how to know they all did.
    fn flush_queue_pair(&self, qp: QueuePairId) -> Result<()>;

    /// Destroys a queue pair; its outstanding requests are dropped. Drain
    /// it first ([`flush_queue_pair`](Verbs::flush_queue_pair), then poll
    /// until its last request completed): completions of a queue pair
    /// destroyed undrained may still reach the completion queue.
    fn destroy_queue_pair(&self, qp: QueuePairId) -> Result<()>;

    /// Posts a chain of READs on `qp` with one doorbell. On `Err`, the first
    /// `posted` requests were posted and will complete.
    fn post_reads(&self, qp: QueuePairId, chain: &[ReadRequest]) -> std::result::Result<(), PostError>;

    /// Moves completions into `out` (about `max`; an implementation whose
    /// library hands over a larger batch moves all of it rather than drop
    /// any), returning how many.
    fn poll_completions(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize>;
}
