//! [`Verbs`] over rdma-core through the `sideway` crate (feature `rdma`).
//! sideway's shim loads `libibverbs.so.1` at run time, so this builds and
//! starts on any Linux machine; [`SidewayVerbs::open`] returns
//! [`Error::Unavailable`] where the library, a device or an active port is
//! missing.
//!
//! Not yet run on RDMA hardware (no machine of ours has a device);
//! `cargo xtask rdma-test` is the loopback test to run where one exists.
//!
//! Two sideway limits shape this file: its `post` does not say how many
//! requests of a failed chain were posted (`ibv_post_send`'s `bad_wr`), so a
//! failed post is reported as nothing posted, and the transport destroys
//! that queue pair, which is correct whatever prefix went out; and a few of
//! its conversions panic on values they do not know (an MTU, a completion
//! status), so raw values are converted here and `open` runs inside
//! `catch_unwind`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue, WorkCompletionStatus};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion as SidewayRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, SetScatterGatherEntry,
    WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use crate::error::{Error, Result};
use crate::gid::{default_gid_index, GidEntry, GidKind};
use crate::verbs::{
    CompletionStatus, ConnectAttributes, MemoryAccess, MemoryKeys, PortAttributes, PostError, QueuePairCaps,
    QueuePairId, ReadRequest, Verbs, WorkCompletion,
};

