//! The insert phase of `gear bench`'s small-item workload on its own, for
//! `perf stat` and `perf record`: a table of 10^6 slots of one 64-byte
//! transition (56 B `obs`, i32 `action`, f32 `reward`), filled through
//! `Writer::insert_batch` in calls of 256 with priorities cycling 1..=7.
//!
//! `cargo run --release -p gear-api --example small_inserts -- [uniform|prioritized] [inserts] [rounds]`
//!
//! Each round builds a fresh table and prints its insert rate. Run it with
//! 0 inserts as well and subtract to get instructions per insert.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sampler: gear_sampler::StrategyKind = args.next().as_deref().unwrap_or("uniform").parse()?;
    let inserts: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let capacity = 1_000_000u64;
    let batch = 256usize;
    let obs: Vec<u8> = (0..batch * 56).map(|i| (i * 31) as u8).collect();
    let actions: Vec<i32> = (0..batch as i32).collect();
    let rewards: Vec<f32> = (0..batch).map(|i| i as f32 * 0.5).collect();
    let priorities: Vec<f64> = (0..batch).map(|i| 1.0 + (i % 7) as f64).collect();
    for _ in 0..rounds {
        let spec = TableSpec::new(
            vec![
                ColumnSpec::new("obs", DType::U8, vec![56]),
                ColumnSpec::new("action", DType::I32, vec![]),
                ColumnSpec::new("reward", DType::F32, vec![]),
            ],
            1,
            capacity,
        )?;
        let table = ReplayTable::builder(spec).sampler_kind(sampler, Default::default()).seed(1).build()?;
        let writer = table.writer();
        let t = Instant::now();
        let mut done = 0;
        while done < inserts {
            let n = batch.min(inserts - done);
            writer.insert_batch(
                n,
                1,
                &[StepValue::typed(&obs[..n * 56]), StepValue::typed(&actions[..n]), StepValue::typed(&rewards[..n])],
                Some(&priorities[..n]),
            )?;
            done += n;
        }
        let s = t.elapsed().as_secs_f64();
        println!("{sampler:?} inserts/s {:.0}", inserts as f64 / s.max(1e-9));
    }
    Ok(())
}
