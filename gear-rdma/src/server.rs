//! The serving side: [`RdmaServer`], `gear_core::TransportServer` over any
//! [`Verbs`]. It registers a shard's region for remote reads (remote read
//! only: nothing remote can write the table) and, for each client, creates
//! as many queue pairs as the client offered and connects them by GID.
//! The server's CPU takes no part in the reads themselves.
//!
//! Queue pairs are bounded ([`RdmaServerConfig`]): a client (its GID and
//! session) holds one connection per region, replaced when it connects
//! again, so a client that reconnects after every failure holds no more
//! than one; a client host holds at most
//! [`max_queue_pairs_per_client`](RdmaServerConfig::max_queue_pairs_per_client)
//! and the server at most [`max_queue_pairs`](RdmaServerConfig::max_queue_pairs);
//! an accept that needs room reaps connections idle (no accept or
//! [`keep_alive`](TransportServer::keep_alive)) for
//! [`idle_timeout`](RdmaServerConfig::idle_timeout), least recently used
//! first, and is refused with `gear_core::Error::Exhausted` when that is
//! not enough.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gear_core::{
    ExposedRegion, MemoryRegion, PeerEndpoint, QueuePairEndpoint, RdmaEndpoint, RemoteAccess, RemoteRegion,
    TransportKind, TransportServer,
};

use crate::client::{new_session, read_limit};
use crate::config::RdmaServerConfig;
use crate::error::Result;
use crate::verbs::{ConnectAttributes, MemoryAccess, MemoryKeys, QueuePairCaps, QueuePairId, Verbs};

type CoreResult<T> = gear_core::Result<T>;

/// One client's connection to one exposed region.
struct Accepted {
    client_gid: [u8; 16],
    session: u64,
    queue_pairs: Vec<QueuePairId>,
    /// The last accept or keep-alive.
    last_used: Instant,
}

struct Exposed {
    _region: Arc<dyn MemoryRegion>,
    keys: MemoryKeys,
    addr: u64,
    connections: Vec<Accepted>,
}

/// `gear_core::TransportServer` for RDMA (see the module docs).
pub struct RdmaServer<V: Verbs> {
    verbs: V,
    config: RdmaServerConfig,
    session: u64,
    state: Mutex<ServerState>,
}

#[derive(Default)]
struct ServerState {
    next_id: u64,
    exposed: HashMap<u64, Exposed>,
    /// Queue pairs being created by accepts in progress (counted against
    /// the bounds before they exist).
    reserved: Vec<([u8; 16], usize)>,
}

impl ServerState {
    fn connections(&self) -> impl Iterator<Item = &Accepted> {
        self.exposed.values().flat_map(|e| e.connections.iter())
    }

    /// Queue pairs held or being created, over all clients or of `gid`.
    fn queue_pairs(&self, gid: Option<[u8; 16]>) -> usize {
        let held: usize =
            self.connections().filter(|c| gid.is_none_or(|g| c.client_gid == g)).map(|c| c.queue_pairs.len()).sum();
        let reserved: usize =
            self.reserved.iter().filter(|(g, _)| gid.is_none_or(|want| *g == want)).map(|r| r.1).sum();
        held + reserved
    }

    /// Removes the least recently used connection idle for at least
    /// `idle` at `now` (of `gid`, or of anyone), returning its queue pairs.
    fn reap_one(&mut self, now: Instant, idle: Duration, gid: Option<[u8; 16]>) -> Option<Vec<QueuePairId>> {
        let (region, index) = self
            .exposed
            .iter()
            .flat_map(|(&id, e)| e.connections.iter().enumerate().map(move |(i, c)| (id, i, c)))
            .filter(|(_, _, c)| {
                now.saturating_duration_since(c.last_used) >= idle && gid.is_none_or(|g| c.client_gid == g)
            })
            .min_by_key(|(_, _, c)| c.last_used)
            .map(|(id, i, _)| (id, i))?;
        let exposed = self.exposed.get_mut(&region)?;
        Some(exposed.connections.swap_remove(index).queue_pairs)
    }
}

/// Completion queue entries of a server; it posts nothing, the queue pairs
/// only need one.
const SERVER_CQ_ENTRIES: u32 = 64;

impl<V: Verbs> RdmaServer<V> {
    /// A server over `verbs` with the default bounds.
    pub fn new(verbs: V) -> Result<Self> {
        Self::with_config(verbs, RdmaServerConfig::default())
    }

