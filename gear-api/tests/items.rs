//! Items over stored trajectories through the public API: patterns, items
//! added while writing and after commit, windows inside items, eviction of
//! a trajectory with its items, stale item keys, priorities per item,
//! `max_times_sampled` on items, batched inserts of transitions.

use gear_api::{Error, ItemPattern, NewItem, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, Pad, SlotKey, TableSpec, WindowSpec};
use gear_sampler::{StrategyKind, StrategyParams};
use std::collections::HashMap;

/// One column `step` (i32: trajectory id * 1000 + step), `T` steps,
/// `capacity` trajectories of `m` items each.
fn spec(t: u64, capacity: u64, m: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("step", DType::I32, vec![])], t, capacity)
        .unwrap()
        .with_items_per_trajectory(m)
        .unwrap()
}

/// Writes trajectory `id` of `len` steps; `items` are added while writing
/// (after the last step).
fn write(table: &ReplayTable, id: u32, len: u64, items: &[(u64, u64, Option<f64>)]) -> (SlotKey, Vec<SlotKey>) {
    let mut t = table.writer().begin(None).unwrap();
    let steps: Vec<i32> = (0..len as i32).map(|s| id as i32 * 1000 + s).collect();
    t.append_column("step", len, StepValue::typed(&steps)).unwrap();
    let keys = items.iter().map(|&(start, n, p)| t.add_item(start, n, p).unwrap()).collect();
    (t.end().unwrap(), keys)
}

/// The values of each row of a sampled batch's `step` column.
fn rows(batch: &gear_api::SampledBatch) -> Vec<Vec<i32>> {
    let v: &[i32] = batch.column("step").unwrap().as_slice().unwrap();
    let w = batch.layout().window().len as usize;
    v.chunks(w).map(<[i32]>::to_vec).collect()
}

#[test]
fn r2d2_windows_are_items_over_one_stored_trajectory() {
    let pattern = ItemPattern::Windows { len: 8, stride: 4, tail: false };
    let table = ReplayTable::builder(spec(32, 4, 8)).item_pattern(pattern).seed(3).build().unwrap();
    let (traj, _) = write(&table, 7, 20, &[]);
    let items = table.items_of(traj).unwrap();
    assert_eq!(items.iter().map(|i| (i.start, i.len)).collect::<Vec<_>>(), vec![(0, 8), (4, 8), (8, 8), (12, 8)]);
    assert!(items.iter().all(|i| i.key.is_item()));
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts, info.slots.committed), (4, 4, 1), "the limiter counts items");
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::first(8))).unwrap();
    let batch = sampler.sample().unwrap();
    let starts: HashMap<SlotKey, u64> = items.iter().map(|i| (i.key, i.start)).collect();
    for (r, row) in rows(batch).iter().enumerate() {
        let start = starts[&batch.keys()[r]];
        assert_eq!(batch.starts()[r], start);
        assert_eq!(batch.lengths()[r], 8);
        assert_eq!(row, &(0..8).map(|s| 7000 + start as i32 + s).collect::<Vec<_>>(), "row {r}");
    }
    assert_eq!(table.info().unwrap().samples, 64);
}

#[test]
fn the_window_applies_inside_each_item() {
    let table = ReplayTable::builder(spec(32, 4, 4)).item_pattern(ItemPattern::None).build().unwrap();
    let (_, keys) = write(&table, 1, 20, &[(10, 5, None)]);
    // The last three steps of the item, head-padded to four; the first
    // six of it, tail-padded to six (it has five).
    let mut last = table.sampler(SampleConfig::new(2, WindowSpec::last(4))).unwrap();
    let b = last.sample().unwrap();
    assert_eq!(b.keys(), &[keys[0], keys[0]]);
    assert_eq!(rows(b)[0], vec![1011, 1012, 1013, 1014]);
    assert_eq!(b.starts()[0], 11);
    let mut first = table.sampler(SampleConfig::new(1, WindowSpec { offset: 1, len: 6, pad: Pad::Tail })).unwrap();
    let b = first.sample().unwrap();
    assert_eq!(rows(b)[0], vec![1011, 1012, 1013, 1014, 0, 0]);
    assert_eq!(b.lengths(), &[4]);
    // A random start stays inside the item.
    let mut random = table.sampler(SampleConfig::new(200, WindowSpec::first(2)).random_start()).unwrap();
    let b = random.sample().unwrap();
    let mut seen: Vec<u64> = b.starts().to_vec();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, vec![10, 11, 12, 13]);
}

