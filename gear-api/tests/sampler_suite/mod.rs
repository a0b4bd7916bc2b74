//! The device sampler's test suite, written once over gear-core's
//! `DeviceApi`: run on gear-device's CPU device in every CI run
//! (`tests/device.rs`) and on CUDA on a GPU (`tests/cuda.rs`, packed by
//! `cargo xtask gpu-test`). Batches gathered on the device must equal, byte
//! for byte, what the CPU collector gathers for the same keys and what the
//! CPU `Sampler` returned for them; the ring, prefetch, trainer-stream
//! ordering, the device cache, selection on the device and the change log
//! that keeps its mirror in step all run through the public API.
//!
//! A trainer here is a stream running gear-device's `TrainStep` kernel over
//! each batch, so a sampler that forgot an ordering rule (a batch
//! rewritten while the trainer reads it, a trainer reading before the
//! gather) is caught by the CPU device.
#![allow(dead_code)]

use gear_api::gear_sampler::{StrategyKind, StrategyParams};
use gear_api::{DeviceSampler, DeviceSamplerOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{Collector, ColumnSpec, DType, Device, DeviceApi, GatherRow, Pad, SlotKey, TableSpec, WindowSpec};
use gear_device::{DevicePrioritized, TrainStep};
use std::collections::HashMap;
use std::time::Duration;

pub fn spec(t: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![37]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F64, vec![2]),
        ],
        t,
        capacity,
    )
    .unwrap()
}

/// Writes a trajectory of `len` steps whose bytes encode (`id`, step).
pub fn write_traj(table: &ReplayTable, id: u8, len: u64) -> SlotKey {
    let mut traj = table.writer().begin(None).unwrap();
    for s in 0..len {
        let obs: Vec<u8> = (0..37u8).map(|i| id.wrapping_mul(31) ^ (s as u8).wrapping_mul(7) ^ i).collect();
        traj.append_step(&[
            StepValue::typed(&obs),
            StepValue::typed(&[i32::from(id) * 1000 + s as i32]),
            StepValue::typed(&[s as f64, f64::from(id)]),
        ])
        .unwrap();
    }
    traj.end().unwrap()
}

fn sampler<A: DeviceApi>(
    dev: &A::Device,
    table: &ReplayTable,
    config: SampleConfig,
    options: DeviceSamplerOptions<A>,
) -> DeviceSampler<A> {
    table.device_sampler(dev, config, options).unwrap()
}

/// Checks the sampler's last batch against the CPU collector gathering
/// the same keys through the sampler's table view, and against the rows the
/// CPU `Sampler` returned for those keys (`cpu_rows`: key to bytes per
/// column). Returns the keys.
pub fn check_last_batch<A: DeviceApi>(
    sampler: &DeviceSampler<A>,
    lens: &HashMap<SlotKey, u64>,
    cpu_rows: &HashMap<SlotKey, Vec<Vec<u8>>>,
    what: &str,
) -> Vec<SlotKey> {
    let batch = sampler.batch();
    let layout = batch.layout().clone();
    assert_eq!(batch.rows(), layout.rows(), "{what}");
    assert_eq!(batch.probabilities().len(), layout.rows(), "{what}");
    assert_eq!(batch.weights().len(), layout.rows(), "{what}");
    let rows: Vec<GatherRow> = batch.keys().iter().map(|k| GatherRow::whole(k.slot, lens[k])).collect();
    let cpu = gear_cpu::CpuCollector::with_threads(1);
    let mut reference = cpu.alloc_batch(&layout).unwrap();
    cpu.gather(&sampler.table_view(), &rows, &layout, &mut reference).unwrap();
    assert_eq!(batch.lengths(), reference.lengths(), "{what}: valid lengths");
    assert_eq!(
        batch.device_batch().lengths_from_device().unwrap(),
        reference.lengths(),
        "{what}: lengths the kernel wrote"
    );
    for c in 0..batch.columns() {
        let got = batch.column_to_host(c).unwrap();
        assert_eq!(got.len() as u64, batch.column_at(c).bytes(), "{what}");
        assert!(got == reference.column(c), "{what}: column {c} differs from the cpu collector");
        let row_bytes = layout.row_bytes(c) as usize;
        for (r, key) in batch.keys().iter().enumerate() {
            if let Some(want) = cpu_rows.get(key) {
                assert!(
                    got[r * row_bytes..][..row_bytes] == want[c][..],
                    "{what}: row {r} ({key}) column {c} differs from the cpu sampler"
                );
            }
        }
    }
    batch.keys().to_vec()
}

