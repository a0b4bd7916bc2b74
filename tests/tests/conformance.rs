//! The conformance suite: one set of behaviour tests, run against every
//! place a table can live that the enabled features select. A new backend
//! proves itself by adding a [`Backend`] variant and passing this file.
//!
//! Backends here: the process-private host pool, a shared-memory table in
//! `/dev/shm`, gear-api's device sampler on gear-device's CPU device (the
//! GPU kernels on worker threads, reporting any ordering misuse) selecting
//! on the device and through a device cache, in every CI run, and, with the
//! `cuda` feature and a GPU, the same two on CUDA (skipped with a printed
//! reason where no GPU is usable, a failure under `GEAR_REQUIRE_GPU=1`;
//! `cargo xtask gpu-test` packs this suite for GPU machines). Each test
//! builds its table through [`Backend::build`] and samples through
//! [`Backend::sample`], which returns the batch as host bytes whatever
//! memory the backend gathers into.

use gear_api::{
    DeviceSampler, DeviceSamplerOptions, Error, RateLimiterConfig, ReplayTable, SampleConfig, StepValue, TableBuilder,
};
use gear_core::{ColumnSpec, DType, DeviceApi, Pad, SlotKey, TableSpec, WindowSpec};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
enum Backend {
    /// Process-private host memory.
    Host,
    /// Named shared memory in `/dev/shm`.
    Shared,
    /// A shared table sampled into the CPU device's memory, selecting on
    /// the device when the strategy has a rule.
    CpuDevice,
    /// The same through a device cache (selection on the host).
    CpuDeviceCache,
    /// A shared table sampled by the CUDA sampler into device memory,
    /// selecting on the GPU when the strategy has a rule.
    #[cfg(feature = "cuda")]
    Cuda,
    /// The same through a device cache.
    #[cfg(feature = "cuda")]
    CudaCache,
}

/// The backends the features select and the machine can run.
fn backends() -> Vec<Backend> {
    let mut all = vec![Backend::Host, Backend::Shared];
    match gear_device::CpuDevice::new() {
        Ok(_) => all.extend([Backend::CpuDevice, Backend::CpuDeviceCache]),
        Err(e) if std::env::var("GEAR_REQUIRE_CXX").is_ok_and(|v| v == "1") => {
            panic!("GEAR_REQUIRE_CXX=1 but the CPU device is unavailable: {e}")
        }
        Err(e) => eprintln!("backend CpuDevice skipped: {e}"),
    }
    #[cfg(feature = "cuda")]
    match gear_cuda::CudaDevice::new(0) {
        Ok(_) => all.extend([Backend::Cuda, Backend::CudaCache]),
        Err(e) if std::env::var("GEAR_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("GEAR_REQUIRE_GPU=1 but the CUDA backend is unavailable: {e}")
        }
        Err(e) => eprintln!("backend Cuda skipped: {e}"),
    }
    all
}

/// A sampled batch as host bytes: per requested column, `[rows, window,
/// *shape]`; and per row, key, length, probability and weight.
struct HostBatch {
    columns: Vec<Vec<u8>>,
    keys: Vec<SlotKey>,
    lengths: Vec<u64>,
    probabilities: Vec<f64>,
    weights: Vec<f64>,
}

impl Backend {
    fn build(self, builder: TableBuilder) -> ReplayTable {
        let builder = match self {
            Backend::Host => builder,
            Backend::CpuDevice | Backend::CpuDeviceCache => return Backend::Shared.build(builder),
            #[cfg(feature = "cuda")]
            Backend::Cuda | Backend::CudaCache => return Backend::Shared.build(builder),
            Backend::Shared => {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                builder.shared_memory(format!("gear-conformance-{}-{n}", std::process::id()))
            }
        };
        builder.seed(11).build().unwrap()
    }

