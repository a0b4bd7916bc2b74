//! Helpers shared by the data-plane tests: a two-column table (`obs`
//! bytes and an `id`), trajectories whose every byte names their id, and
//! the row check that catches torn, misplaced or unpadded windows.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, Pad, TableSpec, WindowSpec};
use gear_net::{ClusterBatch, ClusterClient, ClusterSample, ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A uniform shard server on loopback for each of `tables`, shard `s`
/// serving `tables[s]`, every call checked against `token`.
pub fn serve_uniform(tables: &[ReplayTable], token: &str) -> Vec<ServerHandle> {
    tables
        .iter()
        .enumerate()
        .map(|(s, table)| {
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s as u32, token);
            let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
            ServerHandle::start(table.clone(), &config, strategy).unwrap()
        })
        .collect()
}

/// Runs `body` on its own thread and aborts the process (naming `suite`)
/// if it has not finished after `seconds` (a hang must fail, not stall
/// CI); a panic is passed on.
pub fn within(suite: &str, seconds: u64, body: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    if let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(Duration::from_secs(seconds)) {
        eprintln!("{suite}: a test ran past its {seconds} s deadline");
        std::process::abort();
    }
    if let Err(panic) = worker.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Bytes of one step's `obs`.
pub const OBS: u64 = 24;

/// A table of `obs` (`OBS` bytes a step) and `id` (an i64 a step).
pub fn spec(max_len: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![ColumnSpec::new("obs", DType::U8, vec![OBS]), ColumnSpec::new("id", DType::I64, vec![])],
        max_len,
        capacity,
    )
    .unwrap()
}

/// A trajectory of `steps` steps whose every `obs` byte and every `id` is
/// `value`.
pub fn insert(table: &ReplayTable, value: u8, steps: u64) {
    let mut t = table.writer().begin(None).unwrap();
    t.append_column(0, steps, StepValue::bytes(&vec![value; (steps * OBS) as usize])).unwrap();
    let ids: Vec<i64> = vec![i64::from(value); steps as usize];
    t.append_column(1, steps, StepValue::typed(&ids)).unwrap();
    t.end().unwrap();
}

/// Every row: `obs` bytes of valid steps equal the row's id, padding is
/// zero where the window says, probabilities and weights are in (0, 1].
/// Returns each row's id (`None` for a window with no steps, which is
/// all padding).
pub fn check_rows(batch: &ClusterBatch, window: WindowSpec, rows: usize) -> Vec<Option<i64>> {
    assert_eq!(batch.keys.len(), rows);
    assert_eq!(batch.columns.len(), 2);
    let l = window.len as usize;
    let mut ids = Vec::with_capacity(rows);
    for r in 0..rows {
        let n = batch.lengths[r] as usize;
        assert!(n <= l, "row {r}: {n} steps");
        let dst = if window.pad == Pad::Head { l - n } else { 0 };
        let obs = &batch.columns[0][r * l * OBS as usize..(r + 1) * l * OBS as usize];
        let id_bytes = &batch.columns[1][r * l * 8..(r + 1) * l * 8];
        if n == 0 {
            assert!(obs.iter().chain(id_bytes).all(|&b| b == 0), "row {r}: an empty window is all padding");
            ids.push(None);
            continue;
        }
        let id = i64::from_le_bytes(id_bytes[dst * 8..dst * 8 + 8].try_into().unwrap());
        for step in 0..l {
            let valid = step >= dst && step < dst + n;
            let o = &obs[step * OBS as usize..(step + 1) * OBS as usize];
            let i = i64::from_le_bytes(id_bytes[step * 8..step * 8 + 8].try_into().unwrap());
            if valid {
                assert!(o.iter().all(|&b| i64::from(b) == id), "row {r} step {step}: torn obs {o:?} for id {id}");
                assert_eq!(i, id, "row {r} step {step}: torn id");
            } else {
                assert!(o.iter().all(|&b| b == 0) && i == 0, "row {r} step {step}: padding not zero");
            }
        }
        assert!(batch.probabilities[r] > 0.0 && batch.probabilities[r] <= 1.0);
        assert!(batch.weights[r] > 0.0 && batch.weights[r] <= 1.0);
        ids.push(Some(id));
    }
    ids
}

/// Two tables of 16 slots, full: trajectory ids 1..=16 on table 0 and
/// 101..=116 on table 1, 4 steps each. Small, so that writers recycle every
/// slot many times a second.
pub fn recycled_tables() -> Vec<ReplayTable> {
    let tables: Vec<ReplayTable> =
        (0..2u64).map(|s| ReplayTable::builder(spec(4, 16)).seed(s).build().unwrap()).collect();
    for (s, t) in tables.iter().enumerate() {
        for i in 0..16u8 {
            insert(t, 1 + i + 100 * s as u8, 4);
        }
    }
    tables
}

/// One writer thread per table, inserting 4-step trajectories (ids below
/// 100 on table 0, from 100 on table 1) until `stop`.
pub fn recycling_writers(tables: &[ReplayTable], stop: &Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    tables
        .iter()
        .enumerate()
        .map(|(s, t)| {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut v = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    v = v.wrapping_add(1).max(1) % 100;
                    insert(&t, v.max(1) + 100 * s as u8, 4);
                    // Leave the (two-core) machine to the readers too.
                    std::thread::sleep(Duration::from_micros(300));
                }
            })
        })
        .collect()
}

/// Samples `request` until 150 batches came or 20 s passed, handing each
/// whole batch to `check`. A batch whose rows writers overwrote under every
/// redraw is refused ("overwritten"), which is counted; any other error
/// fails. Returns (batches, refused).
pub fn sample_through_churn(
    cluster: &ClusterClient,
    request: &ClusterSample,
    mut check: impl FnMut(&ClusterBatch),
) -> (u32, u32) {
    let (mut done, mut refused) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while done < 150 && Instant::now() < deadline {
        match cluster.sample(request) {
            Ok(batch) => {
                check(&batch);
                done += 1;
            }
            // Writers may win every redraw of a row; that is refused, never torn.
            Err(e) => {
                assert!(e.to_string().contains("overwritten"), "{e}");
                refused += 1;
            }
        }
    }
    (done, refused)
}
