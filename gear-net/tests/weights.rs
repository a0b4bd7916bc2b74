//! Importance weights never exceed 1 and probabilities stay consistent
//! while another client lowers priorities between (and during) a
//! trainer's batches, with alpha = beta = 1.
//!
//! A trainer splits each batch by the masses its last replies reported;
//! another client's updates since then make those masses stale. The rows'
//! probabilities are the ones they were drawn with (the shard's fresh local
//! probability times its share of the stale split), and every weight is at
//! most 1 (the `weights` module of the client); before that rule a row
//! whose priority was lowered below the cached smallest one came back with
//! a weight of 2 or 50.

use gear_api::ReplayTable;
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_net::{
    ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, DataPlane, RemoteKey, RemoteTrajectory, ServerConfig,
    ServerHandle, StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "weights-test-token-0123";
const SHARDS: usize = 3;
const ITEMS: usize = 16;
const ROWS: u64 = 128;

fn params() -> StrategyParams {
    StrategyParams { alpha: 1.0, beta: 1.0, stratified: false }
}

fn servers() -> Vec<ServerHandle> {
    let spec = TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 1, 64).unwrap();
    (0..SHARDS as u32)
        .map(|s| {
            let table = ReplayTable::builder(spec.clone())
                .sampler_kind(StrategyKind::Prioritized, params())
                .seed(u64::from(s) + 1)
                .build()
                .unwrap();
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN);
            ServerHandle::start(table, &config, StrategyInfo { kind: StrategyKind::Prioritized, params: params() })
                .unwrap()
        })
        .collect()
}

fn client(servers: &[ServerHandle], seed: u64, data_plane: DataPlane) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.seed = seed;
    config.data_plane = data_plane;
    // Only the trainer's own replies renew its view: every other client's
    // update between two batches leaves it stale.
    config.mass_refresh = Duration::from_secs(3600);
    config.call_timeout = Duration::from_secs(10);
    ClusterClient::new(config).unwrap()
}

/// Fills every shard with `ITEMS` items of priority 1; returns their keys.
fn fill(cluster: &ClusterClient) -> Vec<RemoteKey> {
    let mut keys = Vec::new();
    for s in 0..SHARDS {
        let trajectories = (0..ITEMS as i64)
            .map(|i| RemoteTrajectory { steps: 1, columns: vec![i.to_le_bytes().to_vec().into()], priority: Some(1.0) })
            .collect();
        keys.extend(cluster.insert(WriteTarget::Shard(s), trajectories, 0).unwrap());
    }
    keys
}

/// Weights in (0, 1], probabilities in (0, 1], and (beta = 1) every row's
/// weight times its probability the same: the batch's normaliser, which
/// is at most every row's probability.
fn check_weights(batch: &ClusterBatch) {
    assert_eq!(batch.keys.len() as u64, ROWS);
    assert!(batch.lost.is_empty(), "{:?}", batch.lost);
    let norm = batch.weights[0] * batch.probabilities[0];
    for (r, (&p, &w)) in batch.probabilities.iter().zip(&batch.weights).enumerate() {
        assert!(p > 0.0 && p <= 1.0, "row {r}: probability {p}");
        assert!(w > 0.0 && w <= 1.0, "row {r}: weight {w} above 1 (probability {p})");
        assert!((w * p - norm).abs() <= 1e-9 * norm, "row {r}: weight {w} x probability {p} is not {norm}");
        assert!(norm <= p * (1.0 + 1e-12), "row {r}: the normaliser {norm} is above its probability {p}");
    }
}

/// Each shard's total priority in `priorities`.
fn totals(priorities: &HashMap<RemoteKey, f64>) -> Vec<f64> {
    let mut t = vec![0.0; SHARDS];
    for (k, p) in priorities {
        t[k.shard as usize] += p;
    }
    t
}

#[test]
fn weights_stay_at_most_one_while_another_client_lowers_priorities() {
    // The shards gather the windows, or the trainer reads them as byte
    // ranges: the same probabilities and weights.
    for data_plane in [DataPlane::ShardGather, DataPlane::ByteRangeTcp] {
        lowered_between_batches(data_plane);
    }
}

