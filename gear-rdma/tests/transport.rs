//! The RDMA transport's logic against the in-process verbs: how reads are
//! split, spread and signalled, what happens on every error path, and the
//! gear-core `Transport` contract (bounds before posting, overlapping
//! posts, deadlines, handles).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{buffer, check_landed, client, connect, gid, snapshot, Shard};
use gear_core::{Error as CoreError, ReadOp, RemoteAccess, TcpEndpoint, Transport, TransportServer};
use gear_rdma::verbs::CompletionStatus;
use gear_rdma::{InProcessFabric, RdmaConfig};

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// `n` ops of `len` bytes: op i reads remote offset `stride * i + 3` into
/// local offset `len * i`.
fn ops(n: usize, len: u64, stride: u64) -> Vec<ReadOp> {
    (0..n as u64).map(|i| ReadOp { remote_offset: stride * i + 3, local_offset: len * i, len }).collect()
}

#[test]
fn reads_land_byte_exact_in_chains_of_32_spread_over_queue_pairs() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 20);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    let local = buffer(200 * 256, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();

    let reads = ops(200, 256, 4000);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);

    let chains = fabric.posted_chains();
    // Queue pairs are posted to in no fixed order; the chains' sizes are.
    let mut sizes: Vec<usize> = chains.iter().map(|c| c.signaled.len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![8, 32, 32, 32, 32, 32, 32]);
    for c in &chains {
        let last = c.signaled.len() - 1;
        assert!(c.signaled[..last].iter().all(|s| !s), "only the last request is signalled");
        assert!(c.signaled[last]);
        assert_eq!(c.gid, gid(1));
    }
    let qps: HashSet<u32> = chains.iter().map(|c| c.qp_number).collect();
    assert_eq!(qps.len(), 4, "7 chains go round-robin over the 4 queue pairs");
    // The ticket is retired once reported.
    assert!(matches!(transport.poll(&ticket), Err(CoreError::InvalidHandle(_))));
}

#[test]
fn ops_longer_than_the_largest_read_are_split() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let config = RdmaConfig { max_read_bytes: 4096, ..RdmaConfig::default() };
    let transport = client(&fabric, config);
    let remote = connect(&transport, &shard);
    let local = buffer(1 << 16, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let reads = [ReadOp { remote_offset: 100, local_offset: 5, len: 10_000 }];
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    let chains = fabric.posted_chains();
    assert_eq!(chains.len(), 1);
    assert_eq!(chains[0].signaled, vec![false, false, true]);
}

#[test]
fn out_of_bounds_ops_are_refused_before_anything_is_posted() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 4096);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    let local = buffer(1024, |_| 0xee);
    let buffer = transport.register_local(local.clone()).unwrap();
    let good = ReadOp { remote_offset: 0, local_offset: 0, len: 8 };
    for bad in [
        ReadOp { remote_offset: 4090, local_offset: 0, len: 8 },
        ReadOp { remote_offset: 0, local_offset: 1020, len: 8 },
        ReadOp { remote_offset: u64::MAX, local_offset: 0, len: 2 },
    ] {
        let refused = transport.post_reads(&remote, &buffer, &[good, bad]);
        assert!(matches!(refused, Err(CoreError::Region(_))), "{refused:?}");
    }
    assert!(fabric.posted_chains().is_empty(), "nothing was posted");
    assert!(snapshot(&local).iter().all(|&b| b == 0xee), "no byte moved");
}

#[test]
fn a_remote_access_error_fails_exactly_that_op_and_the_rest_land_elsewhere() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 20);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    let first_qp = transport.live_queue_pairs(&remote)[0];
    transport.verbs().fail_read_after(first_qp, 5, CompletionStatus::RemoteAccessError).unwrap();
    let local = buffer(64 * 128, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let reads = ops(64, 128, 1000);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    match transport.wait(&ticket, deadline()) {
        Err(CoreError::RemoteRead { shard: 0, failed, total_ops: 64, reason }) => {
            assert_eq!(failed, vec![5], "only the op whose READ failed");
            assert!(reason.contains("RemoteAccessError"), "{reason}");
            check_landed(0, &local, &reads, &failed);
        }
        other => panic!("expected a remote read error, got {other:?}"),
    }
    assert!(!transport.live_queue_pairs(&remote).contains(&first_qp), "the errored queue pair is retired");
    assert_eq!(transport.live_queue_pairs(&remote).len(), 3);
    // The connection keeps working on the other queue pairs.
    let again = transport.post_reads(&remote, &buffer, &reads).unwrap();
    transport.wait(&again, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
}

#[test]
fn a_retry_exceeded_read_is_retried_on_another_queue_pair() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 20);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    let first_qp = transport.live_queue_pairs(&remote)[0];
    transport.verbs().fail_read_after(first_qp, 3, CompletionStatus::RetryExceeded).unwrap();
    let local = buffer(40 * 64, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let reads = ops(40, 64, 512);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    assert_eq!(transport.live_queue_pairs(&remote).len(), 3);
    assert!(transport.verbs().is_errored(first_qp).is_err(), "the failed queue pair was destroyed");
}

