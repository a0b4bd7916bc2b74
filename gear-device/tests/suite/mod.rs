//! The device test suite, written once over gear-core's `DeviceApi` and run
//! on every device: the CPU device in every CI run (`tests/device.rs`
//! here), CUDA on a GPU (`gear-cuda/tests/device.rs`, which includes this
//! file by path and packs it with `cargo xtask gpu-test`). Each test takes
//! a device and checks the generic layer (gather, regather, registered
//! regions, the device cache, trainer-stream ordering, device priorities
//! and strategies, draws that stay on the device) against CPU references.
//!
//! `device_suite!(Api, device_expr)` writes one `#[test]` per function;
//! `device_expr` gives `Option<device>` (`None` after printing a skip).
#![allow(dead_code)]

use super::common;
use gear_core::{
    BatchLayout, Collector, ColumnSpec, DType, Device, DeviceApi, DeviceBuffer, GatherRow, MemoryKind, MemoryRegion,
    Pad, RandomSource, Sampled, SelectionRule, Selector, SlotKey, TableRegion, TableSpec, WindowSpec, Xoshiro256,
};
use gear_device::{
    DeviceBatch, DeviceCache, DeviceCollector, DevicePrioritized, DeviceSlots, DeviceTopK, DrawnRows, SlotUpdate,
};
use std::sync::Arc;

pub fn spec() -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, [37]),
            ColumnSpec::new("act", DType::F32, [4]),
            ColumnSpec::new("rew", DType::F64, []),
        ],
        24,
        16,
    )
    .unwrap()
}

pub fn pinned_table<A: DeviceApi>(dev: &A::Device, spec: &TableSpec) -> TableRegion<A::Pinned> {
    let bytes = gear_core::RegionLayout::for_spec(spec).unwrap().total_bytes;
    TableRegion::create(dev.alloc_pinned(bytes).unwrap(), spec).unwrap()
}

fn random_rows(rng: &mut Xoshiro256, n: usize, capacity: u64, max_len: u64) -> Vec<GatherRow> {
    (0..n).map(|_| GatherRow::whole(rng.below(capacity) as u32, rng.below(max_len + 1))).collect()
}

pub fn check_batch<A: DeviceApi>(
    batch: &DeviceBatch<A>,
    layout: &gear_core::Layout,
    data: &[u8],
    bl: &BatchLayout,
    rows: &[GatherRow],
    what: &str,
) {
    let (want_cols, want_len) = common::gather_reference(layout, data, bl, rows);
    assert_eq!(batch.lengths(), &want_len[..], "{what}: host lengths");
    assert_eq!(batch.lengths_from_device().unwrap(), want_len, "{what}: device lengths");
    for (i, want) in want_cols.iter().enumerate() {
        assert!(batch.column_to_host(i).unwrap() == *want, "{what}: column {i} differs from the CPU reference");
    }
}

fn read_all<A: DeviceApi>(dev: &A::Device, b: &A::Buffer) -> Vec<u8> {
    let mut v = vec![0u8; DeviceBuffer::len(b) as usize];
    dev.read(b, 0, &mut v).unwrap();
    v
}

pub fn device_and_pinned_memory_round_trip<A: DeviceApi>(dev: &A::Device) {
    let m = dev.alloc(1000).unwrap();
    assert_eq!(DeviceBuffer::len(&m), 1000);
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    dev.write_now(&m, 0, &data).unwrap();
    assert_eq!(read_all::<A>(dev, &m), data);
    assert!(dev.write_now(&m, 990, &data[..20]).is_err(), "out-of-range write is refused");
    let z = dev.alloc(4097).unwrap();
    dev.fill(dev.stream(), &z, 0).unwrap();
    dev.stream_synchronize(dev.stream()).unwrap();
    assert!(read_all::<A>(dev, &z).iter().all(|&b| b == 0));
    let p = dev.alloc_pinned(1 << 20).unwrap();
    assert_eq!(p.kind(), MemoryKind::Pinned);
    assert!(p.host_ptr().is_some() && p.device_ptr().is_some());
    assert!(p.alignment() >= 64);
    assert_eq!(dev.alloc(0).unwrap().device_addr(), 0);
    // Pinned memory round trip through a device copy.
    // SAFETY: no device work uses `p` yet.
    unsafe { dev.write_pinned(&p, 8, &data) }.unwrap();
    let d = dev.alloc(1000).unwrap();
    dev.copy_from_pinned(dev.stream(), &d, 0, &p, 8, 1000).unwrap();
    dev.stream_synchronize(dev.stream()).unwrap();
    assert_eq!(read_all::<A>(dev, &d), data);
}

