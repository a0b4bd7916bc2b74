//! The CUDA sampler through the public API. Without a CUDA driver,
//! `cuda_sampler` must fail with a clear "backend unavailable" error (never
//! a panic). With a device, batches gathered on the GPU must equal, byte
//! for byte, what the CPU collector gathers for the same keys, and what the
//! CPU `Sampler` returned for those keys. Device tests print "skipped: no
//! CUDA device" and pass without one, unless GEAR_REQUIRE_GPU=1. They
//! passed on an H100 (`cargo xtask gpu-test`, 2026-11-22).
#![cfg(feature = "cuda")]

use gear_api::{CudaSampler, CudaSamplerOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{Collector, ColumnSpec, DType, GatherRow, Pad, SlotKey, TableSpec, WindowSpec};
use std::collections::HashMap;
use std::path::PathBuf;

fn spec(t: u64, capacity: u64) -> TableSpec {
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
fn write_traj(table: &ReplayTable, id: u8, len: u64) -> SlotKey {
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

fn required() -> bool {
    std::env::var("GEAR_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn skip(reason: &str) {
    if required() {
        panic!("GEAR_REQUIRE_GPU=1 but no CUDA device: {reason}");
    }
    println!("skipped: no CUDA device ({reason})");
}

/// The NVRTC directory: `GEAR_NVRTC_DIR`, else where
/// `gear-cuda/ci/install-nvrtc.sh` installs it, if present.
fn nvrtc_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GEAR_NVRTC_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/nvrtc/nvidia/cu13/lib");
    default.join("libnvrtc.so.13").exists().then_some(default)
}

/// Whether a device can be used; prints the skip otherwise.
fn device_or_skip() -> bool {
    if let Err(e) = gear_cuda::probe::driver() {
        skip(&e.to_string());
        return false;
    }
    // The first NVRTC probe of the process decides where it is loaded from;
    // NVRTC is needed only without build-time kernel images, and a missing
    // one is then reported by cuda_sampler.
    let _ = gear_cuda::probe::nvrtc_from(nvrtc_dir().as_deref());
    true
}

#[test]
fn without_a_driver_cuda_sampler_is_a_clear_error() {
    if gear_cuda::probe::has_device() {
        println!("skipped: a CUDA device is present, nothing to check here");
        return;
    }
    let table = ReplayTable::builder(spec(8, 4)).build().unwrap();
    write_traj(&table, 1, 5);
    for options in [CudaSamplerOptions::default(), CudaSamplerOptions::new(3)] {
        let err = table.cuda_sampler(SampleConfig::new(2, WindowSpec::last(4)), options).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("backend: cuda backend unavailable: "), "{msg}");
        assert!(msg.contains("driver") || msg.contains("device"), "the reason is given: {msg}");
        let Error::Backend(inner) = &err else { panic!("expected a backend error, got {err:?}") };
        let cuda = inner.downcast_ref::<gear_cuda::Error>().expect("the gear-cuda error is kept");
        assert!(matches!(cuda, gear_cuda::Error::BackendUnavailable(_)), "{cuda:?}");
    }
    // The table is unharmed: the CPU path still samples.
    let mut sampler = table.sampler(SampleConfig::new(2, WindowSpec::last(4))).unwrap();
    assert_eq!(sampler.sample().unwrap().lengths(), &[4, 4]);
}

#[test]
fn bad_configurations_are_refused_before_any_device_is_touched() {
    let table = ReplayTable::builder(spec(8, 4)).build().unwrap();
    let err = table.cuda_sampler(SampleConfig::new(0, WindowSpec::last(4)), Default::default()).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = table
        .cuda_sampler(SampleConfig::new(2, WindowSpec::last(4)).columns(["nope"]), Default::default())
        .unwrap_err();
    assert!(matches!(err, Error::Core(_)), "{err}");
    let err = table.cuda_sampler(SampleConfig::new(2, WindowSpec::last(9)), Default::default()).unwrap_err();
    assert!(matches!(err, Error::Core(_)), "a window longer than T: {err}");
}

#[test]
fn cuda_sampler_is_send() {
    fn send<T: Send>() {}
    send::<CudaSampler>();
    send::<CudaSamplerOptions>();
}

/// Checks the sampler's last batch against the CPU collector gathering
/// the same keys through the sampler's table view, and against the rows the
/// CPU `Sampler` returned for those keys (`cpu_rows`: key to bytes per
/// column). Returns the keys.
fn check_last_batch(
    sampler: &CudaSampler,
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
        batch.cuda_batch().lengths_from_device().unwrap(),
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

#[test]
fn device_batches_equal_the_cpu_gather_byte_for_byte() {
    if !device_or_skip() {
        return;
    }
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
            let mut sampler = table.cuda_sampler(config, CudaSamplerOptions::default()).unwrap();
            for round in 0..10 {
                sampler.sample().unwrap();
                check_last_batch(&sampler, &lens, &cpu_rows, &format!("window {w} columns {columns:?} round {round}"));
            }
        }
    }
    assert!(table.info().unwrap().bytes_gathered > 0);
}

#[test]
fn samplers_share_one_registration_and_accept_a_stream() {
    if !device_or_skip() {
        return;
    }
    let table = ReplayTable::builder(spec(12, 8)).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 12), 12);
    }
    let config = SampleConfig::new(4, WindowSpec::last(3));
    // A second sampler of the same table in the same process must not
    // register the memory again (the driver would refuse).
    let mut a = table.cuda_sampler(config.clone(), CudaSamplerOptions::default()).unwrap();
    let stream = a.device().new_stream().unwrap();
    // A ring of one gathers on the trainer's stream itself.
    let mut b = table.cuda_sampler(config.clone(), CudaSamplerOptions::new(0).stream(stream.clone()).ring(1)).unwrap();
    assert!(**b.stream() == *stream);
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
    let mut c = table.cuda_sampler(config, CudaSamplerOptions::default()).unwrap();
    c.sample().unwrap();
    check_last_batch(&c, &lens, &none, "after re-registration");
}

