//! Public-API tests of the replay table: round trips, windows, bad input,
//! eviction, stale keys, timeouts, shared memory across processes.

use common::spec3;
use gear_api::{AttachOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, Pad, SlotKey, TableSpec, WindowSpec};
use proptest::prelude::*;
use std::time::{Duration, Instant};

mod common;

/// Writes a trajectory of `len` steps whose bytes encode (`id`, step).
fn write_traj(table: &ReplayTable, id: u8, len: u64, priority: Option<f64>) -> SlotKey {
    let mut traj = table.writer().begin(priority).unwrap();
    for s in 0..len {
        let obs = [id, s as u8, 1, 2, 3, 4];
        traj.append_step(&[
            StepValue::typed(&obs),
            StepValue::typed(&[i32::from(id) * 1000 + s as i32]),
            StepValue::typed(&[s as f32, f32::from(id)]),
        ])
        .unwrap();
    }
    traj.end().unwrap()
}

fn unique(prefix: &str) -> String {
    format!("gear-test-{prefix}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64
}

#[test]
fn every_dtype_round_trips_byte_exact() {
    let cols: Vec<ColumnSpec> = DType::ALL.iter().map(|d| ColumnSpec::new(format!("c_{d}"), *d, vec![3])).collect();
    let spec = TableSpec::new(cols, 4, 8).unwrap();
    let table = ReplayTable::builder(spec.clone()).build().unwrap();
    // Distinct, type-valid patterns per dtype: bools are 0/1, floats are
    // arbitrary bit patterns (NaNs included) which must survive untouched.
    let step_bytes = |d: DType, step: u64| -> Vec<u8> {
        (0..3 * d.size())
            .map(|i| match d {
                DType::Bool => ((i + step) % 2) as u8,
                _ => (i as u8).wrapping_mul(37).wrapping_add(step as u8 * 11).wrapping_add(d.code()),
            })
            .collect()
    };
    let mut traj = table.writer().begin(None).unwrap();
    for step in 0..4 {
        let data: Vec<Vec<u8>> = DType::ALL.iter().map(|d| step_bytes(*d, step)).collect();
        let values: Vec<StepValue<'_>> =
            DType::ALL.iter().zip(&data).map(|(d, b)| StepValue::bytes(b).with_dtype(*d).with_shape(&[3])).collect();
        traj.append_step(&values).unwrap();
    }
    traj.end().unwrap();
    let mut sampler = table.sampler(SampleConfig::new(2, WindowSpec::whole(4))).unwrap();
    let batch = sampler.sample().unwrap();
    for (i, d) in DType::ALL.iter().enumerate() {
        let col = batch.column_at(i);
        assert_eq!(col.dtype, *d);
        for row in 0..2 {
            let row_bytes = &col.bytes[row * 4 * 3 * d.size() as usize..][..4 * 3 * d.size() as usize];
            let want: Vec<u8> = (0..4).flat_map(|s| step_bytes(*d, s)).collect();
            assert_eq!(row_bytes, &want[..], "dtype {d} row {row}");
        }
    }
    assert_eq!(batch.lengths(), &[4, 4]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Sampled windows equal a naive per-step reference, for random stored
    /// lengths, offsets, window lengths and both pads; with two or three
    /// trajectories and batches of 8 the batch always repeats keys.
    #[test]
    fn sampled_windows_match_the_per_step_rule(
        lens in prop::collection::vec(1u64..20, 1..4),
        offset in -25i64..25,
        wlen in 1u64..20,
        head in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let t = 20;
        let table = ReplayTable::builder(spec3(t, 4)).seed(seed).build().unwrap();
        let keys: Vec<SlotKey> = lens.iter().enumerate().map(|(i, &l)| write_traj(&table, i as u8 + 1, l, None)).collect();
        let pad = if head { Pad::Head } else { Pad::Tail };
        let window = WindowSpec { offset, len: wlen, pad };
        let mut sampler = table.sampler(SampleConfig::new(8, window).columns(["obs", "reward"])).unwrap();
        let batch = sampler.sample().unwrap();
        let obs = batch.column("obs").unwrap().bytes;
        let reward: &[f32] = batch.column("reward").unwrap().as_slice().unwrap();
        for (r, key) in batch.keys().iter().enumerate() {
            let i = keys.iter().position(|k| k == key).expect("sampled key was written");
            let k = lens[i] as i64;
            let l = wlen as i64;
            let start = if offset >= 0 { offset } else { (k + offset).max(0) };
            let end = (start + l).min(k);
            let n = (end - start).max(0);
            prop_assert_eq!(batch.lengths()[r], n as u64);
            for j in 0..l {
                let src = match pad { Pad::Tail => j, Pad::Head => j - (l - n) };
                let o = &obs[((r as i64 * l + j) * 6) as usize..][..6];
                let rw = &reward[((r as i64 * l + j) * 2) as usize..][..2];
                if (0..n).contains(&src) {
                    let step = start + src;
                    prop_assert_eq!(o, &[i as u8 + 1, step as u8, 1, 2, 3, 4][..]);
                    prop_assert_eq!(rw, &[step as f32, f32::from(i as u8 + 1)][..]);
                } else {
                    prop_assert_eq!(o, &[0u8; 6][..]);
                    prop_assert_eq!(rw, &[0.0f32, 0.0][..]);
                }
            }
        }
    }
}

#[test]
fn wrong_steps_are_refused_and_harm_nothing() {
    let table = ReplayTable::builder(spec3(3, 4)).build().unwrap();
    let good = write_traj(&table, 9, 3, None);
    let mut traj = table.writer().begin(None).unwrap();
    let obs = [1u8; 6];
    let err = |r: gear_api::Result<()>| r.unwrap_err().to_string();
    // Wrong byte length, named column and sizes.
    let e = err(traj.append_step(&[
        StepValue::bytes(&[0u8; 5]),
        StepValue::typed(&[1i32]),
        StepValue::typed(&[0f32, 0.0]),
    ]));
    assert!(e.contains("column `obs`: step has 5 bytes, spec needs 6"), "{e}");
    // Wrong dtype.
    let e =
        err(traj.append_step(&[StepValue::typed(&obs), StepValue::typed(&[1u8; 4]), StepValue::typed(&[0f32, 0.0])]));
    assert!(e.contains("column `action`") && e.contains("dtype u8") && e.contains("i32"), "{e}");
    // Wrong shape.
    let e = err(traj.append_step(&[
        StepValue::typed(&obs),
        StepValue::typed(&[1i32]),
        StepValue::typed(&[0f32, 0.0]).with_shape(&[1, 2]),
    ]));
    assert!(e.contains("column `reward`") && e.contains("shape"), "{e}");
    // Wrong column count.
    assert!(err(traj.append_step(&[StepValue::typed(&obs)])).contains("1 columns, table has 3"));
    assert_eq!(traj.len(), 0, "refused steps are not published");
    // Overflowing T is refused at the step that overflows.
    for s in 0..3 {
        traj.append_step(&[StepValue::typed(&obs), StepValue::typed(&[s]), StepValue::typed(&[0f32, 0.0])]).unwrap();
    }
    let e = err(traj.append_step(&[StepValue::typed(&obs), StepValue::typed(&[3]), StepValue::typed(&[0f32, 0.0])]));
    assert!(e.contains("exceed the maximum length of 3"), "{e}");
    assert_eq!(traj.len(), 3);
    // Absurd step counts are refused, not overflowed.
    for steps in [u64::MAX, u64::MAX / 2] {
        let e = traj.append_column("obs", steps, StepValue::bytes(&obs)).unwrap_err().to_string();
        assert!(e.contains("exceed the maximum length"), "{e}");
    }
    // Column by column: unequal lengths cannot be committed.
    let mut partial = table.writer().begin(None).unwrap();
    partial.append_column("obs", 2, StepValue::bytes(&[7u8; 12])).unwrap();
    assert!(partial.end().unwrap_err().to_string().contains("column `action` has 0 steps"));
    drop(partial);
    traj.end().unwrap();
    // The trajectory written before is intact.
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::whole(3)).columns(["obs"])).unwrap();
    let batch = sampler.sample().unwrap();
    for (r, key) in batch.keys().iter().enumerate() {
        if *key == good {
            let row = &batch.column("obs").unwrap().bytes[r * 18..(r + 1) * 18];
            assert_eq!(&row[..6], &[9, 0, 1, 2, 3, 4]);
        }
    }
    assert_eq!(table.info().unwrap().size, 2);
}

