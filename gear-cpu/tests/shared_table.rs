//! Tables in shared memory: a second process attaches by name and reads
//! what the first wrote; attaching to the wrong thing is a clear error.
// Every test here maps /dev/shm files or starts processes: nothing Miri
// can run (`.ci/run`'s Miri step covers the host pool and the collector).
#![cfg(not(miri))]

mod common;

use common::{pattern, unique_name, TestDir};
use gear_core::{ColumnSpec, DType, Error as CoreError, SlotState, TableRegion, TableSpec};
use gear_cpu::{create_host_table, create_shared_table, open_shared_table, Error, ShmOptions, ShmPool};
use std::process::Command;

/// Set in the child process to the name of the table to attach to.
const CHILD_ENV: &str = "GEAR_CPU_TEST_CHILD_TABLE";
const SLOT: u32 = 2;
const STEPS: u64 = 11;

fn spec() -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![3, 5]),
            ColumnSpec::new("reward", DType::F32, vec![]),
            ColumnSpec::new("done", DType::Bool, vec![]),
        ],
        16,
        4,
    )
    .unwrap()
}

fn expected_steps(table: &TableRegion<impl gear_core::MemoryRegion>, column: usize) -> Vec<u8> {
    let s = table.layout().step_bytes(column) as usize;
    (0..STEPS).flat_map(|t| pattern(u64::from(SLOT), column, t, s)).collect()
}

/// The child half: attach, check the slot record and every byte, and leave
/// a mark (a priority) for the parent to see. Panics (exit code 101) on any
/// mismatch.
fn child(name: &str) {
    let table = open_shared_table(name, None, Some(&spec())).expect("child attaches");
    assert!(!table.region().is_creator());
    let meta = table.slot(SLOT).unwrap().meta(SLOT);
    assert_eq!(meta.state, SlotState::Committed);
    assert_eq!(meta.len, STEPS);
    assert_eq!(meta.priority, 0.5);
    assert_eq!(meta.key.generation, 1);
    for c in 0..table.spec().columns().len() {
        let want = expected_steps(&table, c);
        let mut got = vec![0u8; want.len()];
        assert!(table.read_steps(meta.key, c, 0, &mut got).unwrap(), "slot reused while reading");
        assert_eq!(got, want, "column {c}");
    }
    assert!(table.slot(SLOT).unwrap().set_priority(meta.key, 7.25));
}

#[test]
fn second_process_reads_what_first_wrote() {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        child(&name);
        return;
    }
    let name = unique_name("xproc");
    let table = create_shared_table(&name, &spec(), ShmOptions::default()).unwrap();
    let rec = table.slot(SLOT).unwrap();
    let key = rec.begin_write(SLOT, u64::from(std::process::id()), 1, 0.5).unwrap();
    for c in 0..table.spec().columns().len() {
        table.write_steps(key, c, 0, &expected_steps(&table, c)).unwrap();
    }
    rec.publish_len(key, STEPS).unwrap();
    rec.commit(key).unwrap();

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "second_process_reads_what_first_wrote", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &name)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran no test");
    assert_eq!(rec.meta(SLOT).priority, 7.25, "the child's write is visible to the parent");
    assert!(table.region().path().exists(), "the attacher must not unlink");
    let path = table.region().path();
    drop(table);
    assert!(!path.exists(), "the creator unlinks on drop");
}

#[test]
fn attaching_with_another_spec_is_a_spec_mismatch() {
    let name = unique_name("mismatch");
    let _table = create_shared_table(&name, &spec(), ShmOptions::default()).unwrap();
    let other = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, vec![3, 5])], 16, 4).unwrap();
    let e = open_shared_table(&name, None, Some(&other)).unwrap_err();
    assert!(matches!(e, Error::Core(CoreError::SpecMismatch { .. })), "{e}");
    assert!(e.to_string().contains("spec mismatch"), "{e}");
    // Without an expectation the stored spec is taken as is.
    assert_eq!(open_shared_table(&name, None, None).unwrap().spec(), &spec());
}

/// The bytes of a freshly created table file.
fn table_file_bytes() -> Vec<u8> {
    let dir = TestDir::new("image");
    let name = unique_name("image");
    let t = create_shared_table(&name, &spec(), ShmOptions::new().dir(dir.path())).unwrap();
    std::fs::read(t.region().path()).unwrap()
}

fn open_file(bytes: &[u8]) -> Result<(), Error> {
    let dir = TestDir::new("bad");
    let name = unique_name("bad");
    std::fs::write(dir.path().join(&name), bytes).unwrap();
    open_shared_table(&name, Some(dir.path()), None).map(drop)
}

fn decode_error(bytes: &[u8]) -> String {
    match open_file(bytes) {
        Err(Error::Core(CoreError::Decode(m))) => m,
        other => panic!("expected a decode error, got {other:?}"),
    }
}

#[test]
fn a_good_image_opens() {
    open_file(&table_file_bytes()).unwrap();
}