    /// A server over `verbs` with `config`'s bounds and path settings.
    pub fn with_config(verbs: V, config: RdmaServerConfig) -> Result<Self> {
        config.validate()?;
        verbs.create_completion_queue(SERVER_CQ_ENTRIES)?;
        Ok(RdmaServer {
            verbs,
            config,
            session: new_session(),
            state: Mutex::new(ServerState { next_id: 1, ..Default::default() }),
        })
    }

    /// The verbs underneath.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// Queue pairs the server holds now, over all clients and regions.
    pub fn queue_pair_count(&self) -> usize {
        self.lock().queue_pairs(None)
    }

    /// Client connections the server holds now, over all regions.
    pub fn connection_count(&self) -> usize {
        self.lock().connections().count()
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn psn_for(id: u64, index: usize) -> u32 {
        let mixed = (id.wrapping_add(0x5bd1_e995) ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        (mixed >> 40) as u32 & 0xff_ffff
    }

    fn destroy(&self, queue_pairs: Vec<QueuePairId>) {
        for qp in queue_pairs {
            // The responder side posts nothing, so there is nothing to
            // drain; a failure leaves nothing to retry either.
            let _ = self.verbs.destroy_queue_pair(qp);
        }
    }

    /// Makes room for `wanted` queue pairs of `client`: replaces the
    /// client's own connection to `region`, reaps idle connections if the
    /// bounds need it, and reserves the room. Returns the queue pairs to
    /// destroy, or the refusal.
    fn make_room(
        &self,
        st: &mut ServerState,
        region: u64,
        client: &RdmaEndpoint,
        wanted: usize,
    ) -> CoreResult<Vec<QueuePairId>> {
        let mut freed = Vec::new();
        if let Some(exposed) = st.exposed.get_mut(&region) {
            let before = exposed.connections.len();
            let mut kept = Vec::with_capacity(before);
            for c in exposed.connections.drain(..) {
                if c.client_gid == client.gid && c.session == client.session {
                    freed.extend(c.queue_pairs);
                } else {
                    kept.push(c);
                }
            }
            exposed.connections = kept;
        }
        let (now, idle) = (Instant::now(), self.config.idle_timeout);
        let per_client = self.config.max_queue_pairs_per_client;
        while st.queue_pairs(Some(client.gid)) + wanted > per_client {
            match st.reap_one(now, idle, Some(client.gid)) {
                Some(reaped) => freed.extend(reaped),
                None => {
                    let held = st.queue_pairs(Some(client.gid));
                    return Err(exhausted(
                        freed,
                        self,
                        format!(
                            "rdma: the client at gid {} holds {held} queue pairs and asks for {wanted} more, at most {per_client} per client",
                            gid_text(&client.gid)
                        ),
                    ));
                }
            }
        }
        let total = self.config.max_queue_pairs;
        while st.queue_pairs(None) + wanted > total {
            match st.reap_one(now, idle, None) {
                Some(reaped) => freed.extend(reaped),
                None => {
                    let held = st.queue_pairs(None);
                    return Err(exhausted(
                        freed,
                        self,
                        format!(
                            "rdma: the server holds {held} queue pairs, none idle for {:?}, and {wanted} more would pass its bound of {total}",
                            self.config.idle_timeout
                        ),
                    ));
                }
            }
        }
        st.reserved.push((client.gid, wanted));
        Ok(freed)
    }

    fn unreserve(st: &mut ServerState, gid: [u8; 16], wanted: usize) {
        if let Some(i) = st.reserved.iter().position(|&(g, n)| g == gid && n == wanted) {
            st.reserved.swap_remove(i);
        }
    }

    /// Creates and connects one queue pair per client queue pair.
    fn connect_queue_pairs(
        &self,
        exposed: &ExposedRegion,
        client: &RdmaEndpoint,
        created: &mut Vec<QueuePairId>,
    ) -> CoreResult<Vec<QueuePairEndpoint>> {
        let port = self.verbs.port();
        let mut endpoints = Vec::with_capacity(client.queue_pairs.len());
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
                // 0, or the device refuses every READ; the client keeps
                // its READs in flight within what this descriptor says.
                max_rd_atomic: read_limit(port.max_read_initiator).min(client.max_read_responder),
                max_dest_rd_atomic: read_limit(port.max_read_responder),
                timeout: self.config.ack_timeout,
                retry_count: self.config.retry_count,
                traffic_class: self.config.traffic_class,
                service_level: self.config.service_level,
            };
            self.verbs.connect_queue_pair(qp, &attrs)?;
            endpoints.push(QueuePairEndpoint { qp_number: qp.qp_number, psn });
        }
        Ok(endpoints)
    }
}