/// Rows the CPU `Sampler` returns, by key, over `draws` batches.
fn cpu_sampler_rows(table: &ReplayTable, config: SampleConfig, draws: usize) -> HashMap<SlotKey, Vec<Vec<u8>>> {
    let mut sampler = table.sampler(config).unwrap();
    let mut rows = HashMap::new();
    for _ in 0..draws {
        let batch = sampler.sample().unwrap();
        let layout = batch.layout().clone();
        for (r, key) in batch.keys().iter().enumerate() {
            let cols = (0..layout.columns().len())
                .map(|c| {
                    let n = layout.row_bytes(c) as usize;
                    batch.column_at(c).bytes[r * n..][..n].to_vec()
                })
                .collect();
            rows.insert(*key, cols);
        }
    }
    rows
}

/// Queues a trainer step over the sampler's last batch on `trainer`.
fn train_on<A: DeviceApi>(step: &TrainStep<A>, sampler: &DeviceSampler<A>, trainer: &A::Stream, compute: Duration) {
    let b = sampler.batch();
    let inputs: Vec<&A::Buffer> = (0..b.columns()).map(|c| b.column_at(c).memory).collect();
    step.queue(trainer, &inputs, compute).unwrap();
}

pub fn device_batches_equal_the_cpu_gather_byte_for_byte<A: DeviceApi>(dev: &A::Device) {
    let table = ReplayTable::builder(spec(12, 16)).seed(7).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..16u8 {
        let len = 1 + u64::from(id) % 12;
        lens.insert(write_traj(&table, id, len), len);
    }
    let windows = [
        WindowSpec::last(5),
        WindowSpec { offset: 2, len: 6, pad: Pad::Tail },
        WindowSpec { offset: -3, len: 8, pad: Pad::Head },
        WindowSpec::whole(12),
    ];
    for (w, window) in windows.into_iter().enumerate() {
        for columns in [vec![], vec!["reward".to_owned(), "obs".to_owned()]] {
            let config = SampleConfig::new(9, window).columns(columns.clone());
            let cpu_rows = cpu_sampler_rows(&table, config.clone(), 20);
            let mut s = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default());
            for round in 0..10 {
                s.sample().unwrap();
                check_last_batch(&s, &lens, &cpu_rows, &format!("window {w} columns {columns:?} round {round}"));
            }
        }
    }
    assert!(table.info().unwrap().bytes_gathered > 0);
}

pub fn samplers_share_one_registration_and_accept_a_stream<A: DeviceApi>(dev: &A::Device) {
    let table = ReplayTable::builder(spec(12, 8)).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 12), 12);
    }
    let config = SampleConfig::new(4, WindowSpec::last(3));
    // A second sampler of the same table in the same process must not
    // register the memory again (the device would refuse).
    let mut a = sampler(dev, &table, config.clone(), DeviceSamplerOptions::<A>::default());
    let stream = a.device().new_stream().unwrap();
    // A ring of one gathers on the trainer's stream itself.
    let mut b =
        sampler(dev, &table, config.clone(), DeviceSamplerOptions::<A>::default().stream(stream.clone()).ring(1));
    assert!(dev.same_stream(b.stream(), &stream));
    let none = HashMap::new();
    for round in 0..5 {
        a.sample().unwrap();
        b.sample().unwrap().wait_on(&stream).unwrap();
        check_last_batch(&a, &lens, &none, &format!("a round {round}"));
        check_last_batch(&b, &lens, &none, &format!("b round {round}"));
    }
    // Dropping every sampler unregisters; a new one registers afresh.
    drop(a);
    drop(b);
    let mut c = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default());
    c.sample().unwrap();
    check_last_batch(&c, &lens, &none, "after re-registration");
}

