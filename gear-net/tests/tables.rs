//! Several tables on one server: a prioritized table and a queue (FIFO
//! sampler and remover, every item sampled once, a queue rate limiter)
//! beside it, written and sampled through the cluster client by name, each
//! keeping its own distribution and order; keys routed to their own table;
//! unknown or missing names refused with the list of tables.

// This test uses the table and row helpers only.
#[allow(dead_code)]
mod common;

use common::{check_rows, spec, OBS};
use gear_api::ReplayTable;
use gear_core::{Pad, WindowSpec};
use gear_net::{
    ClusterClient, ClusterConfig, ClusterSample, DataPlane, Error, NamedTable, RemoteTrajectory, ServedTables,
    ServerConfig, ServerHandle, StrategyInfo, WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::time::Duration;

const TOKEN: &str = "tables-test-token-0123456789";
const MAX_LEN: u64 = 4;
const QUEUE: u64 = 32;

fn prioritized() -> StrategyInfo {
    StrategyInfo {
        kind: StrategyKind::Prioritized,
        params: StrategyParams { alpha: 1.0, beta: 1.0, ..StrategyParams::default() },
    }
}

fn fifo() -> StrategyInfo {
    StrategyInfo { kind: StrategyKind::Fifo, params: StrategyParams::default() }
}

/// A server with `replay` (prioritized, alpha = beta = 1) and `queue`
/// (FIFO, `max_times_sampled = 1`, a queue of `QUEUE`), both empty.
fn two_tables() -> (ServerHandle, ReplayTable, ReplayTable) {
    let s = prioritized();
    let replay = ReplayTable::builder(spec(MAX_LEN, 64)).sampler_kind(s.kind, s.params).seed(3).build().unwrap();
    let queue = ReplayTable::builder(spec(MAX_LEN, 64))
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .remover_kind(StrategyKind::Fifo)
        .max_times_sampled(1)
        .queue(QUEUE)
        .unwrap()
        .build()
        .unwrap();
    let tables = ServedTables::new(vec![
        NamedTable::new("replay", replay.clone(), prioritized()),
        NamedTable::new("queue", queue.clone(), fifo()),
    ])
    .unwrap();
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN);
    (ServerHandle::serve(tables, &config).unwrap(), replay, queue)
}

fn client(server: &ServerHandle, table: &str) -> ClusterClient {
    let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], TOKEN);
    config.table = table.to_owned();
    config.call_timeout = Duration::from_secs(2);
    config.seed = 11;
    ClusterClient::new(config).unwrap()
}

/// A trajectory of `steps` steps whose every `obs` byte and `id` is `id`
/// (the layout `common::check_rows` checks).
fn trajectory(id: u8, steps: u64, priority: Option<f64>) -> RemoteTrajectory {
    let obs = vec![id; (steps * OBS) as usize];
    let ids: Vec<u8> = (0..steps).flat_map(|_| i64::from(id).to_le_bytes()).collect();
    RemoteTrajectory { steps, columns: vec![obs.into(), ids.into()], priority }
}

