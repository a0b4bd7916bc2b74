//! The transport traits: one-sided reads of byte ranges of a remote shard's
//! region into local memory, the way RDMA READs work, with the TCP
//! fallback behind the same interface. Implementations: RDMA in gear-rdma;
//! TCP in gear-tcp.
//!
//! # How a read happens
//!
//! Two halves, each a trait, composed by the caller (the crate that owns the
//! control plane passes their descriptors around; neither half knows the
//! other's crate):
//!
//! * the shard server holds a [`TransportServer`]: it [exposes](TransportServer::expose)
//!   the table's region once (RDMA: registers it as a memory region with
//!   remote-read access), and for every client that connects it
//!   [accepts](TransportServer::accept) the client's [`PeerEndpoint`] and
//!   answers with a [`RemoteRegion`] descriptor;
//! * the trainer holds a [`Transport`]:
//!   1. [`register_local`](Transport::register_local) each buffer reads land
//!      in, once (RDMA: memory registration is slow; do it at start-up, not
//!      per batch) → [`LocalBuffer`];
//!   2. [`prepare_connection`](Transport::prepare_connection) → a
//!      [`PendingConnection`] whose endpoint the control plane sends to the
//!      shard; the shard's `accept` answers with a [`RemoteRegion`];
//!      [`connect`](Transport::connect) with it → [`RemoteHandle`]; when
//!      no answer comes (the shard refused, the call failed),
//!      [`abort`](Transport::abort) it so its resources are freed;
//!   3. per batch, [`post_reads`](Transport::post_reads) to every shard
//!      first, each returning a [`Ticket`] at once, then
//!      [`wait`](Transport::wait) on each ticket with one deadline: the reads
//!      to different shards are in flight at the same time.
//!
//! # Contract every implementation keeps
//!
//! * **Bounds before posting.** `post_reads` runs [`check_read_ops`] against
//!   the remote region's length and the local buffer's length before it
//!   posts anything; a refused batch moves no byte and leaves no ticket.
//! * **Handles are checked.** A handle (buffer, remote, ticket) the transport
//!   did not issue, or one already released, is refused with
//!   [`Error::InvalidHandle`], never trusted.
//! * **Tickets finish once.** `wait` or `poll` report a ticket's outcome
//!   exactly once (`Ok` when every op's bytes landed, [`Error::RemoteRead`]
//!   naming the ops that did not); after that the ticket is retired.
//!   A wait that reaches its deadline returns [`Error::Timeout`] and leaves
//!   the ticket in flight: wait again later, or
//!   [`disconnect`](Transport::disconnect), which ends its reads with an
//!   error. A ticket never waited keeps its record (and its buffer busy).
//! * **Local bytes under a ticket.** Until its ticket has finished, the
//!   bytes of a posted op's local range may change at any moment (the NIC or
//!   a receiving thread writes them); read them only after `Ok`. After an
//!   error or a dropped ticket their content is unspecified.
//! * **Buffers outlive their reads.** The transport holds the registered
//!   region (an `Arc`) until it is released and no read into it is in
//!   flight; [`release_local`](Transport::release_local) of a buffer with a
//!   read in flight is refused with [`Error::Busy`].
//! * **No panics on peer data.** Descriptors come from the network: validate
//!   them ([`RemoteRegion::validate`]) and refuse what does not fit.
//! * **Unavailable is an error.** A transport that cannot run on this
//!   machine (no RDMA device, no library) returns
//!   [`Error::TransportUnavailable`] from its constructor; it never panics.
//!
//! Bytes read are not validated here: a remote window is read, then the
//! slot's generation is re-read (another read), exactly like a local one.

use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::memory::MemoryRegion;

/// Which transport a value belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// One-sided RDMA READs (InfiniBand or RoCE).
    Rdma,
    /// Reads served over TCP by the shard server.
    Tcp,
}

impl TransportKind {
    /// A short lowercase name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::Rdma => "rdma",
            TransportKind::Tcp => "tcp",
        }
    }
}

