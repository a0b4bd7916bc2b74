//! Batched paths: `Writer::insert_batch` (many small trajectories per call,
//! with the same guarantees as inserting them one by one) and
//! `Sampler::sample_into` (batches straight into caller-owned buffers).

use gear_api::{Error, RateLimiterConfig, ReplayTable, SampleConfig, StepValue, TableInfo};
use gear_core::{Pad, SlotKey, TableSpec, WindowSpec};
use std::collections::HashMap;
use std::time::Duration;

const T: u64 = 4;

mod common;

fn spec(capacity: u64) -> TableSpec {
    common::spec3(T, capacity)
}

/// Columns of trajectories `ids`, `steps` steps each, whose bytes encode
/// (id, step).
struct Batch {
    obs: Vec<u8>,
    action: Vec<i32>,
    reward: Vec<f32>,
}

impl Batch {
    fn new(ids: impl IntoIterator<Item = u8>, steps: u64) -> Self {
        let mut b = Batch { obs: Vec::new(), action: Vec::new(), reward: Vec::new() };
        for id in ids {
            for s in 0..steps as u8 {
                b.obs.extend_from_slice(&[id, s, 1, 2, 3, 4]);
                b.action.push(i32::from(id) * 1000 + i32::from(s));
                b.reward.extend_from_slice(&[f32::from(s), f32::from(id)]);
            }
        }
        b
    }

    fn values(&self) -> [StepValue<'_>; 3] {
        [StepValue::typed(&self.obs), StepValue::typed(&self.action), StepValue::typed(&self.reward)]
    }
}

/// Samples `rows` rows and checks each against the trajectory its key was
/// inserted with (`ids[key]`, `steps` steps); returns how often each id came.
fn check_rows(table: &ReplayTable, ids: &HashMap<SlotKey, u8>, steps: u64, rows: usize) -> HashMap<u8, usize> {
    let mut sampler = table.sampler(SampleConfig::new(rows, window())).unwrap();
    let batch = sampler.sample().unwrap();
    let obs = batch.column("obs").unwrap().bytes;
    let action = batch.column("action").unwrap().as_slice::<i32>().unwrap();
    let reward = batch.column("reward").unwrap().as_slice::<f32>().unwrap();
    check_batch(ids, steps, batch.keys(), batch.lengths(), obs, action, reward)
}

fn window() -> WindowSpec {
    WindowSpec { offset: 0, len: T, pad: Pad::Tail }
}

/// Checks a batch's rows against the trajectories their keys were inserted
/// with; returns how often each id came.
fn check_batch(
    ids: &HashMap<SlotKey, u8>,
    steps: u64,
    keys: &[SlotKey],
    lengths: &[u64],
    obs: &[u8],
    action: &[i32],
    reward: &[f32],
) -> HashMap<u8, usize> {
    let mut seen = HashMap::new();
    for (r, key) in keys.iter().enumerate() {
        let id = *ids.get(key).unwrap_or_else(|| panic!("row {r}: key {key} was not inserted by this test"));
        *seen.entry(id).or_insert(0) += 1;
        assert_eq!(lengths[r], steps, "row {r}");
        for s in 0..T as usize {
            let o = &obs[(r * T as usize + s) * 6..][..6];
            let a = action[r * T as usize + s];
            let w = &reward[(r * T as usize + s) * 2..][..2];
            if (s as u64) < steps {
                assert_eq!(o, &[id, s as u8, 1, 2, 3, 4], "row {r} step {s}");
                assert_eq!(a, i32::from(id) * 1000 + s as i32, "row {r} step {s}");
                assert_eq!(w, &[s as f32, f32::from(id)], "row {r} step {s}");
            } else {
                assert!(o.iter().all(|&b| b == 0) && a == 0 && w == [0.0, 0.0], "row {r} step {s} is padding");
            }
        }
    }
    seen
}

