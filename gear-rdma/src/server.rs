//! The serving side: [`RdmaServer`], `gear_core::TransportServer` over any
//! [`Verbs`]. It registers a shard's region for remote reads (remote read
//! only: nothing remote can write the table) and, for each client, creates
//! as many queue pairs as the client offered and connects them by GID.
//! The server's CPU takes no part in the reads themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use gear_core::{
    ExposedRegion, MemoryRegion, PeerEndpoint, QueuePairEndpoint, RdmaEndpoint, RemoteAccess, RemoteRegion,
    TransportKind, TransportServer,
};

use crate::error::Result;
use crate::verbs::{ConnectAttributes, MemoryAccess, MemoryKeys, QueuePairCaps, QueuePairId, Verbs};

type CoreResult<T> = gear_core::Result<T>;

struct Exposed {
    _region: Arc<dyn MemoryRegion>,
    keys: MemoryKeys,
    addr: u64,
    queue_pairs: Vec<QueuePairId>,
}

/// `gear_core::TransportServer` for RDMA (see the module docs).
pub struct RdmaServer<V: Verbs> {
    verbs: V,
    state: Mutex<ServerState>,
}

#[derive(Default)]
struct ServerState {
    next_id: u64,
    exposed: HashMap<u64, Exposed>,
}

/// Completion queue entries of a server; it posts nothing, the queue pairs
/// only need one.
const SERVER_CQ_ENTRIES: u32 = 64;

impl<V: Verbs> RdmaServer<V> {
    /// A server over `verbs`.
    pub fn new(verbs: V) -> Result<Self> {
        verbs.create_completion_queue(SERVER_CQ_ENTRIES)?;
        Ok(RdmaServer { verbs, state: Mutex::new(ServerState { next_id: 1, ..Default::default() }) })
    }

    /// The verbs underneath.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn psn_for(id: u64, index: usize) -> u32 {
        let mixed = (id.wrapping_add(0x5bd1_e995) ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        (mixed >> 40) as u32 & 0xff_ffff
    }
}

impl<V: Verbs> TransportServer for RdmaServer<V> {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn expose(&self, shard: u32, incarnation: u64, region: Arc<dyn MemoryRegion>) -> CoreResult<ExposedRegion> {
        let ptr =
            region.host_ptr().ok_or(gear_core::Error::Unsupported("rdma exposes host-addressable memory only"))?;
        let len = usize::try_from(region.len())
            .map_err(|_| gear_core::Error::Region(format!("region of {} bytes is too large", region.len())))?;
        // SAFETY: `Exposed` keeps the `Arc` alive until `withdraw` (or drop)
        // deregisters it; the registration grants remote read only, so the
        // device never writes the region.
        let keys = unsafe { self.verbs.register_memory(ptr.as_ptr(), len, MemoryAccess::RemoteRead) }?;
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        let addr = ptr.as_ptr() as usize as u64;
        st.exposed.insert(id, Exposed { _region: region, keys, addr, queue_pairs: Vec::new() });
        Ok(ExposedRegion::new(id, shard, incarnation, len as u64))
    }

    fn accept(&self, exposed: &ExposedRegion, client: &PeerEndpoint) -> CoreResult<RemoteRegion> {
        client.validate()?;
        let PeerEndpoint::Rdma(client) = client else {
            return Err(gear_core::Error::Descriptor(format!(
                "an rdma server got a {} endpoint",
                client.kind().name()
            )));
        };
        let (addr, rkey) = {
            let st = self.lock();
            let e = st
                .exposed
                .get(&exposed.id())
                .ok_or_else(|| gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())))?;
            (e.addr, e.keys.rkey)
        };
        let port = self.verbs.port();
        let mut created: Vec<QueuePairId> = Vec::with_capacity(client.queue_pairs.len());
        let mut endpoints = Vec::with_capacity(client.queue_pairs.len());
        let outcome = (|| -> CoreResult<()> {
            for (i, theirs) in client.queue_pairs.iter().enumerate() {
                let qp = self.verbs.create_queue_pair(QueuePairCaps { max_send_wr: 1 })?;
                created.push(qp);
                let psn = Self::psn_for(exposed.id() ^ (u64::from(qp.qp_number) << 32), i);
                let attrs = ConnectAttributes {
                    remote_gid: client.gid,
                    remote_lid: client.lid,
                    remote_qp_number: theirs.qp_number,
                    remote_psn: theirs.psn,
                    local_psn: psn,
                    mtu: port.mtu.min(client.mtu),
                    // This side is read: the responder resources must not be
                    // 0, or the device refuses every READ.
                    max_rd_atomic: port.max_read_initiator.clamp(1, 16),
                    max_dest_rd_atomic: port.max_read_responder.clamp(1, 16),
                    timeout: 14,
                    retry_count: 7,
                };
                self.verbs.connect_queue_pair(qp, &attrs)?;
                endpoints.push(QueuePairEndpoint { qp_number: qp.qp_number, psn });
            }
            Ok(())
        })();
        if let Err(e) = outcome {
            for qp in created {
                let _ = self.verbs.destroy_queue_pair(qp);
            }
            return Err(e);
        }
        let mut st = self.lock();
        match st.exposed.get_mut(&exposed.id()) {
            Some(e) => e.queue_pairs.extend(created),
            None => {
                // Withdrawn while we connected.
                for qp in created {
                    let _ = self.verbs.destroy_queue_pair(qp);
                }
                return Err(gear_core::Error::InvalidHandle(format!("region {} was withdrawn", exposed.id())));
            }
        }
        let peer = RdmaEndpoint {
            gid: port.gid,
            gid_index: port.gid_index,
            lid: port.lid,
            mtu: port.mtu,
            queue_pairs: endpoints,
        };
        Ok(RemoteRegion {
            shard: exposed.shard(),
            incarnation: exposed.incarnation(),
            len: exposed.len(),
            access: RemoteAccess::Rdma { addr, rkey, peer },
        })
    }

    fn withdraw(&self, exposed: &ExposedRegion) -> CoreResult<()> {
        let e = self
            .lock()
            .exposed
            .remove(&exposed.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())))?;
        self.verbs.deregister_memory(e.keys)?;
        for qp in e.queue_pairs {
            let _ = self.verbs.destroy_queue_pair(qp);
        }
        Ok(())
    }
}

impl<V: Verbs> Drop for RdmaServer<V> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (_, e) in st.exposed.drain() {
            for qp in e.queue_pairs {
                let _ = self.verbs.destroy_queue_pair(qp);
            }
            let _ = self.verbs.deregister_memory(e.keys);
        }
    }
}
