//! Rows a shard sends straight from its table's memory (`send_from_table`,
//! the cluster client's shard-gather draw) never reach a batch torn: when
//! writers reuse a row's slot while its bytes are still on the way, the
//! shard finds it after the send and the client asks that shard again for
//! gathered rows in place of the overwritten ones.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod proxy;

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{ClusterBatch, ClusterClient, ClusterConfig, ClusterSample, ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use proxy::Proxy;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "sample-from-table-token-01";
/// Bytes of one step's `obs`: a row's window is a slice of the table's
/// region of its own (at least the shard's 64 KiB threshold).
const OBS: u64 = 64 << 10;
/// Steps of every trajectory, and of the sampled window.
const STEPS: u64 = 4;

fn table(capacity: u64) -> ReplayTable {
    let spec = TableSpec::new(
        vec![ColumnSpec::new("obs", DType::U8, vec![OBS]), ColumnSpec::new("id", DType::I64, vec![])],
        STEPS,
        capacity,
    )
    .unwrap();
    ReplayTable::builder(spec).seed(5).build().unwrap()
}

/// A trajectory whose every `obs` byte and every `id` is `value`.
fn insert(table: &ReplayTable, value: u8) {
    let mut t = table.writer().begin(None).unwrap();
    t.append_column(0, STEPS, StepValue::bytes(&vec![value; (STEPS * OBS) as usize])).unwrap();
    t.append_column(1, STEPS, StepValue::typed(&vec![i64::from(value); STEPS as usize])).unwrap();
    t.end().unwrap();
}

fn serve(table: &ReplayTable) -> ServerHandle {
    let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 0, TOKEN);
    let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    ServerHandle::start(table.clone(), &config, strategy).unwrap()
}

fn client(addr: std::net::SocketAddr) -> ClusterClient {
    let mut config = ClusterConfig::new(vec![addr.to_string()], TOKEN);
    config.call_timeout = Duration::from_secs(30);
    ClusterClient::new(config).unwrap()
}

fn request(rows: u64) -> ClusterSample {
    ClusterSample { rows, window: WindowSpec::last(STEPS), columns: vec![], random_start: false }
}

/// Each row's id, after checking that every byte of the row holds it.
fn row_ids(batch: &ClusterBatch) -> Vec<i64> {
    let rows = batch.keys.len();
    let (obs, ids) = (&batch.columns[0], &batch.columns[1]);
    assert_eq!(obs.len() as u64, rows as u64 * STEPS * OBS);
    (0..rows)
        .map(|r| {
            assert_eq!(batch.lengths[r], STEPS);
            let row_ids = &ids[r * STEPS as usize * 8..][..STEPS as usize * 8];
            let id = i64::from_le_bytes(row_ids[..8].try_into().unwrap());
            for step in 0..STEPS as usize {
                assert_eq!(i64::from_le_bytes(row_ids[step * 8..][..8].try_into().unwrap()), id, "row {r}: torn id");
            }
            let row = &obs[r * (STEPS * OBS) as usize..][..(STEPS * OBS) as usize];
            assert!(row.iter().all(|&b| i64::from(b) == id), "row {r}: torn obs for id {id}");
            id
        })
        .collect()
}