#[test]
fn a_batch_round_trips_every_trajectory_in_order() {
    let table = ReplayTable::builder(spec(16)).seed(3).build().unwrap();
    let batch = Batch::new(10..15, 3);
    let keys = table.writer().insert_batch(5, 3, &batch.values(), Some(&[1.0, 2.0, 3.0, 4.0, 5.0])).unwrap();
    assert_eq!(keys.len(), 5);
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts, info.slots.committed, info.slots.writing), (5, 5, 5, 0));
    assert_eq!(info.bytes_written, 5 * 3 * (6 + 4 + 8));
    let ids: HashMap<SlotKey, u8> = keys.iter().copied().zip(10..15).collect();
    assert_eq!(ids.len(), 5, "distinct keys");
    let seen = check_rows(&table, &ids, 3, 400);
    assert_eq!(seen.len(), 5, "every trajectory is sampled: {seen:?}");
}

/// A free list whose entry part way through a batch names a slot that is
/// not free (another process's memory scribbled on, or a bug): the batch
/// stops taking slots from the list there, the list is rebuilt from the
/// slot records, and every trajectory still lands in a slot of its own,
/// with no slot lost.
#[test]
fn a_free_list_entry_naming_a_taken_slot_part_way_through_a_batch_is_repaired() {
    use std::os::unix::fs::FileExt;
    let name = format!("gear-batched-free-list-{}", std::process::id());
    let table = ReplayTable::builder(spec(16)).shared_memory(&name).seed(5).build().unwrap();
    let first = table.writer().insert_batch(2, 3, &Batch::new(0..2, 3).values(), None).unwrap();
    // Slots 0 and 1 are taken; the list pops slots 2, 3, 4, ... from its
    // end. Make the fourth pop name slot 0.
    let rl = gear_core::RegionLayout::for_spec(table.spec()).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(format!("/dev/shm/{name}")).unwrap();
    let free_len = 14u64;
    let entry = rl.free_offset + 4 * (free_len - 4);
    let mut b = [0u8; 4];
    file.read_exact_at(&mut b, entry).unwrap();
    assert_eq!(u32::from_ne_bytes(b), 5, "the list pops slots in order");
    file.write_all_at(&0u32.to_ne_bytes(), entry).unwrap();
    let keys = table.writer().insert_batch(10, 3, &Batch::new(2..12, 3).values(), None).unwrap();
    let mut slots: Vec<u32> = first.iter().chain(&keys).map(|k| k.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 12, "every trajectory in a slot of its own: {first:?} {keys:?}");
    let info = table.info().unwrap();
    assert_eq!((info.size, info.slots.committed, info.slots.free, info.slots.writing), (12, 12, 4, 0));
    let ids: HashMap<SlotKey, u8> = first.iter().chain(&keys).copied().zip(0..12).collect();
    let seen = check_rows(&table, &ids, 3, 600);
    assert_eq!(seen.len(), 12, "every trajectory is sampled, with its own bytes: {seen:?}");
    drop(table);
    let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
}

#[test]
fn no_priorities_lets_the_strategy_choose_and_one_step_items_work() {
    let table = ReplayTable::builder(spec(64))
        .sampler_kind(gear_sampler::StrategyKind::Prioritized, Default::default())
        .build()
        .unwrap();
    let batch = Batch::new(0..40, 1);
    let keys = table.writer().insert_batch(40, 1, &batch.values(), None).unwrap();
    let ids: HashMap<SlotKey, u8> = keys.iter().copied().zip(0..40).collect();
    check_rows(&table, &ids, 1, 256);
}

#[test]
fn a_full_table_evicts_as_single_inserts_would() {
    let table = ReplayTable::builder(spec(4)).build().unwrap();
    let batch = Batch::new(0..10, 2);
    let mut keys = table.writer().insert_batch(4, 2, &Batch::new(0..4, 2).values(), None).unwrap();
    keys.extend(table.writer().insert_batch(3, 2, &Batch::new(4..7, 2).values(), None).unwrap());
    keys.extend(table.writer().insert_batch(3, 2, &Batch::new(7..10, 2).values(), None).unwrap());
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts, info.evictions), (4, 10, 6));
    // FIFO eviction keeps the last four.
    let ids: HashMap<SlotKey, u8> = keys[6..].iter().copied().zip(6..10).collect();
    let seen = check_rows(&table, &ids, 2, 200);
    assert_eq!(seen.len(), 4, "{seen:?}");
    // A batch larger than the table would evict its own first rows: refused
    // whole, and nothing stored is touched.
    let e = table.writer().insert_batch(10, 2, &batch.values(), None).unwrap_err();
    assert!(e.to_string().contains("does not fit a table of 4 slots"), "{e}");
    assert_eq!(table.info().unwrap().inserts, 10);
}