pub fn a_shared_memory_queue_retires_what_the_device_sampled<A: DeviceApi>(dev: &A::Device) {
    let name = format!("gear-test-device-queue-{}-{}", A::NAME, std::process::id());
    let table = ReplayTable::builder(spec(12, 8)).shared_memory(name).queue(8).unwrap().build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 3 + u64::from(id)), 3 + u64::from(id));
    }
    let mut s = sampler(dev, &table, SampleConfig::new(4, WindowSpec::last(4)), DeviceSamplerOptions::<A>::default());
    let none = HashMap::new();
    s.sample().unwrap();
    assert!(!s.is_prefetching(), "a queue must not take rows out ahead of the trainer");
    let mut seen = check_last_batch(&s, &lens, &none, "first half");
    s.sample().unwrap();
    seen.extend(check_last_batch(&s, &lens, &none, "second half"));
    seen.sort();
    let mut all: Vec<SlotKey> = lens.keys().copied().collect();
    all.sort();
    assert_eq!(seen, all, "a queue hands out every trajectory exactly once");
    let info = table.info().unwrap();
    assert_eq!((info.retired, info.size), (8, 0));
}

/// With a ring, `sample()` returns the batch gathered since the previous
/// call and starts the next into another buffer: the returned batch is
/// still intact once that prefetch has finished, every batch equals the CPU
/// gather of its keys, and a trainer reading each batch on its own stream
/// is ordered after the gather and before the buffer's next gather, for
/// host and device selection.
pub fn prefetched_batches_stay_intact_and_correct<A: DeviceApi>(dev: &A::Device) {
    let none = HashMap::new();
    for kind in [StrategyKind::Uniform, StrategyKind::Fifo] {
        let table = ReplayTable::builder(spec(12, 16)).sampler_kind(kind, Default::default()).seed(3).build().unwrap();
        let mut lens = HashMap::new();
        for id in 0..16u8 {
            let len = 2 + u64::from(id) % 11;
            lens.insert(write_traj(&table, id, len), len);
        }
        for ring in [2usize, 3] {
            for with_stream in [false, true] {
                let config = SampleConfig::new(6, WindowSpec { offset: -4, len: 7, pad: Pad::Head });
                let mut options = DeviceSamplerOptions::<A>::default().ring(ring);
                let trainer = dev.new_stream().unwrap();
                if with_stream {
                    options = options.stream(trainer.clone());
                }
                let mut s = sampler(dev, &table, config, options);
                assert_eq!(s.selects_on_device(), kind == StrategyKind::Uniform);
                let step = TrainStep::<A>::new(dev).unwrap();
                assert_eq!(s.ring_len(), ring);
                for round in 0..8 {
                    let what = format!("{kind} ring {ring} stream {with_stream} round {round}");
                    s.sample().unwrap();
                    assert!(s.is_prefetching() || kind == StrategyKind::Fifo, "{what}: the next batch is gathered");
                    if with_stream {
                        // The trainer reads the batch while the next one is
                        // gathered into another buffer.
                        train_on(&step, &s, &trainer, Duration::from_micros(200));
                    }
                    let before: Vec<Vec<u8>> =
                        (0..s.batch().columns()).map(|c| s.batch().column_to_host(c).unwrap()).collect();
                    // Let the prefetch finish: it must not have touched this batch.
                    s.device().synchronize().unwrap();
                    for (c, b) in before.iter().enumerate() {
                        assert!(s.batch().column_to_host(c).unwrap() == *b, "{what}: column {c} overwritten");
                    }
                    check_last_batch(&s, &lens, &none, &what);
                }
                // Batches and trainer steps back to back, with no host wait
                // in between: only the sampler's events order them.
                let keys: Vec<Vec<SlotKey>> = (0..6)
                    .map(|_| {
                        s.sample().unwrap();
                        if with_stream {
                            train_on(&step, &s, &trainer, Duration::from_micros(100));
                        }
                        s.batch().keys().to_vec()
                    })
                    .collect();
                dev.stream_synchronize(&trainer).unwrap();
                assert!(keys.iter().all(|k| k.len() == 6));
                check_last_batch(&s, &lens, &none, &format!("{kind} ring {ring} stream {with_stream}: back to back"));
            }
        }
    }
}

