//! Files and tables that do not fit: each a clear error naming what was
//! wrong, and the table exactly as it was (it already holds a file's
//! trajectories, which must survive every failed import).

mod common;

use common::*;
use gear_api::ReplayTable;
use gear_core::{ColumnSpec, DType, TableSpec};
use gear_hdf5::{Error, ImportOptions, Layout};
use hdf5_pure::FileBuilder;
use std::path::Path;

#[path = "../../gear-api/tests/common/not_regular.rs"]
mod not_regular;
use not_regular::{make_fifo, null_device};

/// A table of `spec` that already holds the test D4RL file (when the
/// spec fits it), and what it held.
fn loaded(dir: &TempDir, spec: TableSpec) -> (ReplayTable, Vec<u64>, u64) {
    let table = ReplayTable::builder(spec).build().unwrap();
    let good = dir.join("good.hdf5");
    write_d4rl(&good);
    let _ = gear_hdf5::import(&table, &good, &ImportOptions::default());
    let held = lengths(&table);
    let inserts = table.inserts();
    (table, held, inserts)
}

/// Imports `path` and expects an error whose text holds every needle;
/// the table must be unchanged.
fn refused(table: &(ReplayTable, Vec<u64>, u64), path: &Path, options: &ImportOptions, needles: &[&str]) -> Error {
    let e = gear_hdf5::import(&table.0, path, options).unwrap_err();
    let text = e.to_string();
    for n in needles {
        assert!(text.contains(n), "`{text}` should say `{n}`");
    }
    assert_eq!(lengths(&table.0), table.1, "trajectories changed by a failed import: {text}");
    assert_eq!(table.0.inserts(), table.2, "inserts changed by a failed import: {text}");
    e
}

#[test]
fn files_that_are_not_hdf5() {
    let dir = TempDir::new("err-file");
    let t = loaded(&dir, d4rl_spec(50, 100));
    assert_eq!(t.1.len(), 8);
    let o = ImportOptions::default();
    let e = refused(&t, &dir.join("missing.hdf5"), &o, &["missing.hdf5", "cannot open"]);
    assert!(matches!(e, Error::File { .. }));
    let text = dir.join("notes.txt");
    std::fs::write(&text, "observations,actions\n1,2\n").unwrap();
    refused(&t, &text, &o, &["notes.txt", "not an HDF5 file"]);
    refused(&t, &dir.0, &o, &["directory"]);
    // Cut short: at every fraction, an error (never a panic) and no change.
    let bytes = std::fs::read(dir.join("good.hdf5")).unwrap();
    let cut = dir.join("cut.hdf5");
    for frac in [0.1, 0.5, 0.9, 0.99] {
        std::fs::write(&cut, &bytes[..(bytes.len() as f64 * frac) as usize]).unwrap();
        refused(&t, &cut, &o, &["cut.hdf5"]);
    }
    // Neither layout, or the wrong one.
    let empty = dir.join("empty.hdf5");
    let mut fb = FileBuilder::new();
    fb.create_dataset("x").with_f32_data(&[1.0]);
    fb.write(&empty).unwrap();
    refused(&t, &empty, &o, &["neither D4RL", "nor Minari"]);
    let minari = ImportOptions { layout: Some(Layout::Minari), ..ImportOptions::default() };
    refused(&t, &dir.join("good.hdf5"), &minari, &["not the Minari layout"]);
    assert!("hdf4".parse::<Layout>().unwrap_err().to_string().contains("unknown layout"));
}

#[test]
fn columns_that_do_not_fit() {
    let dir = TempDir::new("err-columns");
    let good = dir.join("good.hdf5");
    let with = |name: &str, col: ColumnSpec| {
        let mut cols = d4rl_spec(50, 100).columns().to_vec();
        match cols.iter().position(|c| c.name() == name) {
            Some(i) => cols[i] = col,
            None => cols.push(col),
        }
        TableSpec::new(cols, 50, 100).unwrap()
    };
    let o = ImportOptions::default();
    // A column with no dataset (missing dataset).
    let t = loaded(&dir, with("costs", ColumnSpec::new("costs", DType::F32, vec![])));
    refused(&t, &good, &o, &["column `costs` has no dataset `costs`", "DATASET=costs"]);
    // A dtype that would lose values.
    let t = loaded(&dir, with("observations", ColumnSpec::new("observations", DType::I32, vec![3])));
    refused(&t, &good, &o, &["dataset `observations` has dtype f32, column `observations` is i32"]);
    let t = loaded(&dir, with("infos/qpos", ColumnSpec::new("infos/qpos", DType::F32, vec![2])));
    refused(&t, &good, &o, &["dataset `infos/qpos` has dtype f64, column `infos/qpos` is f32"]);
    // A shape that differs.
    let t = loaded(&dir, with("observations", ColumnSpec::new("observations", DType::F32, vec![4])));
    refused(&t, &good, &o, &["dataset `observations` has shape [3] per step, column `observations` has [4]"]);
    // A mapping to a column the table lacks.
    let t = loaded(&dir, d4rl_spec(50, 100));
    let bad_map = ImportOptions { mapping: vec![("rewards".into(), "reward".into())], ..ImportOptions::default() };
    let e = refused(&t, &good, &bad_map, &["names column `reward`"]);
    assert!(matches!(e, Error::Options(_)));
}