#[test]
fn full_table_evicts_the_oldest_committed() {
    let table = ReplayTable::builder(spec3(2, 3)).build().unwrap();
    let keys: Vec<SlotKey> = (1..=5).map(|i| write_traj(&table, i, 2, None)).collect();
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts, info.evictions), (3, 5, 2));
    let mut sampler = table.sampler(SampleConfig::new(200, WindowSpec::whole(2)).columns(["obs"])).unwrap();
    let batch = sampler.sample().unwrap();
    let mut seen: Vec<SlotKey> = batch.keys().to_vec();
    seen.sort();
    seen.dedup();
    let mut newest = keys[2..].to_vec();
    newest.sort();
    assert_eq!(seen, newest, "only the three newest remain");
    // Reused slots carry new generations: the old keys are stale.
    assert!(keys[..2].iter().all(|k| keys[2..].iter().any(|n| n.slot == k.slot && n.generation > k.generation)));
}

#[test]
fn stale_key_priority_updates_are_ignored() {
    let table = ReplayTable::builder(spec3(2, 1))
        .sampler_kind(
            gear_sampler::StrategyKind::Prioritized,
            gear_sampler::StrategyParams { alpha: 1.0, beta: 0.4, stratified: true },
        )
        .build()
        .unwrap();
    let old = write_traj(&table, 1, 2, Some(1.0));
    let new = write_traj(&table, 2, 2, Some(1.0));
    assert_eq!(old.slot, new.slot);
    assert_eq!(table.update_priorities(&[(old, 50.0)]).unwrap(), 0);
    assert_eq!(table.update_priorities(&[(new, 3.0), (new, 4.0)]).unwrap(), 2);
    // A bad priority refuses the whole batch.
    assert!(matches!(table.update_priorities(&[(new, 5.0), (new, f64::NAN)]), Err(Error::Core(_))));
    assert!(table.update_priorities(&[(new, -1.0)]).is_err());
}

