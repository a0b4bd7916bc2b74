//! The byte-range data plane over RDMA, end to end in one process: shard
//! servers in this process, each with gear-rdma's `RdmaServer` over its own
//! node of one `InProcessFabric`, and a `ClusterClient` with an
//! `RdmaTransport` over another node. Every connection descriptor goes
//! through the real `ConnectDataPlane` RPC, and the fabric checks every
//! field of it (GID, LID, MTU, queue pair numbers, PSNs, address, rkey), so
//! a field lost on the way fails the reads or the row checks. Bytes move by
//! `memcpy` out of the tables' memory: this is the RDMA logic, not RDMA
//! hardware.
//!
//! Every test runs under a deadline: a hang aborts the process.

#[allow(dead_code)] // each suite uses part of the shared helpers
mod common;

use common::{check_rows, insert, recycled_tables, recycling_writers, sample_through_churn, spec};
use gear_api::ReplayTable;
use gear_core::{Pad, TransportKind, WindowSpec};
use gear_net::{
    ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, DataPlane, RdmaSettings, ServerConfig, ServerHandle,
    StrategyInfo,
};
use gear_rdma::verbs::{CompletionStatus, PortAttributes};
use gear_rdma::{InProcessFabric, InProcessVerbs, RdmaConfig, RdmaServer, RdmaServerConfig, RdmaTransport};
use gear_sampler::{StrategyKind, StrategyParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "rdma-in-process-token-0123456789";

fn within(seconds: u64, body: impl FnOnce() + Send + 'static) {
    common::within("rdma_in_process", seconds, body);
}

/// The GID of node `n` (fe80::n).
fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = n;
    g
}

const CLIENT_NODE: u8 = 200;

/// InfiniBand-like ports: a LID each, GID index 3, and MTUs that differ
/// between the client (4096) and the shards (1024 and 2048), so LID, MTU
/// and PSNs all have to cross the control plane intact.
fn port(node: u8, mtu: u32) -> PortAttributes {
    PortAttributes {
        gid: gid(node),
        gid_index: 3,
        lid: 0x100 + u16::from(node),
        mtu,
        max_read_initiator: 16,
        max_read_responder: 16,
    }
}

/// Serves `tables`; shard `s` gets an in-process RDMA server when
/// `rdma[s]`, else none (and a device name no machine has, so it serves
/// TCP only even in a build with the `rdma` feature on a machine with a
/// device).
fn serve(fabric: &InProcessFabric, tables: &[ReplayTable], rdma: &[bool]) -> Vec<ServerHandle> {
    let configs: Vec<Option<RdmaServerConfig>> = rdma.iter().map(|&on| on.then(RdmaServerConfig::default)).collect();
    serve_configured(fabric, tables, &configs)
}

/// As [`serve`], shard `s`'s RDMA server with `configs[s]` (its bounds) or
/// none. Shard `s`'s node has GID `gid(s + 1)`.
fn serve_configured(
    fabric: &InProcessFabric,
    tables: &[ReplayTable],
    configs: &[Option<RdmaServerConfig>],
) -> Vec<ServerHandle> {
    tables
        .iter()
        .enumerate()
        .map(|(s, table)| {
            let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s as u32, TOKEN);
            let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
            if let Some(rdma) = configs[s] {
                let mtu = if s % 2 == 0 { 1024 } else { 2048 };
                let verbs = fabric.add_node_with(port(s as u8 + 1, mtu)).unwrap();
                let server = Box::new(RdmaServer::with_config(verbs, rdma).unwrap());
                ServerHandle::start_with_transport(table.clone(), &config, strategy, server).unwrap()
            } else {
                config.rdma =
                    RdmaSettings { device: Some("gear-test-no-such-device".into()), ..RdmaSettings::default() };
                ServerHandle::start(table.clone(), &config, strategy).unwrap()
            }
        })
        .collect()
}

/// A client reading over RDMA from its own fabric node, with `call_timeout`
/// on every call and read; also returns the node, to inject faults on.
fn client(
    fabric: &InProcessFabric,
    servers: &[ServerHandle],
    call_timeout: Duration,
) -> (ClusterClient, InProcessVerbs) {
    client_on(fabric, servers, call_timeout, CLIENT_NODE)
}