/// The most queue pairs one RDMA connection may name; a descriptor with
/// more is refused (it comes from the network).
pub const MAX_QUEUE_PAIRS: usize = 64;

/// The most bytes of a TCP endpoint address a descriptor may carry.
pub const MAX_ADDRESS_LEN: usize = 1024;

/// One RDMA queue pair as its peer needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueuePairEndpoint {
    /// Queue pair number (24 bits).
    pub qp_number: u32,
    /// First packet sequence number the queue pair sends with (24 bits).
    pub psn: u32,
}

/// What an RDMA peer must know to connect reliable-connection queue pairs
/// to this side: plain data, so a control plane can carry it as is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RdmaEndpoint {
    /// The port's GID (global identifier): peers are addressed by GID so
    /// RoCE works as well as InfiniBand.
    pub gid: [u8; 16],
    /// Index of that GID in the port's GID table (for the local side's
    /// address handle; informational for the peer).
    pub gid_index: u8,
    /// The port's LID (0 on RoCE, where only the GID counts).
    pub lid: u16,
    /// Active path MTU of the port in bytes (256, 512, 1024, 2048 or 4096);
    /// the two sides use the smaller of theirs.
    pub mtu: u32,
    /// This side's queue pairs, in the order they pair up with the peer's.
    pub queue_pairs: Vec<QueuePairEndpoint>,
    /// A random id of the sending side, the same for every connection it
    /// makes (a client transport, a server): a server keeps at most one
    /// connection per client GID and session on a region, so a client
    /// that connects again replaces its earlier connection.
    pub session: u64,
    /// The most READs this side's queue pairs have outstanding as
    /// initiator (its device's `max_qp_init_rd_atom`, at least 1).
    pub max_read_initiator: u8,
    /// The most READs this side's queue pairs serve at once as responder
    /// (the `max_dest_rd_atomic` it sets, at least 1). The peer sets its
    /// `max_rd_atomic` to at most this: a NIC that receives more READs
    /// than it has responder resources for refuses them
    /// (`IBV_WC_REM_INV_REQ_ERR` at the reader).
    pub max_read_responder: u8,
}

impl RdmaEndpoint {
    /// Checks what came from the network: a path MTU verbs know, 1 to
    /// [`MAX_QUEUE_PAIRS`] queue pairs, 24-bit QP numbers and PSNs,
    /// outstanding-read limits of at least 1.
    pub fn validate(&self) -> Result<()> {
        if self.max_read_initiator == 0 || self.max_read_responder == 0 {
            return Err(Error::Descriptor(format!(
                "rdma endpoint: outstanding-read limits must be at least 1 (initiator {}, responder {})",
                self.max_read_initiator, self.max_read_responder
            )));
        }
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(Error::Descriptor(format!(
                "rdma endpoint: path mtu {} is not one of 256, 512, 1024, 2048, 4096",
                self.mtu
            )));
        }
        if self.queue_pairs.is_empty() || self.queue_pairs.len() > MAX_QUEUE_PAIRS {
            return Err(Error::Descriptor(format!(
                "rdma endpoint: {} queue pairs, expected 1 to {MAX_QUEUE_PAIRS}",
                self.queue_pairs.len()
            )));
        }
        for (i, qp) in self.queue_pairs.iter().enumerate() {
            if qp.qp_number >= 1 << 24 || qp.psn >= 1 << 24 {
                return Err(Error::Descriptor(format!(
                    "rdma endpoint: queue pair {i} has qp number {:#x} and psn {:#x}, both must fit in 24 bits",
                    qp.qp_number, qp.psn
                )));
            }
        }
        Ok(())
    }
}

/// Where a TCP transport reaches a shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TcpEndpoint {
    /// `host:port` the shard's data plane listens on; empty in a client's
    /// [`PendingConnection`], where TCP has nothing to announce.
    pub address: String,
}

