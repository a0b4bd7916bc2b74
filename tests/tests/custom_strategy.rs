//! A strategy from a downstream crate works through the public API.

use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use tests::AboveThreshold;

#[test]
fn threshold_strategy_drives_sampling_and_follows_priority_updates() {
    let spec = TableSpec::new(vec![ColumnSpec::new("x", DType::I64, vec![])], 1, 16).unwrap();
    let table = ReplayTable::builder(spec).sampler(AboveThreshold::new(5.0)).seed(3).build().unwrap();
    let mut keys = Vec::new();
    for i in 0..10i64 {
        let mut t = table.writer().begin(Some(i as f64)).unwrap();
        t.append_step(&[StepValue::typed(&[i])]).unwrap();
        keys.push(t.end().unwrap());
    }
    let mut sampler = table.sampler(SampleConfig::new(500, WindowSpec::whole(1))).unwrap();
    let xs: Vec<i64> = sampler.sample().unwrap().column("x").unwrap().as_slice::<i64>().unwrap().to_vec();
    assert!(xs.iter().all(|&x| x > 5), "only priorities above 5 are drawn: {xs:?}");
    for want in 6..10 {
        assert!(xs.contains(&want), "item {want} never drawn in 500 draws");
    }
    // Raise item 0 above the threshold, drop items 6..10 below it.
    let mut updates = vec![(keys[0], 100.0)];
    updates.extend(keys[6..].iter().map(|k| (*k, 1.0)));
    assert_eq!(table.update_priorities(&updates).unwrap(), 5);
    let batch = sampler.sample().unwrap();
    assert!(batch.column("x").unwrap().as_slice::<i64>().unwrap().iter().all(|&x| x == 0));
}