/// As [`client`], on the fabric node with GID `gid(node)`.
fn client_on(
    fabric: &InProcessFabric,
    servers: &[ServerHandle],
    call_timeout: Duration,
    node: u8,
) -> (ClusterClient, InProcessVerbs) {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.data_plane = DataPlane::Auto;
    config.seed = 11;
    config.call_timeout = call_timeout;
    let verbs = fabric.add_node_with(port(node, 4096)).unwrap();
    let transport = Box::new(RdmaTransport::new(verbs.clone(), RdmaConfig::default()).unwrap());
    (ClusterClient::with_transport(config, transport).unwrap(), verbs)
}

/// Three shards of 6 items each, all serving RDMA, and a client reading
/// over RDMA with `call_timeout`: the fabric, the servers (kept while the
/// test runs), the client and its node.
fn three_rdma_shards(call_timeout: Duration) -> (InProcessFabric, Vec<ServerHandle>, ClusterClient, InProcessVerbs) {
    let fabric = InProcessFabric::new();
    let servers = serve(&fabric, &tables(&[6, 6, 6]), &[true, true, true]);
    let (cluster, verbs) = client(&fabric, &servers, call_timeout);
    (fabric, servers, cluster, verbs)
}

/// The batch the fault tests sample (48 rows of the last 3 steps), after
/// one clean batch of it.
fn one_clean_batch(cluster: &ClusterClient) -> (WindowSpec, ClusterSample) {
    let window = WindowSpec::last(3);
    let request = ClusterSample { rows: 48, window, columns: vec![], random_start: false };
    check_layout(&cluster.sample(&request).unwrap(), window, 48);
    (window, request)
}

/// Tables of `sizes[s]` trajectories: shard s holds ids 10*s+1 ..= 10*s+n,
/// id i of (i % 10) steps (at most 6).
fn tables(sizes: &[u8]) -> Vec<ReplayTable> {
    sizes
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            let t = ReplayTable::builder(spec(6, 16)).seed(s as u64).build().unwrap();
            for i in 1..=n {
                insert(&t, 10 * s as u8 + i, u64::from(i));
            }
            t
        })
        .collect()
}

/// Rows checked as `check_rows` does, plus what only the fixed layout of
/// `tables` allows: the key's shard holds the id, and length and start
/// follow the window rule on the id's stored length.
fn check_layout(batch: &ClusterBatch, window: WindowSpec, rows: usize) {
    let ids = check_rows(batch, window, rows);
    for (r, id) in ids.into_iter().enumerate() {
        let Some(id) = id else {
            assert_eq!(batch.lengths[r], 0);
            continue;
        };
        let stored = (id % 10) as u64;
        assert_eq!(batch.keys[r].shard as i64, id / 10, "row {r}: id {id} from shard {}", batch.keys[r].shard);
        assert_eq!(batch.lengths[r], window.resolve(stored).steps, "row {r}");
        assert_eq!(batch.starts[r], window.resolve(stored).src_step, "row {r}");
    }
}

