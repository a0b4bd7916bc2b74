//! The in-process verbs keep the RC rules the transport relies on, and the
//! transport sets the outstanding-read limits explicitly.

mod common;

use std::time::{Duration, Instant};

use common::{buffer, gid, pattern, snapshot};
use gear_core::{MemoryRegion, ReadOp, Transport, TransportServer};
use gear_rdma::in_process::LOCAL_QP_OPERATION_ERROR;
use gear_rdma::verbs::{
    CompletionStatus, ConnectAttributes, MemoryAccess, PortAttributes, QueuePairCaps, ReadRequest, Verbs,
};
use gear_rdma::{InProcessFabric, InProcessVerbs, RdmaConfig, RdmaServer, RdmaTransport};

fn attrs(remote_gid: [u8; 16], remote_qp_number: u32, max_rd_atomic: u8, max_dest_rd_atomic: u8) -> ConnectAttributes {
    ConnectAttributes {
        remote_gid,
        remote_lid: 0,
        remote_qp_number,
        remote_psn: 0,
        local_psn: 0,
        mtu: 1024,
        max_rd_atomic,
        max_dest_rd_atomic,
        timeout: 14,
        retry_count: 7,
        traffic_class: 0,
        service_level: 0,
    }
}

/// Two connected nodes; returns the outcome of one 8-byte READ.
fn one_read(initiator_rd: u8, responder_dest_rd: u8, rkey_offset: u32) -> CompletionStatus {
    let fabric = InProcessFabric::new();
    let a = fabric.add_node(gid(1)).unwrap();
    let b = fabric.add_node(gid(2)).unwrap();
    a.create_completion_queue(16).unwrap();
    b.create_completion_queue(16).unwrap();
    let src = buffer(64, |i| pattern(0, i));
    let dst = buffer(64, |_| 0);
    let src_ptr = src.host_ptr().unwrap().as_ptr();
    let dst_ptr = dst.host_ptr().unwrap().as_ptr();
    // SAFETY: both buffers outlive the fabric's use of them in this function.
    let remote = unsafe { b.register_memory(src_ptr, 64, MemoryAccess::RemoteRead) }.unwrap();
    // SAFETY: as above.
    let local = unsafe { a.register_memory(dst_ptr, 64, MemoryAccess::LocalWrite) }.unwrap();
    let qa = a.create_queue_pair(QueuePairCaps { max_send_wr: 8 }).unwrap();
    let qb = b.create_queue_pair(QueuePairCaps { max_send_wr: 8 }).unwrap();
    a.connect_queue_pair(qa, &attrs(gid(2), qb.qp_number, initiator_rd, 1)).unwrap();
    b.connect_queue_pair(qb, &attrs(gid(1), qa.qp_number, 1, responder_dest_rd)).unwrap();
    let read = ReadRequest {
        wr_id: 9,
        local_addr: dst_ptr as u64,
        lkey: local.lkey,
        remote_addr: src_ptr as u64 + 8,
        rkey: remote.rkey + rkey_offset,
        len: 8,
        signaled: true,
    };
    a.post_reads(qa, &[read]).unwrap();
    let mut out = Vec::new();
    a.poll_completions(&mut out, 16).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].wr_id, 9);
    if out[0].status == CompletionStatus::Success {
        assert_eq!(snapshot(&dst)[..8], snapshot(&src)[8..16]);
    }
    out[0].status
}

#[test]
fn reads_need_outstanding_read_limits_on_both_sides() {
    assert_eq!(one_read(1, 1, 0), CompletionStatus::Success);
    assert_eq!(one_read(0, 1, 0), CompletionStatus::Other(LOCAL_QP_OPERATION_ERROR));
    assert_eq!(one_read(1, 0, 0), CompletionStatus::RemoteInvalidRequest);
    assert_eq!(one_read(1, 1, 1000), CompletionStatus::RemoteAccessError);
}