#[test]
fn items_added_while_writing_become_selectable_at_commit() {
    let table = ReplayTable::builder(spec(16, 4, 4)).build().unwrap();
    let mut t = table.writer().begin(None).unwrap();
    t.append_column("step", 6, StepValue::typed(&[0i32, 1, 2, 3, 4, 5])).unwrap();
    let e = t.add_item(4, 3, None).unwrap_err();
    assert!(e.to_string().contains("item steps 4..7 lie past the 6 steps written"), "{e}");
    assert!(t.add_item(2, 0, None).unwrap_err().to_string().contains("at least one step"));
    assert!(t.add_item(0, 1, Some(-1.0)).is_err());
    let item = t.add_item(1, 3, Some(2.0)).unwrap();
    assert_eq!(table.info().unwrap().size, 0, "nothing selectable before the commit");
    let traj = t.end().unwrap();
    let items = table.items_of(traj).unwrap();
    assert_eq!(items.len(), 1, "explicit items replace the pattern (Whole)");
    assert_eq!((items[0].key, items[0].start, items[0].len, items[0].priority), (item, 1, 3, 2.0));
    let mut s = table.sampler(SampleConfig::new(3, WindowSpec::first(3))).unwrap();
    assert!(s.sample().unwrap().keys().iter().all(|&k| k == item));
}

#[test]
fn items_are_added_to_committed_trajectories_and_refused_for_stale_ones() {
    let table = ReplayTable::builder(spec(16, 2, 3)).item_pattern(ItemPattern::None).build().unwrap();
    let (traj, _) = write(&table, 2, 10, &[]);
    assert_eq!(table.info().unwrap().size, 0);
    let keys = table.add_items(traj, &[NewItem::new(0, 2), NewItem::new(8, 2).with_priority(3.0)]).unwrap();
    assert_eq!(table.items_of(traj).unwrap().len(), 2);
    assert_eq!(table.info().unwrap().size, 2);
    let e = table.add_items(traj, &[NewItem::new(9, 2)]).unwrap_err();
    assert!(e.to_string().contains("lie past the 10 steps"), "{e}");
    let e = table.add_items(traj, &[NewItem::new(0, 1), NewItem::new(1, 1)]).unwrap_err();
    assert!(e.to_string().contains("room for 1 more items"), "{e}");
    assert_eq!(table.items_of(traj).unwrap().len(), 2, "a refused call adds nothing");
    let e = table.add_items(keys[0], &[NewItem::new(0, 1)]).unwrap_err();
    assert!(e.to_string().contains("is an item's key"), "{e}");
    let more = table.add_pattern_items(traj, ItemPattern::Whole, None).unwrap();
    assert_eq!(more.len(), 1);
    // Two more trajectories: the first is evicted (FIFO), its items with it.
    write(&table, 3, 4, &[]);
    write(&table, 4, 4, &[]);
    let e = table.add_items(traj, &[NewItem::new(0, 1)]).unwrap_err();
    assert!(matches!(e, Error::Core(gear_core::Error::StaleKey { .. })), "{e}");
    assert!(table.items_of(traj).unwrap().is_empty());
    assert_eq!(table.update_priorities(&[(keys[0], 1.0), (keys[1], 1.0), (more[0], 1.0)]).unwrap(), 0);
}