    fn sample(self, table: &ReplayTable, config: SampleConfig, batches: usize) -> Vec<HostBatch> {
        match self {
            Backend::CpuDevice | Backend::CpuDeviceCache => {
                let dev = gear_device::CpuDevice::new().unwrap();
                let sampler = table
                    .device_sampler::<gear_device::CpuDeviceApi>(
                        &dev,
                        config,
                        device_options(matches!(self, Backend::CpuDeviceCache)),
                    )
                    .unwrap();
                return device_batches(sampler, batches);
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda | Backend::CudaCache => {
                let sampler = table.cuda_sampler(config, device_options(matches!(self, Backend::CudaCache))).unwrap();
                return device_batches(sampler, batches);
            }
            Backend::Host | Backend::Shared => {}
        }
        let mut sampler = table.sampler(config).unwrap();
        (0..batches)
            .map(|_| {
                let b = sampler.sample().unwrap();
                HostBatch {
                    columns: (0..b.layout().columns().len()).map(|i| b.column_at(i).bytes.to_vec()).collect(),
                    keys: b.keys().to_vec(),
                    lengths: b.lengths().to_vec(),
                    probabilities: b.probabilities().to_vec(),
                    weights: b.weights().to_vec(),
                }
            })
            .collect()
    }
}

/// A device sampler's options here: a ring of one, so that no batch is
/// drawn ahead and deterministic strategies see exactly the draws the other
/// backends see; with `cache`, a device cache admitting every row.
fn device_options<A: DeviceApi>(cache: bool) -> DeviceSamplerOptions<A> {
    let o = DeviceSamplerOptions::default().ring(1);
    if cache {
        o.cache(4, 1)
    } else {
        o
    }
}

/// `batches` batches of a device sampler, copied to the host.
fn device_batches<A: DeviceApi>(mut sampler: DeviceSampler<A>, batches: usize) -> Vec<HostBatch> {
    (0..batches)
        .map(|_| {
            let b = sampler.sample().unwrap();
            b.synchronize().unwrap();
            HostBatch {
                columns: (0..b.columns()).map(|i| b.column_to_host(i).unwrap()).collect(),
                keys: b.keys().to_vec(),
                lengths: b.lengths().to_vec(),
                probabilities: b.probabilities().to_vec(),
                weights: b.weights().to_vec(),
            }
        })
        .collect()
}

/// Runs `test` against every backend, naming the backend on failure.
fn each(test: impl Fn(Backend)) {
    for b in backends() {
        eprintln!("backend {b:?}");
        test(b);
    }
}

/// One column of every dtype, shapes of several ranks.
fn every_dtype_spec(t: u64, capacity: u64) -> TableSpec {
    let columns = DType::ALL
        .iter()
        .enumerate()
        .map(|(i, &d)| ColumnSpec::new(format!("c{i}"), d, if i % 2 == 0 { vec![] } else { vec![2, i as u64] }))
        .collect();
    TableSpec::new(columns, t, capacity).unwrap()
}

/// The bytes of step `s` of trajectory `id` in column `c` (`n` bytes): a
/// pattern that names all three, valid for every dtype (bools get 0/1).
fn pattern(id: u64, s: u64, c: usize, n: usize, dtype: DType) -> Vec<u8> {
    (0..n)
        .map(|i| {
            let v = id.wrapping_mul(131).wrapping_add(s * 17).wrapping_add(c as u64 * 7).wrapping_add(i as u64) as u8;
            if dtype == DType::Bool {
                v & 1
            } else {
                v
            }
        })
        .collect()
}

fn write(table: &ReplayTable, id: u64, steps: u64, priority: Option<f64>) -> SlotKey {
    let spec = table.spec().clone();
    let mut t = table.writer().with_timeout(Duration::from_secs(10)).begin(priority).unwrap();
    for s in 0..steps {
        let bytes: Vec<Vec<u8>> = spec
            .columns()
            .iter()
            .enumerate()
            .map(|(c, col)| pattern(id, s, c, col.step_bytes().unwrap() as usize, col.dtype()))
            .collect();
        let values: Vec<StepValue<'_>> = bytes.iter().map(|b| StepValue::bytes(b)).collect();
        t.append_step(&values).unwrap();
    }
    t.end().unwrap()
}

/// The window rule of SPEC.md, step by step: which stored step lands at
/// each output position (`None`: padding).
fn reference_window(k: u64, w: WindowSpec) -> Vec<Option<u64>> {
    let start = if w.offset < 0 { k.saturating_sub(w.offset.unsigned_abs()) } else { (w.offset as u64).min(k) };
    let end = (start + w.len).min(k);
    let n = end.saturating_sub(start);
    let first = match w.pad {
        Pad::Tail => 0,
        Pad::Head => w.len - n,
    };
    (0..w.len).map(|j| (j >= first && j < first + n).then(|| start + j - first)).collect()
}

#[test]
fn round_trips_of_every_dtype_through_every_window() {
    each(|b| {
        let spec = every_dtype_spec(9, 16);
        let table = b.build(ReplayTable::builder(spec.clone()));
        let mut ids = HashMap::new();
        for id in 0..16u64 {
            ids.insert(write(&table, id, 1 + id % 9, None), id);
        }
        let windows = [
            WindowSpec::whole(9),
            WindowSpec::last(4),
            WindowSpec::first(3),
            WindowSpec { offset: 2, len: 5, pad: Pad::Head },
            WindowSpec { offset: -6, len: 3, pad: Pad::Tail },
        ];
        for w in windows {
            for batch in b.sample(&table, SampleConfig::new(24, w), 3) {
                for (r, key) in batch.keys.iter().enumerate() {
                    let id = ids[key];
                    let k = 1 + id % 9;
                    let want = reference_window(k, w);
                    assert_eq!(batch.lengths[r], want.iter().flatten().count() as u64, "{b:?} {w:?}");
                    for (c, col) in spec.columns().iter().enumerate() {
                        let n = col.step_bytes().unwrap() as usize;
                        let row = &batch.columns[c][r * w.len as usize * n..][..w.len as usize * n];
                        for (j, src) in want.iter().enumerate() {
                            let got = &row[j * n..(j + 1) * n];
                            match src {
                                Some(s) => assert_eq!(got, pattern(id, *s, c, n, col.dtype()), "{b:?} {w:?} row {r}"),
                                None => assert!(got.iter().all(|&x| x == 0), "{b:?} {w:?}: padding not zero"),
                            }
                        }
                    }
                }
            }
        }
    });
}

fn one_column(capacity: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 1, capacity).unwrap()
}

