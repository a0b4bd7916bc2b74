//! A cluster of shards whose tables hold items: remote inserts make items
//! on the shard (its table's pattern), cross-shard samples and ranged reads
//! return item windows under item keys, and priority updates by item key
//! are routed to the shard that owns them.

use gear_api::{ItemPattern, ReplayTable};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, DataPlane, RemoteKey, RemoteTrajectory, ServerConfig,
    ServerHandle, StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashSet;
use std::time::Duration;

const TOKEN: &str = "items-test-token-0123456789";
const WINDOW: u64 = 3;

fn strategy() -> StrategyInfo {
    StrategyInfo {
        kind: StrategyKind::Prioritized,
        params: StrategyParams { alpha: 1.0, beta: 0.4, stratified: false },
    }
}

/// A shard whose table keeps windows of 3 steps every 2 as items.
fn shard(s: u32) -> ServerHandle {
    let spec = TableSpec::new(vec![ColumnSpec::new("x", DType::I64, vec![])], 8, 16)
        .unwrap()
        .with_items_per_trajectory(4)
        .unwrap();
    let table = ReplayTable::builder(spec)
        .item_pattern(ItemPattern::Windows { len: WINDOW, stride: 2, tail: false })
        .sampler_kind(strategy().kind, strategy().params)
        .seed(u64::from(s))
        .build()
        .unwrap();
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN);
    ServerHandle::start(table, &config, strategy()).unwrap()
}

fn client(servers: &[ServerHandle], plane: DataPlane) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.call_timeout = Duration::from_secs(5);
    config.data_plane = plane;
    config.seed = 3;
    // Each batch asks every shard's masses: the other client's priority
    // updates count at once.
    config.mass_refresh = Duration::ZERO;
    ClusterClient::new(config).unwrap()
}

/// A trajectory of 7 steps whose values are `id * 100 + step`.
fn trajectory(id: i64) -> RemoteTrajectory {
    let bytes: Vec<u8> = (0..7).flat_map(|s| (id * 100 + s).to_le_bytes()).collect();
    RemoteTrajectory { steps: 7, columns: vec![bytes.into()], priority: Some(1.0) }
}

/// Every row is an item's window: three consecutive steps of one
/// trajectory from the row's start. Returns each row's (shard, value of its
/// first step).
fn check(batch: &ClusterBatch, rows: usize) -> Vec<(u32, i64)> {
    assert_eq!(batch.keys.len(), rows);
    let w = WINDOW as usize;
    (0..rows)
        .map(|r| {
            let key = batch.keys[r];
            assert!(gear_core::SlotKey { slot: key.slot, generation: key.generation }.is_item(), "row {r}: {key:?}");
            assert_eq!(batch.lengths[r], WINDOW, "row {r}");
            let x: Vec<i64> = batch.columns[0][r * w * 8..(r + 1) * w * 8]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(x[0] % 100, batch.starts[r] as i64, "row {r}: starts at its item's first step");
            assert_eq!(x, vec![x[0], x[0] + 1, x[0] + 2], "row {r}: one item's consecutive steps");
            assert!(x[0] % 100 % 2 == 0 && x[0] % 100 <= 4, "row {r}: windows start every 2 steps");
            (key.shard, x[0])
        })
        .collect()
}

#[test]
fn a_cluster_of_item_tables_samples_and_updates_items() {
    let servers = [shard(0), shard(1)];
    let gather = client(&servers, DataPlane::ShardGather);
    let spec = gather.spec(0).unwrap().table;
    assert_eq!(spec.items_per_trajectory(), 4, "the shard's spec names its items");
    // Remote inserts: each 7-step trajectory gets the pattern's 3 items on
    // its shard.
    let keys = gather.insert(WriteTarget::RoundRobin, (1..=6).map(trajectory).collect(), 3).unwrap();
    assert_eq!(keys.len(), 6);
    assert_eq!((gather.info(0).unwrap().size, gather.info(1).unwrap().size), (9, 9));
    let ranged = client(&servers, DataPlane::ByteRangeTcp);
    let request = ClusterSample { rows: 64, window: WindowSpec::first(WINDOW), columns: vec![], random_start: false };
    let mut seen = HashSet::new();
    for c in [&gather, &ranged] {
        for _ in 0..4 {
            let batch = c.sample(&request).unwrap();
            assert!(batch.lost.is_empty(), "{:?}", batch.lost);
            seen.extend(check(&batch, 64));
        }
    }
    assert_eq!(seen.len(), 18, "every item of both shards, through both data planes: {seen:?}");
    assert_eq!(ranged.data_plane_kind(), Some(gear_core::TransportKind::Tcp));
    // Priorities by item key, routed by shard: one item keeps a priority,
    // the others next to none (a shard of zero mass reads as one whose
    // strategy picks deterministically).
    let batch = gather.sample(&request).unwrap();
    let keep = batch.keys[0];
    let mut all: Vec<RemoteKey> = Vec::new();
    for c in [&gather, &ranged] {
        for _ in 0..4 {
            all.extend(c.sample(&request).unwrap().keys);
        }
    }
    all.sort_by_key(|k| (k.shard, k.slot, k.generation));
    all.dedup();
    assert_eq!(all.len(), 18);
    let updates: Vec<(RemoteKey, f64)> = all.iter().map(|&k| (k, if k == keep { 5.0 } else { 1e-12 })).collect();
    assert_eq!(gather.update_priorities(&updates).unwrap().applied, 18);
    for c in [&gather, &ranged] {
        let batch = c.sample(&request).unwrap();
        assert!(batch.keys.iter().all(|&k| k == keep), "only the item with a priority is drawn");
        check(&batch, 64);
    }
    // A trajectory key (the insert's) sets its trajectory's priority for
    // eviction, never an item's.
    assert_eq!(gather.update_priorities(&[(keys[0], 3.0)]).unwrap().applied, 1);
    assert!(gather.sample(&request).unwrap().keys.iter().all(|&k| k == keep));
}