fn same_contents(a: &TableInfo, b: &TableInfo) {
    assert_eq!(
        (a.size, a.inserts, a.evictions, a.bytes_written, a.slots),
        (b.size, b.inserts, b.evictions, b.bytes_written, b.slots)
    );
}

#[test]
fn bad_input_is_refused_before_any_slot_is_taken() {
    let table = ReplayTable::builder(spec(8)).build().unwrap();
    let w = table.writer();
    let good = Batch::new([7], 2);
    let first = w.insert_batch(1, 2, &good.values(), None).unwrap();
    let before = table.info().unwrap();
    let five = Batch::new(0..5, 2);
    let [obs, action, reward] = five.values();
    let wide = vec![0i64; 10];
    let cases: Vec<(&str, gear_api::Result<Vec<SlotKey>>)> = vec![
        ("column", w.insert_batch(5, 2, &[obs, action], None)),
        ("obs", w.insert_batch(5, 2, &[StepValue::typed(&five.obs[..59]), action, reward], None)),
        ("obs", w.insert_batch(4, 2, &five.values(), None)),
        ("action", w.insert_batch(5, 2, &[obs, StepValue::typed(&wide), reward], None)),
        ("priorities", w.insert_batch(5, 2, &five.values(), Some(&[1.0; 4]))),
        ("priority", w.insert_batch(5, 2, &five.values(), Some(&[1.0, 1.0, f64::NAN, 1.0, 1.0]))),
        ("priority", w.insert_batch(5, 2, &five.values(), Some(&[1.0, -1.0, 1.0, 1.0, 1.0]))),
        ("empty", w.insert_batch(5, 0, &five.values(), None)),
        ("maximum", w.insert_batch(2, 5, &five.values(), None)),
    ];
    for (word, result) in cases {
        let e = result.expect_err(word);
        assert!(e.to_string().to_lowercase().contains(word), "`{e}` should name the {word}");
        same_contents(&table.info().unwrap(), &before);
    }
    // The trajectory inserted first is still there, untouched.
    check_rows(&table, &HashMap::from([(first[0], 7)]), 2, 8);
    assert!(w.insert_batch(0, 2, &Batch::new([], 2).values(), None).unwrap().is_empty());
}

#[test]
fn the_rate_limiter_admits_what_it_can_and_a_timeout_keeps_what_was_committed() {
    // At most three inserts ahead of samples (min_diff -1, max_diff 3).
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    let w = table.writer().with_timeout(Duration::from_millis(200));
    let batch = Batch::new(0..5, 1);
    let e = w.insert_batch(5, 1, &batch.values(), None).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts, info.slots.writing, info.slots.committed), (3, 3, 0, 3));

    // With a sampler draining, a batch larger than the limiter's window
    // completes: it never holds slots while it waits.
    let sampler_table = table.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_sampling = stop.clone();
    let drain = std::thread::spawn(move || {
        let config = SampleConfig::new(1, WindowSpec::whole(T)).timeout(Some(Duration::from_millis(50)));
        let mut s = sampler_table.sampler(config).unwrap();
        while !stop_sampling.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = s.sample();
        }
    });
    let many = Batch::new(0..16, 1);
    let w = table.writer().with_timeout(Duration::from_secs(20));
    let keys = w.insert_batch(16, 1, &many.values(), None).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drain.join().unwrap();
    assert_eq!(keys.len(), 16);
    assert_eq!(table.info().unwrap().inserts, 19);
}

#[test]
fn a_refused_commit_stops_the_batch_and_leaks_no_slot() {
    let table = ReplayTable::builder(spec(8)).sampler(refuses_thirteen()).build().unwrap();
    let batch = Batch::new(0..5, 1);
    let e = table.writer().insert_batch(5, 1, &batch.values(), Some(&[1.0, 2.0, 13.0, 4.0, 5.0])).unwrap_err();
    assert!(e.to_string().contains("priority 13 refused"), "{e}");
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts), (2, 2), "the two before the refused one stay");
    assert_eq!((info.slots.committed, info.slots.writing, info.slots.free), (2, 0, 6), "nothing left taken");
    // The table still works: the slots given back are used again.
    let more = Batch::new(10..16, 1);
    table.writer().insert_batch(6, 1, &more.values(), None).unwrap();
    assert_eq!(table.info().unwrap().size, 8);
}

