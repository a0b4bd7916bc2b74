//! Files the tests make with hdf5-pure, and checks shared by the tests.

#![allow(dead_code)]

use gear_api::ReplayTable;
use gear_core::{ColumnSpec, DType, TableSpec};
use hdf5_pure::{Datatype, EnumTypeBuilder, File, FileBuilder};
use std::path::{Path, PathBuf};

/// A fresh directory under the target's tmp, removed by the caller's drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gear-hdf5-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// h5py's bool: an enum over a signed byte.
pub fn bool_type() -> Datatype {
    EnumTypeBuilder::with_base(hdf5_pure::make_i8_type()).value("FALSE", 0).value("TRUE", 1).build().unwrap()
}

/// The value of observation `i` (each row tells its own index).
pub fn obs(i: u64) -> [f32; 3] {
    [i as f32, i as f32 + 0.25, -(i as f32)]
}

pub fn action(i: u64) -> [f32; 2] {
    [(i % 7) as f32 * 0.5, -((i % 5) as f32)]
}

pub fn reward(i: u64) -> f32 {
    (i % 11) as f32 - 3.5
}

pub fn qpos(i: u64) -> [f64; 2] {
    [i as f64 * 1e-3, 1.0 / (i as f64 + 1.0)]
}

/// Episode lengths of the test D4RL file: ends by terminal, by timeout,
/// and a trailing partial episode (no flag on the last row).
pub const D4RL_EPISODES: [(u64, &str); 6] =
    [(40, "terminal"), (25, "timeout"), (90, "terminal"), (1, "terminal"), (60, "timeout"), (34, "none")];

pub fn d4rl_rows() -> u64 {
    D4RL_EPISODES.iter().map(|e| e.0).sum()
}

/// Writes the test D4RL file: chunked and deflated like D4RL's.
pub fn write_d4rl(path: &Path) {
    let n = d4rl_rows();
    let (mut terminals, mut timeouts) = (vec![0u8; n as usize], vec![0u8; n as usize]);
    let mut end = 0;
    for (len, how) in D4RL_EPISODES {
        end += len;
        match how {
            "terminal" => terminals[end as usize - 1] = 1,
            "timeout" => timeouts[end as usize - 1] = 1,
            _ => {}
        }
    }
    let o: Vec<f32> = (0..n).flat_map(obs).collect();
    let a: Vec<f32> = (0..n).flat_map(action).collect();
    let r: Vec<f32> = (0..n).map(reward).collect();
    let q: Vec<f64> = (0..n).flat_map(qpos).collect();
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&o).with_shape(&[n, 3]).with_chunks(&[64, 3]).with_deflate(4);
    fb.create_dataset("actions").with_f32_data(&a).with_shape(&[n, 2]).with_chunks(&[64, 2]).with_deflate(4);
    fb.create_dataset("rewards").with_f32_data(&r).with_chunks(&[64]).with_deflate(4);
    fb.create_dataset("terminals").with_raw_data(bool_type(), terminals, n).with_chunks(&[64]).with_deflate(4);
    fb.create_dataset("timeouts").with_raw_data(bool_type(), timeouts, n);
    let mut infos = fb.create_group("infos");
    infos.create_dataset("qpos").with_f64_data(&q).with_shape(&[n, 2]);
    fb.add_group(infos.finish());
    fb.write(path).unwrap();
}

/// A table spec with one column per dataset of the test D4RL file.
pub fn d4rl_spec(max_len: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("observations", DType::F32, vec![3]),
            ColumnSpec::new("actions", DType::F32, vec![2]),
            ColumnSpec::new("rewards", DType::F32, vec![]),
            ColumnSpec::new("terminals", DType::Bool, vec![]),
            ColumnSpec::new("timeouts", DType::Bool, vec![]),
            ColumnSpec::new("infos/qpos", DType::F64, vec![2]),
        ],
        max_len,
        capacity,
    )
    .unwrap()
}

