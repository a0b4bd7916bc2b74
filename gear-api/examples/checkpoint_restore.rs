//! The restore half of `gear bench --checkpoint` on its own, for timing
//! and `perf record`: a table of `capacity` trajectories of `steps` steps
//! (`step_bytes` of `obs`, an i32 `action`, an f32 `reward`), checkpointed
//! once into `dir`, then restored `rounds` times, each beside a build of
//! an empty table and a plain read of the checkpoint file in 4 MiB reads.
//!
//! `cargo run --release -p gear-api --example checkpoint_restore -- [dir] [capacity] [steps] [step_bytes] [rounds]`

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec};
use std::io::Read;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "target".into()));
    let mut num = |d: usize| args.next().map_or(Ok(d), |a| a.parse::<usize>());
    let (capacity, steps, step_bytes, rounds) = (num(2048)?, num(64)?, num(4096)?, num(5)?);
    let spec = || {
        TableSpec::new(
            vec![
                ColumnSpec::new("obs", DType::U8, vec![step_bytes as u64]),
                ColumnSpec::new("action", DType::I32, vec![]),
                ColumnSpec::new("reward", DType::F32, vec![]),
            ],
            steps as u64,
            capacity as u64,
        )
    };
    let table = ReplayTable::builder(spec()?).build()?;
    let writer = table.writer();
    let obs: Vec<u8> = (0..step_bytes * steps).map(|i| (i * 31 % 251) as u8).collect();
    let actions: Vec<i32> = (0..steps as i32).collect();
    let rewards: Vec<f32> = (0..steps).map(|i| i as f32).collect();
    for _ in 0..capacity {
        let mut t = writer.begin(None)?;
        t.append_column("obs", steps as u64, StepValue::bytes(&obs))?;
        t.append_column("action", steps as u64, StepValue::typed(&actions))?;
        t.append_column("reward", steps as u64, StepValue::typed(&rewards))?;
        t.end()?;
    }
    drop(writer);
    let path = dir.join(format!("checkpoint-restore-{}.gear", std::process::id()));
    let r = table.checkpoint(&path)?;
    drop(table);
    let gb = r.file_bytes as f64 / 1e9;
    println!("{:.1} MB, checkpoint {:.2} GB/s", gb * 1e3, gb / r.elapsed.as_secs_f64());
    let mut buf = vec![0u8; 4 << 20];
    for _ in 0..rounds {
        let t = Instant::now();
        drop(ReplayTable::builder(spec()?).build()?);
        let build = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let restored = ReplayTable::builder(spec()?).restore(&path)?;
        let restore = t.elapsed().as_secs_f64();
        drop(restored);
        let t = Instant::now();
        let mut f = std::fs::File::open(&path)?;
        while f.read(&mut buf)? > 0 {}
        let read = t.elapsed().as_secs_f64();
        println!(
            "build {:.0} ms, restore {:.2} GB/s, plain read {:.2} GB/s, ratio {:.2}",
            build * 1e3,
            gb / restore,
            gb / read,
            read / restore
        );
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
