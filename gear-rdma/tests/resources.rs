//! What the transport holds on both sides and the limits it must respect,
//! against the in-process verbs: bounded queue pairs on the server (one
//! connection per client session, per-client and total bounds, idle
//! connections reaped), aborted connections freed, completion-queue room
//! kept until a retired queue pair drained, outstanding reads negotiated
//! with the responder, traffic class and service level on every queue
//! pair, and locked-memory limits on registration.

mod common;

use std::time::{Duration, Instant};

use common::{buffer, check_landed, client, connect, gid, pattern, snapshot, Shard};
use gear_core::{Error as CoreError, PeerEndpoint, ReadOp, RemoteHandle, Transport, TransportServer};
use gear_rdma::verbs::{CompletionStatus, PortAttributes};
use gear_rdma::{InProcessFabric, InProcessVerbs, RdmaConfig, RdmaServer, RdmaServerConfig, RdmaTransport};

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// Reads 64 bytes at offset 100 of shard `shard`'s region through
/// `remote`; `Ok` only if they landed and are the shard's.
fn read_once(transport: &RdmaTransport<InProcessVerbs>, remote: &RemoteHandle, shard: u32) -> gear_core::Result<()> {
    let local = buffer(64, |_| 0);
    let registered = transport.register_local(local.clone())?;
    let ticket =
        transport.post_reads(remote, &registered, &[ReadOp { remote_offset: 100, local_offset: 0, len: 64 }])?;
    let outcome = transport.wait(&ticket, deadline());
    transport.release_local(&registered)?;
    outcome?;
    let want: Vec<u8> = (100..164).map(|i| pattern(shard, i)).collect();
    assert_eq!(snapshot(&local), want, "the bytes landed are the shard's");
    Ok(())
}

fn server_with(fabric: &InProcessFabric, n: u8, config: RdmaServerConfig) -> Shard {
    let server = RdmaServer::with_config(fabric.add_node(gid(100 + n)).unwrap(), config).unwrap();
    let region = buffer(1 << 16, |i| pattern(u32::from(n), i));
    let exposed = server.expose(u32::from(n), 7, region.clone()).unwrap();
    Shard { server, region, exposed }
}

#[test]
fn a_client_that_connects_again_replaces_its_connection_on_the_server() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let mut handles = Vec::new();
    for _ in 0..5 {
        handles.push(connect(&transport, &shard));
        // A client reconnects after a failure: the shard keeps one
        // connection of 4 queue pairs for it, not one more per connect.
        assert_eq!(shard.server.queue_pair_count(), 4);
        assert_eq!(shard.server.connection_count(), 1);
        assert_eq!(shard.server.verbs().queue_pair_count(), 4, "the replaced queue pairs were destroyed");
    }
    let latest = handles.pop().unwrap();
    read_once(&transport, &latest, 0).unwrap();
    // An earlier connection's queue pairs are gone on the server: its
    // reads fail (retried on every queue pair, then reported).
    let replaced = handles.pop().unwrap();
    assert!(matches!(read_once(&transport, &replaced, 0), Err(CoreError::RemoteRead { .. })));
    // Another client of the same host (same GID, another session) gets a
    // connection of its own.
    let pending = transport.prepare_connection(0).unwrap();
    let PeerEndpoint::Rdma(mut endpoint) = pending.endpoint.clone() else { panic!("an rdma endpoint") };
    endpoint.session ^= 1;
    shard.server.accept(&shard.exposed, &PeerEndpoint::Rdma(endpoint)).unwrap();
    transport.abort(pending).unwrap();
    assert_eq!((shard.server.connection_count(), shard.server.queue_pair_count()), (2, 8));
}