/// The refusal of an accept, after destroying what was freed on the way
/// (a replaced or reaped connection stays closed).
fn exhausted<V: Verbs>(freed: Vec<QueuePairId>, server: &RdmaServer<V>, why: String) -> gear_core::Error {
    server.destroy(freed);
    gear_core::Error::Exhausted(why)
}

/// A GID as IPv6 text for messages.
fn gid_text(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

impl<V: Verbs> TransportServer for RdmaServer<V> {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn expose(&self, shard: u32, incarnation: u64, region: Arc<dyn MemoryRegion>) -> CoreResult<ExposedRegion> {
        let (ptr, len) = region.host_span("rdma exposes host-addressable memory only")?;
        // SAFETY: `Exposed` keeps the `Arc` alive until `withdraw` (or drop)
        // deregisters it; the registration grants remote read only, so the
        // device never writes the region.
        let keys = unsafe { self.verbs.register_memory(ptr.as_ptr(), len, MemoryAccess::RemoteRead) }?;
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        let addr = ptr.as_ptr() as usize as u64;
        st.exposed.insert(id, Exposed { _region: region, keys, addr, connections: Vec::new() });
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
        let wanted = client.queue_pairs.len();
        let (addr, rkey, freed) = {
            let mut st = self.lock();
            let e = st
                .exposed
                .get(&exposed.id())
                .ok_or_else(|| gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())))?;
            let (addr, rkey) = (e.addr, e.keys.rkey);
            let freed = self.make_room(&mut st, exposed.id(), client, wanted)?;
            (addr, rkey, freed)
        };
        self.destroy(freed);
        let mut created = Vec::with_capacity(wanted);
        let outcome = self.connect_queue_pairs(exposed, client, &mut created);
        let mut st = self.lock();
        Self::unreserve(&mut st, client.gid, wanted);
        let endpoints = match outcome {
            Ok(endpoints) => endpoints,
            Err(e) => {
                drop(st);
                self.destroy(created);
                return Err(e);
            }
        };
        match st.exposed.get_mut(&exposed.id()) {
            Some(e) => e.connections.push(Accepted {
                client_gid: client.gid,
                session: client.session,
                queue_pairs: created,
                last_used: Instant::now(),
            }),
            None => {
                // Withdrawn while we connected.
                drop(st);
                self.destroy(created);
                return Err(gear_core::Error::InvalidHandle(format!("region {} was withdrawn", exposed.id())));
            }
        }
        drop(st);
        let port = self.verbs.port();
        let peer = RdmaEndpoint {
            gid: port.gid,
            gid_index: port.gid_index,
            lid: port.lid,
            mtu: port.mtu,
            queue_pairs: endpoints,
            session: self.session,
            max_read_initiator: read_limit(port.max_read_initiator),
            max_read_responder: read_limit(port.max_read_responder),
        };
        Ok(RemoteRegion {
            shard: exposed.shard(),
            incarnation: exposed.incarnation(),
            len: exposed.len(),
            access: RemoteAccess::Rdma { addr, rkey, peer },
        })
    }

    fn keep_alive(&self, exposed: &ExposedRegion, session: u64) {
        let now = Instant::now();
        let mut st = self.lock();
        if let Some(e) = st.exposed.get_mut(&exposed.id()) {
            for c in e.connections.iter_mut().filter(|c| c.session == session) {
                c.last_used = now;
            }
        }
    }

    fn withdraw(&self, exposed: &ExposedRegion) -> CoreResult<()> {
        let e = self
            .lock()
            .exposed
            .remove(&exposed.id())
            .ok_or_else(|| gear_core::Error::InvalidHandle(format!("region {} is not exposed", exposed.id())))?;
        self.verbs.deregister_memory(e.keys)?;
        for c in e.connections {
            self.destroy(c.queue_pairs);
        }
        Ok(())
    }
}

impl<V: Verbs> Drop for RdmaServer<V> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (_, e) in st.exposed.drain() {
            for c in e.connections {
                for qp in c.queue_pairs {
                    let _ = self.verbs.destroy_queue_pair(qp);
                }
            }
            let _ = self.verbs.deregister_memory(e.keys);
        }
    }
}
