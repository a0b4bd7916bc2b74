//! Cross-shard sampling keeps one table's distribution: three in-process
//! shard servers on loopback against one table holding the same items.

use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashMap;
use std::time::Duration;

const TOKEN: &str = "chi-square-token-0123";
const ITEMS_PER_SHARD: u64 = 8;

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 2, 32).unwrap()
}

fn params() -> StrategyParams {
    StrategyParams { alpha: 0.7, beta: 0.5, stratified: true }
}

fn priority(id: u64) -> f64 {
    // Spread over two orders of magnitude, some items tiny.
    0.05 + (id * 37 % 23) as f64 * 0.4
}

fn table_with(ids: impl Iterator<Item = u64>, seed: u64) -> ReplayTable {
    let table =
        ReplayTable::builder(spec()).sampler_kind(StrategyKind::Prioritized, params()).seed(seed).build().unwrap();
    let writer = table.writer();
    for id in ids {
        let mut t = writer.begin(Some(priority(id))).unwrap();
        t.append_step(&[StepValue::typed(&[id as i64])]).unwrap();
        t.end().unwrap();
    }
    table
}

/// Per id: (probability, weight) as one table reports them.
fn one_table_truth(items: u64) -> HashMap<u64, (f64, f64)> {
    let table = table_with(0..items, 99);
    let mut sampler = table.sampler(SampleConfig::new(256, WindowSpec::last(1))).unwrap();
    let mut truth = HashMap::new();
    for _ in 0..20 {
        let b = sampler.sample().unwrap();
        let ids: &[i64] = b.column("id").unwrap().as_slice().unwrap();
        for ((&id, &p), &w) in ids.iter().zip(b.probabilities()).zip(b.weights()) {
            truth.insert(id as u64, (p, w));
        }
    }
    assert_eq!(truth.len() as u64, items, "the reference table never drew some items");
    truth
}

#[test]
fn cross_shard_prioritized_sampling_matches_one_table() {
    let servers: Vec<ServerHandle> = (0..3u64)
        .map(|s| {
            let ids = s * ITEMS_PER_SHARD..(s + 1) * ITEMS_PER_SHARD;
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s as u32, TOKEN);
            ServerHandle::start(
                table_with(ids, s + 1),
                &config,
                StrategyInfo { kind: StrategyKind::Prioritized, params: params() },
            )
            .unwrap()
        })
        .collect();
    let items = 3 * ITEMS_PER_SHARD;
    let truth = one_table_truth(items);
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.seed = 12345;
    config.call_timeout = Duration::from_secs(10);
    let cluster = ClusterClient::new(config).unwrap();
    let request = ClusterSample { rows: 200, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let mut counts = vec![0u64; items as usize];
    let batches = 100;
    for _ in 0..batches {
        let b = cluster.sample(&request).unwrap();
        assert!(b.lost.is_empty());
        for r in 0..b.keys.len() {
            let id = u64::from_le_bytes(b.columns[0][r * 8..][..8].try_into().unwrap());
            assert_eq!(id / ITEMS_PER_SHARD, u64::from(b.keys[r].shard), "row {r} came from the wrong shard");
            let (p, w) = truth[&id];
            assert!(
                (b.probabilities[r] - p).abs() <= 1e-9 * p,
                "id {id}: probability {} vs one table's {p}",
                b.probabilities[r]
            );
            assert!((b.weights[r] - w).abs() <= 1e-9, "id {id}: weight {} vs one table's {w}", b.weights[r]);
            counts[id as usize] += 1;
        }
    }
    // Pearson chi-square against one table's probabilities: 23 degrees of
    // freedom, critical value 49.73 at p = 0.001 (fixed seed: deterministic).
    let n = (batches * request.rows) as f64;
    let chi2: f64 = (0..items)
        .map(|id| {
            let e = truth[&id].0 * n;
            (counts[id as usize] as f64 - e).powi(2) / e
        })
        .sum();
    assert!(chi2 < 49.73, "chi-square {chi2:.1} over {items} items: counts {counts:?}");
}

#[test]
fn deterministic_strategies_are_refused_across_shards() {
    let servers: Vec<ServerHandle> = (0..2u64)
        .map(|s| {
            let table = ReplayTable::builder(spec())
                .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
                .build()
                .unwrap();
            let mut t = table.writer().begin(None).unwrap();
            t.append_step(&[StepValue::typed(&[s as i64])]).unwrap();
            t.end().unwrap();
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s as u32, TOKEN);
            ServerHandle::start(
                table,
                &config,
                StrategyInfo { kind: StrategyKind::Fifo, params: StrategyParams::default() },
            )
            .unwrap()
        })
        .collect();
    let cluster =
        ClusterClient::new(ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN))
            .unwrap();
    let request = ClusterSample { rows: 2, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let e = cluster.sample(&request).unwrap_err();
    assert!(e.to_string().contains("cannot be merged exactly"), "{e}");
    // One shard alone keeps its order.
    assert_eq!(cluster.sample_shard(1, &request).unwrap().keys.len(), 2);
}