pub fn zero_copy_gather_matches_the_reference_byte_for_byte<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = pinned_table::<A>(dev, &spec);
    let data = common::fill_table(&table, 1);
    let collector = DeviceCollector::<A>::new(dev);
    let mut rng = Xoshiro256::seed_from_u64(2);
    for case in 0..50 {
        let t = spec.max_len();
        let window = WindowSpec {
            offset: rng.below(2 * t + 7) as i64 - (t as i64 + 3),
            len: 1 + rng.below(t),
            pad: if rng.below(2) == 0 { Pad::Head } else { Pad::Tail },
        };
        let cols: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(3) as usize).collect();
        let nrows = rng.below(40) as usize;
        let rows = random_rows(&mut rng, nrows, spec.capacity(), t);
        let bl = BatchLayout::new(table.layout(), &cols, rows.len(), window).unwrap();
        let mut batch = collector.alloc_batch(&bl).unwrap();
        collector.gather(&table.view(), &rows, &bl, &mut batch).unwrap();
        check_batch(&batch, table.layout(), &data, &bl, &rows, &format!("case {case}"));
    }
}

/// A torn row is gathered again alone: after `regather_rows`, the replaced
/// rows hold their new windows and lengths, and every other row keeps the
/// bytes it had (here a poison pattern), so nothing else was copied.
pub fn regather_rows_copies_only_the_listed_rows<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = pinned_table::<A>(dev, &spec);
    let data = common::fill_table(&table, 3);
    let collector = DeviceCollector::<A>::new(dev);
    let mut rng = Xoshiro256::seed_from_u64(4);
    let t = spec.max_len();
    let mut rows = random_rows(&mut rng, 12, spec.capacity(), t);
    let bl =
        BatchLayout::new(table.layout(), &[0, 1, 2], rows.len(), WindowSpec { offset: -5, len: 9, pad: Pad::Head })
            .unwrap();
    let mut batch = collector.alloc(&bl).unwrap();
    collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
    check_batch(&batch, table.layout(), &data, &bl, &rows, "first gather");
    for c in 0..3 {
        dev.fill(collector.stream(), batch.column(c).unwrap(), 0xAB).unwrap();
    }
    let which = [2usize, 7, 11];
    for &r in &which {
        rows[r] = GatherRow::whole(((rows[r].slot as u64 + 1) % spec.capacity()) as u32, 1 + rng.below(t));
    }
    collector.regather_rows(&table.view(), &rows, &which, &mut batch).unwrap();
    batch.synchronize().unwrap();
    let (want, want_lengths) = common::gather_reference(table.layout(), &data, &bl, &rows);
    for &r in &which {
        assert_eq!(batch.lengths()[r], want_lengths[r]);
    }
    assert_eq!(batch.lengths_from_device().unwrap()[2], want_lengths[2]);
    for (c, want) in want.iter().enumerate() {
        let got = batch.column_to_host(c).unwrap();
        let rb = bl.row_bytes(c) as usize;
        for r in 0..rows.len() {
            let row = &got[r * rb..][..rb];
            if which.contains(&r) {
                assert_eq!(row, &want[r * rb..][..rb], "column {c} row {r}: regathered");
            } else {
                assert!(row.iter().all(|&b| b == 0xAB), "column {c} row {r} was copied again");
            }
        }
    }
}