#[test]
fn sampling_an_empty_table_times_out() {
    let table = ReplayTable::builder(spec3(2, 2)).build().unwrap();
    let mut sampler =
        table.sampler(SampleConfig::new(4, WindowSpec::whole(2)).timeout(Some(Duration::from_millis(150)))).unwrap();
    let start = Instant::now();
    match sampler.sample() {
        Err(Error::Timeout { waited, .. }) => assert!(waited >= Duration::from_millis(150)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(150));
}

#[test]
fn a_waiting_sampler_wakes_when_data_arrives_and_close_wakes_everyone() {
    let table = ReplayTable::builder(spec3(2, 2)).build().unwrap();
    let t2 = table.clone();
    let waiter = std::thread::spawn(move || {
        let mut s =
            t2.sampler(SampleConfig::new(1, WindowSpec::whole(2)).timeout(Some(Duration::from_secs(30)))).unwrap();
        s.sample().map(|b| b.keys()[0])
    });
    std::thread::sleep(Duration::from_millis(50));
    let key = write_traj(&table, 3, 2, None);
    assert_eq!(waiter.join().unwrap().unwrap(), key);

    let empty = ReplayTable::builder(spec3(2, 2)).build().unwrap();
    let e2 = empty.clone();
    let waiter = std::thread::spawn(move || {
        let mut s = e2.sampler(SampleConfig::new(1, WindowSpec::whole(2)).timeout(None)).unwrap();
        s.sample().map(|_| ())
    });
    std::thread::sleep(Duration::from_millis(50));
    empty.close();
    assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)));
}

#[test]
fn abandoned_trajectories_free_their_slot() {
    let table = ReplayTable::builder(spec3(2, 1)).build().unwrap();
    {
        let mut t = table.writer().begin(None).unwrap();
        t.append_column("obs", 1, StepValue::bytes(&[0; 6])).unwrap();
    }
    assert_eq!(table.info().unwrap().size, 0);
    write_traj(&table, 1, 2, None);
    assert_eq!(table.info().unwrap().size, 1);
    // While one trajectory is being written and none is committed, a second
    // writer cannot get a slot in a one-slot table.
    let t = ReplayTable::builder(spec3(2, 1)).build().unwrap();
    let _w = t.writer().begin(None).unwrap();
    assert!(matches!(t.writer().begin(None), Err(Error::TableFull { capacity: 1 })));
}

const CHILD_ENV: &str = "GEAR_API_TEST_CHILD_TABLE";

/// Child side of `a_second_process_reads_what_the_first_wrote`: attaches by
/// name, checks every stored trajectory through sampling, and writes one.
#[test]
fn child_process_attached_by_name() {
    let Ok(name) = std::env::var(CHILD_ENV) else { return };
    let options = AttachOptions { expected: Some(spec3(5, 4)), ..Default::default() };
    let table = ReplayTable::attach(&name, options).unwrap();
    assert_eq!(table.info().unwrap().size, 3);
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::whole(5)).columns(["obs"])).unwrap();
    let batch = sampler.sample().unwrap();
    let obs = batch.column("obs").unwrap().bytes;
    let mut seen = std::collections::BTreeSet::new();
    for (r, &len) in batch.lengths().iter().enumerate() {
        let row = &obs[r * 30..(r + 1) * 30];
        let id = row[0];
        assert_eq!(len, u64::from(id) + 2);
        for s in 0..len as usize {
            assert_eq!(&row[s * 6..s * 6 + 6], &[id, s as u8, 1, 2, 3, 4]);
        }
        seen.insert(id);
    }
    assert_eq!(seen.len(), 3, "64 uniform draws over 3 items see all of them");
    write_traj(&table, 42, 1, Some(4.0));
    println!("child verified");
}