/// One opened device port with its protection domain.
pub struct SidewayVerbs {
    context: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    port_num: u8,
    port: PortAttributes,
    cq: Mutex<Option<Arc<BasicCompletionQueue>>>,
    queue_pairs: Mutex<HashMap<u64, BasicQueuePair>>,
    regions: Mutex<HashMap<u64, Arc<SidewayRegion>>>,
    next_handle: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn mtu_bytes(raw: u32) -> u32 {
    match raw {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

fn mtu_of(bytes: u32) -> Mtu {
    match bytes {
        0..=256 => Mtu::Mtu256,
        257..=512 => Mtu::Mtu512,
        513..=1024 => Mtu::Mtu1024,
        1025..=2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

fn status_of(raw: u32) -> CompletionStatus {
    const SUCCESS: u32 = WorkCompletionStatus::Success as u32;
    const REMOTE_ACCESS: u32 = WorkCompletionStatus::RemoteAccessError as u32;
    const REMOTE_INVALID: u32 = WorkCompletionStatus::RemoteInvalidRequestError as u32;
    const LOCAL_PROTECTION: u32 = WorkCompletionStatus::LocalProtectionError as u32;
    const LOCAL_LENGTH: u32 = WorkCompletionStatus::LocalLengthError as u32;
    const RETRY: u32 = WorkCompletionStatus::RetryCounterExceededError as u32;
    const FLUSH: u32 = WorkCompletionStatus::WorkRequestFlushedError as u32;
    match raw {
        SUCCESS => CompletionStatus::Success,
        REMOTE_ACCESS => CompletionStatus::RemoteAccessError,
        REMOTE_INVALID => CompletionStatus::RemoteInvalidRequest,
        LOCAL_PROTECTION | LOCAL_LENGTH => CompletionStatus::LocalProtectionError,
        RETRY => CompletionStatus::RetryExceeded,
        FLUSH => CompletionStatus::Flushed,
        other => CompletionStatus::Other(other),
    }
}

impl SidewayVerbs {
    /// Opens `device` (the first one when `None`), port `port_num` (usually
    /// 1), GID table entry `gid_index` (`None`: the port's RoCE v2 entry of
    /// an IPv4, else IPv6, address, else 0, as
    /// [`default_gid_index`] picks from the
    /// types the device reports; `show_gids` lists them). Any failure,
    /// including no libibverbs or no device, is [`Error::Unavailable`].
    pub fn open(device: Option<&str>, port_num: u8, gid_index: Option<u8>) -> Result<Self> {
        match catch_unwind(AssertUnwindSafe(|| Self::open_inner(device, port_num, gid_index))) {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable("the rdma library panicked while opening the device".into())),
        }
    }

    fn open_inner(device: Option<&str>, port_num: u8, gid_index: Option<u8>) -> Result<Self> {
        let unavailable = |what: String| Error::Unavailable(what);
        let list = DeviceList::new()
            .map_err(|e| unavailable(format!("cannot list devices (is libibverbs.so.1 installed?): {e}")))?;
        let found = match device {
            Some(name) => list.iter().find(|d| d.name() == name),
            None => list.iter().next(),
        };
        let Some(found) = found else {
            return Err(unavailable(match device {
                Some(name) => format!("no rdma device named `{name}`"),
                None => "no rdma device on this machine".into(),
            }));
        };
        let name = found.name();
        let context = found.open().map_err(|e| unavailable(format!("cannot open device `{name}`: {e}")))?;
        let attr = context.query_device().map_err(|e| unavailable(format!("cannot query `{name}`: {e}")))?;
        let port_attr =
            context.query_port(port_num).map_err(|e| unavailable(format!("`{name}` port {port_num}: {e}")))?;
        if port_attr.port_state() != PortState::Active {
            return Err(unavailable(format!("`{name}` port {port_num} is not active")));
        }
        let gid_index = match gid_index {
            Some(index) => index,
            None => default_gid_index(&gid_table(&context, port_num, port_attr.gid_tbl_len())),
        };
        let gid = context
            .query_gid(port_num, u32::from(gid_index))
            .map_err(|e| unavailable(format!("`{name}` port {port_num} gid {gid_index}: {e}")))?;
        if gid.is_zero() {
            return Err(unavailable(format!("`{name}` port {port_num} gid index {gid_index} is empty")));
        }
        let pd = context.alloc_pd().map_err(|e| unavailable(format!("cannot allocate a protection domain: {e}")))?;
        let clamp = |v: i32| u8::try_from(v.clamp(0, 255)).unwrap_or(u8::MAX);
        let port = PortAttributes {
            gid: gid.raw,
            gid_index,
            lid: port_attr.lid(),
            // `active_mtu()` panics on a value it does not know (caught by
            // `open`); its discriminant is the raw `ibv_mtu`.
            mtu: mtu_bytes(port_attr.active_mtu() as u32),
            max_read_initiator: clamp(attr.max_qp_init_rd_atom()),
            max_read_responder: clamp(attr.max_qp_rd_atom()),
        };
        Ok(SidewayVerbs {
            context,
            pd,
            port_num,
            port,
            cq: Mutex::new(None),
            queue_pairs: Mutex::new(HashMap::new()),
            regions: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        })
    }

    /// The GID index this value addresses its side by.
    pub fn gid_index(&self) -> u8 {
        self.port.gid_index
    }

    fn cq(&self) -> Result<Arc<BasicCompletionQueue>> {
        lock(&self.cq).clone().ok_or_else(|| Error::verbs("ibv_poll_cq", "no completion queue was created"))
    }
}

/// The valid entries of a port's GID table with their types
/// (`ibv_query_gid`, `ibv_query_gid_type`); entries that cannot be read or
/// are empty are left out.
fn gid_table(context: &DeviceContext, port_num: u8, len: i32) -> Vec<GidEntry> {
    let len = u8::try_from(len.clamp(0, 256)).unwrap_or(u8::MAX);
    (0..len)
        .filter_map(|index| {
            let gid = context.query_gid(port_num, u32::from(index)).ok()?;
            if gid.is_zero() {
                return None;
            }
            // 1 is IBV_GID_TYPE_ROCE_V2; 0 is InfiniBand or RoCE v1.
            let kind = match context.query_gid_type(port_num, u32::from(index)).ok()? {
                1 => GidKind::RoceV2,
                _ => GidKind::InfiniBandOrRoceV1,
            };
            Some(GidEntry { index, gid: gid.raw, kind })
        })
        .collect()
}

impl Verbs for SidewayVerbs {
    fn port(&self) -> PortAttributes {
        self.port
    }

    unsafe fn register_memory(&self, addr: *mut u8, len: usize, access: MemoryAccess) -> Result<MemoryKeys> {
        let flags = match access {
            MemoryAccess::LocalWrite => AccessFlags::LocalWrite,
            MemoryAccess::RemoteRead => AccessFlags::RemoteRead,
        };
        // SAFETY: the caller promises (this trait method's contract) that
        // the range stays allocated until deregistered and no request is in
        // flight; that is what `ibv_reg_mr` needs.
        let mr = unsafe { self.pd.reg_mr(addr as usize, len, flags) }.map_err(|e| Error::verbs("ibv_reg_mr", e))?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let keys = MemoryKeys { handle, lkey: mr.lkey(), rkey: mr.rkey() };
        lock(&self.regions).insert(handle, mr);
        Ok(keys)
    }

    fn deregister_memory(&self, keys: MemoryKeys) -> Result<()> {
        // Dropping the last `Arc` calls `ibv_dereg_mr`.
        lock(&self.regions).remove(&keys.handle).map(drop).ok_or_else(|| Error::verbs("ibv_dereg_mr", "unknown region"))
    }

    fn create_completion_queue(&self, entries: u32) -> Result<()> {
        let mut cq = lock(&self.cq);
        if cq.is_none() {
            let made = self.context.create_cq_builder().setup_cqe(entries).build();
            *cq = Some(made.map_err(|e| Error::verbs("ibv_create_cq", e))?);
        }
        Ok(())
    }

    fn create_queue_pair(&self, caps: QueuePairCaps) -> Result<QueuePairId> {
        let cq = GenericCompletionQueue::from(self.cq().map_err(|_| Error::verbs("ibv_create_qp", "no cq"))?);
        let mut qp = self
            .pd
            .create_qp_builder()
            .setup_send_cq(cq.clone())
            .setup_recv_cq(cq)
            .setup_max_send_wr(caps.max_send_wr)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .build()
            .map_err(|e| Error::verbs("ibv_create_qp", e))?;
        let mut attr = QueuePairAttribute::new();
        // Remote read on every queue pair: a responder refuses READs unless
        // its queue pair grants it.
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port_num)
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteRead);
        qp.modify(&attr).map_err(|e| Error::verbs("ibv_modify_qp(INIT)", e))?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let id = QueuePairId { handle, qp_number: qp.qp_number() };
        lock(&self.queue_pairs).insert(handle, qp);
        Ok(id)
    }

    fn connect_queue_pair(&self, qp: QueuePairId, a: &ConnectAttributes) -> Result<()> {
        let mut qps = lock(&self.queue_pairs);
        let q = qps.get_mut(&qp.handle).ok_or_else(|| Error::verbs("ibv_modify_qp(RTR)", "unknown queue pair"))?;
        let mut av = AddressHandleAttribute::new();
        // Always a global route header addressed by GID: RoCE needs it and
        // InfiniBand accepts it. Its traffic class is the IP header's DSCP
        // and ECN bits on RoCE v2.
        av.setup_dest_lid(a.remote_lid).setup_port(self.port_num).setup_service_level(a.service_level).setup_grh(
            &Gid { raw: a.remote_gid },
            0,
            self.port.gid_index,
            64,
            a.traffic_class,
        );
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu_of(a.mtu))
            .setup_dest_qp_num(a.remote_qp_number)
            .setup_rq_psn(a.remote_psn)
            .setup_max_dest_read_atomic(a.max_dest_rd_atomic)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        q.modify(&rtr).map_err(|e| Error::verbs("ibv_modify_qp(RTR)", e))?;
        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(a.local_psn)
            .setup_timeout(a.timeout)
            .setup_retry_cnt(a.retry_count)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(a.max_rd_atomic);
        q.modify(&rts).map_err(|e| Error::verbs("ibv_modify_qp(RTS)", e))?;
        Ok(())
    }

    fn flush_queue_pair(&self, qp: QueuePairId) -> Result<()> {
        let mut qps = lock(&self.queue_pairs);
        let q = qps.get_mut(&qp.handle).ok_or_else(|| Error::verbs("ibv_modify_qp(ERR)", "unknown queue pair"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        q.modify(&attr).map_err(|e| Error::verbs("ibv_modify_qp(ERR)", e))
    }

    fn destroy_queue_pair(&self, qp: QueuePairId) -> Result<()> {
        // Dropping calls `ibv_destroy_qp`.
        lock(&self.queue_pairs)
            .remove(&qp.handle)
            .map(drop)
            .ok_or_else(|| Error::verbs("ibv_destroy_qp", "unknown queue pair"))
    }

    fn post_reads(&self, qp: QueuePairId, chain: &[ReadRequest]) -> std::result::Result<(), PostError> {
        let mut qps = lock(&self.queue_pairs);
        let q = qps.get_mut(&qp.handle).ok_or_else(|| PostError { posted: 0, reason: "unknown queue pair".into() })?;
        let mut guard = q.start_post_send();
        for r in chain {
            let flags = if r.signaled { WorkRequestFlags::Signaled } else { WorkRequestFlags::none() };
            let wr = guard.construct_wr(r.wr_id, flags).setup_read(r.rkey, r.remote_addr);
            if r.len == 0 {
                // A zero-length READ (the transport's drain marker) has no
                // scatter entry: some devices read a 0 byte count as 2 GiB.
                // SAFETY: an empty list names no memory.
                unsafe { wr.setup_sge_list(&[]) };
                continue;
            }
            // SAFETY: the transport builds requests only inside buffers it
            // registered (and keeps alive while requests are in flight), and
            // the device checks the lkey's bounds as well.
            unsafe { wr.setup_sge(r.lkey, r.local_addr, r.len) };
        }
        // sideway does not report `bad_wr`: count a failure as nothing posted
        // (the transport then destroys the queue pair; see the module docs).
        guard.post().map_err(|e| PostError { posted: 0, reason: format!("ibv_post_send: {e}") })
    }

    fn poll_completions(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        let cq = self.cq()?;
        let poller = match cq.start_poll() {
            Ok(p) => p,
            Err(sideway::ibverbs::completion::PollCompletionQueueError::CompletionQueueEmpty) => return Ok(0),
            Err(e) => return Err(Error::verbs("ibv_poll_cq", e)),
        };
        // Drain the poller whatever `max` says: completions it already took
        // from the queue would be lost with it.
        let _ = max;
        let mut n = 0;
        for wc in poller {
            // The QP number is not exposed by sideway's basic completion;
            // the transport finds the queue pair from the wr_id.
            out.push(WorkCompletion { wr_id: wc.wr_id(), status: status_of(wc.status()), qp_number: 0 });
            n += 1;
        }
        Ok(n)
    }
}