#[test]
fn retries_are_bounded_and_a_connection_without_queue_pairs_fails_its_reads() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let config = RdmaConfig { queue_pairs: 2, max_attempts: 2, ..RdmaConfig::default() };
    let transport = client(&fabric, config);
    let remote = connect(&transport, &shard);
    for qp in transport.live_queue_pairs(&remote) {
        transport.verbs().fail_read_after(qp, 0, CompletionStatus::RetryExceeded).unwrap();
    }
    let local = buffer(1024, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let one = [ReadOp { remote_offset: 0, local_offset: 0, len: 16 }];
    let ticket = transport.post_reads(&remote, &buffer, &one).unwrap();
    match transport.wait(&ticket, deadline()) {
        Err(CoreError::RemoteRead { failed, reason, .. }) => {
            assert_eq!(failed, vec![0]);
            assert!(reason.contains("RetryExceeded"), "two attempts, then reported: {reason}");
        }
        other => panic!("expected a remote read error, got {other:?}"),
    }
    assert!(transport.live_queue_pairs(&remote).is_empty());
    let after = transport.post_reads(&remote, &buffer, &one).unwrap();
    match transport.wait(&after, deadline()) {
        Err(CoreError::RemoteRead { reason, .. }) => assert!(reason.contains("no live queue pair"), "{reason}"),
        other => panic!("expected a remote read error, got {other:?}"),
    }
}

#[test]
fn a_partial_post_completes_with_the_rest_of_its_chain() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let config = RdmaConfig { queue_pairs: 1, ..RdmaConfig::default() };
    let transport = client(&fabric, config);
    let remote = connect(&transport, &shard);
    let qp = transport.live_queue_pairs(&remote)[0];
    transport.verbs().limit_next_post(qp, 10).unwrap();
    let local = buffer(32 * 32, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let reads = ops(32, 32, 100);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    let chains = fabric.posted_chains();
    assert_eq!(chains.len(), 2);
    assert_eq!(chains[0].signaled, vec![false; 10], "the posted prefix has no signalled request");
    assert_eq!(chains[1].signaled.len(), 22);
    assert_eq!(chains[1].signaled.last(), Some(&true));
}

#[test]
fn reads_to_two_shards_overlap_and_are_waited_together() {
    let fabric = InProcessFabric::new();
    let shard_a = Shard::new(&fabric, 1, 1 << 16);
    let shard_b = Shard::new(&fabric, 2, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let remote_a = connect(&transport, &shard_a);
    let remote_b = connect(&transport, &shard_b);
    // Shard A does not answer until released: its reads stay in flight
    // while B's complete, so posting to both before waiting overlaps them.
    for qp in transport.live_queue_pairs(&remote_a) {
        transport.verbs().hold(qp).unwrap();
    }
    let local_a = buffer(4096, |_| 0);
    let local_b = buffer(4096, |_| 0);
    let buffer_a = transport.register_local(local_a.clone()).unwrap();
    let buffer_b = transport.register_local(local_b.clone()).unwrap();
    let reads = ops(100, 40, 300);
    let tickets = [
        transport.post_reads(&remote_a, &buffer_a, &reads).unwrap(),
        transport.post_reads(&remote_b, &buffer_b, &reads).unwrap(),
    ];
    assert_eq!((tickets[0].shard(), tickets[1].shard()), (1, 2));
    assert!(!transport.poll(&tickets[0]).unwrap(), "shard A's reads are in flight");
    assert!(matches!(transport.release_local(&buffer_a), Err(CoreError::Busy(_))));
    for qp in transport.live_queue_pairs(&remote_a) {
        transport.verbs().release(qp).unwrap();
    }
    let outcomes = transport.wait_all(&tickets, deadline());
    assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
    check_landed(1, &local_a, &reads, &[]);
    check_landed(2, &local_b, &reads, &[]);
    transport.release_local(&buffer_a).unwrap();
    assert!(matches!(transport.release_local(&buffer_a), Err(CoreError::InvalidHandle(_))));
}

#[test]
fn a_wait_returns_at_its_deadline_and_the_ticket_stays_in_flight() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    for qp in transport.live_queue_pairs(&remote) {
        transport.verbs().hold(qp).unwrap();
    }
    let local = buffer(4096, |_| 0);
    let buffer = transport.register_local(local.clone()).unwrap();
    let reads = ops(8, 64, 100);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    let waited = transport.wait(&ticket, Instant::now() + Duration::from_millis(50));
    assert!(matches!(waited, Err(CoreError::Timeout(_))), "{waited:?}");
    assert!(!transport.poll(&ticket).unwrap(), "a timed-out ticket stays in flight");
    for qp in transport.live_queue_pairs(&remote) {
        transport.verbs().release(qp).unwrap();
    }
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
}