#[test]
fn an_error_flushes_the_rest_of_the_queue_pair_with_completions_even_unsignalled() {
    let fabric = InProcessFabric::new();
    let a = fabric.add_node(gid(1)).unwrap();
    let b = fabric.add_node(gid(2)).unwrap();
    a.create_completion_queue(16).unwrap();
    b.create_completion_queue(16).unwrap();
    let src = buffer(64, |i| i as u8);
    let dst = buffer(64, |_| 0);
    // SAFETY: both buffers outlive the fabric's use of them in this test.
    let remote = unsafe { b.register_memory(src.host_ptr().unwrap().as_ptr(), 64, MemoryAccess::RemoteRead) }.unwrap();
    // SAFETY: as above.
    let local = unsafe { a.register_memory(dst.host_ptr().unwrap().as_ptr(), 64, MemoryAccess::LocalWrite) }.unwrap();
    let qa = a.create_queue_pair(QueuePairCaps { max_send_wr: 8 }).unwrap();
    let qb = b.create_queue_pair(QueuePairCaps { max_send_wr: 8 }).unwrap();
    a.connect_queue_pair(qa, &attrs(gid(2), qb.qp_number, 1, 1)).unwrap();
    b.connect_queue_pair(qb, &attrs(gid(1), qa.qp_number, 1, 1)).unwrap();
    let base = src.host_ptr().unwrap().as_ptr() as u64;
    let read = |wr_id, offset: u64, signaled| ReadRequest {
        wr_id,
        local_addr: dst.host_ptr().unwrap().as_ptr() as u64 + offset,
        lkey: local.lkey,
        remote_addr: base + offset,
        rkey: remote.rkey,
        len: 8,
        signaled,
    };
    // The second request reads past the remote region.
    let mut bad = read(2, 8, false);
    bad.remote_addr = base + 60;
    a.post_reads(qa, &[read(1, 0, false), bad, read(3, 16, false), read(4, 24, true)]).unwrap();
    let mut out = Vec::new();
    a.poll_completions(&mut out, 16).unwrap();
    let seen = |out: &[gear_rdma::verbs::WorkCompletion]| -> Vec<(u64, CompletionStatus)> {
        out.iter().map(|w| (w.wr_id, w.status)).collect()
    };
    assert_eq!(seen(&out), vec![(2, CompletionStatus::RemoteAccessError)], "the error first, its flushes later");
    out.clear();
    a.poll_completions(&mut out, 16).unwrap();
    assert_eq!(
        seen(&out),
        vec![(3, CompletionStatus::Flushed), (4, CompletionStatus::Flushed)],
        "no completion for the unsignalled success; errors and flushes always"
    );
    assert!(a.is_errored(qa.qp_number).unwrap());
    assert_eq!(snapshot(&dst)[..8], snapshot(&src)[..8], "the first request landed");
}