/// The device cache through the sampler: trajectories sampled at least
/// `admit_after` times are copied to device memory by the fill thread and
/// later batches read them from there; every batch still equals the CPU
/// gather of its keys, also after slots were reused by new trajectories
/// (a stale cached copy is never served).
pub fn hot_trajectories_are_gathered_from_the_device_cache<A: DeviceApi>(dev: &A::Device) {
    let table = ReplayTable::builder(spec(12, 8)).seed(5).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 4 + u64::from(id)), 4 + u64::from(id));
    }
    let config = SampleConfig::new(6, WindowSpec::last(5));
    let mut s = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default().cache(8, 2));
    let none = HashMap::new();
    let mut served = 0;
    for round in 0..200 {
        s.sample().unwrap();
        check_last_batch(&s, &lens, &none, &format!("round {round}"));
        served += s.batch().device_batch().cached_rows();
        if served > 20 && s.cached_trajectories() == 8 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(s.cached_trajectories() > 0, "the fill thread admitted nothing");
    assert!(served > 0, "no row was gathered from the device cache");
    // New trajectories evict old ones and reuse their slots, after the
    // batch prefetched meanwhile was copied and checked (it would be on a
    // GPU by now): its rows were copied cleanly, so they are kept (see
    // `rows_evicted_after_a_clean_copy_are_kept`) and hold the trajectories
    // as they were before the reuse, served from the cache or from host
    // memory alike. (A GPU run caught this test comparing them with the
    // reused slots.)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !s.prefetch_checked() {
        assert!(std::time::Instant::now() < deadline, "the prefetched copy was never checked");
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = rows_before_reuse(&s, &lens);
    for id in 100..106u8 {
        lens.insert(write_traj(&table, id, 9), 9);
    }
    let redrawn = s.redrawn_rows();
    s.sample().unwrap();
    assert_eq!(s.redrawn_rows(), redrawn, "rows copied cleanly before the reuse were redrawn");
    let batch = s.batch();
    let columns: Vec<Vec<u8>> = (0..batch.columns()).map(|c| batch.column_to_host(c).unwrap()).collect();
    for (r, key) in batch.keys().iter().enumerate() {
        for (c, (got, want)) in columns.iter().zip(&before[key]).enumerate() {
            let row_bytes = batch.layout().row_bytes(c) as usize;
            assert!(
                got[r * row_bytes..][..row_bytes] == want[..],
                "prefetched before the reuse: row {r} ({key}) column {c}"
            );
        }
    }
    for round in 0..40 {
        s.sample().unwrap();
        check_last_batch(&s, &lens, &none, &format!("after reuse, round {round}"));
    }
}

/// Every stored trajectory's row (key to bytes per column) as the CPU
/// collector gathers it now, in the sampler's batch layout.
fn rows_before_reuse<A: DeviceApi>(
    sampler: &DeviceSampler<A>,
    lens: &HashMap<SlotKey, u64>,
) -> HashMap<SlotKey, Vec<Vec<u8>>> {
    let layout = sampler.layout().clone();
    let cpu = gear_cpu::CpuCollector::with_threads(1);
    let mut out = cpu.alloc_batch(&layout).unwrap();
    let keys: Vec<SlotKey> = lens.keys().copied().collect();
    let mut rows = HashMap::new();
    for chunk in keys.chunks(layout.rows()) {
        // A short chunk repeats its first key to fill the layout.
        let gather: Vec<GatherRow> = (0..layout.rows())
            .map(|i| *chunk.get(i).unwrap_or(&chunk[0]))
            .map(|k| GatherRow::whole(k.slot, lens[&k]))
            .collect();
        cpu.gather(&sampler.table_view(), &gather, &layout, &mut out).unwrap();
        for (i, key) in chunk.iter().enumerate() {
            let columns = (0..layout.columns().len())
                .map(|c| {
                    let row_bytes = layout.row_bytes(c) as usize;
                    out.column(c)[i * row_bytes..][..row_bytes].to_vec()
                })
                .collect();
            rows.insert(*key, columns);
        }
    }
    rows
}

