//! `gear_core::Transport` for [`RdmaTransport`]: local buffers registered,
//! connections prepared and made, reads posted and waited on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gear_core::transport::check_read_ops;
use gear_core::{
    LocalBuffer, MemoryRegion, PeerEndpoint, PendingConnection, QueuePairEndpoint, RdmaEndpoint, ReadOp, RemoteAccess,
    RemoteHandle, RemoteRegion, Ticket, Transport, TransportKind,
};

use crate::verbs::{ConnectAttributes, MemoryAccess, QueuePairCaps, Verbs};

use super::{
    read_limit, ClientState, Connection, CoreResult, Pending, Piece, PieceState, QueuePairState, RdmaTransport,
    Registration, TicketState,
};

impl<V: Verbs> Transport for RdmaTransport<V> {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn register_local(&self, region: Arc<dyn MemoryRegion>) -> CoreResult<LocalBuffer> {
        let (ptr, len) = region.host_span("rdma reads land in host-addressable memory")?;
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
    fn psn_for(id: u64, index: usize) -> u32 {
        // Any 24-bit value works; vary it per queue pair so a stale packet
        // of an earlier connection is unlikely to match.
        let mixed = (id ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        (mixed >> 40) as u32 & 0xff_ffff
    }

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