#[test]
fn evicting_a_trajectory_removes_exactly_its_items() {
    let pattern = ItemPattern::Windows { len: 2, stride: 1, tail: false };
    let table = ReplayTable::builder(spec(8, 3, 8)).item_pattern(pattern).build().unwrap();
    let trajs: Vec<SlotKey> = (1..=3).map(|id| write(&table, id, 2 + id as u64, &[]).0).collect();
    let before: Vec<Vec<SlotKey>> =
        trajs.iter().map(|&t| table.items_of(t).unwrap().iter().map(|i| i.key).collect()).collect();
    assert_eq!(before.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(table.info().unwrap().size, 9);
    let (newest, _) = write(&table, 4, 3, &[]);
    assert_eq!(table.info().unwrap().size, 9 - 2 + 2);
    assert!(table.items_of(trajs[0]).unwrap().is_empty());
    for (t, items) in trajs[1..].iter().zip(&before[1..]) {
        assert_eq!(&table.items_of(*t).unwrap().iter().map(|i| i.key).collect::<Vec<_>>(), items);
    }
    // Only the survivors' items are drawn, never a stale one.
    let mut s = table.sampler(SampleConfig::new(500, WindowSpec::first(2))).unwrap();
    let b = s.sample().unwrap();
    let live: Vec<SlotKey> =
        before[1..].iter().flatten().copied().chain(table.items_of(newest).unwrap().iter().map(|i| i.key)).collect();
    assert!(b.keys().iter().all(|k| live.contains(k)));
    for (k, row) in b.keys().iter().zip(rows(b)) {
        assert_ne!(row[0] / 1000, 1, "row of {k} reads the evicted trajectory");
    }
    // Stale item keys are counted stale; live ones apply.
    assert_eq!(table.update_priorities(&[(before[0][0], 5.0), (before[1][0], 5.0)]).unwrap(), 1);
}

#[test]
fn item_priorities_choose_the_rows_and_update_by_item_key() {
    let params = StrategyParams { alpha: 1.0, beta: 1.0, stratified: false };
    let table = ReplayTable::builder(spec(8, 2, 4))
        .item_pattern(ItemPattern::None)
        .sampler_kind(StrategyKind::Prioritized, params)
        .seed(9)
        .build()
        .unwrap();
    let (_, keys) = write(&table, 1, 4, &[(0, 1, Some(1.0)), (1, 1, Some(0.0)), (2, 1, Some(3.0))]);
    let mut s = table.sampler(SampleConfig::new(4000, WindowSpec::first(1))).unwrap();
    let count = |b: &gear_api::SampledBatch, k: SlotKey| b.keys().iter().filter(|&&x| x == k).count();
    let b = s.sample().unwrap();
    assert_eq!(count(b, keys[1]), 0, "priority 0 is never drawn");
    let (a, c) = (count(b, keys[0]) as f64, count(b, keys[2]) as f64);
    assert!((c / a - 3.0).abs() < 0.4, "3:1 expected, got {c}:{a}");
    let i = b.keys().iter().position(|&k| k == keys[2]).unwrap();
    assert!((b.probabilities()[i] - 0.75).abs() < 1e-12);
    assert_eq!(table.update_priorities(&[(keys[1], 4.0), (keys[2], 0.0)]).unwrap(), 2);
    let b = s.sample().unwrap();
    assert_eq!(count(b, keys[2]), 0);
    assert!(count(b, keys[1]) > count(b, keys[0]) * 3);
}

#[test]
fn items_leave_after_max_times_sampled_and_their_trajectory_stays() {
    let table = ReplayTable::builder(spec(8, 2, 4))
        .item_pattern(ItemPattern::Transitions { n_step: 1 })
        .sampler_kind(StrategyKind::Fifo, StrategyParams::default())
        .max_times_sampled(1)
        .build()
        .unwrap();
    let (traj, _) = write(&table, 1, 4, &[]);
    assert_eq!(table.info().unwrap().size, 3);
    let mut s = table.sampler(SampleConfig::new(3, WindowSpec::first(2))).unwrap();
    let b = s.sample().unwrap();
    assert_eq!(rows(b), vec![vec![1000, 1001], vec![1001, 1002], vec![1002, 1003]]);
    let info = table.info().unwrap();
    assert_eq!((info.size, info.retired, info.slots.committed), (0, 3, 1));
    assert!(table.items_of(traj).unwrap().is_empty());
    // Its records are free for new items of the same trajectory.
    assert_eq!(table.add_items(traj, &[NewItem::new(0, 4)]).unwrap().len(), 1);
}

#[test]
fn batched_inserts_make_one_item_per_transition_with_its_priority() {
    let params = StrategyParams { alpha: 1.0, beta: 0.0, stratified: true };
    let table = ReplayTable::builder(spec(2, 64, 1)).sampler_kind(StrategyKind::Prioritized, params).build().unwrap();
    let steps: Vec<i32> = (0..64 * 2).collect();
    let priorities: Vec<f64> = (0..64).map(|i| if i == 5 { 1.0 } else { 0.0 }).collect();
    let keys = table.writer().insert_batch(64, 2, &[StepValue::typed(&steps)], Some(&priorities)).unwrap();
    assert_eq!(table.info().unwrap().size, 64);
    let item = table.items_of(keys[5]).unwrap()[0];
    assert_eq!((item.start, item.len, item.priority), (0, 2, 1.0));
    let mut s = table.sampler(SampleConfig::new(8, WindowSpec::first(2))).unwrap();
    let b = s.sample().unwrap();
    assert!(b.keys().iter().all(|&k| k == item.key));
    assert!(rows(b).iter().all(|r| r == &vec![10, 11]));
    // Patterns that do not fit the records are refused before anything is taken.
    let e = table.writer().insert_batch(1, 3, &[StepValue::typed(&[0i32, 1, 2])], None).unwrap_err();
    assert!(e.to_string().contains("exceed the maximum length") || e.to_string().contains("items"), "{e}");
}

#[test]
fn tables_without_items_refuse_item_calls_and_patterns() {
    let plain = TableSpec::new(vec![ColumnSpec::new("step", DType::I32, vec![])], 4, 2).unwrap();
    let table = ReplayTable::builder(plain.clone()).build().unwrap();
    let (traj, _) = write(&table, 1, 2, &[]);
    assert!(table.add_items(traj, &[NewItem::new(0, 1)]).unwrap_err().to_string().contains("has no items"));
    let mut t = table.writer().begin(None).unwrap();
    t.append_column("step", 1, StepValue::typed(&[1i32])).unwrap();
    assert!(t.add_item(0, 1, None).unwrap_err().to_string().contains("has no items"));
    let e = ReplayTable::builder(plain).item_pattern(ItemPattern::None).build().unwrap_err();
    assert!(e.to_string().contains("needs a spec with items"), "{e}");
    let e = ReplayTable::builder(spec(4, 2, 2)).sample_while_writing(true).build().unwrap_err();
    assert!(e.to_string().contains("cannot sample while writing"), "{e}");
}

#[test]
fn a_pattern_with_more_items_than_records_leaves_the_trajectory_open() {
    let table =
        ReplayTable::builder(spec(16, 2, 2)).item_pattern(ItemPattern::Transitions { n_step: 1 }).build().unwrap();
    let mut t = table.writer().begin(None).unwrap();
    t.append_column("step", 4, StepValue::typed(&[0i32, 1, 2, 3])).unwrap();
    let e = t.end().unwrap_err();
    assert!(e.to_string().contains("makes 3 items"), "{e}");
    assert_eq!(table.info().unwrap().slots.writing, 1, "still open: nothing lost");
    t.add_item(0, 2, None).unwrap();
    t.end().unwrap();
    assert_eq!(table.info().unwrap().size, 1);
}

#[test]
fn a_writer_that_chooses_no_items_gets_none_not_the_pattern() {
    let table = ReplayTable::builder(spec(8, 2, 8)).build().unwrap();
    let mut t = table.writer().begin(None).unwrap();
    t.append_column("step", 1, StepValue::typed(&[5i32])).unwrap();
    // One step has no transition: the writer's choice is no item.
    assert!(t.add_items(ItemPattern::Transitions { n_step: 1 }, None).unwrap().is_empty());
    let traj = t.end().unwrap();
    assert!(table.items_of(traj).unwrap().is_empty(), "the table's Whole pattern did not apply");
    assert_eq!(table.info().unwrap().size, 0);
}