fn shards_of(batch: &ClusterBatch) -> Vec<u32> {
    let mut shards: Vec<u32> = batch.keys.iter().map(|k| k.shard).collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

#[test]
fn auto_reads_every_row_over_in_process_rdma() {
    within(60, || {
        let (fabric, _servers, cluster, verbs) = three_rdma_shards(Duration::from_secs(10));
        let first = ClusterSample { rows: 64, window: WindowSpec::last(4), columns: vec![], random_start: false };
        assert_eq!(cluster.data_plane_for(&first).unwrap(), Some(TransportKind::Rdma));
        for window in [WindowSpec::last(4), WindowSpec::first(3), WindowSpec { offset: 1, len: 5, pad: Pad::Tail }] {
            let batch =
                cluster.sample(&ClusterSample { rows: 64, window, columns: vec![], random_start: false }).unwrap();
            assert!(batch.lost.is_empty(), "{:?}", batch.lost);
            check_layout(&batch, window, 64);
            assert_eq!(shards_of(&batch), vec![0, 1, 2]);
            // Uniform over 18 items: every row's global probability.
            for p in &batch.probabilities {
                assert!((p - 1.0 / 18.0).abs() < 1e-12, "probability {p}");
            }
        }
        assert_eq!(cluster.data_plane_kind(), Some(TransportKind::Rdma));
        // The windows really crossed the fabric, from the client's node, on
        // queue pairs connected to every shard.
        let chains = fabric.posted_chains();
        assert!(!chains.is_empty() && chains.iter().all(|c| c.gid == gid(CLIENT_NODE)));
        for s in 0..3u8 {
            assert!(!verbs.queue_pairs_to(gid(s + 1)).is_empty(), "no queue pair to shard {s}");
        }
        // A subset of columns.
        let request =
            ClusterSample { rows: 8, window: WindowSpec::last(2), columns: vec!["id".into()], random_start: false };
        let batch = cluster.sample(&request).unwrap();
        assert_eq!(batch.columns.len(), 1);
        assert_eq!(batch.columns[0].len(), 8 * 2 * 8);
    });
}

#[test]
fn rows_overwritten_during_rdma_reads_are_never_returned_torn() {
    within(90, || {
        let fabric = InProcessFabric::new();
        let tables = recycled_tables();
        let servers = serve(&fabric, &tables, &[true, true]);
        let stop = Arc::new(AtomicBool::new(false));
        let writers = recycling_writers(&tables, &stop);
        let (cluster, _verbs) = client(&fabric, &servers, Duration::from_secs(10));
        let window = WindowSpec::last(4);
        let request = ClusterSample { rows: 32, window, columns: vec![], random_start: false };
        let (done, refused) = sample_through_churn(&cluster, &request, |batch| {
            assert!(batch.lost.is_empty(), "{:?}", batch.lost);
            for (r, id) in check_rows(batch, window, 32).into_iter().enumerate() {
                let id = id.expect("every window of 4 holds 4 steps");
                assert_eq!(i64::from(batch.keys[r].shard), id / 100, "row {r}: id {id}");
            }
        });
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(cluster.data_plane_kind(), Some(TransportKind::Rdma));
        assert!(done > 10, "only {done} batches ({refused} refused)");
    });
}

#[test]
fn a_failed_rdma_read_reports_the_shard_lost_and_it_rejoins() {
    within(60, || {
        let (_fabric, _servers, cluster, verbs) = three_rdma_shards(Duration::from_secs(10));
        let (window, request) = one_clean_batch(&cluster);
        // Every queue pair to shard 1 fails its next READ with a remote
        // access error (not retried).
        let to_shard_1 = verbs.queue_pairs_to(gid(2));
        assert!(!to_shard_1.is_empty());
        for qp in to_shard_1 {
            verbs.fail_read_after(qp, 0, CompletionStatus::RemoteAccessError).unwrap();
        }
        let batch = cluster.sample(&request).unwrap();
        let lost: Vec<_> = batch.lost.iter().map(|l| l.shard).collect();
        assert_eq!(lost, vec![1], "{:?}", batch.lost);
        assert!(batch.lost[0].reason.contains("reads failed"), "{:?}", batch.lost);
        check_layout(&batch, window, 48);
        assert_eq!(shards_of(&batch), vec![0, 2]);
        // The next batch connects to shard 1 again.
        let batch = cluster.sample(&request).unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        assert_eq!(batch.rejoined, vec![1]);
        check_layout(&batch, window, 48);
        assert_eq!(shards_of(&batch), vec![0, 1, 2]);
    });
}

#[test]
fn a_shard_whose_reads_hang_hits_the_deadline_and_is_reported() {
    within(60, || {
        let (_fabric, _servers, cluster, verbs) = three_rdma_shards(Duration::from_secs(2));
        let (window, request) = one_clean_batch(&cluster);
        // Shard 2 stops answering READs: they wait until the call deadline.
        for qp in verbs.queue_pairs_to(gid(3)) {
            verbs.hold(qp).unwrap();
        }
        let batch = cluster.sample(&request).unwrap();
        let lost: Vec<_> = batch.lost.iter().map(|l| l.shard).collect();
        assert_eq!(lost, vec![2], "{:?}", batch.lost);
        check_layout(&batch, window, 48);
        assert_eq!(shards_of(&batch), vec![0, 1]);
        // The held connection was ended; a new one reads again.
        let batch = cluster.sample(&request).unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        check_layout(&batch, window, 48);
        assert_eq!(shards_of(&batch), vec![0, 1, 2]);
    });
}

#[test]
fn a_shard_without_rdma_is_gathered_not_lost() {
    within(60, || {
        let fabric = InProcessFabric::new();
        // 4 + 5 + 6 items: a uniform row has probability 1/15 whichever
        // shard it comes from, gathered or read.
        let tables = tables(&[4, 5, 6]);
        let servers = serve(&fabric, &tables, &[true, false, true]);
        let (cluster, verbs) = client(&fabric, &servers, Duration::from_secs(10));
        let window = WindowSpec::last(4);
        let request = ClusterSample { rows: 48, window, columns: vec![], random_start: false };
        assert_eq!(cluster.data_plane_for(&request).unwrap(), Some(TransportKind::Rdma));
        let mut from_shard_1 = 0u64;
        let mut wasted = None;
        for round in 0..6 {
            let batch = cluster.sample(&request).unwrap();
            assert!(batch.lost.is_empty(), "round {round}: {:?}", batch.lost);
            check_layout(&batch, window, 48);
            assert_eq!(shards_of(&batch), vec![0, 1, 2], "round {round}");
            for (p, w) in batch.probabilities.iter().zip(&batch.weights) {
                assert!((p - 1.0 / 15.0).abs() < 1e-12, "round {round}: probability {p}");
                assert_eq!(*w, 1.0);
            }
            from_shard_1 += batch.keys.iter().filter(|k| k.shard == 1).count() as u64;
            // Shard 1 counts every row it drew: those returned, plus the
            // one ranged draw of the first batch that it could not serve.
            let drawn = tables[1].info().unwrap().samples;
            match wasted {
                None => wasted = Some(drawn - from_shard_1),
                Some(w) => assert_eq!(drawn - from_shard_1, w, "round {round}: shard 1 was asked for ranges again"),
            }
        }
        assert!(wasted.unwrap() > 0, "the first batch asked shard 1 for ranges once");
        assert!(verbs.queue_pairs_to(gid(2)).is_empty(), "no queue pair to the shard without rdma");
        assert!(!verbs.queue_pairs_to(gid(1)).is_empty() && !verbs.queue_pairs_to(gid(3)).is_empty());
    });
}

/// The queue pairs the node of shard `s` holds.
fn shard_queue_pairs(fabric: &InProcessFabric, s: u8) -> usize {
    fabric.node(gid(s + 1)).expect("the shard's node").queue_pair_count()
}

#[test]
fn a_client_that_reconnects_after_every_failure_holds_one_connection_per_shard() {
    within(60, || {
        let (fabric, _servers, cluster, verbs) = three_rdma_shards(Duration::from_secs(10));
        let (window, request) = one_clean_batch(&cluster);
        for round in 0..8 {
            // Shard 1's reads fail: it is left out of this batch, the
            // connection ended, and the next batch connects again.
            for qp in verbs.queue_pairs_to(gid(2)) {
                verbs.fail_read_after(qp, 0, CompletionStatus::RemoteAccessError).unwrap();
            }
            let batch = cluster.sample(&request).unwrap();
            assert_eq!(batch.lost.iter().map(|l| l.shard).collect::<Vec<_>>(), vec![1], "round {round}");
            let batch = cluster.sample(&request).unwrap();
            assert!(batch.lost.is_empty(), "round {round}: {:?}", batch.lost);
            check_layout(&batch, window, 48);
            // The shard replaced the client's connection each time: still
            // 4 queue pairs, not 4 more per reconnect.
            assert_eq!(shard_queue_pairs(&fabric, 1), 4, "round {round}");
            // The client's retired queue pairs drain and go; at most one
            // connection's worth is still draining.
            assert!(verbs.queue_pair_count() <= 3 * 4 + 4, "round {round}: {}", verbs.queue_pair_count());
        }
        assert_eq!((shard_queue_pairs(&fabric, 0), shard_queue_pairs(&fabric, 2)), (4, 4));
    });
}

#[test]
fn a_shard_that_refuses_the_connect_is_gathered_and_the_queue_pairs_are_freed() {
    within(60, || {
        let fabric = InProcessFabric::new();
        // 4 + 5 + 6 items, uniform: probability 1/15 for every row.
        let tables = tables(&[4, 5, 6]);
        // Shard 1 has room for 2 queue pairs, and a client brings 4: every
        // accept is refused (RESOURCE_EXHAUSTED), a state of the shard, not
        // a bad request, so the batch gathers that shard's rows.
        let full = RdmaServerConfig { max_queue_pairs: 2, ..RdmaServerConfig::default() };
        let configs = [Some(RdmaServerConfig::default()), Some(full), Some(RdmaServerConfig::default())];
        let servers = serve_configured(&fabric, &tables, &configs);
        let (cluster, verbs) = client(&fabric, &servers, Duration::from_secs(10));
        let window = WindowSpec::last(4);
        let request = ClusterSample { rows: 48, window, columns: vec![], random_start: false };
        for round in 0..4 {
            let batch = cluster.sample(&request).unwrap();
            assert!(batch.lost.is_empty(), "round {round}: {:?}", batch.lost);
            check_layout(&batch, window, 48);
            assert_eq!(shards_of(&batch), vec![0, 1, 2], "round {round}");
            for p in &batch.probabilities {
                assert!((p - 1.0 / 15.0).abs() < 1e-12, "round {round}: probability {p}");
            }
            // The queue pairs prepared for shard 1 were aborted: only the
            // two connected shards' remain on the client's node.
            assert_eq!(verbs.queue_pair_count(), 8, "round {round}");
            assert_eq!(shard_queue_pairs(&fabric, 1), 0);
        }
        assert_eq!(cluster.data_plane_kind(), Some(TransportKind::Rdma));
    });
}

#[test]
fn a_batch_buffer_that_cannot_be_pinned_is_gathered_by_the_shards() {
    within(60, || {
        let (fabric, _servers, cluster, verbs) = three_rdma_shards(Duration::from_secs(10));
        // As under a low RLIMIT_MEMLOCK: 16 KiB may be registered. A batch
        // of 48 rows of 4 steps needs 6.4 KiB, one of 256 rows 34 KiB.
        verbs.set_memlock_limit(Some(16 << 10));
        let window = WindowSpec::last(4);
        let large = ClusterSample { rows: 256, window, columns: vec![], random_start: false };
        for round in 0..3 {
            let batch = cluster.sample(&large).unwrap();
            assert!(batch.lost.is_empty(), "round {round}: {:?}", batch.lost);
            check_layout(&batch, window, 256);
            assert_eq!(shards_of(&batch), vec![0, 1, 2]);
        }
        assert_eq!(cluster.data_plane_for(&large).unwrap(), None, "the shards gather what cannot be pinned");
        // A batch whose buffer fits is read over RDMA.
        let small = ClusterSample { rows: 48, window, columns: vec![], random_start: false };
        assert_eq!(cluster.data_plane_for(&small).unwrap(), Some(TransportKind::Rdma));
        fabric.clear_posted_chains();
        let batch = cluster.sample(&small).unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        check_layout(&batch, window, 48);
        assert!(!fabric.posted_chains().is_empty(), "the small batch crossed the fabric");
    });
}

#[test]
fn sampling_keeps_a_connection_alive_and_an_idle_one_makes_room() {
    within(60, || {
        let fabric = InProcessFabric::new();
        let tables = tables(&[6, 6]);
        // Shard 0 has room for two clients; a connection idle for 300 ms
        // may be reaped for a third.
        let idle = Duration::from_millis(300);
        let bounded = RdmaServerConfig { max_queue_pairs: 8, idle_timeout: idle, ..RdmaServerConfig::default() };
        let servers = serve_configured(&fabric, &tables, &[Some(bounded), Some(RdmaServerConfig::default())]);
        let (a, _) = client_on(&fabric, &servers, Duration::from_secs(10), 201);
        let (b, _) = client_on(&fabric, &servers, Duration::from_secs(10), 202);
        let (c, _) = client_on(&fabric, &servers, Duration::from_secs(10), 203);
        let window = WindowSpec::last(3);
        let request = ClusterSample { rows: 24, window, columns: vec![], random_start: false };
        let clean = |who: &str, cluster: &ClusterClient| {
            let batch = cluster.sample(&request).unwrap();
            assert!(batch.lost.is_empty(), "{who}: {:?}", batch.lost);
            check_layout(&batch, window, 24);
            assert_eq!(shards_of(&batch), vec![0, 1], "{who}");
        };
        clean("a", &a);
        clean("b", &b);
        assert_eq!(shard_queue_pairs(&fabric, 0), 8, "shard 0 is full");
        // A and B idle past the timeout; A samples again, which tells shard
        // 0 its connection is in use; then C connects and B's idle
        // connection is reaped for it, not A's.
        std::thread::sleep(idle + Duration::from_millis(150));
        clean("a", &a);
        clean("c", &c);
        clean("a", &a);
        assert_eq!(shard_queue_pairs(&fabric, 0), 8);
        // B's reads now fail once (its connection is gone); it connects
        // again, finds shard 0 full of connections in use, and gathers.
        let batch = b.sample(&request).unwrap();
        assert_eq!(batch.lost.iter().map(|l| l.shard).collect::<Vec<_>>(), vec![0], "{:?}", batch.lost);
        clean("b", &b);
        clean("b", &b);
    });
}