#[test]
fn the_transport_sets_read_limits_even_where_the_device_reports_none() {
    let fabric = InProcessFabric::new();
    let zero =
        |gid| PortAttributes { gid, gid_index: 3, lid: 0, mtu: 1024, max_read_initiator: 0, max_read_responder: 0 };
    let server = RdmaServer::new(fabric.add_node_with(zero(gid(2))).unwrap()).unwrap();
    let region = buffer(4096, |i| pattern(5, i));
    let exposed = server.expose(5, 1, region).unwrap();
    let verbs: InProcessVerbs = fabric.add_node_with(zero(gid(1))).unwrap();
    let transport = RdmaTransport::new(verbs, RdmaConfig::default()).unwrap();
    let pending = transport.prepare_connection(5).unwrap();
    let remote = server.accept(&exposed, &pending.endpoint).unwrap();
    let handle = transport.connect(pending, &remote).unwrap();
    let local = buffer(128, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let ticket =
        transport.post_reads(&handle, &buffer, &[ReadOp { remote_offset: 64, local_offset: 0, len: 128 }]).unwrap();
    transport.wait(&ticket, Instant::now() + Duration::from_secs(10)).unwrap();
    let want: Vec<u8> = (64..192).map(|i| pattern(5, i)).collect();
    assert_eq!(snapshot(&local), want);
}

#[test]
fn a_descriptor_with_a_wrong_psn_lid_or_mtu_fails_its_reads() {
    // InfiniBand-like ports (LIDs set) with different MTUs: the path MTU
    // is the smaller one, and every field of the descriptor matters.
    let port = |n: u8, lid: u16, mtu: u32| PortAttributes {
        gid: gid(n),
        gid_index: 3,
        lid,
        mtu,
        max_read_initiator: 16,
        max_read_responder: 16,
    };
    type Tamper = fn(&mut gear_core::RdmaEndpoint);
    let cases: [(&str, Tamper); 4] = [
        ("untouched", |_| {}),
        ("psn", |p| p.queue_pairs[0].psn ^= 1),
        ("lid", |p| p.lid += 1),
        ("mtu", |p| p.mtu = 4096),
    ];
    for (what, tamper) in cases {
        let fabric = InProcessFabric::new();
        let server = RdmaServer::new(fabric.add_node_with(port(2, 0x22, 1024)).unwrap()).unwrap();
        let region = buffer(4096, |i| pattern(0, i));
        let exposed = server.expose(0, 1, region.clone()).unwrap();
        let config = RdmaConfig { queue_pairs: 1, max_attempts: 1, ..RdmaConfig::default() };
        let client = RdmaTransport::new(fabric.add_node_with(port(1, 0x11, 4096)).unwrap(), config).unwrap();
        let pending = client.prepare_connection(0).unwrap();
        let mut remote = server.accept(&exposed, &pending.endpoint).unwrap();
        if let gear_core::RemoteAccess::Rdma { peer, .. } = &mut remote.access {
            tamper(peer);
        }
        let handle = client.connect(pending, &remote).unwrap();
        let local = buffer(64, |_| 0);
        let buffer = client.register_local(local.clone()).unwrap();
        let ticket =
            client.post_reads(&handle, &buffer, &[ReadOp { remote_offset: 100, local_offset: 0, len: 64 }]).unwrap();
        let outcome = client.wait(&ticket, Instant::now() + Duration::from_secs(10));
        if what == "untouched" {
            outcome.unwrap();
            assert_eq!(snapshot(&local)[..], snapshot(&region)[100..164]);
        } else {
            assert!(outcome.is_err(), "a descriptor with a changed {what} still read");
            assert!(snapshot(&local).iter().all(|&b| b == 0), "{what}: bytes landed");
        }
    }
}

#[test]
fn a_responder_refuses_reads_beyond_its_limit_and_connects_within_the_device() {
    let fabric = InProcessFabric::new();
    let a = fabric.add_node(gid(1)).unwrap();
    let b = fabric.add_node(gid(2)).unwrap();
    a.create_completion_queue(64).unwrap();
    b.create_completion_queue(64).unwrap();
    let src = buffer(256, |i| pattern(0, i));
    let dst = buffer(256, |_| 0);
    // SAFETY: both buffers outlive the fabric's use of them in this test.
    let remote = unsafe { b.register_memory(src.host_ptr().unwrap().as_ptr(), 256, MemoryAccess::RemoteRead) }.unwrap();
    // SAFETY: as above.
    let local = unsafe { a.register_memory(dst.host_ptr().unwrap().as_ptr(), 256, MemoryAccess::LocalWrite) }.unwrap();
    let qa = a.create_queue_pair(QueuePairCaps { max_send_wr: 16 }).unwrap();
    let qb = b.create_queue_pair(QueuePairCaps { max_send_wr: 16 }).unwrap();
    // The device's limits (16 here) bound what a queue pair may be given.
    let too_many = attrs(gid(2), qb.qp_number, 17, 1);
    assert!(a.connect_queue_pair(qa, &too_many).unwrap_err().to_string().contains("max_rd_atomic 17"));
    let bad_level = ConnectAttributes { service_level: 16, ..attrs(gid(2), qb.qp_number, 1, 1) };
    assert!(a.connect_queue_pair(qa, &bad_level).unwrap_err().to_string().contains("service level"));
    // The reader issues 8 at once; the responder serves 2.
    a.connect_queue_pair(qa, &attrs(gid(2), qb.qp_number, 8, 1)).unwrap();
    b.connect_queue_pair(qb, &attrs(gid(1), qa.qp_number, 1, 2)).unwrap();
    let read = |i: u64| ReadRequest {
        wr_id: i,
        local_addr: dst.host_ptr().unwrap().as_ptr() as u64 + 8 * i,
        lkey: local.lkey,
        remote_addr: src.host_ptr().unwrap().as_ptr() as u64 + 8 * i,
        rkey: remote.rkey,
        len: 8,
        signaled: true,
    };
    let chain: Vec<ReadRequest> = (0..8).map(read).collect();
    a.post_reads(qa, &chain).unwrap();
    let mut out = Vec::new();
    a.poll_completions(&mut out, 64).unwrap();
    a.poll_completions(&mut out, 64).unwrap();
    let statuses: Vec<CompletionStatus> = out.iter().map(|w| w.status).collect();
    let mut want = vec![CompletionStatus::Success; 2];
    want.push(CompletionStatus::RemoteInvalidRequest);
    want.extend([CompletionStatus::Flushed; 5]);
    assert_eq!(statuses, want, "the third READ in flight is one too many");
    assert_eq!(snapshot(&dst)[..16], snapshot(&src)[..16]);
    assert!(snapshot(&dst)[16..].iter().all(|&b| b == 0));
}