#[test]
fn queue_pairs_are_bounded_per_client_host_and_in_total() {
    let fabric = InProcessFabric::new();
    let config = RdmaServerConfig { max_queue_pairs: 12, max_queue_pairs_per_client: 8, ..RdmaServerConfig::default() };
    let shard = server_with(&fabric, 0, config);
    let transport = client(&fabric, RdmaConfig::default());
    let endpoint_with_session = |session: u64| {
        let pending = transport.prepare_connection(0).unwrap();
        let PeerEndpoint::Rdma(mut endpoint) = pending.endpoint.clone() else { panic!("an rdma endpoint") };
        transport.abort(pending).unwrap();
        endpoint.session = session;
        PeerEndpoint::Rdma(endpoint)
    };
    shard.server.accept(&shard.exposed, &endpoint_with_session(1)).unwrap();
    shard.server.accept(&shard.exposed, &endpoint_with_session(2)).unwrap();
    // A third session of the same host passes its bound of 8 (none idle).
    match shard.server.accept(&shard.exposed, &endpoint_with_session(3)) {
        Err(CoreError::Exhausted(why)) => assert!(why.contains("at most 8 per client"), "{why}"),
        other => panic!("expected the per-client bound, got {other:?}"),
    }
    assert_eq!(shard.server.queue_pair_count(), 8, "a refused accept holds nothing");
    // Another host fits once, then the total bound of 12 refuses.
    let other = RdmaTransport::new(fabric.add_node(gid(2)).unwrap(), RdmaConfig::default()).unwrap();
    let first = connect(&other, &shard);
    read_once(&other, &first, 0).unwrap();
    let third = RdmaTransport::new(fabric.add_node(gid(3)).unwrap(), RdmaConfig::default()).unwrap();
    let pending = third.prepare_connection(0).unwrap();
    match shard.server.accept(&shard.exposed, &pending.endpoint) {
        Err(CoreError::Exhausted(why)) => assert!(why.contains("bound of 12"), "{why}"),
        other => panic!("expected the total bound, got {other:?}"),
    }
    third.abort(pending).unwrap();
    assert_eq!(shard.server.verbs().queue_pair_count(), 12);
}

#[test]
fn an_accept_that_needs_room_reaps_the_connections_idle_longest() {
    let fabric = InProcessFabric::new();
    let idle = Duration::from_millis(300);
    let config = RdmaServerConfig {
        max_queue_pairs: 8,
        max_queue_pairs_per_client: 8,
        idle_timeout: idle,
        ..RdmaServerConfig::default()
    };
    let shard = server_with(&fabric, 0, config);
    let a = client(&fabric, RdmaConfig::default());
    let b = RdmaTransport::new(fabric.add_node(gid(2)).unwrap(), RdmaConfig::default()).unwrap();
    let c = RdmaTransport::new(fabric.add_node(gid(3)).unwrap(), RdmaConfig::default()).unwrap();
    let to_a = connect(&a, &shard);
    let to_b = connect(&b, &shard);
    // Full, and nobody idle yet: refused.
    let pending = c.prepare_connection(0).unwrap();
    assert!(matches!(shard.server.accept(&shard.exposed, &pending.endpoint), Err(CoreError::Exhausted(_))));
    c.abort(pending).unwrap();
    // Both become idle; A samples again (the control plane keeps it alive)
    // just before C connects, so B, idle longest, is reaped for C.
    std::thread::sleep(idle + Duration::from_millis(100));
    shard.server.keep_alive(&shard.exposed, a.session());
    let to_c = connect(&c, &shard);
    assert_eq!(shard.server.queue_pair_count(), 8);
    read_once(&a, &to_a, 0).unwrap();
    read_once(&c, &to_c, 0).unwrap();
    assert!(matches!(read_once(&b, &to_b, 0), Err(CoreError::RemoteRead { .. })), "b's connection was reaped");
}