#[test]
fn disconnect_ends_reads_in_flight_with_an_error() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    for qp in transport.live_queue_pairs(&remote) {
        transport.verbs().hold(qp).unwrap();
    }
    let local = buffer(4096, |_| 0);
    let buffer = transport.register_local(local).unwrap();
    let ticket = transport.post_reads(&remote, &buffer, &ops(4, 16, 100)).unwrap();
    transport.disconnect(&remote).unwrap();
    assert!(matches!(transport.wait(&ticket, deadline()), Err(CoreError::RemoteRead { .. })));
    let refused = transport.post_reads(&remote, &buffer, &ops(1, 16, 100));
    assert!(matches!(refused, Err(CoreError::InvalidHandle(_))));
    transport.release_local(&buffer).unwrap();
}

#[test]
fn a_withdrawn_region_fails_reads_instead_of_hanging() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    shard.server.withdraw(&shard.exposed).unwrap();
    let local = buffer(4096, |_| 0);
    let buffer = transport.register_local(local).unwrap();
    let reads = ops(50, 16, 100);
    let ticket = transport.post_reads(&remote, &buffer, &reads).unwrap();
    match transport.wait(&ticket, deadline()) {
        Err(CoreError::RemoteRead { failed, total_ops: 50, .. }) => assert_eq!(failed.len(), 50),
        other => panic!("expected every read to fail, got {other:?}"),
    }
}

#[test]
fn descriptors_of_another_shard_or_transport_are_refused() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 3, 4096);
    let transport = client(&fabric, RdmaConfig::default());

    let pending = transport.prepare_connection(3).unwrap();
    let mut remote = shard.server.accept(&shard.exposed, &pending.endpoint).unwrap();
    remote.shard = 4;
    assert!(matches!(transport.connect(pending, &remote), Err(CoreError::Descriptor(_))));

    let pending = transport.prepare_connection(3).unwrap();
    let mut remote = shard.server.accept(&shard.exposed, &pending.endpoint).unwrap();
    remote.access = RemoteAccess::Tcp { peer: TcpEndpoint { address: "10.0.0.1:1".into() }, region_id: 1 };
    assert!(matches!(transport.connect(pending, &remote), Err(CoreError::Descriptor(_))));

    let pending = transport.prepare_connection(3).unwrap();
    let mut remote = shard.server.accept(&shard.exposed, &pending.endpoint).unwrap();
    if let RemoteAccess::Rdma { peer, .. } = &mut remote.access {
        peer.queue_pairs.pop();
    }
    assert!(matches!(transport.connect(pending, &remote), Err(CoreError::Descriptor(_))));

    // A server refuses a client endpoint that is not RDMA or not valid.
    let tcp = gear_core::PeerEndpoint::Tcp(TcpEndpoint { address: String::new() });
    assert!(matches!(shard.server.accept(&shard.exposed, &tcp), Err(CoreError::Descriptor(_))));
    let pending = transport.prepare_connection(3).unwrap();
    let gear_core::PeerEndpoint::Rdma(mut endpoint) = pending.endpoint.clone() else { panic!("rdma endpoint") };
    endpoint.queue_pairs.clear();
    let empty = gear_core::PeerEndpoint::Rdma(endpoint);
    assert!(matches!(shard.server.accept(&shard.exposed, &empty), Err(CoreError::Descriptor(_))));
}

#[test]
fn without_a_device_rdma_is_unavailable_not_a_crash() {
    // No machine of our CI has an RDMA device (or, without the `rdma`
    // feature, no backend): both must be a clear error.
    match gear_rdma::device_transport(None, 1, None, RdmaConfig::default()) {
        Err(CoreError::TransportUnavailable(why)) => assert!(why.contains("rdma"), "{why}"),
        Err(other) => panic!("expected unavailable, got {other}"),
        Ok(_) => eprintln!("skipped: this machine has an rdma device (run cargo xtask rdma-test)"),
    }
    match gear_rdma::device_server(None, 1, None, gear_rdma::RdmaServerConfig::default()) {
        Err(CoreError::TransportUnavailable(_)) => {}
        Err(other) => panic!("expected unavailable, got {other}"),
        Ok(_) => eprintln!("skipped: this machine has an rdma device"),
    }
}

#[test]
fn transports_are_usable_as_trait_objects() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 4096);
    let server: Box<dyn TransportServer> = Box::new(shard.server);
    let transport: Box<dyn Transport> = Box::new(client(&fabric, RdmaConfig::default()));
    let pending = transport.prepare_connection(0).unwrap();
    let remote = server.accept(&shard.exposed, &pending.endpoint).unwrap();
    let handle = transport.connect(pending, &remote).unwrap();
    let local = buffer(64, |_| 0);
    let buffer = transport.register_local(local.clone() as Arc<dyn gear_core::MemoryRegion>).unwrap();
    let reads = [ReadOp { remote_offset: 1000, local_offset: 0, len: 64 }];
    let ticket = transport.post_reads(&handle, &buffer, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    let empty = transport.post_reads(&handle, &buffer, &[]).unwrap();
    assert!(transport.poll(&empty).unwrap(), "an empty batch finishes at once");
}
