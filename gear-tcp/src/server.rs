//! The serving side: [`TcpServer`], `gear_core::TransportServer` over TCP,
//! and [`ReadService`], the `gear.data.v1.RegionReader` service that streams
//! byte ranges of the exposed regions.
//!
//! The bytes of a shard's region change under a read (writers overwrite
//! recycled slots from other threads or processes): the service copies them
//! as the table's own readers do, with [`gear_core::copy::copy_bytes`], and
//! leaves validation to the reader's seqlock protocol (read the window,
//! then re-read the slot's generation in a later request). Each request
//! starts with an acquire fence, so a generation read by a later request is
//! ordered after the window bytes of an earlier one.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use gear_core::{
    check_read_ops, ExposedRegion, MemoryRegion, PeerEndpoint, ReadOp, RemoteAccess, RemoteRegion, TcpEndpoint,
    TransportKind, TransportServer,
};
use parking_lot::RwLock;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::proto::region_reader_server::{RegionReader, RegionReaderServer};
use crate::proto::{ReadChunk, ReadRequest};

type CoreResult<T> = gear_core::Result<T>;

/// Bytes per streamed chunk unless configured otherwise (2 MiB: large
/// enough that per-message costs vanish, small enough to stay far below
/// any message limit).
pub const DEFAULT_CHUNK_BYTES: usize = 2 << 20;

/// The most ranges one request may name.
pub const MAX_RANGES: usize = 1 << 20;

/// Chunks queued ahead of the network per request.
const QUEUED_CHUNKS: usize = 4;

struct Exposed {
    /// Keeps the bytes behind `base` alive while a read copies them.
    _region: Arc<dyn MemoryRegion>,
    /// `region.host_ptr()`, checked at `expose`.
    base: std::ptr::NonNull<u8>,
    len: u64,
}

// SAFETY: `base` points into `region`, which is `Send + Sync` (a
// `MemoryRegion`); the pointer is only read through while `region` is held.
unsafe impl Send for Exposed {}
// SAFETY: as for `Send`; nothing is written through `base`.
unsafe impl Sync for Exposed {}

type Regions = Arc<RwLock<HashMap<u64, Arc<Exposed>>>>;

/// `gear_core::TransportServer` over TCP. Regions are exposed here; the
/// bytes are served by the [`ReadService`] from [`TcpServer::service`],
/// which shares the region table.
pub struct TcpServer {
    address: String,
    chunk_bytes: usize,
    regions: Regions,
    next_id: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServer").field("address", &self.address).finish()
    }
}

impl TcpServer {
    /// A server whose descriptors tell clients to dial `address`
    /// (`host:port` where [`TcpServer::service`] is served), streaming
    /// chunks of [`DEFAULT_CHUNK_BYTES`].
    pub fn new(address: impl Into<String>) -> crate::Result<Self> {
        Self::with_chunk_bytes(address, DEFAULT_CHUNK_BYTES)
    }

    /// As [`TcpServer::new`] with chunks of `chunk_bytes` (4 KiB to 16 MiB).
    pub fn with_chunk_bytes(address: impl Into<String>, chunk_bytes: usize) -> crate::Result<Self> {
        let address = address.into();
        PeerEndpoint::Tcp(TcpEndpoint { address: address.clone() }).validate()?;
        if !(4096..=16 << 20).contains(&chunk_bytes) {
            return Err(crate::Error::Config(format!(
                "chunk of {chunk_bytes} bytes: expected 4096 to {} bytes",
                16 << 20
            )));
        }
        Ok(TcpServer { address, chunk_bytes, regions: Arc::default(), next_id: std::sync::atomic::AtomicU64::new(1) })
    }

    /// The address descriptors name.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The read service over this server's regions, to add to a tonic
    /// router (wrap it in the caller's interceptor for authentication).
    /// Its message limits are the chunk size plus framing.
    pub fn service(&self) -> RegionReaderServer<ReadService> {
        RegionReaderServer::new(ReadService { regions: self.regions.clone(), chunk_bytes: self.chunk_bytes })
            .max_encoding_message_size(self.chunk_bytes + 1024)
    }
}