#[test]
fn episodes_and_lengths_that_do_not_fit() {
    let dir = TempDir::new("err-episodes");
    let good = dir.join("good.hdf5");
    let t = loaded(&dir, d4rl_spec(50, 100));
    // An episode longer than T, splitting off.
    let no_split = ImportOptions { split_long_episodes: false, ..ImportOptions::default() };
    refused(&t, &good, &no_split, &["episode 2 (rows 65..155) has 90 steps", "max_len is 50", "2 episodes are longer"]);
    // More trajectories than the table holds.
    let small = loaded(&dir, d4rl_spec(50, 7));
    assert!(small.1.is_empty());
    refused(&small, &good, &ImportOptions::default(), &["makes 8 trajectories", "holds 7"]);

    // Lengths that disagree.
    let n = d4rl_rows();
    let short = dir.join("short.hdf5");
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&(0..n).flat_map(obs).collect::<Vec<_>>()).with_shape(&[n, 3]);
    fb.create_dataset("actions").with_f32_data(&(0..n).flat_map(action).collect::<Vec<_>>()).with_shape(&[n, 2]);
    fb.create_dataset("rewards").with_f32_data(&(0..n - 1).map(reward).collect::<Vec<_>>());
    fb.create_dataset("terminals").with_raw_data(bool_type(), vec![0; n as usize], n);
    fb.create_dataset("timeouts").with_raw_data(bool_type(), vec![0; n as usize], n);
    let mut infos = fb.create_group("infos");
    infos.create_dataset("qpos").with_f64_data(&vec![0.0; 2 * n as usize]).with_shape(&[n, 2]);
    fb.add_group(infos.finish());
    fb.write(&short).unwrap();
    refused(
        &t,
        &short,
        &ImportOptions::default(),
        &["dataset `rewards` has 249 rows, `observations` has 250", "disagree"],
    );

    // No terminals: no episode ends.
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&[0.0; 6]).with_shape(&[2, 3]);
    let bare = dir.join("bare.hdf5");
    fb.write(&bare).unwrap();
    let obs_only =
        loaded(&dir, TableSpec::new(vec![ColumnSpec::new("observations", DType::F32, vec![3])], 5, 5).unwrap());
    refused(&obs_only, &bare, &ImportOptions::default(), &["dataset `terminals`: missing"]);
}

#[test]
fn a_bad_value_deep_in_the_file_changes_nothing() {
    let dir = TempDir::new("err-value");
    let t = loaded(&dir, d4rl_spec(50, 100));
    // A terminals byte of 2 at row 200: not a bool. Found by the
    // verification pass, after the metadata checks passed.
    let n = d4rl_rows();
    let mut terminals = vec![0u8; n as usize];
    terminals[200] = 2;
    let bad = dir.join("bad.hdf5");
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&(0..n).flat_map(obs).collect::<Vec<_>>()).with_shape(&[n, 3]);
    fb.create_dataset("actions").with_f32_data(&(0..n).flat_map(action).collect::<Vec<_>>()).with_shape(&[n, 2]);
    fb.create_dataset("rewards").with_f32_data(&(0..n).map(reward).collect::<Vec<_>>());
    fb.create_dataset("terminals").with_raw_data(bool_type(), terminals, n);
    fb.create_dataset("timeouts").with_raw_data(bool_type(), vec![0; n as usize], n);
    let mut infos = fb.create_group("infos");
    infos.create_dataset("qpos").with_f64_data(&vec![0.0; 2 * n as usize]).with_shape(&[n, 2]);
    fb.add_group(infos.finish());
    fb.write(&bad).unwrap();
    let e = refused(&t, &bad, &ImportOptions::default(), &["dataset `terminals`, row 200", "bools are 0 or 1"]);
    assert!(matches!(e, Error::Row { row: 200, .. }));
}

