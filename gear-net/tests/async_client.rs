//! The async cluster client inside tokio runtimes (current-thread and
//! multi-thread), futures dropped part way (a sample mid-reply, inserts
//! mid-stream, byte-range reads) leaving the next call whole, and the
//! blocking client refusing (never panicking) inside a runtime, its sampling
//! calls (tasks on its runtime) writing only their callers' buffers.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod proxy;

use common::{check_rows, insert, spec, OBS};
use gear_api::ReplayTable;
use gear_core::WindowSpec;
use gear_net::{
    AsyncClusterClient, BatchRows, ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, DataPlane, Error,
    RemoteTrajectory, ServerHandle, WriteTarget,
};
use std::time::Duration;

const TOKEN: &str = "async-client-token-0123";

/// Shard `s` holds ids `10 * s + 1 ..= 10 * s + 8`, of 1 to 4 steps.
fn tables(shards: u8) -> Vec<ReplayTable> {
    (0..shards)
        .map(|s| {
            let t = ReplayTable::builder(spec(4, 64)).seed(u64::from(s)).build().unwrap();
            for i in 1..=8u8 {
                insert(&t, 10 * s + i, u64::from(1 + i % 4));
            }
            t
        })
        .collect()
}

fn serve(tables: &[ReplayTable]) -> Vec<ServerHandle> {
    common::serve_uniform(tables, TOKEN)
}

fn config(addresses: Vec<String>, plane: DataPlane) -> ClusterConfig {
    let mut config = ClusterConfig::new(addresses, TOKEN);
    config.data_plane = plane;
    config.call_timeout = Duration::from_secs(5);
    config.seed = 3;
    config
}

fn addresses(servers: &[ServerHandle]) -> Vec<String> {
    servers.iter().map(|s| s.local_addr().to_string()).collect()
}

fn request(rows: u64) -> ClusterSample {
    ClusterSample { rows, window: WindowSpec::last(4), columns: vec![], random_start: false }
}

/// A batch written into caller buffers, as a `ClusterBatch` for the checks.
fn as_batch(columns: &[Vec<u8>], rows: &BatchRows) -> ClusterBatch {
    ClusterBatch {
        columns: columns.to_vec(),
        keys: rows.keys.clone(),
        lengths: rows.lengths.clone(),
        starts: rows.starts.clone(),
        probabilities: rows.probabilities.clone(),
        weights: rows.weights.clone(),
        lost: rows.lost.clone(),
        rejoined: rows.rejoined.clone(),
    }
}

/// Every call of the async client, awaited in `runtime`.
fn every_call(runtime: &tokio::runtime::Runtime, servers: &[ServerHandle]) {
    runtime.block_on(async {
        let cluster = AsyncClusterClient::new(config(addresses(servers), DataPlane::ShardGather)).unwrap();
        assert_eq!(cluster.shards(), servers.len());
        let spec = cluster.spec(0).await.unwrap();
        assert_eq!(spec.table, common::spec(4, 64));
        assert_eq!(spec.sampler, "uniform");
        let before = cluster.info(1).await.unwrap();
        let one = RemoteTrajectory {
            steps: 1,
            columns: vec![vec![77u8; OBS as usize].into(), 77i64.to_le_bytes().to_vec().into()],
            priority: None,
        };
        let keys = cluster.insert(WriteTarget::Shard(1), vec![one], 0).await.unwrap();
        assert_eq!(cluster.info(1).await.unwrap().size, before.size + 1);
        let batch = cluster.sample(&request(32)).await.unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        check_rows(&batch, WindowSpec::last(4), 32);
        let sizes = cluster.column_bytes(&request(32)).await.unwrap();
        let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAB; n]).collect();
        let mut rows = BatchRows::default();
        for _ in 0..3 {
            let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
            cluster.sample_into(&request(32), &mut views, &mut rows).await.unwrap();
            check_rows(&as_batch(&columns, &rows), WindowSpec::last(4), 32);
        }
        let updated = cluster.update_priorities(&[(keys[0], 2.0)]).await.unwrap();
        assert_eq!((updated.applied, updated.stale), (1, 0));
    });
}

#[test]
fn the_async_client_runs_in_a_current_thread_runtime() {
    let servers = serve(&tables(3));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    every_call(&runtime, &servers);
}

#[test]
fn the_async_client_runs_in_a_multi_thread_runtime_from_many_tasks() {
    let servers = serve(&tables(3));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    every_call(&runtime, &servers);
    // Its futures are `Send`: clones sample from spawned tasks at once.
    runtime.block_on(async {
        let cluster = AsyncClusterClient::new(config(addresses(&servers), DataPlane::Auto)).unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let cluster = cluster.clone();
                tokio::spawn(async move { cluster.sample(&request(16)).await })
            })
            .collect();
        for t in tasks {
            check_rows(&t.await.unwrap().unwrap(), WindowSpec::last(4), 16);
        }
    });
}