fn lowered_between_batches(data_plane: DataPlane) {
    let servers = servers();
    let trainer = client(&servers, 11, data_plane);
    let other = client(&servers, 12, DataPlane::ShardGather);
    let mut priorities: HashMap<RemoteKey, f64> = fill(&other).into_iter().map(|k| (k, 1.0)).collect();
    let request = ClusterSample { rows: ROWS, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let mut rng = Xoshiro256::seed_from_u64(5);
    // What the trainer's last replies reported: each shard's total just
    // after its draw (nothing changed priorities since the fill).
    let mut reported = totals(&priorities);
    let smallest = |p: &HashMap<RemoteKey, f64>| p.values().fold(f64::INFINITY, |m, &x| m.min(x));
    let mut reported_min = smallest(&priorities);
    let mut below_cached_min = 0;
    for round in 0..40 {
        let batch = trainer.sample(&request).unwrap();
        check_weights(&batch);
        // Probabilities are the ones the rows were drawn with: the shard's
        // fresh local probability times its share of the split, which was
        // made with the masses the trainer's last replies reported.
        let now = totals(&priorities);
        let split: f64 = reported.iter().sum();
        for (r, k) in batch.keys.iter().enumerate() {
            let s = k.shard as usize;
            let want = priorities[k] / now[s] * reported[s] / split;
            let got = batch.probabilities[r];
            assert!(
                (got - want).abs() <= 1e-9 * want,
                "{data_plane:?} round {round} row {r}: probability {got}, drawn with {want}"
            );
            // Normalised by the smallest probability the trainer's cached
            // masses give, this row's weight would be above 1.
            if reported_min / split > got * (1.0 + 1e-9) {
                below_cached_min += 1;
            }
        }
        reported = now;
        reported_min = smallest(&priorities);
        // Another client lowers about half the rows' priorities below any
        // priority the trainer has seen.
        let mut updates: Vec<(RemoteKey, f64)> = Vec::new();
        for &k in &batch.keys {
            if rng.next_f64() < 0.5 {
                updates.push((k, reported_min * (0.2 + 0.6 * rng.next_f64())));
            }
        }
        let done = other.update_priorities(&updates).unwrap();
        assert_eq!(done.applied + done.stale, updates.len() as u64);
        assert_eq!(done.stale, 0, "every key is live");
        for (k, p) in updates {
            priorities.insert(k, p);
        }
    }
    assert!(below_cached_min > 0, "no row was drawn below the cached smallest probability: the test tests nothing");
}

#[test]
fn weights_stay_at_most_one_under_concurrent_priority_updates() {
    let servers = servers();
    let trainer = client(&servers, 21, DataPlane::ShardGather);
    let keys = fill(&trainer);
    let stop = Arc::new(AtomicBool::new(false));
    let updater = {
        let (addrs, stop) = (servers.iter().map(|s| s.local_addr().to_string()).collect::<Vec<_>>(), stop.clone());
        std::thread::spawn(move || {
            let mut config = ClusterConfig::new(addrs, TOKEN);
            config.seed = 22;
            let other = ClusterClient::new(config).unwrap();
            let mut rng = Xoshiro256::seed_from_u64(9);
            let mut floor = 1.0f64;
            let mut calls = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Mostly lower (below any priority yet), sometimes raise.
                floor *= 0.9;
                let updates: Vec<(RemoteKey, f64)> = (0..8)
                    .map(|_| {
                        let k = keys[(rng.next_f64() * keys.len() as f64) as usize % keys.len()];
                        let p = if rng.next_f64() < 0.8 { floor.max(1e-200) } else { 1.0 + rng.next_f64() };
                        (k, p)
                    })
                    .collect();
                other.update_priorities(&updates).unwrap();
                calls += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            calls
        })
    };
    let request = ClusterSample { rows: ROWS, window: WindowSpec::last(1), columns: vec![], random_start: false };
    for _ in 0..150 {
        check_weights(&trainer.sample(&request).unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    assert!(updater.join().unwrap() > 10, "the other client barely updated");
}
