//! The sample phase of `gear bench`'s small-item workload on its own, for
//! `perf` and instruction counts: a table of 10^6 slots of one 64-byte
//! transition (56 B `obs`, i32 `action`, f32 `reward`), filled with
//! `inserts` transitions through `Writer::insert_batch`, then `batches`
//! batches of 256 rows of one step drawn by `Sampler::sample`.
//!
//! `cargo run --release -p gear-api --example small_samples -- [uniform|prioritized] [inserts] [batches]`
//!
//! Run it with 0 batches as well and subtract to get instructions per
//! sampled row.

use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let sampler: gear_sampler::StrategyKind = args.next().as_deref().unwrap_or("uniform").parse()?;
    let inserts: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let batches: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let batch = 256usize;
    let obs: Vec<u8> = (0..batch * 56).map(|i| (i * 31) as u8).collect();
    let actions: Vec<i32> = (0..batch as i32).collect();
    let rewards: Vec<f32> = (0..batch).map(|i| i as f32 * 0.5).collect();
    let priorities: Vec<f64> = (0..batch).map(|i| 1.0 + (i % 7) as f64).collect();
    let spec = TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![56]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
        ],
        1,
        1_000_000,
    )?;
    let table = ReplayTable::builder(spec).sampler_kind(sampler, Default::default()).seed(1).build()?;
    let writer = table.writer();
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
    let mut s = table.sampler(SampleConfig::new(batch, WindowSpec::last(1)))?;
    let t = Instant::now();
    for _ in 0..batches {
        s.sample()?;
    }
    let secs = t.elapsed().as_secs_f64();
    println!("{sampler:?} sampled rows/s {:.0}", (batches * batch) as f64 / secs.max(1e-9));
    Ok(())
}
