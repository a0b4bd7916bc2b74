//! Remote writers: an insert stream that fails part way reports what it
//! committed, and writers spread by free space go to the emptiest shard.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{
    ClusterClient, ClusterConfig, ClusterSample, Error, RemoteTrajectory, ServerConfig, ServerHandle, StrategyInfo,
    WriteTarget,
};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashSet;
use std::time::Duration;

const TOKEN: &str = "writers-test-token-0123";
const MAX_LEN: u64 = 4;

fn spec() -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], MAX_LEN, 32).unwrap()
}

fn strategy() -> StrategyInfo {
    StrategyInfo { kind: StrategyKind::Prioritized, params: StrategyParams::default() }
}

/// A shard server holding `items` one-step trajectories.
fn shard(s: u32, items: u64) -> ServerHandle {
    let table = ReplayTable::builder(spec()).sampler_kind(strategy().kind, strategy().params).build().unwrap();
    let writer = table.writer();
    for i in 0..items {
        let mut t = writer.begin(Some(1.0)).unwrap();
        t.append_step(&[StepValue::typed(&[-1 - i as i64])]).unwrap();
        t.end().unwrap();
    }
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN);
    ServerHandle::start(table, &config, strategy()).unwrap()
}

fn client(servers: &[&ServerHandle], refresh: Duration) -> ClusterClient {
    let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
    config.call_timeout = Duration::from_secs(5);
    config.free_space_refresh = refresh;
    ClusterClient::new(config).unwrap()
}

/// A trajectory of `steps` steps whose ids are `id * 10 + step`.
fn trajectory(id: i64, steps: u64) -> RemoteTrajectory {
    let bytes: Vec<u8> = (0..steps as i64).flat_map(|s| (id * 10 + s).to_le_bytes()).collect();
    RemoteTrajectory { steps, columns: vec![bytes.into()], priority: Some(1.0) }
}

/// Every id shard `s` holds, by sampling it many times.
fn ids_on(cluster: &ClusterClient, s: usize) -> HashSet<i64> {
    let request = ClusterSample { rows: 64, window: WindowSpec::last(1), columns: vec![], random_start: false };
    let mut ids = HashSet::new();
    for _ in 0..8 {
        let b = cluster.sample_shard(s, &request).unwrap();
        ids.extend(b.columns[0].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) / 10));
    }
    ids
}