fn write_id(table: &ReplayTable, id: i64, priority: Option<f64>) -> SlotKey {
    let mut t = table.writer().begin(priority).unwrap();
    t.append_step(&[StepValue::typed(&[id])]).unwrap();
    t.end().unwrap()
}

fn ids_of(batch: &HostBatch) -> Vec<i64> {
    batch.columns[0].chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Pearson's chi-square of `counts` against `expected` probabilities.
fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts.iter().zip(expected).map(|(&c, &p)| (c as f64 - n as f64 * p).powi(2) / (n as f64 * p)).sum()
}

#[test]
fn random_strategies_draw_their_distribution_with_exact_weights() {
    each(|b| {
        for kind in [StrategyKind::Uniform, StrategyKind::Prioritized] {
            let params = StrategyParams { alpha: 0.7, beta: 0.5, ..Default::default() };
            let table = b.build(ReplayTable::builder(one_column(8)).sampler_kind(kind, params));
            let priorities = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
            for (i, &p) in priorities.iter().enumerate() {
                write_id(&table, i as i64, Some(p));
            }
            let mass: Vec<f64> = priorities
                .iter()
                .map(|&p: &f64| if kind == StrategyKind::Uniform { 1.0 } else { p.powf(0.7) })
                .collect();
            let total: f64 = mass.iter().sum();
            let expected: Vec<f64> = mass.iter().map(|m| m / total).collect();
            let mut counts = [0u64; 8];
            for batch in b.sample(&table, SampleConfig::new(256, WindowSpec::whole(1)), 40) {
                let max_w = expected.iter().map(|&p| (8.0 * p).powf(-0.5)).fold(0.0, f64::max);
                for (r, id) in ids_of(&batch).into_iter().enumerate() {
                    counts[id as usize] += 1;
                    let p = expected[id as usize];
                    assert!((batch.probabilities[r] - p).abs() < 1e-9, "{b:?} {kind:?}: P({id})");
                    if kind == StrategyKind::Prioritized {
                        let w = (8.0 * p).powf(-0.5) / max_w;
                        assert!((batch.weights[r] - w).abs() < 1e-9, "{b:?}: weight of {id}");
                    }
                }
            }
            // 7 degrees of freedom: 24.3 is the 0.999 quantile.
            let chi = chi_square(&counts, &expected);
            assert!(chi < 24.3, "{b:?} {kind:?}: chi-square {chi} for {counts:?}");
        }
    });
}