/// One side's connection data, per transport.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerEndpoint {
    /// RDMA: GID, LID, MTU, queue pair numbers and PSNs.
    Rdma(RdmaEndpoint),
    /// TCP: the address to dial.
    Tcp(TcpEndpoint),
}

impl PeerEndpoint {
    /// The transport this endpoint belongs to.
    pub fn kind(&self) -> TransportKind {
        match self {
            PeerEndpoint::Rdma(_) => TransportKind::Rdma,
            PeerEndpoint::Tcp(_) => TransportKind::Tcp,
        }
    }

    /// The sending side's session ([`RdmaEndpoint::session`]); 0 for a
    /// transport without per-client state on the server (TCP).
    pub fn session(&self) -> u64 {
        match self {
            PeerEndpoint::Rdma(rdma) => rdma.session,
            PeerEndpoint::Tcp(_) => 0,
        }
    }

    /// Checks what came from the network (see [`RdmaEndpoint::validate`];
    /// a TCP address is at most [`MAX_ADDRESS_LEN`] bytes).
    pub fn validate(&self) -> Result<()> {
        match self {
            PeerEndpoint::Rdma(rdma) => rdma.validate(),
            PeerEndpoint::Tcp(tcp) if tcp.address.len() > MAX_ADDRESS_LEN => Err(Error::Descriptor(format!(
                "tcp endpoint: address has {} bytes, at most {MAX_ADDRESS_LEN} allowed",
                tcp.address.len()
            ))),
            PeerEndpoint::Tcp(_) => Ok(()),
        }
    }
}

/// How the bytes of a remote region are reached, per transport.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoteAccess {
    /// RDMA: the registered memory region and the queue pairs the shard
    /// created for this client.
    Rdma {
        /// Remote virtual address of the region's first byte.
        addr: u64,
        /// Remote key the shard registered the region with.
        rkey: u32,
        /// The shard's port and its queue pairs for this client.
        peer: RdmaEndpoint,
    },
    /// TCP: the shard's data-plane address and its id for the region.
    Tcp {
        /// Where to dial.
        peer: TcpEndpoint,
        /// The shard's name for the exposed region, sent with each read.
        region_id: u64,
    },
}

/// What a reader needs to know about a remote region: which shard, how long,
/// and the transport's connection data. Comes from the network: call
/// [`validate`](RemoteRegion::validate) before use (`connect` does).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// Which shard (server) holds it.
    pub shard: u32,
    /// The shard's incarnation (changes when the shard restarts), so a
    /// descriptor of an earlier life is told apart.
    pub incarnation: u64,
    /// Size in bytes; every read is checked against it before posting.
    pub len: u64,
    /// Transport-specific connection data.
    pub access: RemoteAccess,
}

impl RemoteRegion {
    /// The transport this descriptor is for.
    pub fn kind(&self) -> TransportKind {
        match self.access {
            RemoteAccess::Rdma { .. } => TransportKind::Rdma,
            RemoteAccess::Tcp { .. } => TransportKind::Tcp,
        }
    }

    /// Checks what came from the network: the endpoint is valid and, for
    /// RDMA, `addr + len` does not wrap.
    pub fn validate(&self) -> Result<()> {
        match &self.access {
            RemoteAccess::Rdma { addr, peer, .. } => {
                if addr.checked_add(self.len).is_none() {
                    return Err(Error::Descriptor(format!(
                        "shard {}: region at {addr:#x} of {} bytes wraps the address space",
                        self.shard, self.len
                    )));
                }
                peer.validate()
            }
            RemoteAccess::Tcp { peer, .. } => PeerEndpoint::Tcp(peer.clone()).validate(),
        }
    }
}

/// One read: `len` bytes at `remote_offset` of the remote region into
/// `local_offset` of the local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReadOp {
    /// Offset in the remote region.
    pub remote_offset: u64,
    /// Offset in the local buffer.
    pub local_offset: u64,
    /// Bytes to read.
    pub len: u64,
}