pub fn registered_shared_region_is_read_in_place<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let bytes = gear_core::RegionLayout::for_spec(&spec).unwrap().total_bytes as usize;
    let reg = dev.register(common::SharedMapping::new(bytes)).unwrap();
    assert_eq!(reg.kind(), MemoryKind::Shared, "a registered region keeps its kind");
    assert_eq!(reg.name(), Some("test-shared-mapping"));
    assert!(reg.device_ptr().is_some());
    let table = TableRegion::create(reg, &spec).unwrap();
    let collector = DeviceCollector::<A>::new(dev);
    let rows = vec![GatherRow::whole(3, 24), GatherRow::whole(3, 7), GatherRow::whole(0, 24)];
    let bl = BatchLayout::new(table.layout(), &[0, 2], rows.len(), WindowSpec::last(8)).unwrap();
    let mut batch = collector.alloc(&bl).unwrap();
    for round in 0..2 {
        // A write on the host after registration is what the next gather
        // sees: nothing was copied at registration.
        let data = common::fill_table(&table, 10 + round);
        collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
        check_batch(&batch, table.layout(), &data, &bl, &rows, &format!("round {round}"));
    }
    // Dropping unregisters before unmapping; registering fresh memory of the
    // same size works again.
    drop(batch);
    drop(table);
    let again = dev.register(common::SharedMapping::new(bytes)).unwrap();
    assert!(again.device_ptr().is_some());
}

pub fn device_cache_serves_hot_rows_in_the_same_launch<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = Arc::new(pinned_table::<A>(dev, &spec));
    let mut data = common::fill_table(&table, 3);
    let keys = common::commit_all(&table);
    let cache = Arc::new(DeviceCache::<A, _>::new(dev, table.clone(), 4).unwrap());
    for k in &keys[..6] {
        cache.insert(*k).unwrap();
    }
    assert_eq!(cache.keys(), keys[2..6].to_vec(), "FIFO keeps the 4 most recent inserts");
    let collector = DeviceCollector::<A>::new(dev).with_cache(cache.clone()).unwrap();
    let rows: Vec<GatherRow> = [2u32, 9, 5, 5, 0, 3].iter().map(|&slot| GatherRow::whole(slot, 20)).collect();
    let bl = BatchLayout::new(table.layout(), &[1, 0], rows.len(), WindowSpec::last(12)).unwrap();
    let mut batch = collector.alloc(&bl).unwrap();
    collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
    assert_eq!(batch.cached_rows(), 4, "slots 2, 5, 5, 3 come from the cache");
    check_batch(&batch, table.layout(), &data, &bl, &rows, "mixed cache/zero-copy");
    // Inserts while gathers of other entries may be queued: each waits only
    // for the gathers that could read the entry it rewrites.
    collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
    cache.insert(keys[7]).unwrap();
    collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
    check_batch(&batch, table.layout(), &data, &bl, &rows, "gathers beside an insert");

    // Reuse slot 5 with new bytes: the stale cache entry must not be served.
    let rec = table.slot(5).unwrap();
    rec.free(keys[5]).unwrap();
    let k5 = rec.begin_write(5, 2, 100, 1.0).unwrap();
    let fresh = vec![0x5au8; (spec.max_len() * table.layout().step_bytes(0)) as usize];
    table.write_steps(k5, 0, 0, &fresh).unwrap();
    let off = table.layout().offset(5, 0, 0) as usize;
    data[off..off + fresh.len()].copy_from_slice(&fresh);
    rec.publish_len(k5, spec.max_len()).unwrap();
    collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
    assert_eq!(batch.cached_rows(), 1, "the reused slot is read zero-copy (slot 2 was replaced by 7)");
    check_batch(&batch, table.layout(), &data, &bl, &rows, "after slot reuse");
    assert!(cache.insert(keys[5]).is_err(), "a stale key cannot be cached");
    assert_eq!(cache.retain_current(), 1);
}