#[test]
fn ordered_strategies_draw_in_their_order() {
    each(|b| {
        for (kind, want) in
            [(StrategyKind::Fifo, 0), (StrategyKind::Lifo, 5), (StrategyKind::MaxHeap, 2), (StrategyKind::MinHeap, 4)]
        {
            let table = b.build(ReplayTable::builder(one_column(8)).sampler_kind(kind, StrategyParams::default()));
            for (id, p) in [(0, 5.0), (1, 3.0), (2, 9.0), (3, 4.0), (4, 1.0), (5, 6.0)] {
                write_id(&table, id, Some(p));
            }
            let batch = b.sample(&table, SampleConfig::new(1, WindowSpec::whole(1)), 1).remove(0);
            assert_eq!(ids_of(&batch), vec![want], "{b:?} {kind:?}");
        }
    });
}

#[test]
fn eviction_follows_the_remover_and_stale_keys_are_ignored() {
    each(|b| {
        let table = b.build(ReplayTable::builder(one_column(4)));
        let keys: Vec<SlotKey> = (0..7).map(|id| write_id(&table, id, None)).collect();
        let info = table.info().unwrap();
        assert_eq!((info.size, info.evictions), (4, 3), "{b:?}");
        let mut seen: Vec<i64> = b.sample(&table, SampleConfig::new(64, WindowSpec::whole(1)), 1).remove(0).columns[0]
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![3, 4, 5, 6], "{b:?}: FIFO eviction keeps the newest");
        // The first three keys name evicted trajectories: ignored.
        let updates: Vec<(SlotKey, f64)> = keys.iter().map(|&k| (k, 2.0)).collect();
        assert_eq!(table.update_priorities(&updates).unwrap(), 4, "{b:?}");
    });
}