/// Every dataset of `a` (paths from the root, depth first).
pub fn dataset_paths(file: &File) -> Vec<String> {
    fn walk(g: &hdf5_pure::Group, prefix: &str, out: &mut Vec<String>) {
        for d in g.datasets().unwrap() {
            out.push(format!("{prefix}{d}"));
        }
        for (name, sub) in g.iter_groups().unwrap() {
            walk(&sub, &format!("{prefix}{name}/"), out);
        }
    }
    let mut out = Vec::new();
    walk(&file.root(), "", &mut out);
    out.sort();
    out
}

/// Asserts the datasets of two files are equal: names, types, shapes, bytes.
pub fn assert_same_datasets(a: &Path, b: &Path) {
    let (fa, fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let names = dataset_paths(&fa);
    assert_eq!(names, dataset_paths(&fb), "dataset names");
    for name in names {
        let (da, db) = (fa.dataset(&name).unwrap(), fb.dataset(&name).unwrap());
        assert_eq!(da.datatype().unwrap(), db.datatype().unwrap(), "{name}: datatype");
        assert_eq!(da.shape().unwrap(), db.shape().unwrap(), "{name}: shape");
        assert_eq!(da.read_raw().unwrap(), db.read_raw().unwrap(), "{name}: bytes");
    }
}

/// The table's committed trajectories' lengths, oldest first.
pub fn lengths(table: &ReplayTable) -> Vec<u64> {
    table.committed_trajectories().unwrap().iter().map(|t| t.len).collect()
}

/// Whether row `i` of the test D4RL file is a terminal / a timeout.
pub fn flags(i: u64) -> (bool, bool) {
    let mut end = 0;
    for (len, how) in D4RL_EPISODES {
        end += len;
        if i + 1 == end {
            return (how == "terminal", how == "timeout");
        }
    }
    (false, false)
}

/// Steps of the test Minari file's episodes, and how each ends.
pub const MINARI_EPISODES: [(u64, &str); 3] = [(12, "terminated"), (45, "truncated"), (7, "terminated")];

/// Writes the test Minari file: `episode_<id>` groups with `T + 1`
/// observations. Returns the spec with a next-observation column.
pub fn write_minari(path: &Path) -> TableSpec {
    let mut fb = FileBuilder::new();
    let mut base = 0u64;
    for (id, (t, how)) in MINARI_EPISODES.iter().enumerate() {
        let mut g = fb.create_group(&format!("episode_{id}"));
        let o: Vec<f32> = (base..base + t + 1).flat_map(obs).collect();
        let a: Vec<f32> = (base..base + t).flat_map(action).collect();
        let r: Vec<f64> = (base..base + t).map(|i| f64::from(reward(i))).collect();
        let mut term = vec![0u8; *t as usize];
        let mut trunc = vec![0u8; *t as usize];
        if *how == "terminated" {
            term[*t as usize - 1] = 1;
        } else {
            trunc[*t as usize - 1] = 1;
        }
        g.create_dataset("observations").with_f32_data(&o).with_shape(&[t + 1, 3]).with_chunks(&[8, 3]).with_deflate(1);
        g.create_dataset("actions").with_f32_data(&a).with_shape(&[*t, 2]);
        g.create_dataset("rewards").with_f64_data(&r);
        g.create_dataset("terminations").with_raw_data(bool_type(), term, *t);
        g.create_dataset("truncations").with_raw_data(bool_type(), trunc, *t);
        fb.add_group(g.finish());
        base += t + 1;
    }
    fb.write(path).unwrap();
    minari_spec(true)
}

pub fn minari_spec(next: bool) -> TableSpec {
    let mut cols = vec![ColumnSpec::new("observations", DType::F32, vec![3])];
    if next {
        cols.push(ColumnSpec::new("next_observations", DType::F32, vec![3]));
    }
    cols.extend([
        ColumnSpec::new("actions", DType::F32, vec![2]),
        ColumnSpec::new("rewards", DType::F64, vec![]),
        ColumnSpec::new("terminations", DType::Bool, vec![]),
        ColumnSpec::new("truncations", DType::Bool, vec![]),
    ]);
    TableSpec::new(cols, 20, 10).unwrap()
}