#[test]
fn a_second_process_reads_what_the_first_wrote() {
    let name = unique("attach");
    let table = ReplayTable::builder(spec3(5, 4)).shared_memory(name.clone()).build().unwrap();
    for id in 1..=3u8 {
        write_traj(&table, id, u64::from(id) + 2, Some(f64::from(id)));
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_attached_by_name", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &name)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("child verified"), "child failed:\n{text}");
    // What the child wrote is selectable here.
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts), (4, 4));
    let mut sampler = table.sampler(SampleConfig::new(200, WindowSpec::whole(5)).columns(["obs"])).unwrap();
    let batch = sampler.sample().unwrap();
    let obs = batch.column("obs").unwrap().bytes;
    assert!((0..200).any(|r| obs[r * 30] == 42), "the child's trajectory is sampled by the creator");
}

#[test]
fn attaching_with_a_wrong_spec_or_name_is_a_clear_error() {
    let name = unique("mismatch");
    let _table = ReplayTable::builder(spec3(5, 4)).shared_memory(name.clone()).build().unwrap();
    let wrong = AttachOptions { expected: Some(spec3(6, 4)), ..Default::default() };
    let e = ReplayTable::attach(&name, wrong).unwrap_err().to_string();
    assert!(e.contains("spec mismatch") && e.contains("T=5") && e.contains("T=6"), "{e}");
    let e = ReplayTable::attach("gear-test-no-such-table", AttachOptions::default()).unwrap_err().to_string();
    assert!(e.contains("gear-test-no-such-table") && e.contains("not found"), "{e}");
    // ... and lists the tables that do exist there, this one among them.
    assert!(e.contains("tables there:") && e.contains(&name), "{e}");
    // Creating a second table under the same name is refused, naming the
    // process that holds it and the call that reaches it instead.
    let e = ReplayTable::builder(spec3(5, 4)).shared_memory(name.clone()).build().unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    assert!(e.contains(&format!("process {}", std::process::id())) && e.contains("which is running"), "{e}");
    assert!(e.contains("ReplayTable::attach") && !e.contains("attach with open"), "{e}");
}

#[test]
fn a_table_built_from_a_builtin_strategy_instance_is_attached_without_it() {
    // The README's way: `.sampler(Prioritized::new(..)?)`, then a plain
    // attach; the attacher rebuilds the same prioritized strategy.
    let name = unique("builtin-instance");
    let table = ReplayTable::builder(spec3(5, 8))
        .sampler(gear_sampler::Prioritized::new(0.7, 0.3).unwrap())
        .remover(gear_sampler::Lifo::new())
        .shared_memory(name.clone())
        .build()
        .unwrap();
    write_traj(&table, 1, 2, Some(4.0));
    let attached = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let mut sampler = attached.sampler(SampleConfig::new(4, WindowSpec::last(2))).unwrap();
    // One item: probability 1.
    assert_eq!(sampler.sample().unwrap().probabilities(), &[1.0; 4]);
    assert_eq!(attached.selection_mass().unwrap().map(|m| m.total), Some(4f64.powf(0.7)), "alpha 0.7 came along");
    // A strategy of the user's own type still has to be passed, and the
    // error says how.
    let custom = unique("custom-instance");
    let _t = ReplayTable::builder(spec3(5, 8))
        .sampler(common::HookedUniform::new("mine"))
        .shared_memory(custom.clone())
        .build()
        .unwrap();
    let e = ReplayTable::attach(&custom, AttachOptions::default()).unwrap_err().to_string();
    assert!(e.contains("AttachOptions { sampler: Some(Box::new(...)), .. }"), "{e}");
}

#[test]
fn a_lowest_priority_remover_evicts_the_least_useful_trajectory() {
    let table = ReplayTable::builder(spec3(2, 3)).remover_kind(gear_sampler::StrategyKind::MinHeap).build().unwrap();
    let a = write_traj(&table, 1, 2, Some(5.0));
    let b = write_traj(&table, 2, 2, Some(0.5));
    let c = write_traj(&table, 3, 2, Some(3.0));
    table.update_priorities(&[(a, 0.1)]).unwrap();
    let d = write_traj(&table, 4, 2, Some(9.0));
    assert_eq!(d.slot, a.slot, "the lowest priority (a, lowered to 0.1) is evicted, not the oldest");
    let e = write_traj(&table, 5, 2, Some(9.0));
    assert_eq!(e.slot, b.slot);
    let _ = c;
}