#[test]
fn a_prioritized_table_and_a_queue_keep_their_own_distribution_and_order() {
    let (server, replay_table, queue_table) = two_tables();
    let replay = client(&server, "replay");
    let queue = client(&server, "queue");
    // Interleaved writes: ids 1..=8 (priority = id) into replay, ids
    // 100..=119 into the queue, sent in 1-step chunks (only a stream's
    // first chunk names its table).
    for i in 0..20u8 {
        if i < 8 {
            let keys =
                replay.insert(WriteTarget::Shard(0), vec![trajectory(i + 1, 3, Some(f64::from(i + 1)))], 1).unwrap();
            assert_eq!(keys.len(), 1);
        }
        queue.insert(WriteTarget::Shard(0), vec![trajectory(100 + i, 2, None)], 1).unwrap();
    }
    assert_eq!((replay_table.info().unwrap().size, queue_table.info().unwrap().size), (8, 20));

    // The queue: every item once, in insertion order, whole.
    let window = WindowSpec::first(MAX_LEN);
    let request = ClusterSample { rows: 5, window, columns: vec![], random_start: false };
    let mut order = Vec::new();
    for _ in 0..4 {
        let batch = queue.sample(&request).unwrap();
        order.extend(check_rows(&batch, window, 5).into_iter().map(Option::unwrap));
    }
    assert_eq!(order, (100..120).collect::<Vec<i64>>(), "the queue's order");
    assert_eq!(queue_table.info().unwrap().size, 0, "every item was sampled once and retired");
    assert!(queue.sample(&request).is_err(), "an empty queue has nothing more");

    // The prioritized table: untouched by the queue's draws, and its rows
    // drawn with probability id / 36 (alpha 1), weights (p_min / p)^1.
    assert_eq!(replay_table.info().unwrap().samples, 0);
    let request = ClusterSample { rows: 32, window: WindowSpec::last(2), columns: vec![], random_start: false };
    let mut counts = [0u64; 9];
    let (mut replay_keys, mut replay_ids) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        let batch = replay.sample(&request).unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        replay_ids = check_rows(&batch, request.window, 32).into_iter().map(Option::unwrap).collect();
        for (r, &id) in replay_ids.iter().enumerate() {
            let id = id as usize;
            assert!((1..=8).contains(&id), "row {r}: id {id} is not the replay table's");
            counts[id] += 1;
            let p = id as f64 / 36.0;
            assert!((batch.probabilities[r] - p).abs() < 1e-9, "id {id}: probability {}", batch.probabilities[r]);
            assert!((batch.weights[r] - (1.0 / 36.0) / p).abs() < 1e-9, "id {id}: weight {}", batch.weights[r]);
        }
        replay_keys = batch.keys;
    }
    let n: u64 = counts.iter().sum();
    let chi2: f64 = (1..=8)
        .map(|id| {
            let expected = n as f64 * id as f64 / 36.0;
            (counts[id] as f64 - expected).powi(2) / expected
        })
        .sum();
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    assert!(chi2 < 24.3, "ids drawn {counts:?} (chi2 {chi2:.1}) are not proportional to priority");
    assert_eq!(queue_table.info().unwrap().samples, 20, "the replay table's draws left the queue alone");

    // Keys go to their own table: a queue key given with the replay
    // table's name is stale there (another table's incarnation).
    queue.insert(WriteTarget::Shard(0), vec![trajectory(120, 1, None)], 0).unwrap();
    let queue_key =
        queue.sample(&ClusterSample { rows: 1, window, columns: vec![], random_start: false }).unwrap().keys[0];
    assert_ne!(queue_key.incarnation, replay_keys[0].incarnation, "each table has its own incarnation");
    let stale = replay.update_priorities(&[(queue_key, 50.0)]).unwrap();
    assert_eq!((stale.applied, stale.stale), (0, 1), "another table's key is stale");
    let updates: Vec<_> = replay_keys.iter().map(|&k| (k, 1.0)).collect();
    assert_eq!(replay.update_priorities(&updates).unwrap().applied, updates.len() as u64);
    // The replay table's mass is the updated priorities' and the others'.
    let expected: f64 = (1..=8i64).map(|id| if replay_ids.contains(&id) { 1.0 } else { id as f64 }).sum();
    let mass = replay_table.selection_mass().unwrap().unwrap();
    assert!((mass.total - expected).abs() < 1e-9, "total mass {} after the updates, expected {expected}", mass.total);
}