#[test]
fn rate_limiting_blocks_each_side_on_time() {
    each(|b| {
        let limited = RateLimiterConfig::sample_to_insert_ratio(1.0, 2, 2.0).unwrap();
        let table = b.build(ReplayTable::builder(one_column(16)).rate_limiter(limited));
        let short = Some(Duration::from_millis(100));
        let sample =
            |n| table.sampler(SampleConfig::new(n, WindowSpec::whole(1)).timeout(short)).unwrap().sample().map(|_| ());
        write_id(&table, 0, None);
        assert!(matches!(sample(1), Err(Error::Timeout { .. })), "{b:?}: below min size");
        write_id(&table, 1, None);
        sample(1).unwrap();
        // Inserts run at most max_diff ahead of samples.
        let w = table.writer().with_timeout(Duration::from_millis(100));
        let mut refused = false;
        for id in 2..10 {
            let begun = w.begin(None);
            match begun {
                Ok(mut t) => {
                    t.append_step(&[StepValue::typed(&[id as i64])]).unwrap();
                    t.end().unwrap();
                }
                Err(e) => {
                    assert!(matches!(e, Error::Timeout { .. }), "{b:?}: {e}");
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused, "{b:?}: the limiter never held a writer back");
    });
}

#[test]
fn a_writer_that_gives_up_leaves_nothing_behind() {
    each(|b| {
        let table = b.build(ReplayTable::builder(one_column(4)));
        write_id(&table, 0, None);
        {
            let mut t = table.writer().begin(None).unwrap();
            t.append_step(&[StepValue::typed(&[1i64])]).unwrap();
            // Dropped without end(): as a writer thread that panicked.
        }
        let info = table.info().unwrap();
        assert_eq!((info.size, info.slots.writing, info.slots.free), (1, 0, 3), "{b:?}");
    });
}

/// Child role: attach to the table named in `GEAR_CONFORMANCE_TABLE`, begin
/// a trajectory, publish two steps, say so, and wait to be killed.
#[test]
fn child_writer() {
    let Ok(name) = std::env::var("GEAR_CONFORMANCE_TABLE") else { return };
    let table = ReplayTable::attach(&name, gear_api::AttachOptions::default()).unwrap();
    let mut t = table.writer().begin(None).unwrap();
    for id in [40i64, 41] {
        t.append_step(&[StepValue::typed(&[id])]).unwrap();
    }
    println!("published");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_crashed_writer_process_keeps_what_it_published() {
    each(|b| {
        let spec = TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 4, 4).unwrap();
        let table = b.build(ReplayTable::builder(spec));
        let Some(name) = table.name().map(str::to_owned) else {
            eprintln!("{b:?}: skipped, a process-private table has no other process to crash");
            return;
        };
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
            .env("GEAR_CONFORMANCE_TABLE", &name)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("published") {
            line.clear();
            assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "child ended early");
        }
        child.kill().unwrap(); // SIGKILL mid-trajectory
        child.wait().unwrap();
        // Reclaimed on its own (no reclaim_dead; taking the lock to sample
        // is enough): the two published steps become a trajectory.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while table.info().unwrap().reclaimed == 0 && std::time::Instant::now() < deadline {
            let mut s = table
                .sampler(SampleConfig::new(1, WindowSpec::whole(4)).timeout(Some(Duration::from_millis(20))))
                .unwrap();
            let _ = s.sample();
            std::thread::sleep(Duration::from_millis(20));
        }
        let batch = b.sample(&table, SampleConfig::new(1, WindowSpec::whole(4)), 1).remove(0);
        assert_eq!(batch.lengths, vec![2], "{b:?}");
        assert_eq!(ids_of(&batch)[..2], [40, 41], "{b:?}");
    });
}

/// A table of `capacity` trajectories of at most 8 steps with `m` items
/// each, column `id` holding `trajectory * 100 + step`.
fn items_spec(capacity: u64, m: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("id", DType::I64, vec![])], 8, capacity)
        .unwrap()
        .with_items_per_trajectory(m)
        .unwrap()
}

/// Writes trajectory `id` of `len` steps with items `(start, len,
/// priority)` added while writing; returns its key and the items' keys.
fn write_items(table: &ReplayTable, id: i64, len: u64, items: &[(u64, u64, f64)]) -> (SlotKey, Vec<SlotKey>) {
    let mut t = table.writer().with_timeout(Duration::from_secs(10)).begin(None).unwrap();
    let steps: Vec<i64> = (0..len as i64).map(|s| id * 100 + s).collect();
    t.append_column("id", len, StepValue::typed(&steps)).unwrap();
    let keys = items.iter().map(|&(start, n, p)| t.add_item(start, n, Some(p)).unwrap()).collect();
    (t.end().unwrap(), keys)
}