impl TransportServer for TcpServer {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn expose(&self, shard: u32, incarnation: u64, region: Arc<dyn MemoryRegion>) -> CoreResult<ExposedRegion> {
        let (base, _) = region.host_span("tcp exposes host-addressable memory only")?;
        let len = region.len();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.regions.write().insert(id, Arc::new(Exposed { _region: region, base, len }));
        Ok(ExposedRegion::new(id, shard, incarnation, len))
    }

    fn accept(&self, exposed: &ExposedRegion, client: &PeerEndpoint) -> CoreResult<RemoteRegion> {
        client.validate()?;
        if client.kind() != TransportKind::Tcp {
            return Err(gear_core::Error::Descriptor(format!("a tcp server got a {} endpoint", client.kind().name())));
        }
        if !self.regions.read().contains_key(&exposed.id()) {
            return Err(gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())));
        }
        Ok(RemoteRegion {
            shard: exposed.shard(),
            incarnation: exposed.incarnation(),
            len: exposed.len(),
            access: RemoteAccess::Tcp { peer: TcpEndpoint { address: self.address.clone() }, region_id: exposed.id() },
        })
    }

    fn withdraw(&self, exposed: &ExposedRegion) -> CoreResult<()> {
        // Reads in progress keep their `Arc` and finish; new ones are refused.
        self.regions
            .write()
            .remove(&exposed.id())
            .map(|_| ())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())))
    }
}

/// The `gear.data.v1.RegionReader` service of a [`TcpServer`].
#[derive(Clone)]
pub struct ReadService {
    regions: Regions,
    chunk_bytes: usize,
}

impl std::fmt::Debug for ReadService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadService").field("chunk_bytes", &self.chunk_bytes).finish()
    }
}

/// The checked plan of one request: its region and ranges.
pub(crate) struct ReadPlan {
    exposed: Arc<Exposed>,
    ranges: Vec<(u64, u64)>,
    total: u64,
}

impl ReadService {
    /// Checks a request against the exposed regions: the region exists, at
    /// most [`MAX_RANGES`] ranges, each inside the region. Never panics.
    pub(crate) fn plan(&self, req: &ReadRequest) -> Result<ReadPlan, Status> {
        let exposed = self
            .regions
            .read()
            .get(&req.region_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("region {} is not exposed here", req.region_id)))?;
        if req.ranges.len() > MAX_RANGES {
            return Err(Status::invalid_argument(format!(
                "{} ranges in one read, at most {MAX_RANGES} allowed",
                req.ranges.len()
            )));
        }
        let ops: Vec<ReadOp> =
            req.ranges.iter().map(|r| ReadOp { remote_offset: r.offset, local_offset: 0, len: r.len }).collect();
        check_read_ops(exposed.len, u64::MAX, &ops)
            .map_err(|e| Status::out_of_range(format!("region {} of {} bytes: {e}", req.region_id, exposed.len)))?;
        // Each range is inside a region that fits a `usize` (checked at
        // expose), but their sum may not.
        let total = ops
            .iter()
            .try_fold(0u64, |acc, op| acc.checked_add(op.len))
            .ok_or_else(|| Status::out_of_range("the ranges add up to more than 2^64 bytes"))?;
        Ok(ReadPlan { exposed, ranges: req.ranges.iter().map(|r| (r.offset, r.len)).collect(), total })
    }
}