pub fn a_trainer_stream_waits_on_the_batch_event<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = pinned_table::<A>(dev, &spec);
    let data = common::fill_table(&table, 4);
    let gather_stream = dev.new_stream().unwrap();
    let trainer = dev.new_stream().unwrap();
    let collector = DeviceCollector::<A>::new(dev).on_stream(gather_stream).unwrap();
    let rows = random_rows(&mut Xoshiro256::seed_from_u64(5), 64, spec.capacity(), spec.max_len());
    let bl = BatchLayout::new(table.layout(), &[0], rows.len(), WindowSpec::last(16)).unwrap();
    let mut batch = collector.alloc(&bl).unwrap();
    let copy = dev.alloc(bl.column_bytes(0)).unwrap();
    let done = dev.new_event().unwrap();
    for _ in 0..3 {
        // The next gather rewrites the batch the trainer copied last round.
        dev.wait(collector.stream(), &done).unwrap();
        collector.gather_into(&table.view(), &rows, &mut batch).unwrap();
        batch.wait_on(&trainer).unwrap();
        dev.copy(&trainer, &copy, 0, batch.column(0).unwrap(), 0, bl.column_bytes(0)).unwrap();
        dev.record(&done, &trainer).unwrap();
        dev.stream_synchronize(&trainer).unwrap();
        let (want, _) = common::gather_reference(table.layout(), &data, &bl, &rows);
        assert!(read_all::<A>(dev, &copy) == want[0], "the trainer stream saw an incomplete batch");
        assert!(batch.is_ready().unwrap());
    }
}

fn sample_keys(s: &mut dyn Selector, n: usize, seed: u64) -> Vec<Sampled> {
    let mut out = Vec::new();
    s.sample(n, &mut Xoshiro256::seed_from_u64(seed), &mut out).unwrap();
    out
}

fn shared_keys(s: &dyn Selector, n: usize, seed: u64) -> Vec<Sampled> {
    let mut out = Vec::new();
    s.sample_shared(n, &mut Xoshiro256::seed_from_u64(seed), &mut out).expect("draws through &self").unwrap();
    out
}

pub fn prioritized_draws_follow_the_priorities<A: DeviceApi>(dev: &A::Device) {
    let prios = [4.0, 1.0, 0.0, 0.5, 2.0, 8.0, 0.25, 3.0, 1.5, 6.0];
    for (alpha, stratified) in [(1.0, false), (0.6, true)] {
        let mut s = DevicePrioritized::<A>::new(dev, alpha, 0.4).unwrap().stratified(stratified);
        s.prepare(32).unwrap();
        let keys: Vec<_> = prios
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let key = SlotKey { slot: 3 * i as u32, generation: 7 };
                s.insert(key, Some(p)).unwrap();
                key
            })
            .collect();
        let w: Vec<f64> = prios.iter().map(|&p: &f64| if p > 0.0 { p.powf(alpha) } else { 0.0 }).collect();
        let total: f64 = w.iter().sum();
        let p: Vec<f64> = w.iter().map(|x| x / total).collect();
        let mut counts = vec![0u64; prios.len()];
        for round in 0..20 {
            for d in sample_keys(&mut s, 10_000, round) {
                let i = keys.iter().position(|&k| k == d.key).expect("a held key");
                counts[i] += 1;
                assert!((d.probability - p[i]).abs() < 1e-12);
                let wmin = w.iter().copied().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
                assert!((d.weight - (wmin / w[i]).powf(0.4)).abs() < 1e-9);
            }
        }
        let dof = p.iter().filter(|&&x| x > 0.0).count() - 1;
        let chi = common::chi_square(&counts, &p);
        assert!(chi < common::chi_square_bound(dof), "alpha {alpha}: chi2 {chi} {counts:?}");
        assert_eq!(sample_keys(&mut s, 100, 9), sample_keys(&mut s, 100, 9), "a seed fixes the draws");
        assert_eq!(shared_keys(&s, 100, 9), sample_keys(&mut s, 100, 9), "shared draws are the same draws");
    }
}