#[test]
fn a_stream_failing_part_way_reports_the_committed_keys() {
    let server = shard(0, 0);
    let cluster = client(&[&server], Duration::ZERO);
    // The third trajectory overflows max_len in its third chunk: its first
    // two chunks were appended, and must not be committed.
    let mut bad_sizes = trajectory(3, 2);
    let short = bad_sizes.columns[0].len() - 1;
    bad_sizes.columns[0].truncate(short);
    for bad in [trajectory(3, MAX_LEN + 2), bad_sizes] {
        let before = cluster.info(0).unwrap().size;
        let batch = vec![trajectory(1, 2), trajectory(2, 1), bad, trajectory(4, 1)];
        let e = cluster.insert(WriteTarget::Shard(0), batch, 2).unwrap_err();
        let Error::PartialInsert { committed, source } = e else { panic!("expected a partial insert, got {e}") };
        assert_eq!(committed.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!(committed.iter().all(|(_, k)| k.shard == 0));
        assert!(
            matches!(*source, Error::Status { shard: 0, ref status } if status.code() == tonic::Code::InvalidArgument)
        );
        assert_eq!(cluster.info(0).unwrap().size, before + 2);
        // The reported keys are live keys of the shard.
        let updates: Vec<_> = committed.iter().map(|&(_, k)| (k, 2.0)).collect();
        assert_eq!(cluster.update_priorities(&updates).unwrap().applied, 2);
    }
    assert_eq!(ids_on(&cluster, 0), HashSet::from([1, 2]));
    // Nothing committed: the plain error.
    let mut bad = trajectory(5, 1);
    let short = bad.columns[0].len() - 1;
    bad.columns[0].truncate(short);
    assert!(matches!(cluster.insert(WriteTarget::Shard(0), vec![bad], 0).unwrap_err(), Error::Status { .. }));
}

#[test]
fn a_dead_shard_leaves_the_others_keys_reported() {
    let alive = shard(0, 0);
    let dead = shard(1, 0);
    let cluster = client(&[&alive, &dead], Duration::ZERO);
    dead.stop().unwrap();
    let batch = (0..4).map(|i| trajectory(i, 1)).collect();
    let e = cluster.insert(WriteTarget::RoundRobin, batch, 0).unwrap_err();
    let Error::PartialInsert { committed, source } = e else { panic!("expected a partial insert, got {e}") };
    // Round-robin gave trajectories 0 and 2 to shard 0.
    assert_eq!(committed.iter().map(|&(i, k)| (i, k.shard)).collect::<Vec<_>>(), vec![(0, 0), (2, 0)]);
    assert!(matches!(*source, Error::Status { shard: 1, .. }), "{source}");
    assert_eq!(cluster.info(0).unwrap().size, 2);
}

#[test]
fn most_free_writes_go_to_the_emptiest_shard() {
    let servers = [shard(0, 5), shard(1, 1), shard(2, 3)];
    let refs: Vec<&ServerHandle> = servers.iter().collect();
    // Sizes asked once: later calls count what this client sent.
    let cluster = client(&refs, Duration::from_secs(3600));
    let shards = |keys: Vec<gear_net::RemoteKey>| keys.iter().map(|k| k.shard).collect::<Vec<_>>();
    assert_eq!(shards(cluster.insert(WriteTarget::MostFree, vec![trajectory(1, 1)], 0).unwrap()), vec![1]);
    // Free 27, 30, 29: shard 1, then a tie 29/29 to the lower id, then shard 2.
    let batch = (2..5).map(|i| trajectory(i, 1)).collect();
    assert_eq!(shards(cluster.insert(WriteTarget::MostFree, batch, 0).unwrap()), vec![1, 1, 2]);
    let sizes: Vec<u64> = (0..3).map(|s| cluster.info(s).unwrap().size).collect();
    assert_eq!(sizes, vec![5, 4, 4]);
    // Asked every time: sizes 5, 4, 4 tie shards 1 and 2, the lower id wins.
    let fresh = client(&refs, Duration::ZERO);
    assert_eq!(shards(fresh.insert(WriteTarget::MostFree, vec![trajectory(9, 1)], 0).unwrap()), vec![1]);
    // A dead shard is left out: sizes 5, 5, 4 with the emptiest gone.
    let [a, b, c] = servers;
    let after = client(&[&a, &b, &c], Duration::ZERO);
    drop(c);
    let keys = after.insert(WriteTarget::MostFree, vec![trajectory(10, 1)], 0).unwrap();
    assert_eq!(shards(keys), vec![0]);
}

/// The bytes of steps `from..to` of trajectory `id` (ids `id * 10 + step`).
fn steps(id: i64, from: i64, to: i64) -> bytes::Bytes {
    (from..to).flat_map(|s| (id * 10 + s).to_le_bytes()).collect::<Vec<u8>>().into()
}

#[test]
fn a_streamed_trajectory_commits_at_its_end_even_after_longer_than_the_call_deadline() {
    let server = shard(0, 0);
    let mut config = ClusterConfig::new(vec![server.local_addr().to_string()], TOKEN);
    // Shorter than the pause between the chunks below: the stream must not
    // be held to the call deadline (it is open-ended).
    config.call_timeout = Duration::from_millis(400);
    let cluster = ClusterClient::new(config).unwrap();
    let chunk = Duration::from_secs(1);
    let mut stream = cluster.open_trajectory(WriteTarget::RoundRobin).unwrap();
    assert_eq!(stream.shard(), 0);
    assert!(stream.send(2, vec![steps(7, 0, 2)], Some(3.0), chunk).unwrap());
    assert!(stream.started());
    std::thread::sleep(Duration::from_millis(900));
    assert!(stream.send(1, vec![steps(7, 2, 3)], None, chunk).unwrap());
    assert!(stream.send_end(1, vec![steps(7, 3, 4)], None, chunk).unwrap());
    let mut key = None;
    for _ in 0..50 {
        key = stream.key(Duration::from_millis(100)).unwrap();
        if key.is_some() {
            break;
        }
    }
    let key = key.expect("the shard confirmed the trajectory");
    assert_eq!(key.shard, 0);
    let request = ClusterSample { rows: 4, window: WindowSpec::first(MAX_LEN), columns: vec![], random_start: false };
    let b = cluster.sample_shard(0, &request).unwrap();
    let ids: Vec<i64> = b.columns[0][..32].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(ids, vec![70, 71, 72, 73]);
    assert_eq!(b.lengths[0], 4);
}

#[test]
fn a_stream_dropped_or_refused_before_its_end_stores_nothing() {
    let server = shard(0, 0);
    let cluster = client(&[&server], Duration::from_millis(500));
    let second = Duration::from_secs(1);
    let mut stream = cluster.open_trajectory(WriteTarget::Shard(0)).unwrap();
    assert!(stream.send(2, vec![steps(1, 0, 2)], None, second).unwrap());
    drop(stream);
    // A chunk of the wrong size is refused; the stream's status says why.
    // The refusal is asynchronous: a send fails once the shard's status
    // has ended the call, so keep sending (paced) until it has.
    let paced = || std::thread::sleep(Duration::from_millis(25));
    let mut bad = cluster.open_trajectory(WriteTarget::Shard(0)).unwrap();
    let refused = (0..200)
        .find_map(|_| {
            paced();
            bad.send(1, vec![vec![0u8; 5].into()], None, second).err()
        })
        .expect("the shard refused the chunk");
    assert!(refused.to_string().contains("bytes"), "{refused}");
    // Too many steps for the table's max_len: refused as well.
    let mut long = cluster.open_trajectory(WriteTarget::Shard(0)).unwrap();
    let err = (0..200).find_map(|_| {
        paced();
        long.send(MAX_LEN + 1, vec![steps(2, 0, MAX_LEN as i64 + 1)], None, second).err()
    });
    assert!(err.is_some());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(cluster.info(0).unwrap().size, 0);
    assert!(matches!(cluster.open_trajectory(WriteTarget::Shard(3)), Err(Error::Config(_))));
}
