//! The client's view of the shards' masses (`ClusterConfig::mass_refresh`):
//! what its own updates and inserts change is used by its next batch at
//! once; what other clients change is seen within `mass_refresh`.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, RemoteTrajectory, ServerConfig, ServerHandle,
    StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::time::Duration;

const TOKEN: &str = "mass-refresh-token-0123";
const ROWS: u64 = 200;

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 2, 64).unwrap()
}

fn params() -> StrategyParams {
    StrategyParams { alpha: 0.7, beta: 0.5, stratified: false }
}

fn insert(table: &ReplayTable, ids: std::ops::Range<i64>) {
    let writer = table.writer();
    for id in ids {
        let mut t = writer.begin(Some(1.0)).unwrap();
        t.append_step(&[StepValue::typed(&[id])]).unwrap();
        t.end().unwrap();
    }
}

/// Shard `shard` over `table` at `addr`, prioritized.
fn start(table: ReplayTable, addr: std::net::SocketAddr, shard: u32) -> ServerHandle {
    let config = ServerConfig::new(addr, shard, TOKEN);
    ServerHandle::start(table, &config, StrategyInfo { kind: StrategyKind::Prioritized, params: params() }).unwrap()
}

/// A shard server over each of `tables` on a free port.
fn servers(tables: &[ReplayTable]) -> Vec<ServerHandle> {
    tables.iter().enumerate().map(|(s, t)| start(t.clone(), "127.0.0.1:0".parse().unwrap(), s as u32)).collect()
}

fn tables() -> Vec<ReplayTable> {
    (0..2)
        .map(|s| {
            ReplayTable::builder(spec()).sampler_kind(StrategyKind::Prioritized, params()).seed(s + 1).build().unwrap()
        })
        .collect()
}

fn client(servers: &[ServerHandle], mass_refresh: Duration) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.seed = 7;
    config.mass_refresh = mass_refresh;
    // A shard that waits out its wait for data fails a test in seconds.
    config.call_timeout = Duration::from_secs(4);
    ClusterClient::new(config).unwrap()
}

fn sample(cluster: &ClusterClient) -> ClusterBatch {
    let b = cluster
        .sample(&ClusterSample { rows: ROWS, window: WindowSpec::last(1), columns: vec![], random_start: false })
        .unwrap();
    assert!(b.lost.is_empty(), "lost: {:?}", b.lost);
    b
}

fn rows_from(batch: &ClusterBatch, shard: u32) -> usize {
    batch.keys.iter().filter(|k| k.shard == shard).count()
}

#[test]
fn priority_updates_through_the_client_split_its_next_batch_at_once() {
    let tables = tables();
    insert(&tables[0], 0..8);
    insert(&tables[1], 8..16);
    let servers = servers(&tables);
    // Never asked again by age: only the replies keep the view current.
    let cluster = client(&servers, Duration::from_secs(3600));
    let first = sample(&cluster);
    assert!(rows_from(&first, 0) > 50 && rows_from(&first, 1) > 50, "equal shards split a batch evenly");
    // Make shard 0's items all but unsampleable.
    let mut keys: Vec<_> = first.keys.iter().copied().filter(|k| k.shard == 0).collect();
    keys.sort_by_key(|k| k.slot);
    keys.dedup();
    assert_eq!(keys.len(), 8, "200 rows drew every item of shard 0");
    let updates: Vec<_> = keys.iter().map(|&k| (k, 1e-9)).collect();
    assert_eq!(cluster.update_priorities(&updates).unwrap(), gear_net::PriorityUpdates { applied: 8, stale: 0 });
    let next = sample(&cluster);
    assert!(rows_from(&next, 0) <= 1, "{} rows still came from the shard whose mass fell", rows_from(&next, 0));
    for (r, p) in next.probabilities.iter().enumerate() {
        if next.keys[r].shard == 1 {
            assert!((p - 1.0 / 8.0).abs() < 1e-6, "row {r}: global probability {p}, one table gives ~1/8");
        }
    }
}