#[test]
fn a_shared_memory_queue_retires_what_the_gpu_sampled() {
    if !device_or_skip() {
        return;
    }
    let name = format!("gear-test-cuda-queue-{}", std::process::id());
    let table = ReplayTable::builder(spec(12, 8)).shared_memory(name).queue(8).unwrap().build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 3 + u64::from(id)), 3 + u64::from(id));
    }
    let mut sampler = table.cuda_sampler(SampleConfig::new(4, WindowSpec::last(4)), Default::default()).unwrap();
    let none = HashMap::new();
    sampler.sample().unwrap();
    assert!(!sampler.is_prefetching(), "a queue must not take rows out ahead of the trainer");
    let mut seen = check_last_batch(&sampler, &lens, &none, "first half");
    sampler.sample().unwrap();
    seen.extend(check_last_batch(&sampler, &lens, &none, "second half"));
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
/// gather of its keys, and the trainer's stream is ordered after each
/// gather.
#[test]
fn prefetched_batches_stay_intact_and_correct() {
    if !device_or_skip() {
        return;
    }
    let table = ReplayTable::builder(spec(12, 16)).seed(3).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..16u8 {
        let len = 2 + u64::from(id) % 11;
        lens.insert(write_traj(&table, id, len), len);
    }
    let none = HashMap::new();
    for ring in [2usize, 3] {
        for with_stream in [false, true] {
            let config = SampleConfig::new(6, WindowSpec { offset: -4, len: 7, pad: Pad::Head });
            let mut options = CudaSamplerOptions::new(0).ring(ring);
            let dev = gear_cuda::CudaDevice::new(0).unwrap();
            let trainer = dev.new_stream().unwrap();
            if with_stream {
                options = options.stream(trainer.clone());
            }
            let mut sampler = table.cuda_sampler(config, options).unwrap();
            assert_eq!(sampler.ring_len(), ring);
            for round in 0..8 {
                let what = format!("ring {ring} stream {with_stream} round {round}");
                sampler.sample().unwrap();
                assert!(sampler.is_prefetching(), "{what}: the next batch is being gathered");
                let before: Vec<Vec<u8>> =
                    (0..sampler.batch().columns()).map(|c| sampler.batch().column_to_host(c).unwrap()).collect();
                // Let the prefetch finish: it must not have touched this batch.
                sampler.device().synchronize().unwrap();
                trainer.synchronize().unwrap();
                for (c, b) in before.iter().enumerate() {
                    assert!(sampler.batch().column_to_host(c).unwrap() == *b, "{what}: column {c} overwritten");
                }
                check_last_batch(&sampler, &lens, &none, &what);
            }
        }
    }
}