/// A local buffer registered with a transport
/// ([`Transport::register_local`]): reads land in it. Only meaningful to the
/// transport that issued it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct LocalBuffer {
    id: u64,
    len: u64,
}

impl LocalBuffer {
    /// A handle with the transport's own id for the buffer (for
    /// implementations).
    pub fn new(id: u64, len: u64) -> Self {
        LocalBuffer { id, len }
    }
    /// The transport's id for the buffer.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Length of the registered buffer in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A client's half of a connection being set up
/// ([`Transport::prepare_connection`]): send `endpoint` to the shard, whose
/// [`TransportServer::accept`] answers with the [`RemoteRegion`] to pass to
/// [`Transport::connect`] together with this value.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PendingConnection {
    /// The transport's id for the half-made connection.
    pub id: u64,
    /// What the shard must know about this side.
    pub endpoint: PeerEndpoint,
}

/// A connection to one shard's region ([`Transport::connect`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RemoteHandle {
    id: u64,
    shard: u32,
    len: u64,
}

impl RemoteHandle {
    /// A handle with the transport's own id (for implementations).
    pub fn new(id: u64, shard: u32, len: u64) -> Self {
        RemoteHandle { id, shard, len }
    }
    /// The transport's id for the connection.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The shard at the other end.
    pub fn shard(&self) -> u32 {
        self.shard
    }
    /// Length of the remote region in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the remote region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A batch of posted reads in flight ([`Transport::post_reads`]); finish it
/// with [`Transport::wait`] or [`Transport::poll`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    id: u64,
    shard: u32,
}

impl Ticket {
    /// A ticket with the transport's own id (for implementations).
    pub fn new(id: u64, shard: u32) -> Self {
        Ticket { id, shard }
    }
    /// The transport's id for the batch.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The shard the reads go to.
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

/// The reading half of a transport, held by trainers. Object-safe: the
/// client picks an implementation at run time (`Box<dyn Transport>`). See
/// the [module docs](self) for the sequence of calls and the contract.
pub trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Registers `region` as a destination of reads, once (RDMA: a memory
    /// region with local-write access). The transport keeps the `Arc` until
    /// the buffer is released and no read into it is in flight.
    fn register_local(&self, region: Arc<dyn MemoryRegion>) -> Result<LocalBuffer>;

    /// Releases a registered buffer. Refused with [`Error::Busy`] while a
    /// ticket that reads into it has not finished.
    fn release_local(&self, buffer: &LocalBuffer) -> Result<()>;

    /// Starts a connection to `shard`: creates what this side needs (RDMA:
    /// queue pairs) and returns the endpoint the shard must learn.
    fn prepare_connection(&self, shard: u32) -> Result<PendingConnection>;

    /// Completes a connection with the shard's answer. Validates `remote`
    /// ([`RemoteRegion::validate`]) and refuses a descriptor of another
    /// transport or shard with [`Error::Descriptor`]. Consumes `pending`
    /// whatever the outcome: on an error its resources are freed.
    fn connect(&self, pending: PendingConnection, remote: &RemoteRegion) -> Result<RemoteHandle>;

    /// Gives up a connection that will not be completed (the shard refused
    /// it, the control plane failed): frees what
    /// [`prepare_connection`](Transport::prepare_connection) made (RDMA:
    /// its queue pairs). Every prepared connection ends in exactly one of
    /// `connect` or `abort`; one that ends in neither holds its resources
    /// until the transport is dropped. [`Error::InvalidHandle`] for a
    /// connection this transport did not prepare.
    fn abort(&self, pending: PendingConnection) -> Result<()>;

    /// Closes a connection. Tickets still in flight on it finish with an
    /// error.
    fn disconnect(&self, remote: &RemoteHandle) -> Result<()>;

    /// Posts every read of `ops` from `remote` into `local` and returns at
    /// once. Runs [`check_read_ops`] first: an op outside either region
    /// refuses the whole batch before anything is posted. An empty `ops`
    /// gives a ticket that finishes `Ok` at once.
    fn post_reads(&self, remote: &RemoteHandle, local: &LocalBuffer, ops: &[ReadOp]) -> Result<Ticket>;

    /// Non-blocking: `Ok(true)` once every op of `ticket` has landed (the
    /// ticket is then retired), `Ok(false)` while some are in flight, or the
    /// ticket's error (also retiring it).
    fn poll(&self, ticket: &Ticket) -> Result<bool>;

    /// Blocks until `ticket` finishes or `deadline` passes. `Ok(())` when
    /// every op landed; [`Error::RemoteRead`] naming the ops that did not
    /// (after the transport's own retries); [`Error::Timeout`] at the
    /// deadline, with the ticket left in flight.
    fn wait(&self, ticket: &Ticket, deadline: Instant) -> Result<()>;

    /// Waits for several tickets (typically one per shard) against one
    /// deadline, returning each one's outcome in order.
    fn wait_all(&self, tickets: &[Ticket], deadline: Instant) -> Vec<Result<()>> {
        tickets.iter().map(|t| self.wait(t, deadline)).collect()
    }
}

/// A region a [`TransportServer`] made readable by remote peers.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ExposedRegion {
    id: u64,
    shard: u32,
    incarnation: u64,
    len: u64,
}