/// A contiguous file (h5py's default layout) cut inside its data: the
/// metadata still reads, the rows are missing. Refused before the first
/// insert, naming the dataset, even though contiguous numbers are not
/// read by the verification (their extent is checked against the file).
#[test]
fn a_contiguous_file_cut_inside_its_data_changes_nothing() {
    let dir = TempDir::new("err-cut-contiguous");
    let t = loaded(&dir, d4rl_spec(50, 100));
    let n = d4rl_rows();
    let whole = dir.join("whole.hdf5");
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&(0..n).flat_map(obs).collect::<Vec<_>>()).with_shape(&[n, 3]);
    fb.create_dataset("actions").with_f32_data(&(0..n).flat_map(action).collect::<Vec<_>>()).with_shape(&[n, 2]);
    fb.create_dataset("rewards").with_f32_data(&(0..n).map(reward).collect::<Vec<_>>());
    let terminals: Vec<u8> = (0..n).map(|i| u8::from(i % 20 == 19 || i == n - 1)).collect();
    fb.create_dataset("terminals").with_raw_data(bool_type(), terminals, n);
    fb.create_dataset("timeouts").with_raw_data(bool_type(), vec![0; n as usize], n);
    let mut infos = fb.create_group("infos");
    infos.create_dataset("qpos").with_f64_data(&(0..n).flat_map(qpos).collect::<Vec<_>>()).with_shape(&[n, 2]);
    fb.add_group(infos.finish());
    fb.write(&whole).unwrap();
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.join("cut.hdf5");
    for drop in [1usize, 7, 100, 1000] {
        std::fs::write(&cut, &bytes[..bytes.len() - drop]).unwrap();
        for verify in [true, false] {
            // Windows of one trajectory: without the extent check, the
            // first trajectories would go in before the missing rows.
            let options = ImportOptions { verify, window_bytes: 1, ..ImportOptions::default() };
            refused(&t, &cut, &options, &["cut.hdf5", "dataset `infos/qpos`: truncated", "cut short"]);
        }
    }
    // The whole file imports.
    let table = ReplayTable::builder(d4rl_spec(20, 20)).build().unwrap();
    gear_hdf5::import(&table, &whole, &ImportOptions::default()).unwrap();
    assert_eq!(lengths(&table).iter().sum::<u64>(), n);
}

/// Sources that are not regular files are refused before they are read
/// (a FIFO would block the import, a device feed it without end);
/// export targets that are not regular files are refused before the
/// table is read, and left as they were.
#[test]
fn sources_and_targets_that_are_not_regular_files() {
    use gear_hdf5::ExportOptions;
    use std::os::unix::fs::FileTypeExt;
    let dir = TempDir::new("err-not-files");
    let t = loaded(&dir, d4rl_spec(50, 100));
    let fifo = dir.join("a-fifo");
    make_fifo(&fifo);
    let (tx, rx) = std::sync::mpsc::channel();
    let table = t.0.clone();
    let source = fifo.clone();
    std::thread::spawn(move || tx.send(gear_hdf5::import(&table, &source, &ImportOptions::default()).map(|_| ())));
    let e = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("an import from a FIFO returns").unwrap_err();
    assert!(e.to_string().contains("is a FIFO"), "{e}");
    refused(&t, Path::new("/dev/zero"), &ImportOptions::default(), &["is a character device"]);
    refused(&t, &dir.0, &ImportOptions::default(), &["is a directory"]);

    let export = |path: &Path| gear_hdf5::export(&t.0, path, &ExportOptions::default()).unwrap_err().to_string();
    if let Some(null) = null_device(&dir.0) {
        let msg = export(&null);
        assert!(msg.contains("is a character device, not a regular file"), "{msg}");
        assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_char_device());
    }
    assert!(export(&dir.0).contains("is a directory"));
    assert!(export(&fifo).contains("is a FIFO"));
    let socket = dir.join("a-socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    assert!(export(&socket).contains("is a socket"));
    let kept = dir.join("kept.hdf5");
    std::fs::write(&kept, b"not mine").unwrap();
    let link = dir.join("link.hdf5");
    std::os::unix::fs::symlink(&kept, &link).unwrap();
    assert!(export(&link).contains("is a symbolic link"));
    assert_eq!(std::fs::read(&kept).unwrap(), b"not mine");
    // A temporary file a dead export to the same path left is removed;
    // nothing else is left behind.
    let out = dir.join("out.hdf5");
    std::fs::write(dir.join("out.hdf5.tmp.4242.0"), b"partial").unwrap();
    gear_hdf5::export(&t.0, &out, &ExportOptions::default()).unwrap();
    let left: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
