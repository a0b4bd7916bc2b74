//! A D4RL-layout file made with hdf5-pure: imported, sampled (bytes checked
//! against the source rows), exported and compared dataset by dataset.

mod common;

use common::*;
use gear_api::{ReplayTable, SampleConfig};
use gear_core::WindowSpec;
use gear_hdf5::{ExportOptions, ImportOptions, Layout, Phase};

#[test]
fn import_sample_export_is_byte_for_byte() {
    let dir = TempDir::new("d4rl");
    let src = dir.join("d4rl.hdf5");
    write_d4rl(&src);
    let table = ReplayTable::builder(d4rl_spec(50, 100)).build().unwrap();
    let mut calls = Vec::new();
    let report =
        gear_hdf5::import_with_progress(&table, &src, &ImportOptions::default(), &mut |p| calls.push(p)).unwrap();
    assert_eq!(report.layout, Layout::D4rl);
    assert_eq!(report.episodes, 6);
    // 90 -> 50 + 40, 60 -> 50 + 10.
    assert_eq!(report.split_episodes, 2);
    assert_eq!(report.trajectories, 8);
    assert_eq!(report.steps, d4rl_rows());
    assert!(report.unused_datasets.is_empty(), "{:?}", report.unused_datasets);
    assert_eq!(lengths(&table), [40, 25, 50, 40, 1, 50, 10, 34]);
    // Both passes report, ending at the total.
    for phase in [Phase::Verify, Phase::Insert] {
        let last = calls.iter().rfind(|p| p.phase == phase).unwrap();
        assert_eq!((last.steps_done, last.total_steps), (d4rl_rows(), d4rl_rows()));
    }

    // Sampled windows hold the source's rows, step for step.
    let w = 16usize;
    let mut sampler = table.sampler(SampleConfig::new(64, WindowSpec::first(w as u64)).random_start()).unwrap();
    let mut checked = 0;
    for _ in 0..20 {
        let b = sampler.sample().unwrap();
        let o: &[f32] = b.column("observations").unwrap().as_slice().unwrap();
        let a: &[f32] = b.column("actions").unwrap().as_slice().unwrap();
        let r: &[f32] = b.column("rewards").unwrap().as_slice().unwrap();
        let term: &[bool] = b.column("terminals").unwrap().as_slice().unwrap();
        let tout: &[bool] = b.column("timeouts").unwrap().as_slice().unwrap();
        let q: &[f64] = b.column("infos/qpos").unwrap().as_slice().unwrap();
        for (row, &len) in b.lengths().iter().enumerate() {
            assert!(len >= 1);
            let i0 = o[row * w * 3] as u64;
            for j in 0..len as usize {
                let (i, k) = (i0 + j as u64, row * w + j);
                assert_eq!(o[k * 3..k * 3 + 3], obs(i), "row {row} step {j}");
                assert_eq!(a[k * 2..k * 2 + 2], action(i));
                assert_eq!(r[k], reward(i));
                assert_eq!((term[k], tout[k]), flags(i));
                assert_eq!(q[k * 2..k * 2 + 2], qpos(i));
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);

    let out = dir.join("out.hdf5");
    let exported = gear_hdf5::export(&table, &out, &ExportOptions::default()).unwrap();
    assert_eq!((exported.trajectories, exported.steps, exported.dropped), (8, d4rl_rows(), 0));
    assert!(!exported.terminals_from_ends);
    assert_same_datasets(&src, &out);

    // Compressed like D4RL's files: the same datasets again.
    let out2 = dir.join("out-deflate.hdf5");
    gear_hdf5::export(&table, &out2, &ExportOptions { deflate: Some(4), ..ExportOptions::default() }).unwrap();
    assert_same_datasets(&src, &out2);
    assert!(hdf5_pure::File::open(&out2).unwrap().dataset("observations").unwrap().is_chunked());
}

#[test]
fn a_spec_from_the_file_and_conversions() {
    let dir = TempDir::new("d4rl-spec");
    let src = dir.join("d4rl.hdf5");
    write_d4rl(&src);
    let info = gear_hdf5::describe(&src, None).unwrap();
    assert_eq!(info.layout, Layout::D4rl);
    assert_eq!(info.episode_lengths, D4RL_EPISODES.map(|e| e.0));
    assert_eq!(info.longest_episode, 90);
    let spec = info.table_spec(None, None).unwrap();
    assert_eq!(spec, {
        // Same columns as the hand-written spec (depth-first order).
        let mut cols = d4rl_spec(90, 6).columns().to_vec();
        cols.sort_by(|a, b| a.name().cmp(b.name()));
        let mut got = spec.columns().to_vec();
        got.sort_by(|a, b| a.name().cmp(b.name()));
        assert_eq!(got, cols);
        spec.clone()
    });
    assert_eq!((spec.max_len(), spec.capacity()), (90, 6));
    let table = ReplayTable::builder(spec).build().unwrap();
    gear_hdf5::import(&table, &src, &ImportOptions::default()).unwrap();
    assert_eq!(lengths(&table), D4RL_EPISODES.map(|e| e.0));

    // Lossless conversions (bool -> u8, f32 -> f64) and a rename.
    let spec = gear_core::TableSpec::new(
        vec![
            gear_core::ColumnSpec::new("obs", gear_core::DType::F64, vec![3]),
            gear_core::ColumnSpec::new("done", gear_core::DType::U8, vec![]),
        ],
        100,
        10,
    )
    .unwrap();
    let table = ReplayTable::builder(spec).build().unwrap();
    let options = ImportOptions {
        mapping: vec![("observations".into(), "obs".into()), ("terminals".into(), "done".into())],
        ..ImportOptions::default()
    };
    let report = gear_hdf5::import(&table, &src, &options).unwrap();
    assert_eq!(report.columns, [("obs".into(), "observations".into()), ("done".into(), "terminals".into())]);
    assert!(report.unused_datasets.contains(&"actions".to_owned()));
    let t = &table.committed_trajectories().unwrap()[0];
    let mut bytes = vec![0u8; 40 * 24];
    assert!(table.read_trajectory(t.key, "obs", 0, &mut bytes).unwrap());
    let want: Vec<u8> = (0..40).flat_map(obs).flat_map(|v| f64::from(v).to_le_bytes()).collect();
    assert_eq!(bytes, want);
    let mut done = vec![0u8; 40];
    assert!(table.read_trajectory(t.key, "done", 0, &mut done).unwrap());
    assert_eq!(done.iter().rposition(|&d| d == 1), Some(39));

    // Export without a terminals column marks trajectory ends.
    let out = dir.join("ends.hdf5");
    let r = gear_hdf5::export(&table, &out, &ExportOptions::default()).unwrap();
    assert!(r.terminals_from_ends);
    let f = hdf5_pure::File::open(&out).unwrap();
    let t = f.dataset("terminals").unwrap().read_raw().unwrap();
    assert_eq!(t.iter().filter(|&&b| b == 1).count(), 6);
}

/// Contiguous datasets (h5py's default) are read straight from the file:
/// big-endian numbers come out swapped, unsigned integers widened, and a
/// user block in front of the HDF5 data does not shift the rows.
#[test]
fn contiguous_datasets_are_read_directly_swapped_and_widened() {
    let dir = TempDir::new("d4rl-contiguous");
    let n = 50u64;
    let mut be_f32 = hdf5_pure::make_f32_type();
    if let hdf5_pure::Datatype::FloatingPoint { byte_order, .. } = &mut be_f32 {
        *byte_order = hdf5_pure::DatatypeByteOrder::BigEndian;
    }
    let o: Vec<u8> = (0..n).flat_map(obs).flat_map(f32::to_be_bytes).collect();
    let a: Vec<u8> = (0..n * 2).flat_map(|i| (i as u16 * 500).to_le_bytes()).collect();
    let mut timeouts = vec![0u8; n as usize];
    timeouts[19] = 1;
    for userblock in [0u64, 512] {
        let src = dir.join(&format!("contiguous-{userblock}.hdf5"));
        let mut fb = hdf5_pure::FileBuilder::new();
        if userblock > 0 {
            fb.with_userblock(userblock);
        }
        fb.create_dataset("observations").with_raw_data(be_f32.clone(), o.clone(), n * 3).with_shape(&[n, 3]);
        fb.create_dataset("actions").with_raw_data(hdf5_pure::make_u16_type(), a.clone(), n * 2).with_shape(&[n, 2]);
        fb.create_dataset("terminals").with_raw_data(bool_type(), vec![0u8; n as usize], n);
        fb.create_dataset("timeouts").with_raw_data(bool_type(), timeouts.clone(), n);
        fb.write(&src).unwrap();
        let spec = gear_core::TableSpec::new(
            vec![
                gear_core::ColumnSpec::new("observations", gear_core::DType::F32, vec![3]),
                gear_core::ColumnSpec::new("actions", gear_core::DType::I32, vec![2]),
                gear_core::ColumnSpec::new("timeouts", gear_core::DType::Bool, vec![]),
            ],
            50,
            4,
        )
        .unwrap();
        let table = ReplayTable::builder(spec).build().unwrap();
        gear_hdf5::import(&table, &src, &ImportOptions::default()).unwrap();
        assert_eq!(lengths(&table), [20, 30]);
        let mut first = 0u64;
        for t in table.committed_trajectories().unwrap() {
            let mut got = vec![0u8; 12 * t.len as usize];
            assert!(table.read_trajectory(t.key, "observations", 0, &mut got).unwrap());
            let want: Vec<u8> = (first..first + t.len).flat_map(obs).flat_map(f32::to_le_bytes).collect();
            assert_eq!(got, want, "user block {userblock}");
            let mut got = vec![0u8; 8 * t.len as usize];
            assert!(table.read_trajectory(t.key, "actions", 0, &mut got).unwrap());
            let want: Vec<u8> = (first * 2..(first + t.len) * 2).flat_map(|i| (i as i32 * 500).to_le_bytes()).collect();
            assert_eq!(got, want, "user block {userblock}");
            first += t.len;
        }
    }
}