/// A table (seeded with `seed`) holding trajectories 10 to 14, three steps
/// each, and the id of each key.
fn five_items(seed: u64) -> (ReplayTable, HashMap<SlotKey, u8>) {
    let table = ReplayTable::builder(spec(16)).seed(seed).build().unwrap();
    let batch = Batch::new(10..15, 3);
    let keys = table.writer().insert_batch(5, 3, &batch.values(), None).unwrap();
    let ids = keys.iter().copied().zip(10..15).collect();
    (table, ids)
}

#[test]
fn sample_into_writes_caller_buffers_like_a_sampled_batch() {
    let (table, ids) = five_items(5);
    let rows = 64;
    let mut sampler = table.sampler(SampleConfig::new(rows, window())).unwrap();
    let layout = sampler.layout().clone();
    let n = |i: usize| layout.column_bytes(i) as usize;
    // Larger than needed and not zeroed: padding must still come out zero,
    // and the bytes past each column must stay as they were.
    let mut bufs: Vec<Vec<u8>> = (0..3).map(|i| vec![0xEE; n(i) + 16]).collect();
    for round in 0..3 {
        let mut cols: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let out = sampler.sample_into(&mut cols).unwrap();
        assert_eq!(out.rows(), rows);
        assert!(out.probabilities().iter().all(|&p| (p - 0.2).abs() < 1e-12), "uniform over 5");
        assert!(out.weights().iter().all(|&w| w == 1.0) && out.starts().iter().all(|&s| s == 0));
        let (keys, lengths) = (out.keys().to_vec(), out.lengths().to_vec());
        let action: Vec<i32> = bufs[1][..n(1)].chunks(4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).collect();
        let reward: Vec<f32> = bufs[2][..n(2)].chunks(4).map(|b| f32::from_ne_bytes(b.try_into().unwrap())).collect();
        let seen = check_batch(&ids, 3, &keys, &lengths, &bufs[0][..n(0)], &action, &reward);
        assert_eq!(seen.len(), 5, "round {round}: {seen:?}");
        for (i, b) in bufs.iter().enumerate() {
            assert!(b[n(i)..].iter().all(|&x| x == 0xEE), "round {round}: column {i} written past its batch bytes");
        }
    }
    assert_eq!(table.info().unwrap().samples, 3 * rows as u64);
}

#[test]
fn sample_into_uninit_writes_every_byte_of_uninitialised_buffers() {
    use std::mem::MaybeUninit;
    let (table, ids) = five_items(9);
    let rows = 48;
    let mut sampler = table.sampler(SampleConfig::new(rows, window())).unwrap();
    let layout = sampler.layout().clone();
    let n = |i: usize| layout.column_bytes(i) as usize;
    let mut bufs: Vec<Vec<MaybeUninit<u8>>> = (0..3).map(|i| vec![MaybeUninit::uninit(); n(i)]).collect();
    let mut cols: Vec<&mut [MaybeUninit<u8>]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let out = sampler.sample_into_uninit(&mut cols).unwrap();
    let (keys, lengths) = (out.keys().to_vec(), out.lengths().to_vec());
    let bytes: Vec<Vec<u8>> = bufs
        .iter()
        .map(|b| {
            b.iter()
                .map(|x| {
                    // SAFETY: `sample_into_uninit` returned `Ok`, so it wrote
                    // every byte of each column, padding included (its
                    // contract; Miri flags a byte left unwritten).
                    unsafe { x.assume_init() }
                })
                .collect()
        })
        .collect();
    let action: Vec<i32> = bytes[1].chunks(4).map(|b| i32::from_ne_bytes(b.try_into().unwrap())).collect();
    let reward: Vec<f32> = bytes[2].chunks(4).map(|b| f32::from_ne_bytes(b.try_into().unwrap())).collect();
    let seen = check_batch(&ids, 3, &keys, &lengths, &bytes[0], &action, &reward);
    assert_eq!(seen.len(), 5, "{seen:?}");
}