/// The device cache through the sampler: trajectories sampled at least
/// `admit_after` times are copied to device memory by the fill thread and
/// later batches read them from there; every batch still equals the CPU
/// gather of its keys, also after slots were reused by new trajectories
/// (a stale cached copy is never served).
#[test]
fn hot_trajectories_are_gathered_from_the_device_cache() {
    if !device_or_skip() {
        return;
    }
    let table = ReplayTable::builder(spec(12, 8)).seed(5).build().unwrap();
    let mut lens = HashMap::new();
    for id in 0..8u8 {
        lens.insert(write_traj(&table, id, 4 + u64::from(id)), 4 + u64::from(id));
    }
    let config = SampleConfig::new(6, WindowSpec::last(5));
    let mut sampler = table.cuda_sampler(config, CudaSamplerOptions::new(0).cache(8, 2)).unwrap();
    let none = HashMap::new();
    let mut served = 0;
    for round in 0..200 {
        sampler.sample().unwrap();
        check_last_batch(&sampler, &lens, &none, &format!("round {round}"));
        served += sampler.batch().cuda_batch().cached_rows();
        if served > 20 && sampler.cached_trajectories() == 8 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(sampler.cached_trajectories() > 0, "the fill thread admitted nothing");
    assert!(served > 0, "no row was gathered from the device cache");
    // New trajectories evict old ones and reuse their slots.
    for id in 100..106u8 {
        lens.insert(write_traj(&table, id, 9), 9);
    }
    for round in 0..40 {
        sampler.sample().unwrap();
        check_last_batch(&sampler, &lens, &none, &format!("after reuse, round {round}"));
    }
}

/// GPU selection through the public API: `CudaPrioritized` as the table's
/// sampling strategy keeps the priorities in device memory; the table's
/// change log feeds it inserts and priority updates (from any process)
/// before each draw, so a batch drawn after `update_priorities` follows
/// the new priorities. Slots with priority 0 are never drawn.
#[test]
fn gpu_selection_follows_priority_updates() {
    if !device_or_skip() {
        return;
    }
    let dev = gear_cuda::CudaDevice::new(0).unwrap();
    let strategy = gear_cuda::CudaPrioritized::new(&dev, 1.0, 0.0).unwrap();
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
    let mut sampler =
        table.cuda_sampler(SampleConfig::new(16, WindowSpec::last(4)), CudaSamplerOptions::new(0).ring(1)).unwrap();
    let none = HashMap::new();
    for round in 0..10 {
        sampler.sample().unwrap();
        let drawn = check_last_batch(&sampler, &lens, &none, &format!("round {round}"));
        assert!(drawn.iter().all(|k| k.slot % 2 == 1), "a zero-priority slot was drawn: {drawn:?}");
    }
    // Only keys[2] keeps a weight: every later row is that trajectory.
    let updates: Vec<(SlotKey, f64)> =
        keys.iter().enumerate().map(|(i, &k)| (k, if i == 2 { 5.0 } else { 0.0 })).collect();
    assert_eq!(table.update_priorities(&updates).unwrap(), 8);
    for round in 0..5 {
        sampler.sample().unwrap();
        let drawn = check_last_batch(&sampler, &lens, &none, &format!("after update, round {round}"));
        assert!(drawn.iter().all(|&k| k == keys[2]), "drawn after the update: {drawn:?}");
        assert!(sampler.batch().probabilities().iter().all(|&p| (p - 1.0).abs() < 1e-12));
    }
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

/// Tables built with the ordinary strategies select on the GPU without
/// asking (uniform, prioritized, max-heap), with the host strategy's
/// probabilities and weights; FIFO, a device cache and
/// `host_selection(true)` select on the host.
#[test]
fn builtin_strategies_select_on_the_gpu_with_the_host_weights() {
    use gear_api::gear_sampler::{StrategyKind, StrategyParams};
    if !device_or_skip() {
        return;
    }
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
        let mut sampler = table.cuda_sampler(config.clone(), CudaSamplerOptions::default()).unwrap();
        assert_eq!(sampler.selects_on_device(), kind != StrategyKind::Fifo, "{kind}");
        let none = HashMap::new();
        for round in 0..5 {
            sampler.sample().unwrap();
            let drawn = check_last_batch(&sampler, &lens, &none, &format!("{kind} round {round}"));
            let batch = sampler.batch();
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
        assert_eq!(sampler.device_batches() > 0, kind != StrategyKind::Fifo, "{kind}");
        let cached = table.cuda_sampler(config.clone(), CudaSamplerOptions::default().cache(4, 1)).unwrap();
        assert!(!cached.selects_on_device(), "{kind}: a device cache selects on the host");
        let host = table.cuda_sampler(config, CudaSamplerOptions::default().host_selection(true)).unwrap();
        assert!(!host.selects_on_device());
    }
}

/// Priority updates made through another handle of a shared table (as
/// another process would) reach the device mirror before the next draw;
/// when every priority is zero the device draws nothing and the host draws
/// the rows (uniformly, as the strategy does), so batches keep coming.
#[test]
fn gpu_selection_follows_updates_from_another_handle() {
    use gear_api::gear_sampler::{StrategyKind, StrategyParams};
    if !device_or_skip() {
        return;
    }
    let name = format!("gear-test-cuda-devsel-{}", std::process::id());
    let params = StrategyParams { alpha: 1.0, beta: 0.0, stratified: false };
    let table = ReplayTable::builder(spec(12, 8))
        .sampler_kind(StrategyKind::Prioritized, params)
        .shared_memory(name.clone())
        .build()
        .unwrap();
    let (keys, lens) = write_with_priorities(&table, &[1.0; 8]);
    let other = ReplayTable::attach(&name, Default::default()).unwrap();
    let mut sampler = table.cuda_sampler(SampleConfig::new(32, WindowSpec::last(4)), Default::default()).unwrap();
    assert!(sampler.selects_on_device());
    let none = HashMap::new();
    sampler.sample().unwrap();
    let only = |i: usize| -> Vec<(SlotKey, f64)> {
        keys.iter().enumerate().map(|(j, &k)| (k, if j == i { 3.0 } else { 0.0 })).collect()
    };
    for (round, i) in [5usize, 2, 7].into_iter().enumerate() {
        assert_eq!(other.update_priorities(&only(i)).unwrap(), 8);
        // The batch prefetched before the update may still hold old rows;
        // the one drawn after it follows the update.
        sampler.sample().unwrap();
        sampler.sample().unwrap();
        let drawn = check_last_batch(&sampler, &lens, &none, &format!("round {round}"));
        assert!(drawn.iter().all(|&k| k == keys[i]), "round {round}: {drawn:?}");
        assert!(sampler.batch().probabilities().iter().all(|&p| p == 1.0));
    }
    let before = sampler.device_batches();
    let zeros: Vec<(SlotKey, f64)> = keys.iter().map(|&k| (k, 0.0)).collect();
    assert_eq!(other.update_priorities(&zeros).unwrap(), 8);
    sampler.sample().unwrap();
    sampler.sample().unwrap();
    let drawn = check_last_batch(&sampler, &lens, &none, "all zero");
    assert_eq!(drawn.len(), 32);
    assert!(sampler.batch().probabilities().iter().all(|&p| p == 1.0 / 8.0), "the strategy's uniform fallback");
    assert!(sampler.device_batches() > before, "still drawn on the device first");
}