/// With alpha = 0 every positive priority has mass 1 and a zero priority
/// none, as the host strategy (`gear_sampler::Prioritized`) and the device
/// sampler's mirror give it: the device strategy once gave it `0^0 = 1`.
pub fn zero_priorities_have_no_mass_even_with_alpha_zero<A: DeviceApi>(dev: &A::Device) {
    let mut s = DevicePrioritized::<A>::new(dev, 0.0, 1.0).unwrap();
    s.prepare(8).unwrap();
    let keys: Vec<SlotKey> = (0..6).map(|i| SlotKey { slot: i, generation: 1 }).collect();
    for (i, &k) in keys.iter().enumerate() {
        s.insert(k, Some(if i % 2 == 0 { 0.0 } else { 3.0 + i as f64 })).unwrap();
    }
    let drawn = sample_keys(&mut s, 3000, 4);
    assert!(drawn.iter().all(|d| d.key.slot % 2 == 1), "a zero priority was drawn with alpha = 0");
    assert!(drawn.iter().all(|d| (d.probability - 1.0 / 3.0).abs() < 1e-12 && d.weight == 1.0));
}

pub fn updates_are_batched_with_last_write_wins<A: DeviceApi>(dev: &A::Device) {
    let mut s = DevicePrioritized::<A>::new(dev, 1.0, 0.0).unwrap();
    s.prepare(8).unwrap();
    let a = SlotKey { slot: 1, generation: 1 };
    let b = SlotKey { slot: 2, generation: 1 };
    assert_eq!(s.insert(a, None).unwrap(), 1.0, "first item gets the default max priority");
    s.insert(b, Some(5.0)).unwrap();
    s.update(a, 3.0).unwrap();
    s.update(a, 0.0).unwrap();
    assert!(s.update(SlotKey { slot: 1, generation: 0 }, 1.0).is_err(), "stale key");
    let host = s.with_priorities(|p| p.to_host()).unwrap();
    assert_eq!((host[1], host[2], host[0]), (0.0, 5.0, -1.0));
    assert!(sample_keys(&mut s, 1000, 1).iter().all(|d| d.key == b), "a zero priority is never drawn");
    s.remove(b).unwrap();
    let uniform = sample_keys(&mut s, 10, 2);
    assert!(uniform.iter().all(|d| d.key == a && d.probability == 1.0), "all-zero weights fall back to uniform");
}

pub fn top_k_selector_returns_the_best_first<A: DeviceApi>(dev: &A::Device) {
    let mut s = DeviceTopK::<A>::new(dev).unwrap();
    s.prepare(5000).unwrap();
    let mut rng = Xoshiro256::seed_from_u64(8);
    let mut held = Vec::new();
    for slot in (0..5000).step_by(3) {
        let key = SlotKey { slot, generation: 1 };
        let p = rng.below(50) as f64;
        s.insert(key, Some(p)).unwrap();
        held.push((key, p));
    }
    held.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.slot.cmp(&y.0.slot)));
    let got = sample_keys(&mut s, 100, 0);
    let want: Vec<_> = held[..100].iter().map(|x| x.0).collect();
    assert_eq!(got.iter().map(|d| d.key).collect::<Vec<_>>(), want);
    assert_eq!(shared_keys(&s, 100, 0), got, "shared draws are the same draws");
}