#[test]
fn a_sample_dropped_mid_reply_leaves_the_next_one_whole() {
    let servers = serve(&tables(2));
    let proxy = proxy::Proxy::start(servers[1].local_addr());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let addrs = vec![servers[0].local_addr().to_string(), proxy.addr().to_string()];
        let cluster = AsyncClusterClient::new(config(addrs, DataPlane::ShardGather)).unwrap();
        let big = request(512);
        let sizes = cluster.column_bytes(&big).await.unwrap();
        let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let mut rows = BatchRows::default();
        for round in 0..5u64 {
            // Shard 1's reply stops part way; the caller gives up on the
            // batch (drops the future) while the reply is being written
            // into its buffers.
            proxy.pass_from_shard(2000 + 3000 * round);
            {
                let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
                let call = cluster.sample_into(&big, &mut views, &mut rows);
                let outcome = tokio::time::timeout(Duration::from_millis(300), call).await;
                assert!(outcome.is_err(), "round {round}: {outcome:?}");
            }
            proxy.pass_from_shard(u64::MAX);
            // The next batch, into the same buffers, is whole.
            let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
            cluster.sample_into(&big, &mut views, &mut rows).await.unwrap();
            assert!(rows.lost.is_empty(), "round {round}: {:?}", rows.lost);
            let batch = as_batch(&columns, &rows);
            check_rows(&batch, WindowSpec::last(4), 512);
            assert!(batch.keys.iter().any(|k| k.shard == 1), "round {round}: shard 1 gave rows");
        }
    });
}

#[test]
fn dropped_inserts_and_byte_range_samples_leave_the_next_call_whole() {
    let tables = tables(2);
    let servers = serve(&tables);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        for plane in [DataPlane::ShardGather, DataPlane::ByteRangeTcp] {
            let cluster = AsyncClusterClient::new(config(addresses(&servers), plane)).unwrap();
            for i in 0..30u64 {
                // Four-step trajectories sent a step per chunk, the call
                // dropped at a different point each time.
                let id = 100 + (i % 100) as u8;
                let t = || RemoteTrajectory {
                    steps: 4,
                    columns: vec![vec![id; 4 * OBS as usize].into(), i64::from(id).to_le_bytes().repeat(4).into()],
                    priority: None,
                };
                let call = cluster.insert(WriteTarget::RoundRobin, vec![t(), t(), t()], 1);
                let _ = tokio::time::timeout(Duration::from_micros(200 * i), call).await;
                let r = request(64);
                let _ = tokio::time::timeout(Duration::from_micros(150 * i), cluster.sample(&r)).await;
            }
            // Whole calls work, and every stored trajectory is whole:
            // `check_rows` sees every valid step of a row name one id.
            let keys = cluster
                .insert(
                    WriteTarget::Shard(0),
                    vec![RemoteTrajectory {
                        steps: 2,
                        columns: vec![vec![9u8; 2 * OBS as usize].into(), 9i64.to_le_bytes().repeat(2).into()],
                        priority: None,
                    }],
                    1,
                )
                .await
                .unwrap();
            assert_eq!(keys.len(), 1);
            for _ in 0..5 {
                let batch = cluster.sample(&request(64)).await.unwrap();
                assert!(batch.lost.is_empty(), "{plane:?}: {:?}", batch.lost);
                check_rows(&batch, WindowSpec::last(4), 64);
            }
        }
    });
    for t in &tables {
        let info = t.info().unwrap();
        assert!(info.size <= 64, "{info:?}");
    }
}

#[test]
fn the_blocking_client_refuses_inside_a_runtime_and_drops_there_quietly() {
    let servers = serve(&tables(1));
    let addrs = addresses(&servers);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let outside = runtime.block_on(async {
        let client = ClusterClient::new(config(addrs.clone(), DataPlane::ShardGather)).unwrap();
        assert!(matches!(client.info(0), Err(Error::InsideRuntime)));
        let e = client.sample(&request(4)).unwrap_err();
        assert!(e.to_string().contains("use AsyncClusterClient"), "{e}");
        // Its async side works here.
        assert_eq!(client.as_async().info(0).await.unwrap().shard, 0);
        // Dropped inside the runtime: no panic.
        drop(client);
        ClusterClient::new(config(addrs, DataPlane::ShardGather)).unwrap()
    });
    // Made inside, used outside: fine.
    assert_eq!(outside.info(0).unwrap().shard, 0);
    // And from a runtime's blocking thread, refused too (blocking there is
    // allowed by tokio, but the thread belongs to the runtime).
    let refused = runtime.block_on(async move {
        tokio::task::spawn_blocking(move || matches!(outside.info(0), Err(Error::InsideRuntime))).await.unwrap()
    });
    assert!(refused);
    // The async client needs a runtime to be made in.
    let e = AsyncClusterClient::new(config(addresses(&servers), DataPlane::ShardGather)).unwrap_err();
    assert!(e.to_string().contains("inside a tokio runtime"), "{e}");
}

/// The blocking client's sampling calls run as tasks on its runtime while
/// borrowing the caller's buffers: several threads, each with buffers of
/// its own reused every batch, over both data planes; every row whole and
/// in its own thread's buffers (a task that wrote past its call, or into
/// another call's buffers, would show as a torn or foreign row).
#[test]
fn the_blocking_clients_sampling_tasks_write_only_their_callers_buffers() {
    let tables = tables(3);
    let servers = serve(&tables);
    for plane in [DataPlane::ShardGather, DataPlane::Auto] {
        let client = ClusterClient::new(config(addresses(&servers), plane)).unwrap();
        let sizes = client.column_bytes(&request(32)).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                let (client, sizes) = (&client, &sizes);
                scope.spawn(move || {
                    let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAB; n]).collect();
                    let mut rows = BatchRows::default();
                    for _ in 0..40 {
                        columns.iter_mut().for_each(|c| c.fill(0xAB));
                        let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
                        client.sample_into(&request(32), &mut views, &mut rows).unwrap();
                        check_rows(&as_batch(&columns, &rows), WindowSpec::last(4), 32);
                        let batch = client.sample(&request(8)).unwrap();
                        check_rows(&batch, WindowSpec::last(4), 8);
                    }
                });
            }
        });
    }
}