/// Selection on the device through the public API: a device strategy
/// (`DevicePrioritized`) as the table's sampling strategy; the table's
/// change log feeds its mirror inserts and priority updates before each
/// draw, so a batch drawn after `update_priorities` follows the new
/// priorities. Slots with priority 0 are never drawn.
pub fn device_selection_follows_priority_updates<A: DeviceApi>(dev: &A::Device) {
    let strategy = DevicePrioritized::<A>::new(dev, 1.0, 0.0).unwrap();
    let table = ReplayTable::builder(spec(12, 8)).sampler(strategy).seed(9).build().unwrap();
    let mut lens = HashMap::new();
    let mut keys = Vec::new();
    for id in 0..8u8 {
        let mut traj = table.writer().begin(Some(if id % 2 == 0 { 0.0 } else { 1.0 })).unwrap();
        for s in 0..6u64 {
            let obs: Vec<u8> = (0..37u8).map(|i| id ^ i ^ s as u8).collect();
            traj.append_step(&[
                StepValue::typed(&obs),
                StepValue::typed(&[i32::from(id)]),
                StepValue::typed(&[s as f64, f64::from(id)]),
            ])
            .unwrap();
        }
        let key = traj.end().unwrap();
        lens.insert(key, 6);
        keys.push(key);
    }
    let mut s =
        sampler(dev, &table, SampleConfig::new(16, WindowSpec::last(4)), DeviceSamplerOptions::<A>::default().ring(1));
    assert!(s.selects_on_device());
    let none = HashMap::new();
    for round in 0..10 {
        s.sample().unwrap();
        let drawn = check_last_batch(&s, &lens, &none, &format!("round {round}"));
        assert!(drawn.iter().all(|k| k.slot % 2 == 1), "a zero-priority slot was drawn: {drawn:?}");
    }
    // Only keys[2] keeps a weight: every later row is that trajectory.
    let updates: Vec<(SlotKey, f64)> =
        keys.iter().enumerate().map(|(i, &k)| (k, if i == 2 { 5.0 } else { 0.0 })).collect();
    assert_eq!(table.update_priorities(&updates).unwrap(), 8);
    for round in 0..5 {
        s.sample().unwrap();
        let drawn = check_last_batch(&s, &lens, &none, &format!("after update, round {round}"));
        assert!(drawn.iter().all(|&k| k == keys[2]), "drawn after the update: {drawn:?}");
        assert!(s.batch().probabilities().iter().all(|&p| (p - 1.0).abs() < 1e-12));
    }
    // A host sampler of the same table draws through the strategy's own
    // device priorities, with the table lock released.
    let mut host = table.sampler(SampleConfig::new(8, WindowSpec::last(4))).unwrap();
    assert!(host.sample().unwrap().keys().iter().all(|&k| k == keys[2]));
}

/// Writes `priorities.len()` trajectories of 5 steps with these priorities.
fn write_with_priorities(table: &ReplayTable, priorities: &[f64]) -> (Vec<SlotKey>, HashMap<SlotKey, u64>) {
    let mut keys = Vec::new();
    let mut lens = HashMap::new();
    for (id, &p) in priorities.iter().enumerate() {
        let mut traj = table.writer().begin(Some(p)).unwrap();
        for s in 0..5u64 {
            let obs: Vec<u8> = (0..37u8).map(|i| (id as u8) ^ i ^ s as u8).collect();
            traj.append_step(&[
                StepValue::typed(&obs),
                StepValue::typed(&[id as i32]),
                StepValue::typed(&[s as f64, id as f64]),
            ])
            .unwrap();
        }
        let key = traj.end().unwrap();
        lens.insert(key, 5);
        keys.push(key);
    }
    (keys, lens)
}

