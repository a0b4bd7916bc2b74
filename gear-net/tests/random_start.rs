//! R2D2-style random starts across shards (`ClusterSample::random_start`):
//! every row is a whole window of one trajectory beginning at a random
//! step, through both data planes (shard gather, byte ranges over TCP),
//! with `starts` telling where each row begins.

#[allow(dead_code)] // each suite uses part of the shared helpers
mod common;

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{ClusterClient, ClusterConfig, ClusterSample, DataPlane};
use std::collections::BTreeSet;

const TOKEN: &str = "random-start-token-0123456789";
const MAX_LEN: u64 = 12;
const WINDOW: u64 = 4;

/// One column `t`: trajectory `id`'s step `k` holds `id * 1000 + k`.
fn table(ids: std::ops::Range<i64>, seed: u64) -> ReplayTable {
    let spec = TableSpec::new(vec![ColumnSpec::new("t", DType::I64, vec![])], MAX_LEN, 16).unwrap();
    let table = ReplayTable::builder(spec).seed(seed).build().unwrap();
    for id in ids {
        // Trajectory 0 of each shard is shorter than the window.
        let steps = if id % 10 == 0 { WINDOW - 1 } else { MAX_LEN };
        let values: Vec<i64> = (0..steps as i64).map(|k| id * 1000 + k).collect();
        let mut t = table.writer().begin(None).unwrap();
        t.append_column(0, steps, StepValue::typed(&values)).unwrap();
        t.end().unwrap();
    }
    table
}

#[test]
fn random_starts_give_whole_windows_from_every_start_on_both_data_planes() {
    common::within("random_start", 60, || {
        let tables: Vec<ReplayTable> = (0..3i64).map(|s| table(s * 10..s * 10 + 5, s as u64 + 1)).collect();
        let servers = common::serve_uniform(&tables, TOKEN);
        for plane in [DataPlane::ShardGather, DataPlane::ByteRangeTcp] {
            let mut config = ClusterConfig::new(servers.iter().map(|s| s.local_addr().to_string()).collect(), TOKEN);
            config.data_plane = plane;
            config.seed = 11;
            let cluster = ClusterClient::new(config).unwrap();
            // The offset is not used with random starts.
            let window = WindowSpec { offset: 3, ..WindowSpec::first(WINDOW) };
            let request = ClusterSample { rows: 64, window, columns: vec![], random_start: true };
            let mut starts = BTreeSet::new();
            for _ in 0..20 {
                let batch = cluster.sample(&request).unwrap();
                assert!(batch.lost.is_empty(), "{:?}", batch.lost);
                for r in 0..64 {
                    let row = &batch.columns[0][r * WINDOW as usize * 8..(r + 1) * WINDOW as usize * 8];
                    let t: Vec<i64> = row.chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
                    let (id, start, len) = (t[0] / 1000, batch.starts[r], batch.lengths[r]);
                    if id % 10 == 0 {
                        // Shorter than the window: all its steps, padded at the tail.
                        assert_eq!((start, len), (0, WINDOW - 1), "{plane:?} row {r}");
                        assert_eq!(t, [id * 1000, id * 1000 + 1, id * 1000 + 2, 0], "{plane:?} row {r}");
                        continue;
                    }
                    assert_eq!(len, WINDOW, "{plane:?} row {r}");
                    assert!(start <= MAX_LEN - WINDOW, "{plane:?} row {r}: start {start}");
                    let want: Vec<i64> = (0..WINDOW as i64).map(|k| id * 1000 + start as i64 + k).collect();
                    assert_eq!(t, want, "{plane:?} row {r}: not the window at its start");
                    assert_eq!(batch.keys[r].shard as i64, id / 10);
                    starts.insert(start);
                }
            }
            let every: BTreeSet<u64> = (0..=MAX_LEN - WINDOW).collect();
            assert_eq!(starts, every, "{plane:?}: some starts never drawn");
        }
    });
}