impl ExposedRegion {
    /// A handle with the server's own id (for implementations).
    pub fn new(id: u64, shard: u32, incarnation: u64, len: u64) -> Self {
        ExposedRegion { id, shard, incarnation, len }
    }
    /// The server's id for the region.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The shard it belongs to.
    pub fn shard(&self) -> u32 {
        self.shard
    }
    /// The shard's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The serving half of a transport, held by a shard server. Object-safe.
pub trait TransportServer: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Makes `region` readable by remote peers, once (RDMA: registers it
    /// with remote-read access only; nothing remote can write it).
    fn expose(&self, shard: u32, incarnation: u64, region: Arc<dyn MemoryRegion>) -> Result<ExposedRegion>;

    /// Answers a client's [`PendingConnection::endpoint`] (validated first:
    /// it comes from the network) with the descriptor it connects with
    /// (RDMA: creates and connects this side's queue pairs). A server with
    /// per-client resources bounds them: a client that connects again
    /// (same [`PeerEndpoint::session`]) replaces its earlier connection,
    /// and a connect beyond the bounds is refused with
    /// [`Error::Exhausted`]. [`Error::Descriptor`] for an endpoint that is
    /// not valid or of another transport; [`Error::InvalidHandle`] for a
    /// region not (or no longer) exposed.
    fn accept(&self, exposed: &ExposedRegion, client: &PeerEndpoint) -> Result<RemoteRegion>;

    /// Notes that the client with `session` still uses its connection to
    /// `exposed` (the control plane calls this on every request of that
    /// client): a server reaps connections idle for long when it needs
    /// room. A transport without per-client state has nothing to keep.
    fn keep_alive(&self, exposed: &ExposedRegion, session: u64) {
        let _ = (exposed, session);
    }

    /// Stops serving a region; connections to it fail their reads.
    fn withdraw(&self, exposed: &ExposedRegion) -> Result<()>;
}

/// Checks that every op lies inside both regions. Transports call this
/// before posting anything, so a bad op harms nothing; servers call it on
/// read requests from the network.
pub fn check_read_ops(remote_len: u64, local_len: u64, ops: &[ReadOp]) -> Result<()> {
    for (i, op) in ops.iter().enumerate() {
        let r_end = op.remote_offset.checked_add(op.len);
        let l_end = op.local_offset.checked_add(op.len);
        if r_end.is_none_or(|e| e > remote_len) || l_end.is_none_or(|e| e > local_len) {
            return Err(Error::Region(format!(
                "read op {i} ({} bytes, remote {} of {remote_len}, local {} of {local_len}) is out of bounds",
                op.len, op.remote_offset, op.local_offset
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rdma_peer(qps: usize) -> RdmaEndpoint {
        RdmaEndpoint {
            gid: [0xfe; 16],
            gid_index: 0,
            lid: 0,
            mtu: 1024,
            queue_pairs: (0..qps as u32).map(|i| QueuePairEndpoint { qp_number: 0x100 + i, psn: i }).collect(),
            session: 9,
            max_read_initiator: 16,
            max_read_responder: 16,
        }
    }

    #[test]
    fn read_ops_are_checked_against_both_regions() {
        let op = |remote_offset, local_offset, len| ReadOp { remote_offset, local_offset, len };
        assert!(check_read_ops(100, 50, &[op(0, 0, 50), op(50, 0, 50)]).is_ok());
        assert!(check_read_ops(100, 50, &[op(0, 0, 50), op(51, 0, 50)]).is_err());
        assert!(check_read_ops(100, 50, &[op(0, 1, 50)]).is_err());
        assert!(check_read_ops(u64::MAX, u64::MAX, &[op(u64::MAX, 0, 1)]).is_err());
        assert!(check_read_ops(u64::MAX, u64::MAX, &[op(0, u64::MAX - 1, 2)]).is_err());
        let err = check_read_ops(10, 10, &[op(0, 0, 1), op(9, 0, 2)]).unwrap_err().to_string();
        assert!(err.contains("read op 1"), "{err}");
    }

    #[test]
    fn descriptors_from_the_network_are_validated() {
        let region = |access| RemoteRegion { shard: 3, incarnation: 1, len: 4096, access };
        let good = region(RemoteAccess::Rdma { addr: 0x1000, rkey: 7, peer: rdma_peer(4) });
        assert!(good.validate().is_ok());
        assert_eq!(good.kind(), TransportKind::Rdma);

        let wraps = region(RemoteAccess::Rdma { addr: u64::MAX - 10, rkey: 7, peer: rdma_peer(1) });
        assert!(matches!(wraps.validate(), Err(Error::Descriptor(_))));
        let no_qps = region(RemoteAccess::Rdma { addr: 0, rkey: 7, peer: rdma_peer(0) });
        assert!(matches!(no_qps.validate(), Err(Error::Descriptor(_))));
        let many_qps = region(RemoteAccess::Rdma { addr: 0, rkey: 7, peer: rdma_peer(MAX_QUEUE_PAIRS + 1) });
        assert!(matches!(many_qps.validate(), Err(Error::Descriptor(_))));
        let mut wide = rdma_peer(1);
        wide.queue_pairs[0].qp_number = 1 << 24;
        assert!(matches!(PeerEndpoint::Rdma(wide).validate(), Err(Error::Descriptor(_))));
        let mut odd_mtu = rdma_peer(1);
        odd_mtu.mtu = 1500;
        assert!(matches!(PeerEndpoint::Rdma(odd_mtu).validate(), Err(Error::Descriptor(_))));
        for (initiator, responder) in [(0, 4), (4, 0)] {
            let limits = RdmaEndpoint { max_read_initiator: initiator, max_read_responder: responder, ..rdma_peer(1) };
            let err = PeerEndpoint::Rdma(limits).validate().unwrap_err().to_string();
            assert!(err.contains("outstanding-read limits"), "{err}");
        }
        assert_eq!(PeerEndpoint::Rdma(rdma_peer(1)).session(), 9);

        let tcp = |address: String| region(RemoteAccess::Tcp { peer: TcpEndpoint { address }, region_id: 1 });
        assert!(tcp("10.0.0.1:7000".into()).validate().is_ok());
        assert_eq!(tcp(String::new()).kind(), TransportKind::Tcp);
        assert!(matches!(tcp("x".repeat(MAX_ADDRESS_LEN + 1)).validate(), Err(Error::Descriptor(_))));
    }

    #[test]
    fn transport_traits_are_object_safe() {
        fn takes(_: Option<&dyn Transport>, _: Option<&dyn TransportServer>) {}
        takes(None, None);
    }
}