/// Tables built with the ordinary strategies select on the device without
/// asking (uniform, prioritized, max-heap), with the host strategy's
/// probabilities and weights; FIFO, a device cache and
/// `host_selection(true)` select on the host.
pub fn builtin_strategies_select_on_the_device_with_the_host_weights<A: DeviceApi>(dev: &A::Device) {
    let priorities = [1.0, 2.0, 3.0, 0.5, 4.0, 6.0, 0.25, 8.0];
    let params = StrategyParams { alpha: 0.7, beta: 0.5, stratified: true };
    for kind in [StrategyKind::Uniform, StrategyKind::Prioritized, StrategyKind::MaxHeap, StrategyKind::Fifo] {
        let table = ReplayTable::builder(spec(12, 8)).sampler_kind(kind, params).seed(21).build().unwrap();
        let (keys, lens) = write_with_priorities(&table, &priorities);
        let mass: Vec<f64> =
            priorities.iter().map(|&p| if kind == StrategyKind::Uniform { 1.0 } else { p.powf(0.7) }).collect();
        let total: f64 = mass.iter().sum();
        let min = mass.iter().copied().fold(f64::INFINITY, f64::min);
        let config = SampleConfig::new(64, WindowSpec::last(4));
        let mut s = sampler(dev, &table, config.clone(), DeviceSamplerOptions::<A>::default());
        assert_eq!(s.selects_on_device(), kind != StrategyKind::Fifo, "{kind}");
        let none = HashMap::new();
        for round in 0..5 {
            s.sample().unwrap();
            let drawn = check_last_batch(&s, &lens, &none, &format!("{kind} round {round}"));
            let batch = s.batch();
            for (r, key) in drawn.iter().enumerate() {
                let i = keys.iter().position(|k| k == key).expect("a written key");
                let (p, w) = (batch.probabilities()[r], batch.weights()[r]);
                match kind {
                    StrategyKind::Uniform => assert_eq!((p, w), (1.0 / 8.0, 1.0), "{kind}"),
                    StrategyKind::Prioritized => {
                        assert!((p - mass[i] / total).abs() < 1e-12, "{kind}: P({i}) = {p}");
                        assert!((w - (min / mass[i]).powf(0.5)).abs() < 1e-12, "{kind}: weight of {i} = {w}");
                    }
                    StrategyKind::MaxHeap => {
                        assert_eq!((p, w), (1.0, 1.0));
                        // 8 distinct priorities: rows are the ranking, repeated.
                        let mut order: Vec<usize> = (0..8).collect();
                        order.sort_by(|&a, &b| priorities[b].total_cmp(&priorities[a]));
                        assert_eq!(i, order[r % 8], "{kind}: row {r}");
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(s.device_batches() > 0, kind != StrategyKind::Fifo, "{kind}");
        let cached = sampler(dev, &table, config.clone(), DeviceSamplerOptions::<A>::default().cache(4, 1));
        assert!(!cached.selects_on_device(), "{kind}: a device cache selects on the host");
        let host = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default().host_selection(true));
        assert!(!host.selects_on_device());
    }
}

/// Priority updates made through another handle of a shared table (as
/// another process would) reach the device mirror before the next draw;
/// when every priority is zero the device draws nothing and the host draws
/// the rows (uniformly, as the strategy does), so batches keep coming.
pub fn device_selection_follows_updates_from_another_handle<A: DeviceApi>(dev: &A::Device) {
    let name = format!("gear-test-device-devsel-{}-{}", A::NAME, std::process::id());
    let params = StrategyParams { alpha: 1.0, beta: 0.0, stratified: false };
    let table = ReplayTable::builder(spec(12, 8))
        .sampler_kind(StrategyKind::Prioritized, params)
        .shared_memory(name.clone())
        .build()
        .unwrap();
    let (keys, lens) = write_with_priorities(&table, &[1.0; 8]);
    let other = ReplayTable::attach(&name, Default::default()).unwrap();
    let mut s = sampler(dev, &table, SampleConfig::new(32, WindowSpec::last(4)), DeviceSamplerOptions::<A>::default());
    assert!(s.selects_on_device());
    let none = HashMap::new();
    s.sample().unwrap();
    let only = |i: usize| -> Vec<(SlotKey, f64)> {
        keys.iter().enumerate().map(|(j, &k)| (k, if j == i { 3.0 } else { 0.0 })).collect()
    };
    for (round, i) in [5usize, 2, 7].into_iter().enumerate() {
        assert_eq!(other.update_priorities(&only(i)).unwrap(), 8);
        // The batch prefetched before the update may still hold old rows;
        // the one drawn after it follows the update.
        s.sample().unwrap();
        s.sample().unwrap();
        let drawn = check_last_batch(&s, &lens, &none, &format!("round {round}"));
        assert!(drawn.iter().all(|&k| k == keys[i]), "round {round}: {drawn:?}");
        assert!(s.batch().probabilities().iter().all(|&p| p == 1.0));
    }
    let before = s.device_batches();
    let zeros: Vec<(SlotKey, f64)> = keys.iter().map(|&k| (k, 0.0)).collect();
    assert_eq!(other.update_priorities(&zeros).unwrap(), 8);
    s.sample().unwrap();
    s.sample().unwrap();
    let drawn = check_last_batch(&s, &lens, &none, "all zero");
    assert_eq!(drawn.len(), 32);
    assert!(s.batch().probabilities().iter().all(|&p| p == 1.0 / 8.0), "the strategy's uniform fallback");
    assert!(s.device_batches() > before, "still drawn on the device first");
}

/// Another thread of the process updating priorities in a loop, so the
/// table lock is held most of the time (as writers of a busy table hold
/// it): a wait on the lock whose deadline has passed then times out.
struct LockTraffic {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl LockTraffic {
    /// Updates `keys` to `priority` (20 000 updates a call) until dropped.
    fn start(table: &ReplayTable, keys: &[SlotKey], priority: f64) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, flag) = (table.clone(), stop.clone());
        let updates: Vec<(SlotKey, f64)> = keys.iter().cycle().take(20_000).map(|&k| (k, priority)).collect();
        let thread = std::thread::spawn(move || {
            let mut calls = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                t.update_priorities(&updates).unwrap();
                calls += 1;
            }
            calls
        });
        LockTraffic { stop, thread: Some(thread) }
    }
}

impl Drop for LockTraffic {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A prefetched batch is admitted with no time to wait; redrawing its rows
/// when it is finished must get the finishing call's timeout. Every
/// priority zero makes the device draw no row, so each prefetched batch is
/// redrawn on the host, while another thread keeps the table lock busy: it
/// once failed with `Timeout` because its deadline was the instant it was
/// started (a lock that was not free at once timed out).
pub fn redraws_of_a_prefetched_batch_get_the_next_calls_time<A: DeviceApi>(dev: &A::Device) {
    let params = StrategyParams { alpha: 1.0, beta: 0.0, stratified: false };
    let table = ReplayTable::builder(spec(12, 8)).sampler_kind(StrategyKind::Prioritized, params).build().unwrap();
    let (keys, lens) = write_with_priorities(&table, &[0.0; 8]);
    let config = SampleConfig::new(16, WindowSpec::last(4)).timeout(Some(Duration::from_secs(10)));
    let mut s = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default());
    assert!(s.selects_on_device());
    let none = HashMap::new();
    let traffic = LockTraffic::start(&table, &keys, 0.0);
    for round in 0..12 {
        let got = s.sample();
        assert!(got.is_ok(), "round {round}: {:?}", got.err());
        let drawn = check_last_batch(&s, &lens, &none, &format!("round {round}"));
        assert!(drawn.iter().all(|k| keys.contains(k)));
    }
    drop(traffic);
    assert!(s.redrawn_rows() >= 11 * 16, "the device drew nothing, so the host redrew every row");
}

/// The same on the host path: a prefetched batch whose rows are evicted
/// and overwritten before its gather runs (the gather waits behind a
/// trainer step) is redrawn within the next call's timeout.
pub fn torn_rows_of_a_prefetched_batch_get_the_next_calls_time<A: DeviceApi>(dev: &A::Device) {
    let table = ReplayTable::builder(spec(12, 8)).sampler_kind(StrategyKind::Fifo, Default::default()).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 6), 6);
    }
    let trainer = dev.new_stream().unwrap();
    let config = SampleConfig::new(4, WindowSpec::last(4)).timeout(Some(Duration::from_secs(10)));
    let mut s = sampler(dev, &table, config, DeviceSamplerOptions::<A>::default().stream(trainer.clone()));
    let step = TrainStep::<A>::new(dev).unwrap();
    s.sample().unwrap();
    for round in 0..8u8 {
        // The trainer's step holds its stream; the prefetch queued after it
        // gathers only when the step is done.
        train_on(&step, &s, &trainer, Duration::from_millis(100));
        s.sample().unwrap();
        assert!(s.is_prefetching());
        // Overwrite every slot before the prefetched gather runs.
        let keys: Vec<SlotKey> = (0..8u8)
            .map(|i| {
                let key = write_traj(&table, 20 + 8 * round + i, 6);
                lens.insert(key, 6);
                key
            })
            .collect();
        let before = s.redrawn_rows();
        let traffic = LockTraffic::start(&table, &keys, 1.0);
        let got = s.sample();
        drop(traffic);
        assert!(got.is_ok(), "round {round}: {:?}", got.err());
        assert!(s.redrawn_rows() > before, "round {round}: the torn rows were redrawn");
        check_last_batch(&s, &lens, &HashMap::new(), &format!("round {round}: after the redraw"));
    }
}