#[test]
fn random_bytes_are_not_a_table() {
    let noise: Vec<u8> = (0..3 * 4096u64).flat_map(|i| pattern(i, 9, 9, 1)).collect();
    assert!(decode_error(&noise).contains("bad magic"));
    assert!(decode_error(&[0u8; 10]).contains("too small"));
}

#[test]
fn truncated_table_is_refused() {
    let image = table_file_bytes();
    let msg = decode_error(&image[..image.len() - 4096]);
    assert!(msg.contains("truncated"), "{msg}");
    let msg = decode_error(&image[..70]);
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn wrong_version_is_refused() {
    let mut image = table_file_bytes();
    image[8..12].copy_from_slice(&99u32.to_le_bytes());
    let msg = decode_error(&image);
    assert!(msg.contains("version 99"), "{msg}");
}

#[test]
fn unfinished_header_is_refused() {
    let mut image = table_file_bytes();
    image[12..16].copy_from_slice(&0u32.to_le_bytes());
    assert!(decode_error(&image).contains("not initialised"));
}

#[test]
fn table_creation_failure_removes_the_pool() {
    // A capacity whose data area cannot fit /dev/shm: the pool is refused
    // up front and nothing is left behind.
    let big = TableSpec::new(vec![ColumnSpec::new("x", DType::F64, vec![1 << 20])], 1 << 12, 1 << 12).unwrap();
    let name = unique_name("bigtable");
    let e = create_shared_table(&name, &big, ShmOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoSpace { .. }), "{e}");
    assert!(matches!(ShmPool::open(&name, None), Err(Error::NotFound { .. })));
}

#[test]
fn host_table_round_trips_steps() {
    let table = create_host_table(&spec()).unwrap();
    let rec = table.slot(0).unwrap();
    let key = rec.begin_write(0, 1, 1, 1.0).unwrap();
    let obs = pattern(0, 0, 0, 15 * 3);
    table.write_steps(key, 0, 0, &obs).unwrap();
    rec.publish_len(key, 3).unwrap();
    let mut back = vec![0; obs.len()];
    assert!(table.read_steps(key, 0, 0, &mut back).unwrap());
    assert_eq!(back, obs);
}

/// `TableRegion::write_batch` writes and publishes each trajectory as
/// `write_steps` of every column and `publish_len` would, and refuses bad
/// sizes before copying anything.
#[test]
fn write_batch_matches_write_steps_and_refuses_before_copying() {
    let table = create_host_table(&spec()).unwrap();
    let steps = 3u64;
    let keys: Vec<_> =
        (0..3u32).map(|s| table.slot(s).unwrap().begin_write(s, 1, u64::from(s), 1.0).unwrap()).collect();
    // Four trajectories' bytes; the batch writes items 1..4 into slots 0..3.
    let columns: Vec<Vec<u8>> = (0..3)
        .map(|c| {
            let s = table.layout().step_bytes(c) as usize;
            (0..4u64).flat_map(|i| pattern(i, c, 0, s * steps as usize)).collect()
        })
        .collect();
    let bytes: Vec<&[u8]> = columns.iter().map(Vec::as_slice).collect();
    let short: Vec<&[u8]> =
        bytes.iter().enumerate().map(|(c, b)| if c == 2 { &b[..b.len() - 1] } else { *b }).collect();
    assert!(matches!(table.write_batch(&keys, 1, steps, &short), Err(CoreError::StepSize { .. })));
    assert!(matches!(table.write_batch(&keys, 1, steps, &bytes[..2]), Err(CoreError::StepColumns { .. })));
    assert!(matches!(table.write_batch(&keys, 1, 17, &bytes), Err(CoreError::TrajectoryTooLong { .. })));
    for &key in &keys {
        let rec = table.slot(key.slot).unwrap();
        assert_eq!(rec.meta(key.slot).len, 0, "a refused batch publishes nothing");
        rec.publish_len(key, steps).unwrap();
        let mut back = vec![0u8; columns[0].len() / 4];
        assert!(table.read_steps(key, 0, 0, &mut back).unwrap());
        assert!(back.iter().all(|&b| b == 0), "a refused batch copies nothing");
    }
    table.write_batch(&keys, 1, steps, &bytes).unwrap();
    for (i, &key) in (1..).zip(&keys) {
        assert_eq!(table.slot(key.slot).unwrap().meta(key.slot).len, steps);
        for (c, col) in columns.iter().enumerate() {
            let per = col.len() / 4;
            let mut back = vec![0u8; per];
            assert!(table.read_steps(key, c, 0, &mut back).unwrap());
            assert_eq!(back, col[i * per..(i + 1) * per], "slot {} column {c}", key.slot);
        }
    }
    // A key that is no longer being written stops the batch there.
    table.slot(keys[1].slot).unwrap().commit(keys[1]).unwrap();
    let e = table.write_batch(&keys, 0, 1, &bytes).unwrap_err();
    assert!(matches!(e, CoreError::SlotState { .. }), "{e}");
    assert_eq!(table.slot(keys[0].slot).unwrap().meta(keys[0].slot).len, 1, "the key before it was written");
    assert_eq!(table.slot(keys[2].slot).unwrap().meta(keys[2].slot).len, steps, "the key after it was not");
}