fn drawn_updates(n: u64, t: u64, rng: &mut Xoshiro256) -> Vec<SlotUpdate> {
    (0..n as u32)
        .map(|s| SlotUpdate {
            slot: s,
            key: (s % 5 != 0).then_some(SlotKey { slot: s, generation: 3 + s }),
            priority: 1.0 + f64::from(s),
            len: rng.below(t + 1),
        })
        .collect()
}

/// Draws made on the device go into the gather without a host round trip:
/// every row read back names a slot the mirror holds, with its length, and
/// the batch equals the CPU gather of those rows; the top-k rule returns
/// the best slots in order; a mirror synced again only changes what the
/// updates name (a slot emptied is never drawn after).
pub fn device_draws_gather_the_rows_they_name<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = pinned_table::<A>(dev, &spec);
    let data = common::fill_table(&table, 3);
    let collector = DeviceCollector::<A>::new(dev);
    let (n, t) = (spec.capacity(), spec.max_len());
    let mut slots = DeviceSlots::<A>::new(dev, collector.stream().clone(), n, t).unwrap();
    let mut rng = Xoshiro256::seed_from_u64(5);
    let mut updates = drawn_updates(n, t, &mut rng);
    let rules = [
        SelectionRule::Uniform,
        SelectionRule::Proportional { alpha: 0.6, beta: 0.4, stratified: true },
        SelectionRule::TopK,
    ];
    for (case, rule) in rules.into_iter().cycle().take(12).enumerate() {
        if case == 6 {
            // Empty slot 3 and re-key slot 4: only they are written.
            updates = vec![
                SlotUpdate { slot: 3, key: None, priority: 0.0, len: 0 },
                SlotUpdate { slot: 4, key: Some(SlotKey { slot: 4, generation: 99 }), priority: 50.0, len: t },
            ];
        }
        slots.sync(rule, &updates).unwrap();
        let window = WindowSpec { offset: -(1 + rng.below(t) as i64), len: 1 + rng.below(t), pad: Pad::Head };
        let bl = BatchLayout::new(table.layout(), &[0, 2], 20, window).unwrap();
        let mut batch = collector.alloc_batch(&bl).unwrap();
        let mut drawn = DrawnRows::<A>::new(dev, 20).unwrap();
        collector.gather_drawn(&table.view(), &mut slots, rule, rng.next_u64(), None, &mut drawn, &mut batch).unwrap();
        let got = drawn.read_back(&mut batch, n).unwrap().to_vec();
        let mut rows = Vec::new();
        for (r, row) in got.iter().enumerate() {
            let key = row.key.unwrap_or_else(|| panic!("case {case} row {r}: nothing drawn"));
            assert_ne!(key.slot % 5, 0, "case {case}: slot {} holds nothing", key.slot);
            if case >= 6 {
                assert_ne!(key.slot, 3, "case {case}: an emptied slot was drawn");
                if key.slot == 4 {
                    assert_eq!((key.generation, row.len), (99, t), "case {case}: the re-keyed slot");
                }
            }
            if rule == SelectionRule::TopK {
                let best_held = (0..n as u32).rev().find(|s| s % 5 != 0).unwrap();
                let want = if case >= 6 { 4 } else { best_held };
                if r == 0 {
                    assert_eq!(key.slot, want, "case {case}: the best slot first");
                }
            }
            rows.push(GatherRow::whole(key.slot, row.len));
        }
        check_batch(&batch, table.layout(), &data, &bl, &rows, &format!("case {case} {rule:?}"));
    }
}