/// A prefetched batch whose copy completed cleanly keeps its rows even if
/// their slots are reused before the call that returns it: the rows are
/// checked the moment the copy completes, not a training step later, so no
/// row is redrawn (and regathered on the critical path) for an eviction
/// that came after its bytes were read. Host and device selection.
pub fn rows_evicted_after_a_clean_copy_are_kept<A: DeviceApi>(dev: &A::Device) {
    for kind in [StrategyKind::Fifo, StrategyKind::Uniform] {
        let table = ReplayTable::builder(spec(12, 8)).sampler_kind(kind, Default::default()).build().unwrap();
        let mut ids = HashMap::new();
        for id in 0..8u8 {
            ids.insert(write_traj(&table, id, 6), id);
        }
        let mut s =
            sampler(dev, &table, SampleConfig::new(8, WindowSpec::last(3)), DeviceSamplerOptions::<A>::default());
        s.sample().unwrap();
        assert!(s.is_prefetching(), "{kind}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !s.prefetch_checked() {
            assert!(std::time::Instant::now() < deadline, "{kind}: the prefetched copy was never checked");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Every slot is reused after the copy.
        for id in 50..58u8 {
            write_traj(&table, id, 6);
        }
        let redrawn = s.redrawn_rows();
        s.sample().unwrap();
        assert_eq!(s.redrawn_rows(), redrawn, "{kind}: rows copied cleanly were redrawn");
        let batch = s.batch();
        // The rows hold the trajectories their (now stale) keys named.
        let actions = batch.column_to_host(1).unwrap();
        for (r, key) in batch.keys().iter().enumerate() {
            let id = i32::from(ids[key]);
            let row: Vec<i32> =
                actions[r * 12..][..12].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
            assert_eq!(row, [id * 1000 + 3, id * 1000 + 4, id * 1000 + 5], "{kind}: row {r} ({key})");
        }
    }
}

/// A bad sampler configuration is refused before the device is touched.
pub fn bad_configurations_are_refused_before_any_device_is_touched<A: DeviceApi>(dev: &A::Device) {
    let table = ReplayTable::builder(spec(8, 4)).build().unwrap();
    let open = |config: SampleConfig, options: DeviceSamplerOptions<A>| table.device_sampler(dev, config, options);
    let err = open(SampleConfig::new(0, WindowSpec::last(4)), Default::default()).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = open(SampleConfig::new(2, WindowSpec::last(4)).columns(["nope"]), Default::default()).unwrap_err();
    assert!(matches!(err, Error::Core(_)), "{err}");
    let err = open(SampleConfig::new(2, WindowSpec::last(9)), Default::default()).unwrap_err();
    assert!(matches!(err, Error::Core(_)), "a window longer than T: {err}");
    let err = open(SampleConfig::new(2, WindowSpec::last(4)), DeviceSamplerOptions::default().ring(0)).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

/// One `#[test]` per suite function on device API `$api`, the device from
/// `$device` (an `Option`, `None` after a printed skip).
#[macro_export]
macro_rules! sampler_suite {
    ($api:ty, $device:expr) => {
        $crate::sampler_suite!(@tests $api, $device;
            device_batches_equal_the_cpu_gather_byte_for_byte,
            samplers_share_one_registration_and_accept_a_stream,
            a_shared_memory_queue_retires_what_the_device_sampled,
            prefetched_batches_stay_intact_and_correct,
            hot_trajectories_are_gathered_from_the_device_cache,
            device_selection_follows_priority_updates,
            builtin_strategies_select_on_the_device_with_the_host_weights,
            device_selection_follows_updates_from_another_handle,
            redraws_of_a_prefetched_batch_get_the_next_calls_time,
            torn_rows_of_a_prefetched_batch_get_the_next_calls_time,
            rows_evicted_after_a_clean_copy_are_kept,
            bad_configurations_are_refused_before_any_device_is_touched,
        );
    };
    (@tests $api:ty, $device:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                let Some(dev) = $device else { return };
                sampler_suite::$name::<$api>(&dev);
            }
        )*
    };
}