/// Copies the plan's bytes, chunk by chunk, into `send` until done or the
/// receiver is gone. Runs on a blocking thread.
fn produce(plan: ReadPlan, chunk_bytes: usize, send: tokio::sync::mpsc::Sender<Result<ReadChunk, Status>>) {
    // Bytes of earlier requests (a window) are ordered before the bytes
    // copied here (a generation word), as the seqlock's reader needs.
    fence(Ordering::Acquire);
    let mut position = 0u64;
    let mut ranges = plan.ranges.iter().copied().filter(|&(_, len)| len > 0);
    let mut current = ranges.next();
    while position < plan.total {
        let want = (plan.total - position).min(chunk_bytes as u64) as usize;
        let mut data: Vec<u8> = Vec::with_capacity(want);
        while data.len() < want {
            let Some((offset, len)) = current else { break };
            let take = (want - data.len()).min(len as usize);
            let at = data.len();
            // SAFETY: `offset + take <= offset + len <= exposed.len`
            // (checked by `plan` against the region, whose length fits a
            // `usize`), so the source lies inside the region, which
            // `plan.exposed` keeps alive; the destination is the spare
            // capacity of `data` (`at + take <= want`), a separate
            // allocation. The region's bytes may be written concurrently
            // by other threads or processes: they are copied as the table's
            // own readers copy them, and the reader discards rows whose
            // slot generation changed (see the module doc).
            unsafe {
                gear_core::copy::copy_bytes(
                    plan.exposed.base.as_ptr().add(offset as usize),
                    data.as_mut_ptr().add(at),
                    take,
                );
                data.set_len(at + take);
            }
            current = if take as u64 == len { ranges.next() } else { Some((offset + take as u64, len - take as u64)) };
        }
        let n = data.len() as u64;
        if send.blocking_send(Ok(ReadChunk { position, data })).is_err() {
            return;
        }
        position += n;
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<ReadChunk, Status>> + Send>>;

#[tonic::async_trait]
impl RegionReader for ReadService {
    type ReadStream = ChunkStream;

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<Self::ReadStream>, Status> {
        let plan = self.plan(request.get_ref())?;
        let (send, receive) = tokio::sync::mpsc::channel(QUEUED_CHUNKS);
        let chunk_bytes = self.chunk_bytes;
        tokio::task::spawn_blocking(move || produce(plan, chunk_bytes, send));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receive))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ReadRange;
    use proptest::prelude::*;

    fn server_with(len_words: usize) -> (TcpServer, ReadService, u64) {
        let server = TcpServer::new("127.0.0.1:1").unwrap();
        let exposed = server.expose(0, 1, Arc::new(gear_core::HeapRegion::zeroed(len_words * 8))).unwrap();
        let service = ReadService { regions: server.regions.clone(), chunk_bytes: 4096 };
        (server, service, exposed.id())
    }

    proptest! {
        /// Arbitrary requests never panic the handler: each is planned or
        /// refused, and a planned one covers exactly the bytes asked for.
        #[test]
        fn arbitrary_requests_are_planned_or_refused(
            region_id in prop_oneof![Just(1u64), any::<u64>()],
            ranges in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..8),
            small in proptest::collection::vec((0u64..600, 0u64..600), 0..8),
        ) {
            let (_server, service, id) = server_with(64);
            for ranges in [ranges, small] {
                let req = ReadRequest {
                    region_id: if region_id == 1 { id } else { region_id },
                    ranges: ranges.iter().map(|&(offset, len)| ReadRange { offset, len }).collect(),
                };
                match service.plan(&req) {
                    Ok(plan) => {
                        prop_assert!(ranges.iter().all(|&(o, l)| o.checked_add(l).is_some_and(|e| e <= 512)));
                        prop_assert_eq!(plan.total, ranges.iter().map(|r| r.1).sum::<u64>());
                    }
                    Err(s) => prop_assert!(matches!(
                        s.code(),
                        tonic::Code::OutOfRange | tonic::Code::NotFound | tonic::Code::InvalidArgument
                    )),
                }
            }
        }
    }

    #[test]
    fn endpoints_of_another_transport_and_withdrawn_regions_are_refused() {
        let (server, _service, id) = server_with(8);
        let exposed = ExposedRegion::new(id, 0, 1, 64);
        let tcp = PeerEndpoint::Tcp(TcpEndpoint { address: String::new() });
        let remote = server.accept(&exposed, &tcp).unwrap();
        assert_eq!(remote.kind(), TransportKind::Tcp);
        server.withdraw(&exposed).unwrap();
        assert!(matches!(server.accept(&exposed, &tcp), Err(gear_core::Error::InvalidHandle(_))));
        assert!(server.withdraw(&exposed).is_err());
    }
}