/// `gather_drawn` is safe, so dropping what it wrote right after it
/// returned (the draw buffers, the device mirror, the batch) must wait for
/// the queued kernels instead of freeing memory they still write; and rows
/// read back through a batch drawn with other buffers wait for their own
/// gather. (The CPU device reports the early free this used to be.)
pub fn dropping_draw_buffers_early_waits_for_their_kernels<A: DeviceApi>(dev: &A::Device) {
    let spec = spec();
    let table = pinned_table::<A>(dev, &spec);
    let data = common::fill_table(&table, 6);
    let collector = DeviceCollector::<A>::new(dev);
    let (n, t) = (spec.capacity(), spec.max_len());
    let mut rng = Xoshiro256::seed_from_u64(6);
    let updates = drawn_updates(n, t, &mut rng);
    let bl = BatchLayout::new(table.layout(), &[0, 1, 2], 32, WindowSpec::last(t)).unwrap();
    for round in 0..4 {
        let mut slots = DeviceSlots::<A>::new(dev, collector.stream().clone(), n, t).unwrap();
        // (round 2 drops the batch first, while its gather may be queued)
        slots.sync(SelectionRule::Uniform, &updates).unwrap();
        let mut batch = collector.alloc_batch(&bl).unwrap();
        let mut drawn = DrawnRows::<A>::new(dev, 32).unwrap();
        collector
            .gather_drawn(&table.view(), &mut slots, SelectionRule::Uniform, round, None, &mut drawn, &mut batch)
            .unwrap();
        match round {
            0 => drop(drawn),
            1 => drop(slots),
            2 => {
                drop(batch);
                drop(drawn);
                drop(slots);
            }
            _ => {
                // Read back through a batch that was not drawn with these
                // buffers: the rows' own gather is waited for.
                let mut other = collector.alloc_batch(&bl).unwrap();
                let rows = drawn.read_back(&mut other, n).unwrap().to_vec();
                let rows: Vec<GatherRow> = rows.iter().map(|r| GatherRow::whole(r.key.unwrap().slot, r.len)).collect();
                let (want_cols, want_len) = common::gather_reference(table.layout(), &data, &bl, &rows);
                assert_eq!(other.lengths(), &want_len[..], "rows read back elsewhere: lengths");
                for (i, want) in want_cols.iter().enumerate() {
                    assert!(batch.column_to_host(i).unwrap() == *want, "rows read back elsewhere: column {i}");
                }
            }
        }
    }
}

/// A batch of updates larger than the last replaces the scatter's upload
/// buffers: the old ones may still be read by the scatter queued before,
/// which is waited for first. Every update lands, last write winning.
pub fn growing_update_batches_wait_for_the_scatter_before<A: DeviceApi>(dev: &A::Device) {
    let mut p = gear_device::DevicePriorities::<A>::new(dev, 3000).unwrap();
    let mut want = vec![-1.0; 3000];
    for round in 0..4u32 {
        let n = 10usize.pow(round);
        let updates: Vec<(u32, f64)> = (0..n as u32).map(|i| ((i * 7 + round) % 3000, f64::from(i + round))).collect();
        for &(slot, v) in &updates {
            want[slot as usize] = v;
        }
        p.set(&updates).unwrap();
    }
    assert_eq!(p.to_host().unwrap(), want);
}

/// One `#[test]` per suite function on device API `$api`, the device from
/// `$device` (an `Option`, `None` after a printed skip).
#[macro_export]
macro_rules! device_suite {
    ($api:ty, $device:expr) => {
        $crate::device_suite!(@tests $api, $device;
            device_and_pinned_memory_round_trip,
            zero_copy_gather_matches_the_reference_byte_for_byte,
            regather_rows_copies_only_the_listed_rows,
            registered_shared_region_is_read_in_place,
            device_cache_serves_hot_rows_in_the_same_launch,
            a_trainer_stream_waits_on_the_batch_event,
            prioritized_draws_follow_the_priorities,
            zero_priorities_have_no_mass_even_with_alpha_zero,
            updates_are_batched_with_last_write_wins,
            top_k_selector_returns_the_best_first,
            device_draws_gather_the_rows_they_name,
            dropping_draw_buffers_early_waits_for_their_kernels,
            growing_update_batches_wait_for_the_scatter_before,
        );
    };
    (@tests $api:ty, $device:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                let Some(dev) = $device else { return };
                suite::$name::<$api>(&dev);
            }
        )*
    };
}