#[test]
fn an_aborted_connection_frees_its_queue_pairs() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 4096);
    let transport = client(&fabric, RdmaConfig::default());
    for _ in 0..10 {
        // The shard refused, or the control plane failed: no answer to
        // connect with.
        let pending = transport.prepare_connection(0).unwrap();
        assert_eq!(transport.queue_pair_count(), 4);
        let again = gear_core::PendingConnection { id: pending.id, endpoint: pending.endpoint.clone() };
        transport.abort(pending).unwrap();
        assert_eq!(transport.queue_pair_count(), 0);
        assert_eq!(transport.verbs().queue_pair_count(), 0, "the device's queue pairs were destroyed");
        assert!(matches!(transport.abort(again), Err(CoreError::InvalidHandle(_))));
    }
    // A connect that fails frees them as well.
    let pending = transport.prepare_connection(0).unwrap();
    let mut remote = shard.server.accept(&shard.exposed, &pending.endpoint).unwrap();
    remote.shard = 9;
    assert!(matches!(transport.connect(pending, &remote), Err(CoreError::Descriptor(_))));
    assert_eq!(transport.verbs().queue_pair_count(), 0);
    // A connection that cannot fit the completion queue is refused before
    // any queue pair is made.
    let small = RdmaConfig { completion_queue_entries: 256, send_queue_depth: 64, ..RdmaConfig::default() };
    let tight = RdmaTransport::new(fabric.add_node(gid(9)).unwrap(), small).unwrap();
    let mut kept = Vec::new();
    let refused = loop {
        match tight.prepare_connection(0) {
            Ok(p) => kept.push(p),
            Err(e) => break e,
        }
    };
    assert!(matches!(&refused, CoreError::Exhausted(why) if why.contains("completion queue")), "{refused}");
    assert_eq!(tight.queue_pair_count(), kept.len() * 4);
    assert!(kept.len() * 4 + 4 + 32 > 256 && kept.len() * 4 + 32 <= 256);
}

#[test]
fn a_retired_queue_pair_keeps_its_completion_room_until_its_flushes_are_polled() {
    // Every READ signalled (chains of 1), so completions match requests
    // one to one, and the completion queue holds just two queue pairs'
    // worth. One queue pair fails its first READ: its 31 other requests
    // are flushed, and those completions arrive a poll after the error.
    // Releasing their room at the error lets the other queue pairs post
    // into it, and the flushes then overrun the completion queue.
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 20);
    let config = RdmaConfig {
        queue_pairs: 3,
        chain_len: 1,
        send_queue_depth: 32,
        completion_queue_entries: 64,
        ..RdmaConfig::default()
    };
    let transport = client(&fabric, config);
    let remote = connect(&transport, &shard);
    let failing = transport.live_queue_pairs(&remote)[0];
    transport.verbs().fail_read_after(failing, 0, CompletionStatus::RetryExceeded).unwrap();
    let n = 3 * 64;
    let local = buffer(n * 16, |_| 0);
    let registered = transport.register_local(local.clone()).unwrap();
    let reads: Vec<ReadOp> =
        (0..n as u64).map(|i| ReadOp { remote_offset: 1000 * i + 5, local_offset: 16 * i, len: 16 }).collect();
    let ticket = transport.post_reads(&remote, &registered, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    assert!(!transport.live_queue_pairs(&remote).contains(&failing));
    assert_eq!(transport.live_queue_pairs(&remote).len(), 2);
    assert_eq!(transport.draining_queue_pairs(), 0, "the retired queue pair drained");
    assert_eq!(transport.queue_pair_count(), 2, "and was destroyed once drained");
    assert!(transport.verbs().is_errored(failing).is_err(), "gone from the device");
}

#[test]
fn outstanding_reads_are_negotiated_down_to_the_responders_limit() {
    // The shard's NIC serves 4 READs per queue pair, the client's issues
    // 16: a chain of 32 READs then has 16 in flight at the shard, which
    // refuses the fifth (REM_INV_REQ) unless the client keeps to 4.
    let port = |n: u8, responder: u8| PortAttributes {
        gid: gid(n),
        gid_index: 3,
        lid: 0,
        mtu: 4096,
        max_read_initiator: 16,
        max_read_responder: responder,
    };
    let fabric = InProcessFabric::new();
    let server = RdmaServer::new(fabric.add_node_with(port(2, 4)).unwrap()).unwrap();
    let region = buffer(1 << 16, |i| pattern(0, i));
    let exposed = server.expose(0, 1, region).unwrap();
    let config = RdmaConfig { queue_pairs: 1, max_attempts: 1, ..RdmaConfig::default() };
    let transport = RdmaTransport::new(fabric.add_node_with(port(1, 16)).unwrap(), config).unwrap();
    let pending = transport.prepare_connection(0).unwrap();
    let remote = server.accept(&exposed, &pending.endpoint).unwrap();
    if let gear_core::RemoteAccess::Rdma { peer, .. } = &remote.access {
        assert_eq!((peer.max_read_initiator, peer.max_read_responder), (16, 4), "the descriptor carries the limits");
    }
    let handle = transport.connect(pending, &remote).unwrap();
    let local = buffer(32 * 64, |_| 0);
    let registered = transport.register_local(local.clone()).unwrap();
    let reads: Vec<ReadOp> =
        (0..32u64).map(|i| ReadOp { remote_offset: 300 * i, local_offset: 64 * i, len: 64 }).collect();
    let ticket = transport.post_reads(&handle, &registered, &reads).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    check_landed(0, &local, &reads, &[]);
    let qp = transport.live_queue_pairs(&handle)[0];
    let attrs = transport.verbs().connect_attributes(qp).unwrap().unwrap();
    assert_eq!((attrs.max_rd_atomic, attrs.max_dest_rd_atomic), (4, 16));
}

