//! Checkpoints: round trips of every dtype with equal draws after restore,
//! truncated, bit-flipped, other-version and other-spec files refused,
//! hand-edited records no table can hold refused (checksums recomputed),
//! targets that are not regular files refused, a checkpointing child
//! killed with SIGKILL at many points (the previous checkpoint loads, the
//! temporary files of dead writers are removed, a stopped writer's kept),
//! and a checkpoint taken while writer processes and a sampler run, every
//! row checked. Children are this test binary re-run in a role; every wait
//! has a deadline.

mod processes;
mod refused_files;
mod round_trips;
mod targets;

use gear_api::{AttachOptions, Error, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../common/not_regular.rs"]
mod not_regular;

const ROLE: &str = "GEAR_CKPT_CHILD_ROLE";
const ARG: &str = "GEAR_CKPT_CHILD_ARG";

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gear-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One column of every dtype, with shapes of zero, one and two dimensions.
fn every_dtype_spec(capacity: u64) -> TableSpec {
    let columns = DType::ALL
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let shape = match i % 3 {
                0 => vec![],
                1 => vec![3],
                _ => vec![2, 2],
            };
            ColumnSpec::new(format!("c{i}"), d, shape)
        })
        .collect();
    TableSpec::new(columns, 12, capacity).unwrap()
}

/// Writes `n` trajectories of random length and random bytes (bools as 0
/// or 1), some with priorities.
fn fill_random(table: &ReplayTable, n: usize, seed: u64) {
    let spec = table.spec().clone();
    let mut rng = Xoshiro256::seed_from_u64(seed);
    let writer = table.writer();
    for i in 0..n {
        let priority = (i % 3 != 0).then(|| 0.1 + rng.below(100) as f64);
        let mut traj = writer.begin(priority).unwrap();
        let len = 1 + rng.below(spec.max_len());
        for (c, col) in spec.columns().iter().enumerate() {
            let bytes: Vec<u8> = (0..col.step_bytes().unwrap() * len)
                .map(|_| if col.dtype() == DType::Bool { rng.below(2) as u8 } else { rng.below(256) as u8 })
                .collect();
            traj.append_column(c, len, StepValue::bytes(&bytes)).unwrap();
        }
        traj.end().unwrap();
    }
}

/// One batch as drawn: keys, lengths, and each column's bytes.
type Drawn = (Vec<gear_core::SlotKey>, Vec<u64>, Vec<Vec<u8>>);

/// The keys, lengths and bytes of `batches` batches from a fresh sampler.
fn draws(table: &ReplayTable, batches: usize) -> Vec<Drawn> {
    let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::whole(12))).unwrap();
    (0..batches)
        .map(|_| {
            let b = sampler.sample().unwrap();
            let cols = (0..table.spec().columns().len()).map(|c| b.column_at(c).bytes.to_vec()).collect();
            (b.keys().to_vec(), b.lengths().to_vec(), cols)
        })
        .collect()
}

fn small_table() -> ReplayTable {
    let table = ReplayTable::builder(every_dtype_spec(16)).seed(1).build().unwrap();
    fill_random(&table, 20, 5);
    table
}

fn refused(path: &Path) -> String {
    match ReplayTable::builder(every_dtype_spec(16)).restore(path) {
        Ok(_) => panic!("{} was restored", path.display()),
        Err(e @ Error::Checkpoint { .. }) => e.to_string(),
        Err(e) => panic!("expected a checkpoint error, got {e}"),
    }
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

const OBS: usize = 256;

fn pattern_spec(capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![ColumnSpec::new("id", DType::I64, vec![]), ColumnSpec::new("obs", DType::U8, vec![OBS as u64])],
        16,
        capacity,
    )
    .unwrap()
}

fn obs_byte(id: i64, step: u64, i: usize) -> u8 {
    (id as u64).wrapping_mul(0x9e37).wrapping_add(step * 13).wrapping_add(i as u64) as u8
}

/// A trajectory whose every byte says which trajectory and step it is.
fn write_pattern(writer: &gear_api::Writer, id: i64, len: u64) {
    let mut traj = writer.begin(None).unwrap();
    for s in 0..len {
        let obs: Vec<u8> = (0..OBS).map(|i| obs_byte(id, s, i)).collect();
        traj.append_step(&[StepValue::typed(&[id]), StepValue::typed(&obs)]).unwrap();
    }
    traj.end().unwrap();
}

/// Entry point of every child; does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let arg = std::env::var(ARG).unwrap();
    match role.as_str() {
        // Checkpoints a growing table into directory `arg` again and again
        // (keeping 2) until killed; says "first" after the first one.
        "checkpointer" => {
            let table = ReplayTable::builder(pattern_spec(4096)).build().unwrap();
            let writer = table.writer();
            let mut id = 0;
            for _ in 0..2000 {
                id += 1;
                write_pattern(&writer, id, 1 + (id as u64 % 16));
            }
            let mut first = true;
            loop {
                table.checkpoint_into(&arg, 2).unwrap();
                if std::mem::take(&mut first) {
                    println!("first");
                }
                for _ in 0..50 {
                    id += 1;
                    write_pattern(&writer, id, 1 + (id as u64 % 16));
                }
            }
        }
        // Writes pattern trajectories into shared table `arg` for 1.5 s.
        "writer" => {
            let table = ReplayTable::attach(&arg, AttachOptions::default()).unwrap();
            let writer = table.writer().with_timeout(Duration::from_secs(10));
            let base = (std::process::id() as i64) << 32;
            let deadline = Instant::now() + Duration::from_millis(1500);
            let mut n = 0;
            while Instant::now() < deadline {
                n += 1;
                write_pattern(&writer, base | n, 1 + (n as u64 % 16));
            }
            println!("wrote {n}");
        }
        other => panic!("unknown role {other}"),
    }
}