#[test]
fn unknown_or_missing_table_names_are_refused_with_the_list() {
    let (server, replay_table, queue_table) = two_tables();
    client(&server, "replay").insert(WriteTarget::Shard(0), vec![trajectory(1, 2, Some(1.0))], 0).unwrap();
    let listed = |e: &Error, code: tonic::Code| {
        let text = e.to_string();
        assert!(text.contains("`replay`") && text.contains("`queue`"), "the tables are not listed: {text}");
        match e {
            Error::Status { status, .. } => assert_eq!(status.code(), code, "{text}"),
            other => panic!("expected a status, got {other}"),
        }
    };
    for (name, code) in [("nope", tonic::Code::NotFound), ("", tonic::Code::InvalidArgument)] {
        let c = client(&server, name);
        listed(&c.info(0).unwrap_err(), code);
        listed(&c.spec(0).unwrap_err(), code);
        let request = ClusterSample { rows: 2, window: WindowSpec::last(2), columns: vec![], random_start: false };
        listed(&c.sample(&request).unwrap_err(), code);
        listed(&c.sample_shard(0, &request).unwrap_err(), code);
        match c.insert(WriteTarget::Shard(0), vec![trajectory(9, 2, None)], 0).unwrap_err() {
            Error::PartialInsert { committed, source } => {
                assert!(committed.is_empty());
                listed(&source, code);
            }
            other => listed(&other, code),
        }
        let key = gear_net::RemoteKey { shard: 0, incarnation: 1, slot: 0, generation: 0 };
        listed(&c.update_priorities(&[(key, 2.0)]).unwrap_err(), code);
    }
    // Nothing changed in either table.
    assert_eq!((replay_table.info().unwrap().inserts, queue_table.info().unwrap().inserts), (1, 0));
    assert_eq!(replay_table.info().unwrap().samples, 0);
    // The list of tables, with their counters, by name.
    let tables = client(&server, "").tables(0).unwrap();
    let names: Vec<&str> = tables.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["replay", "queue"]);
    assert_eq!((tables.tables[0].sampler.as_str(), tables.tables[1].sampler.as_str()), ("prioritized", "fifo"));
    assert_eq!((tables.tables[0].size, tables.tables[0].inserts, tables.tables[1].size), (1, 1, 0));
    assert_ne!(tables.tables[0].incarnation, tables.tables[1].incarnation);
    assert_eq!(tables.tables[0].rpc_bytes_received, 2 * (OBS + 8));
}

#[test]
fn an_insert_stream_cannot_change_table_half_way() {
    use gear_net::proto::shard_client::ShardClient;
    use gear_net::proto::InsertChunk;
    let (server, replay_table, queue_table) = two_tables();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status = runtime.block_on(async {
        let mut c = ShardClient::connect(format!("http://{}", server.local_addr())).await.unwrap();
        let t = trajectory(7, 1, Some(1.0));
        let chunk = |table: &str| InsertChunk {
            steps: 1,
            columns: t.columns.clone(),
            priority: Some(1.0),
            end: true,
            table: table.to_owned(),
            begin_wait_ms: None,
        };
        // The second chunk repeats the name (allowed), the third names another.
        let chunks = vec![chunk("replay"), chunk("replay"), chunk(""), chunk("queue")];
        let mut request = tonic::Request::new(tokio_stream::iter(chunks));
        request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        c.insert(request).await.unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().contains("`queue`") && status.message().contains("`replay`"), "{status}");
    // The three committed before the refusal stay, in the stream's table.
    assert_eq!((replay_table.info().unwrap().size, queue_table.info().unwrap().size), (3, 0));
}

#[test]
fn byte_range_reads_reach_the_named_table_region() {
    // Two uniform tables with different contents at the same slots.
    let uniform = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    let tables: Vec<ReplayTable> = (0..2u8)
        .map(|t| {
            let table = ReplayTable::builder(spec(MAX_LEN, 16)).seed(u64::from(t)).build().unwrap();
            for id in 1..=6u8 {
                common::insert(&table, 100 * t + id, u64::from(id % 4 + 1));
            }
            table
        })
        .collect();
    let named =
        vec![NamedTable::new("a", tables[0].clone(), uniform), NamedTable::new("b", tables[1].clone(), uniform)];
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN);
    let server = ServerHandle::serve(ServedTables::new(named).unwrap(), &config).unwrap();
    for (name, ids) in [("b", 101..=106), ("a", 1..=6)] {
        let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], TOKEN);
        config.table = name.into();
        config.data_plane = DataPlane::ByteRangeTcp;
        let cluster = ClusterClient::new(config).unwrap();
        for window in [WindowSpec::last(3), WindowSpec { offset: 1, len: 2, pad: Pad::Tail }] {
            let batch =
                cluster.sample(&ClusterSample { rows: 48, window, columns: vec![], random_start: false }).unwrap();
            assert!(batch.lost.is_empty(), "{:?}", batch.lost);
            for id in check_rows(&batch, window, 48).into_iter().flatten() {
                assert!(ids.contains(&id), "table `{name}`: a row of id {id} came from another table's region");
            }
        }
    }
}