#[test]
fn traffic_class_and_service_level_reach_every_queue_pair() {
    let fabric = InProcessFabric::new();
    let server_config = RdmaServerConfig { traffic_class: 106, service_level: 3, ..RdmaServerConfig::default() };
    let shard = server_with(&fabric, 0, server_config);
    let config = RdmaConfig { traffic_class: 104, service_level: 5, ..RdmaConfig::default() };
    let transport = client(&fabric, config);
    let remote = connect(&transport, &shard);
    for qp in transport.live_queue_pairs(&remote) {
        let attrs = transport.verbs().connect_attributes(qp).unwrap().unwrap();
        assert_eq!((attrs.traffic_class, attrs.service_level), (104, 5));
    }
    for qp in shard.server.verbs().queue_pairs_to(gid(1)) {
        let attrs = shard.server.verbs().connect_attributes(qp).unwrap().unwrap();
        assert_eq!((attrs.traffic_class, attrs.service_level), (106, 3));
    }
    read_once(&transport, &remote, 0).unwrap();
    // A service level is 4 bits.
    let refused = RdmaTransport::new(fabric.add_node(gid(7)).unwrap(), RdmaConfig { service_level: 16, ..config });
    assert!(refused.is_err_and(|e| e.to_string().contains("service level 16")));
    let refused = RdmaServer::with_config(
        fabric.add_node(gid(8)).unwrap(),
        RdmaServerConfig { service_level: 200, ..server_config },
    );
    assert!(refused.is_err_and(|e| e.to_string().contains("service level 200")));
}

#[test]
fn registrations_beyond_the_locked_memory_limit_fail_like_the_device() {
    let fabric = InProcessFabric::new();
    let shard = Shard::new(&fabric, 0, 1 << 16);
    let transport = client(&fabric, RdmaConfig::default());
    let remote = connect(&transport, &shard);
    transport.verbs().set_memlock_limit(Some(64 << 10));
    let small = transport.register_local(buffer(48 << 10, |_| 0)).unwrap();
    match transport.register_local(buffer(32 << 10, |_| 0)) {
        Err(CoreError::Transport(why)) => {
            assert!(why.contains("ibv_reg_mr") && why.contains("RLIMIT_MEMLOCK"), "{why}")
        }
        other => panic!("expected a registration failure, got {other:?}"),
    }
    // Releasing gives the locked bytes back.
    transport.release_local(&small).unwrap();
    let larger = buffer(60 << 10, |_| 0);
    let registered = transport.register_local(larger.clone()).unwrap();
    let ticket =
        transport.post_reads(&remote, &registered, &[ReadOp { remote_offset: 0, local_offset: 0, len: 4096 }]).unwrap();
    transport.wait(&ticket, deadline()).unwrap();
    assert_eq!(snapshot(&larger)[..4096], snapshot(&shard.region)[..4096]);
    // Lifting the limit lets the larger registration through.
    assert!(transport.register_local(buffer(8 << 10, |_| 0)).is_err());
    transport.verbs().set_memlock_limit(None);
    transport.register_local(buffer(8 << 10, |_| 0)).unwrap();
}
