//! Sampling through the byte-range data plane (TCP on loopback): shard
//! servers in this process, every row's bytes checked, and writers
//! overwriting slots while the client reads them.

#[allow(dead_code)] // each suite uses part of the shared helpers
mod common;

use common::{check_rows, insert, recycled_tables, recycling_writers, sample_through_churn, spec};
use gear_api::ReplayTable;
use gear_core::{Pad, WindowSpec};
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, DataPlane, ServerHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const TOKEN: &str = "data-plane-token-0123456789";

fn serve(tables: &[ReplayTable]) -> Vec<ServerHandle> {
    common::serve_uniform(tables, TOKEN)
}

fn client(servers: &[ServerHandle], plane: DataPlane) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.data_plane = plane;
    config.seed = 7;
    ClusterClient::new(config).unwrap()
}

#[test]
fn byte_range_sampling_over_tcp_reads_every_row_exactly() {
    // Shard s holds ids 10*s+1 ..= 10*s+6, of 1 to 6 steps.
    let tables: Vec<ReplayTable> = (0..3u8)
        .map(|s| {
            let t = ReplayTable::builder(spec(6, 16)).seed(u64::from(s)).build().unwrap();
            for i in 1..=6u8 {
                insert(&t, 10 * s + i, u64::from(i));
            }
            t
        })
        .collect();
    let servers = serve(&tables);
    let cluster = client(&servers, DataPlane::ByteRangeTcp);
    let gather = client(&servers, DataPlane::ShardGather);
    for window in [WindowSpec::last(4), WindowSpec::first(3), WindowSpec { offset: 1, len: 5, pad: Pad::Tail }] {
        let request = ClusterSample { rows: 64, window, columns: vec![], random_start: false };
        let batch = cluster.sample(&request).unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        check_rows(&batch, window, 64);
        let reference = gather.sample(&request).unwrap();
        check_rows(&reference, window, 64);
        // Start and length agree with the window rule on each row's id.
        for r in 0..64 {
            let l = window.len as usize;
            if batch.lengths[r] == 0 {
                continue;
            }
            let ids = &batch.columns[1][r * l * 8..(r + 1) * l * 8];
            let dst = if window.pad == Pad::Head { l - batch.lengths[r] as usize } else { 0 };
            let id = i64::from_le_bytes(ids[dst * 8..dst * 8 + 8].try_into().unwrap());
            let stored = (id % 10) as u64;
            assert_eq!(batch.lengths[r], window.resolve(stored).steps);
            assert_eq!(batch.starts[r], window.resolve(stored).src_step);
            assert_eq!(batch.keys[r].shard as i64, id / 10);
        }
    }
    assert_eq!(cluster.data_plane_kind(), Some(gear_core::TransportKind::Tcp));
    // A subset of columns, in another order.
    let request =
        ClusterSample { rows: 8, window: WindowSpec::last(2), columns: vec!["id".into()], random_start: false };
    let batch = cluster.sample(&request).unwrap();
    assert_eq!(batch.columns.len(), 1);
    assert_eq!(batch.columns[0].len(), 8 * 2 * 8);
}

#[test]
fn rows_overwritten_during_reads_are_never_returned_torn() {
    let tables = recycled_tables();
    let servers = serve(&tables);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = recycling_writers(&tables, &stop);
    let cluster = client(&servers, DataPlane::ByteRangeTcp);
    let window = WindowSpec::last(4);
    let request = ClusterSample { rows: 32, window, columns: vec![], random_start: false };
    let (done, refused) = sample_through_churn(&cluster, &request, |batch| {
        check_rows(batch, window, 32);
    });
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert!(done > 10, "only {done} batches ({refused} refused)");
}

#[test]
fn auto_selection_samples_without_rdma() {
    let tables: Vec<ReplayTable> = (0..2u8)
        .map(|s| {
            let t = ReplayTable::builder(spec(3, 8)).build().unwrap();
            for i in 1..=3u8 {
                insert(&t, 10 * s + i, u64::from(i));
            }
            t
        })
        .collect();
    let servers = serve(&tables);
    let cluster = client(&servers, DataPlane::Auto);
    let window = WindowSpec::last(3);
    let batch = cluster.sample(&ClusterSample { rows: 16, window, columns: vec![], random_start: false }).unwrap();
    check_rows(&batch, window, 16);
    let empty = cluster.sample(&ClusterSample { rows: 0, window, columns: vec![], random_start: false });
    assert!(matches!(empty, Err(gear_net::Error::Config(_))), "{empty:?}");
    // No RDMA device here: Auto gathers on the shards over TCP.
    assert_eq!(cluster.data_plane_kind(), None);
    let small = ClusterSample { rows: 16, window, columns: vec![], random_start: false };
    assert_eq!(cluster.data_plane_for(&small).unwrap(), None, "without RDMA the shards gather");
    // ByteRange asks for RDMA and falls back to TCP byte ranges.
    let ranged = client(&servers, DataPlane::ByteRange);
    check_rows(
        &ranged.sample(&ClusterSample { rows: 16, window, columns: vec![], random_start: false }).unwrap(),
        window,
        16,
    );
    assert_eq!(ranged.data_plane_kind(), Some(gear_core::TransportKind::Tcp));
}

#[test]
fn a_stopped_shard_is_left_out_and_reported() {
    let tables: Vec<ReplayTable> = (0..3u8)
        .map(|s| {
            let t = ReplayTable::builder(spec(3, 8)).seed(u64::from(s)).build().unwrap();
            for i in 1..=3u8 {
                insert(&t, 10 * s + i, u64::from(i));
            }
            t
        })
        .collect();
    let mut servers = serve(&tables);
    let cluster = client(&servers, DataPlane::ByteRangeTcp);
    let window = WindowSpec::last(3);
    let request = ClusterSample { rows: 24, window, columns: vec![], random_start: false };
    check_rows(&cluster.sample(&request).unwrap(), window, 24);
    servers.remove(1).stop().unwrap();
    let batch = cluster.sample(&request).unwrap();
    assert!(batch.lost.iter().any(|l| l.shard == 1), "{:?}", batch.lost);
    check_rows(&batch, window, 24);
    assert!(batch.keys.iter().all(|k| k.shard != 1));
}