/// The shard's count of rows found overwritten after their send.
fn overwritten(server: &ServerHandle) -> u64 {
    let metrics = server.tables().metrics_text();
    let line = metrics.lines().find(|l| l.starts_with("gear_table_rpc_overwritten_rows_total{")).unwrap();
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// A shard over a table of eight trajectories (ids 1 to 8) behind a proxy,
/// and a draw of 128 rows whose reply the proxy holds after its first MiB:
/// 128 rows of 256 KiB, 32 MiB, far more than the client's stream window
/// and the sockets hold, so most of the reply is still in the table.
/// Returns once it is held; `proxy.pass_from_shard(u64::MAX)` lets it go.
fn a_held_reply() -> (ReplayTable, ServerHandle, Proxy, std::thread::JoinHandle<gear_net::Result<ClusterBatch>>) {
    let table = table(8);
    for v in 1..=8 {
        insert(&table, v);
    }
    let server = serve(&table);
    let proxy = Proxy::start(server.local_addr());
    let cluster = client(proxy.addr());
    // The connection and the shard's masses, before the proxy holds.
    let ids = row_ids(&cluster.sample(&request(2)).unwrap());
    assert!(ids.iter().all(|id| (1..=8).contains(id)), "{ids:?}");
    assert_eq!(overwritten(&server), 0);
    proxy.pass_from_shard(1 << 20);
    let sampling = std::thread::spawn(move || cluster.sample(&request(128)));
    let held_by = Instant::now() + Duration::from_secs(30);
    while proxy.budget_left() > 0 {
        assert!(Instant::now() < held_by, "the reply never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    (table, server, proxy, sampling)
}

#[test]
fn rows_overwritten_on_the_wire_are_asked_for_again() {
    common::within("sample_from_table", 90, || {
        let (table, server, proxy, sampling) = a_held_reply();
        // Writers reuse every slot (FIFO eviction) while the reply waits.
        for v in 11..=18 {
            insert(&table, v);
        }
        proxy.pass_from_shard(u64::MAX);
        let batch = sampling.join().unwrap().unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        let ids = row_ids(&batch);
        // Only the new trajectories are stored: the rows came from the ask
        // made after the shard found its first reply overwritten.
        assert!(ids.iter().all(|id| (11..=18).contains(id)), "{ids:?}");
        assert_eq!(overwritten(&server), 128);
    });
}

#[test]
fn only_the_rows_overwritten_on_the_wire_are_drawn_again() {
    common::within("sample_from_table", 90, || {
        let (table, server, proxy, sampling) = a_held_reply();
        // Two writers reuse the two oldest slots (ids 1 and 2, FIFO) while
        // the reply waits; the rows of ids 3 to 8 stay as they were sent.
        let drawn_before = table.info().unwrap().samples;
        insert(&table, 11);
        insert(&table, 12);
        proxy.pass_from_shard(u64::MAX);
        let batch = sampling.join().unwrap().unwrap();
        assert!(batch.lost.is_empty(), "{:?}", batch.lost);
        let ids = row_ids(&batch);
        assert!(ids.iter().all(|id| (3..=8).contains(id) || *id == 11 || *id == 12), "{ids:?}");
        let redrawn = overwritten(&server);
        assert!((1..128).contains(&redrawn), "{redrawn} of 128 rows overwritten");
        // One draw of 128 rows, then one of as many rows as were overwritten
        // (a whole second ask would have drawn 128 more).
        assert_eq!(table.info().unwrap().samples - drawn_before, redrawn, "rows drawn again");
        assert!(batch.keys.iter().all(|k| k.shard == 0) && batch.probabilities.iter().all(|&p| p > 0.0));
    });
}

#[test]
fn batches_sampled_while_writers_recycle_every_slot_are_never_torn() {
    common::within("sample_from_table", 90, || {
        let table = table(6);
        for v in 1..=6 {
            insert(&table, v);
        }
        let server = serve(&table);
        let cluster = client(server.local_addr());
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut v = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    v = v % 200 + 1;
                    insert(&table, v);
                    // Leave the (two-core) machine to the reader too.
                    std::thread::sleep(Duration::from_micros(300));
                }
            })
        };
        let until = Instant::now() + Duration::from_secs(3);
        let (mut batches, mut refused) = (0, 0);
        while Instant::now() < until || batches < 20 {
            match cluster.sample(&request(24)) {
                Ok(batch) => {
                    assert!(batch.lost.is_empty(), "{:?}", batch.lost);
                    row_ids(&batch);
                    batches += 1;
                }
                // The gathered ask redraws torn rows; writers may still win
                // every redraw, which is refused, never torn.
                Err(e) => {
                    assert!(e.to_string().contains("overwritten"), "{e}");
                    refused += 1;
                    assert!(refused < 1000, "{refused} batches refused, {batches} drawn");
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let sent_again = overwritten(&server);
        eprintln!("{batches} batches ({refused} refused); {sent_again} rows found overwritten after their send");
    });
}