#[test]
fn sample_into_refuses_bad_buffers_before_drawing() {
    let table = ReplayTable::builder(spec(16)).max_times_sampled(1).build().unwrap();
    let batch = Batch::new(0..4, 2);
    table.writer().insert_batch(4, 2, &batch.values(), None).unwrap();
    let mut sampler = table.sampler(SampleConfig::new(2, window())).unwrap();
    let layout = sampler.layout().clone();
    let mut ok: Vec<Vec<u8>> = (0..3).map(|i| vec![0; layout.column_bytes(i) as usize]).collect();
    let mut short = vec![0u8; layout.column_bytes(0) as usize - 1];
    let [a, b, c] = &mut ok[..] else { unreachable!("three buffers") };
    let e = sampler.sample_into(&mut [&mut a[..], &mut b[..]]).unwrap_err();
    assert!(e.to_string().contains("2 column buffers"), "{e}");
    let e = sampler.sample_into(&mut [&mut short[..], &mut b[..], &mut c[..]]).unwrap_err();
    assert!(e.to_string().contains("batch column 0"), "{e}");
    let info = table.info().unwrap();
    assert_eq!((info.samples, info.size, info.retired), (0, 4, 0), "nothing drawn, nothing retired");
    let out = sampler.sample_into(&mut [&mut a[..], &mut b[..], &mut c[..]]).unwrap();
    let distinct = out.keys().iter().collect::<std::collections::HashSet<_>>().len() as u64;
    let info = table.info().unwrap();
    assert_eq!((info.samples, info.retired), (2, distinct), "a good call draws and retires as sample() does");
}

/// Uniform selection that refuses items of priority 13 (as a downstream
/// strategy might refuse what it cannot hold).
fn refuses_thirteen() -> common::HookedUniform {
    common::HookedUniform { refuse: |p| p == Some(13.0), ..common::HookedUniform::new("refuses-thirteen") }
}

/// A batch into a full table evicts what as many single inserts would
/// (the remover's oldest, FIFO) in one go, and another handle's mirror
/// follows through the log: both draw from exactly the live trajectories
/// with the same masses, and the evicted keys are stale for both.
#[test]
fn a_batch_into_a_full_table_evicts_the_oldest_and_every_mirror_follows() {
    let name = format!("gear-batched-evict-{}", std::process::id());
    let params = gear_sampler::StrategyParams { alpha: 0.6, beta: 0.4, stratified: true };
    let table = ReplayTable::builder(spec(64))
        .shared_memory(&name)
        .sampler_kind(gear_sampler::StrategyKind::Prioritized, params)
        .build()
        .unwrap();
    let other = ReplayTable::attach(&name, gear_api::AttachOptions::default()).unwrap();
    let w = table.writer();
    let first = Batch::new(0..64, 1);
    let priorities: Vec<f64> = (0..64).map(|i| 1.0 + f64::from(i)).collect();
    let old = w.insert_batch(64, 1, &first.values(), Some(&priorities)).unwrap();
    let second = Batch::new(100..140, 1);
    let new = w.insert_batch(40, 1, &second.values(), Some(&priorities[..40])).unwrap();
    let info = table.info().unwrap();
    assert_eq!((info.size, info.evictions, info.inserts), (64, 40, 104));
    // FIFO: the forty oldest went, the rest stayed.
    let stale: Vec<(SlotKey, f64)> = old[..40].iter().map(|&k| (k, 1.0)).collect();
    assert_eq!(table.update_priorities(&stale).unwrap(), 0);
    assert_eq!(other.update_priorities(&stale).unwrap(), 0);
    let live: Vec<(SlotKey, f64)> = old[40..].iter().chain(&new).map(|&k| (k, 2.0)).collect();
    assert_eq!(other.update_priorities(&live).unwrap(), 64, "the attached mirror holds every live key");
    assert_eq!(table.selection_mass().unwrap(), other.selection_mass().unwrap());
    for t in [&table, &other] {
        let mut s = t.sampler(SampleConfig::new(256, WindowSpec::last(1))).unwrap();
        let b = s.sample().unwrap();
        assert!(b.keys().iter().all(|k| live.iter().any(|(l, _)| l == k)));
        let ids: &[i32] = b.column("action").unwrap().as_slice().unwrap();
        assert!(ids.iter().all(|&a| a / 1000 >= 40), "no evicted trajectory's bytes");
    }
}