#[test]
fn bool_columns_hold_only_zero_and_one() {
    let spec = TableSpec::new(vec![ColumnSpec::new("done", DType::Bool, vec![2])], 2, 2).unwrap();
    let table = ReplayTable::builder(spec).build().unwrap();
    let mut t = table.writer().begin(None).unwrap();
    let e = t.append_step(&[StepValue::bytes(&[1, 7])]).unwrap_err().to_string();
    assert!(e.contains("column `done` is bool") && e.contains("is 7"), "{e}");
    t.append_step(&[StepValue::typed(&[true, false])]).unwrap();
    t.end().unwrap();
    let mut s = table.sampler(SampleConfig::new(1, WindowSpec::first(1))).unwrap();
    assert_eq!(s.sample().unwrap().column("done").unwrap().as_slice::<bool>().unwrap(), &[true, false]);
}

#[test]
fn strategy_mirrors_agree_through_log_replay_and_after_falling_behind_the_ring() {
    // Two handles on one shared table keep separate strategy mirrors, as two
    // processes would.
    let name = unique("mirror");
    let a = ReplayTable::builder(spec3(2, 16))
        .shared_memory(name.clone())
        .sampler_kind(gear_sampler::StrategyKind::Fifo, Default::default())
        .build()
        .unwrap();
    let b = ReplayTable::attach(&name, AttachOptions::default()).unwrap();
    let order = |t: &ReplayTable| -> Vec<SlotKey> {
        let mut s = t.sampler(SampleConfig::new(16, WindowSpec::whole(2)).columns(["obs"])).unwrap();
        s.sample().unwrap().keys().to_vec()
    };
    for i in 0..10 {
        write_traj(&a, i, 2, None);
    }
    write_traj(&b, 99, 2, None);
    assert_eq!(order(&a), order(&b), "replayed log gives the same FIFO order");
    // 20,000 inserts with evictions log far more entries than the ring
    // holds, so `b` must rebuild from the slot records.
    for i in 0..20_000u32 {
        write_traj(&a, (i % 200) as u8, 2, None);
    }
    let (oa, ob) = (order(&a), order(&b));
    assert_eq!(oa.len(), 16);
    assert_eq!(oa, ob, "a rebuilt mirror matches");
}

#[test]
fn random_starts_cover_every_full_window_uniformly_and_pad_short_trajectories() {
    let table = ReplayTable::builder(spec3(20, 2)).seed(5).build().unwrap();
    let long = write_traj(&table, 1, 20, None);
    let short = write_traj(&table, 2, 3, None);
    let mut sampler = table
        .sampler(
            SampleConfig::new(64, WindowSpec { offset: 7, len: 5, pad: Pad::Head }).columns(["obs"]).random_start(),
        )
        .unwrap();
    let mut counts = [0u32; 16];
    for _ in 0..100 {
        let batch = sampler.sample().unwrap();
        let obs = batch.column("obs").unwrap().bytes;
        for (r, key) in batch.keys().iter().enumerate() {
            let (start, n) = (batch.starts()[r], batch.lengths()[r]);
            let row = &obs[r * 30..(r + 1) * 30];
            if *key == long {
                assert_eq!(n, 5);
                assert!(start <= 15, "a full window of 5 from 20 steps starts at 0..=15, got {start}");
                counts[start as usize] += 1;
                for j in 0..5 {
                    assert_eq!(&row[j * 6..j * 6 + 2], &[1, (start + j as u64) as u8]);
                }
            } else {
                assert_eq!(*key, short);
                assert_eq!((start, n), (0, 3), "a short trajectory gives all its steps");
                assert_eq!(&row[..12], &[0u8; 12], "head padding first");
                assert_eq!(&row[12..14], &[2, 0]);
            }
        }
    }
    // About 3200 long rows over 16 starts (~200 each); a chi-square with 15
    // degrees of freedom stays under 37.7 at p = 0.001 for a uniform draw.
    let total: u32 = counts.iter().sum();
    let expected = f64::from(total) / 16.0;
    let chi2: f64 = counts.iter().map(|&c| (f64::from(c) - expected).powi(2) / expected).sum();
    assert!(chi2 < 37.7, "starts are not uniform: {counts:?} (chi2 {chi2:.1})");
}