#[test]
fn items_draw_their_distribution_with_exact_weights_and_windows() {
    each(|b| {
        for kind in [StrategyKind::Uniform, StrategyKind::Prioritized] {
            let params = StrategyParams { alpha: 0.7, beta: 0.5, ..Default::default() };
            let builder = ReplayTable::builder(items_spec(4, 4))
                .item_pattern(gear_api::ItemPattern::None)
                .sampler_kind(kind, params);
            let table = b.build(builder);
            // Eight overlapping items over two stored trajectories.
            let mut windows = HashMap::new();
            let mut keys = Vec::new();
            let mut priorities = Vec::new();
            for (id, items) in [
                (1i64, [(0, 3, 1.0), (1, 3, 2.0), (2, 4, 3.0), (5, 3, 4.0)]),
                (2, [(0, 2, 5.0), (0, 8, 6.0), (3, 1, 7.0), (6, 2, 8.0)]),
            ] {
                let (_, ks) = write_items(&table, id, 8, &items);
                for (k, &(start, len, p)) in ks.iter().zip(&items) {
                    windows.insert(*k, (id, start, len));
                    keys.push(*k);
                    priorities.push(p);
                }
            }
            let mass: Vec<f64> = priorities
                .iter()
                .map(|&p: &f64| if kind == StrategyKind::Uniform { 1.0 } else { p.powf(0.7) })
                .collect();
            let total: f64 = mass.iter().sum();
            let expected: Vec<f64> = mass.iter().map(|m| m / total).collect();
            let max_w = expected.iter().map(|&p| (8.0 * p).powf(-0.5)).fold(0.0, f64::max);
            let mut counts = [0u64; 8];
            // Each row is its item's window: the first four steps of it,
            // tail-padded.
            let w = WindowSpec::first(4);
            for batch in b.sample(&table, SampleConfig::new(256, w), 40) {
                let ids = ids_of(&batch);
                for (r, key) in batch.keys.iter().enumerate() {
                    let i = keys.iter().position(|k| k == key).unwrap_or_else(|| panic!("{b:?}: {key} is no item"));
                    counts[i] += 1;
                    let (id, start, len) = windows[key];
                    let n = len.min(4);
                    assert_eq!(batch.lengths[r], n, "{b:?} {kind:?}: length of {key}");
                    for j in 0..4u64 {
                        let want = if j < n { id * 100 + (start + j) as i64 } else { 0 };
                        assert_eq!(ids[r * 4 + j as usize], want, "{b:?} {kind:?}: row of {key} step {j}");
                    }
                    let p = expected[i];
                    assert!((batch.probabilities[r] - p).abs() < 1e-9, "{b:?} {kind:?}: P({key})");
                    if kind == StrategyKind::Prioritized {
                        let want_w = (8.0 * p).powf(-0.5) / max_w;
                        assert!((batch.weights[r] - want_w).abs() < 1e-9, "{b:?}: weight of {key}");
                    }
                }
            }
            // Per item: 7 degrees of freedom, 24.3 is the 0.999 quantile.
            let chi = chi_square(&counts, &expected);
            assert!(chi < 24.3, "{b:?} {kind:?}: chi-square {chi} for {counts:?}");
        }
    });
}

#[test]
fn evicting_a_trajectory_removes_exactly_its_items() {
    each(|b| {
        let pattern = gear_api::ItemPattern::Windows { len: 2, stride: 1, tail: false };
        let table = b.build(ReplayTable::builder(items_spec(3, 8)).item_pattern(pattern));
        let mut items = Vec::new();
        for id in 0..3 {
            let (traj, _) = write_items(&table, id, 3 + id as u64, &[]);
            items.push(table.items_of(traj).unwrap().iter().map(|i| i.key).collect::<Vec<_>>());
        }
        assert_eq!(table.info().unwrap().size, 2 + 3 + 4, "{b:?}");
        // A fourth trajectory evicts the first (FIFO), and its two items
        // with it: nothing else.
        let (newest, _) = write_items(&table, 3, 4, &[]);
        let newest_items: Vec<SlotKey> = table.items_of(newest).unwrap().iter().map(|i| i.key).collect();
        let info = table.info().unwrap();
        assert_eq!((info.size, info.evictions), (3 + 4 + 3, 1), "{b:?}");
        let mut drawn: Vec<SlotKey> =
            b.sample(&table, SampleConfig::new(512, WindowSpec::first(2)), 1).remove(0).keys.to_vec();
        drawn.sort_unstable();
        drawn.dedup();
        let mut live: Vec<SlotKey> = items[1..].iter().flatten().copied().chain(newest_items).collect();
        live.sort_unstable();
        assert_eq!(drawn, live, "{b:?}: exactly the surviving items are drawn");
        // The evicted items' keys are stale; every surviving one applies.
        let updates: Vec<(SlotKey, f64)> = items.iter().flatten().map(|&k| (k, 2.0)).collect();
        assert_eq!(table.update_priorities(&updates).unwrap(), 3 + 4, "{b:?}");
    });
}