#[test]
fn inserts_through_the_client_are_drawn_by_its_next_batch() {
    let tables = tables();
    insert(&tables[0], 0..8);
    let servers = servers(&tables);
    let cluster = client(&servers, Duration::from_secs(3600));
    assert_eq!(rows_from(&sample(&cluster), 1), 0, "shard 1 is empty");
    let trajectories = (8..16i64)
        .map(|id| RemoteTrajectory { steps: 1, columns: vec![id.to_le_bytes().to_vec().into()], priority: Some(1.0) })
        .collect();
    cluster.insert(WriteTarget::Shard(1), trajectories, 0).unwrap();
    let next = sample(&cluster);
    assert!(rows_from(&next, 1) > 50, "{} of {ROWS} rows from the shard just filled", rows_from(&next, 1));
}

#[test]
fn another_clients_inserts_are_seen_within_mass_refresh() {
    let tables = tables();
    insert(&tables[0], 0..8);
    let servers = servers(&tables);
    let refresh = Duration::from_millis(200);
    let cluster = client(&servers, refresh);
    let asks_every_batch = client(&servers, Duration::ZERO);
    assert_eq!(rows_from(&sample(&cluster), 1), 0, "shard 1 is empty");
    assert_eq!(rows_from(&sample(&asks_every_batch), 1), 0, "shard 1 is empty");
    // Someone else fills shard 1 (here: its own process, in place).
    insert(&tables[1], 8..16);
    assert!(rows_from(&sample(&asks_every_batch), 1) > 50, "asking every batch sees the insert at once");
    std::thread::sleep(refresh + Duration::from_millis(50));
    let b = sample(&cluster);
    assert!(rows_from(&b, 1) > 50, "{} of {ROWS} rows from shard 1 after mass_refresh", rows_from(&b, 1));
}

#[test]
fn a_shard_restarted_between_batches_is_not_asked_for_rows_its_new_run_lacks() {
    let tables = tables();
    insert(&tables[0], 0..8);
    insert(&tables[1], 8..16);
    let mut servers = servers(&tables);
    let cluster = client(&servers, Duration::from_secs(3600));
    assert!(rows_from(&sample(&cluster), 1) > 50);
    // Shard 1 restarts, empty, on the same address, between two batches;
    // the client's view still holds its old run's mass.
    let addr = servers[1].local_addr();
    servers.pop().unwrap().stop().unwrap();
    servers.push(start(crate::tables().pop().unwrap(), addr, 1)); // empty
                                                                  // The channel reconnects (`info` leaves the client's view alone).
    let reconnected = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        cluster.info(1).is_ok()
    });
    assert!(reconnected, "the restarted shard never answered");
    // Its new run refuses the rows split for the old one at once (rather
    // than waiting for data until the deadline); the rows come from shard 0.
    let b = cluster
        .sample(&ClusterSample { rows: ROWS, window: WindowSpec::last(1), columns: vec![], random_start: false })
        .unwrap();
    assert_eq!(b.lost.len(), 1, "lost: {:?}", b.lost);
    assert_eq!(b.lost[0].shard, 1);
    assert!(b.lost[0].reason.contains("restarted"), "reason: {}", b.lost[0].reason);
    assert_eq!(rows_from(&b, 0), ROWS as usize);
    // The next batch asks again: the shard is back, empty, and drawn no rows.
    let b = sample(&cluster);
    assert_eq!(b.rejoined, vec![1]);
    assert_eq!(rows_from(&b, 1), 0);
}

#[test]
fn an_empty_cluster_is_asked_again_on_every_batch() {
    let tables = tables();
    let servers = servers(&tables);
    let cluster = client(&servers, Duration::from_secs(3600));
    let request = ClusterSample { rows: ROWS, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let err = cluster.sample(&request).unwrap_err().to_string();
    assert!(err.contains("no shard holds items"), "{err}");
    // Another process's first inserts are drawn by the very next batch.
    insert(&tables[1], 0..8);
    assert_eq!(rows_from(&sample(&cluster), 1), ROWS as usize);
}
