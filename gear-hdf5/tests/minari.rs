//! A Minari-layout file made with hdf5-pure: imported (the final
//! observation kept in `next_observations`), sampled, exported and
//! compared dataset by dataset.

mod common;

use common::*;
use gear_api::{ReplayTable, SampleConfig};
use gear_core::WindowSpec;
use gear_hdf5::{ExportOptions, ImportOptions, Layout};

#[test]
fn import_sample_export_is_byte_for_byte() {
    let dir = TempDir::new("minari");
    let src = dir.join("main_data.hdf5");
    let spec = write_minari(&src);
    let table = ReplayTable::builder(spec).build().unwrap();
    let report = gear_hdf5::import(&table, &src, &ImportOptions::default()).unwrap();
    assert_eq!(report.layout, Layout::Minari);
    assert_eq!((report.episodes, report.trajectories, report.split_episodes), (3, 5, 1));
    assert_eq!(report.dropped_final_observations, 0);
    // T = 20: 45 -> 20 + 20 + 5.
    assert_eq!(lengths(&table), [12, 20, 20, 5, 7]);

    let w = 8usize;
    let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::first(w as u64)).random_start()).unwrap();
    for _ in 0..10 {
        let b = sampler.sample().unwrap();
        let o: &[f32] = b.column("observations").unwrap().as_slice().unwrap();
        let n: &[f32] = b.column("next_observations").unwrap().as_slice().unwrap();
        let a: &[f32] = b.column("actions").unwrap().as_slice().unwrap();
        let r: &[f64] = b.column("rewards").unwrap().as_slice().unwrap();
        for (row, &len) in b.lengths().iter().enumerate() {
            let i0 = o[row * w * 3] as u64;
            for j in 0..len as usize {
                let (i, k) = (i0 + j as u64, row * w + j);
                assert_eq!(o[k * 3..k * 3 + 3], obs(i));
                assert_eq!(n[k * 3..k * 3 + 3], obs(i + 1));
                assert_eq!(a[k * 2..k * 2 + 2], action(i));
                assert_eq!(r[k], f64::from(reward(i)));
            }
        }
    }

    let out = dir.join("out.hdf5");
    let e =
        gear_hdf5::export(&table, &out, &ExportOptions { layout: Layout::Minari, ..ExportOptions::default() }).unwrap();
    // The split episode is one group again.
    assert_eq!((e.trajectories, e.episodes), (5, 3));
    assert_same_datasets(&src, &out);
    let f = hdf5_pure::File::open(&out).unwrap();
    assert_eq!(f.root().attrs().unwrap()["total_episodes"], hdf5_pure::AttrValue::I64(3));
}

#[test]
fn without_a_next_column_the_final_observation_is_dropped() {
    let dir = TempDir::new("minari-drop");
    let src = dir.join("main_data.hdf5");
    write_minari(&src);
    let info = gear_hdf5::describe(&src, None).unwrap();
    assert_eq!(info.episode_lengths, [12, 45, 7]);
    assert!(info.table_spec(None, None).unwrap().column("next_observations").is_ok());
    let table = ReplayTable::builder(minari_spec(false)).build().unwrap();
    let r = gear_hdf5::import(&table, &src, &ImportOptions::default()).unwrap();
    assert_eq!(r.dropped_final_observations, 3);
    let e = gear_hdf5::export(
        &table,
        &dir.join("x.hdf5"),
        &ExportOptions { layout: Layout::Minari, ..ExportOptions::default() },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("final observation"), "{e}");
    // As D4RL it exports.
    gear_hdf5::export(&table, &dir.join("d.hdf5"), &ExportOptions::default()).unwrap();
}

/// Many episodes, their groups written in shuffled order with ids whose
/// names do not sort as numbers (`episode_10` before `episode_9`): every
/// episode lands in id order with its own rows, through group handles
/// opened once (opening each by its path from the root cost O(N^2)).
#[test]
fn many_episodes_import_in_id_order() {
    let dir = TempDir::new("minari-many");
    let src = dir.join("many.hdf5");
    let episodes = 300u64;
    let len = |id: u64| 1 + id % 9;
    let mut order: Vec<u64> = (0..episodes).collect();
    // A fixed shuffle: multiply by a unit modulo the count.
    order.sort_by_key(|&i| (i * 127) % episodes);
    let mut fb = hdf5_pure::FileBuilder::new();
    for &id in &order {
        let t = len(id);
        let mut g = fb.create_group(&format!("episode_{id}"));
        let o: Vec<f32> = (0..t + 1).flat_map(|s| obs(id * 100 + s)).collect();
        g.create_dataset("observations").with_f32_data(&o).with_shape(&[t + 1, 3]);
        let a: Vec<f32> = (0..t).flat_map(|s| action(id * 100 + s)).collect();
        g.create_dataset("actions").with_f32_data(&a).with_shape(&[t, 2]);
        g.create_dataset("rewards").with_f64_data(&vec![id as f64; t as usize]);
        let mut term = vec![0u8; t as usize];
        term[t as usize - 1] = 1;
        g.create_dataset("terminations").with_raw_data(bool_type(), term, t);
        g.create_dataset("truncations").with_raw_data(bool_type(), vec![0u8; t as usize], t);
        fb.add_group(g.finish());
    }
    fb.write(&src).unwrap();
    let spec = gear_core::TableSpec::new(minari_spec(true).columns().to_vec(), 9, episodes).unwrap();
    let table = ReplayTable::builder(spec).build().unwrap();
    let report = gear_hdf5::import(&table, &src, &ImportOptions::default()).unwrap();
    assert_eq!((report.episodes, report.trajectories), (episodes, episodes));
    let listed = table.committed_trajectories().unwrap();
    for (id, t) in listed.iter().enumerate() {
        let id = id as u64;
        assert_eq!(t.len, len(id), "episode {id}");
        let mut r = vec![0u8; 8 * t.len as usize];
        assert!(table.read_trajectory(t.key, "rewards", 0, &mut r).unwrap());
        assert!(r.chunks(8).all(|v| f64::from_le_bytes(v.try_into().unwrap()) == id as f64), "episode {id}");
        let mut n = vec![0u8; 12 * t.len as usize];
        assert!(table.read_trajectory(t.key, "next_observations", 0, &mut n).unwrap());
        let want: Vec<u8> = (1..=t.len).flat_map(|s| obs(id * 100 + s)).flat_map(f32::to_le_bytes).collect();
        assert_eq!(n, want, "episode {id}: next observations");
    }
    let info = gear_hdf5::describe(&src, None).unwrap();
    assert_eq!(info.episode_lengths, (0..episodes).map(len).collect::<Vec<_>>());
}
