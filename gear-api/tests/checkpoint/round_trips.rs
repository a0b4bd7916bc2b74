//! Round trips: every dtype (equal draws after restore) and items (keys,
//! windows, priorities and times sampled).

use super::{draws, every_dtype_spec, fill_random, temp_dir};
use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_sampler::{StrategyKind, StrategyParams};

#[test]
fn every_dtype_round_trips_and_draws_after_restore_equal_draws_before() {
    let dir = temp_dir("roundtrip");
    let strategies = [
        (StrategyKind::Uniform, StrategyKind::Fifo),
        (StrategyKind::Prioritized, StrategyKind::MinHeap),
        (StrategyKind::MaxHeap, StrategyKind::Lifo),
    ];
    for (sampler_kind, remover_kind) in strategies {
        let build = || {
            ReplayTable::builder(every_dtype_spec(48))
                .sampler_kind(sampler_kind, StrategyParams::default())
                .remover_kind(remover_kind)
                .seed(11)
        };
        let table = build().build().unwrap();
        // Three times the capacity: evictions reorder the strategies.
        fill_random(&table, 150, 3);
        let keys = draws(&table, 2)[0].0.clone();
        table.update_priorities(&keys.iter().map(|&k| (k, 7.5)).collect::<Vec<_>>()).unwrap();
        let path = dir.join(format!("{}.gear", sampler_kind.name()));
        let report = table.checkpoint(&path).unwrap();
        assert_eq!((report.trajectories, report.dropped), (48, 0));
        let before = draws(&table, 4);
        let restored = build().restore(&path).unwrap();
        // The restored table made no sampler yet: align the sampler count.
        draws(&restored, 2);
        assert_eq!(draws(&restored, 4), before, "{sampler_kind:?}: same seed, same rows");
        let (a, b) = (table.info().unwrap(), restored.info().unwrap());
        assert_eq!((b.size, b.evictions), (a.size, a.evictions));
        // Counters restored at the checkpoint (the original sampled since).
        assert_eq!(b.inserts, a.inserts);
        // Both go on alike: the next insert without a priority gets the
        // same one, and the next draws match again.
        fill_random(&table, 5, 99);
        fill_random(&restored, 5, 99);
        assert_eq!(draws(&restored, 2), draws(&table, 2), "{sampler_kind:?}: after more inserts");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A table of items: two columns, windows of 3 every 2 (the tail too) by
/// default, prioritized, `M = T`.
fn item_table() -> gear_api::TableBuilder {
    let spec =
        TableSpec::new(vec![ColumnSpec::new("x", DType::I32, vec![]), ColumnSpec::new("y", DType::U8, vec![3])], 10, 6)
            .unwrap()
            .with_items_per_trajectory(10)
            .unwrap();
    ReplayTable::builder(spec)
        .item_pattern(gear_api::ItemPattern::Windows { len: 3, stride: 2, tail: true })
        .sampler_kind(StrategyKind::Prioritized, StrategyParams::default())
        .seed(5)
}

#[test]
fn items_round_trip_with_keys_windows_priorities_and_times_sampled() {
    let dir = temp_dir("items");
    let table = item_table().build().unwrap();
    let mut rng = Xoshiro256::seed_from_u64(8);
    let mut trajectories = Vec::new();
    // Nine trajectories through six slots: evictions took items out.
    for i in 0..9 {
        let len = 2 + rng.below(9);
        let mut t = table.writer().begin(None).unwrap();
        let x: Vec<i32> = (0..len as i32).map(|s| i * 100 + s).collect();
        t.append_column("x", len, StepValue::typed(&x)).unwrap();
        t.append_column("y", len, StepValue::bytes(&vec![i as u8; 3 * len as usize])).unwrap();
        if i % 3 == 0 {
            t.add_item(0, len, Some(4.0)).unwrap();
        }
        trajectories.push(t.end().unwrap());
    }
    table.add_items(trajectories[8], &[gear_api::NewItem::new(1, 1).with_priority(0.5)]).unwrap();
    let mut s = table.sampler(SampleConfig::new(16, WindowSpec::first(3))).unwrap();
    let keys = s.sample().unwrap().keys().to_vec();
    table.update_priorities(&keys[..4].iter().map(|&k| (k, 9.0)).collect::<Vec<_>>()).unwrap();
    let path = dir.join("items.gear");
    let report = table.checkpoint(&path).unwrap();
    let restored = item_table().restore(&path).unwrap();
    let mut items = 0;
    for &t in &trajectories {
        let (a, b) = (table.items_of(t).unwrap(), restored.items_of(t).unwrap());
        assert_eq!(a, b, "items of {t}: keys, windows, priorities and times sampled");
        items += a.len() as u64;
    }
    assert_eq!(report.items, items);
    assert!(items > 6, "several items per trajectory");
    let (a, b) = (table.info().unwrap(), restored.info().unwrap());
    assert_eq!((b.size, b.inserts, b.samples), (a.size, a.inserts, a.samples));
    // Seeded alike, both draw the same item rows (the restored table's
    // second sampler, as the original's).
    drop(restored.sampler(SampleConfig::new(1, WindowSpec::first(3))).unwrap());
    let (mut sa, mut sb) = (
        table.sampler(SampleConfig::new(64, WindowSpec::first(3))).unwrap(),
        restored.sampler(SampleConfig::new(64, WindowSpec::first(3))).unwrap(),
    );
    let (ba, bb) = (sa.sample().unwrap(), sb.sample().unwrap());
    assert_eq!(ba.keys(), bb.keys());
    assert_eq!(ba.column("x").unwrap().bytes, bb.column("x").unwrap().bytes);
    assert!(ba.keys().iter().all(|k| k.is_item()));
    // Stale keys stay stale: an evicted trajectory's items are not back.
    assert!(restored.items_of(trajectories[0]).unwrap().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
