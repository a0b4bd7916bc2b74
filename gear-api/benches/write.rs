//! The write and sample hot paths through the public API, beside a plain
//! copy of the same bytes.
//!
//! * `write/append_commit_64B`: begin, one step of three columns (64 B),
//!   end, into a full table of 10^5 slots (every insert evicts).
//! * `write/insert_batch_256x64B`: the same 256 at a time with
//!   `Writer::insert_batch`.
//! * `write/append_commit_513KiB`: one default `gear bench` trajectory (128
//!   steps of 4096 + 4 + 4 B) into a full table of 256 slots, beside
//!   `write/memcpy_513KiB`, a plain copy of the same bytes into a cycling
//!   table-sized buffer.
//! * `sample/prioritized_256x64B`: one batch of 256 small items from a
//!   prioritized table of 10^5.
//! * `sample/uniform_32x513KiB_then_copy` and `sample/uniform_32x513KiB_into`:
//!   a default `gear bench` batch (32 whole trajectories) delivered into a
//!   caller's buffers, by copying out of the sampler's batch or with
//!   `Sampler::sample_into`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use std::hint::black_box;
use std::time::Duration;

fn spec(obs: u64, steps: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![obs]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
        ],
        steps,
        capacity,
    )
    .unwrap()
}

/// Columns of `n` trajectories of `steps` steps.
struct Columns {
    obs: Vec<u8>,
    action: Vec<i32>,
    reward: Vec<f32>,
}

impl Columns {
    fn new(obs: u64, steps: u64, n: u64) -> Self {
        let s = (steps * n) as usize;
        Columns {
            obs: (0..s * obs as usize).map(|i| i as u8).collect(),
            action: (0..s as i32).collect(),
            reward: (0..s).map(|i| i as f32).collect(),
        }
    }

    fn values(&self) -> [StepValue<'_>; 3] {
        [StepValue::typed(&self.obs), StepValue::typed(&self.action), StepValue::typed(&self.reward)]
    }
}

/// A table of `capacity` slots, filled so that every further insert evicts.
fn full_table(spec: TableSpec, prioritized: bool) -> ReplayTable {
    let capacity = spec.capacity();
    let steps = spec.max_len();
    let obs = spec.columns()[0].shape()[0];
    let mut b = ReplayTable::builder(spec);
    if prioritized {
        b = b.sampler_kind(gear_sampler::StrategyKind::Prioritized, Default::default());
    }
    let table = b.build().unwrap();
    let fill = Columns::new(obs, steps, 256);
    let priorities: Vec<f64> = (0..256).map(|i| 1.0 + (i % 7) as f64).collect();
    let mut left = capacity;
    while left > 0 {
        let n = left.min(256);
        let per = (steps * n) as usize;
        table
            .writer()
            .insert_batch(
                n as usize,
                steps,
                &[
                    StepValue::typed(&fill.obs[..per * obs as usize]),
                    StepValue::typed(&fill.action[..per]),
                    StepValue::typed(&fill.reward[..per]),
                ],
                Some(&priorities[..n as usize]),
            )
            .unwrap();
        left -= n;
    }
    table
}

fn bench_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("write");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));

    let small = full_table(spec(56, 1, 100_000), true);
    let one = Columns::new(56, 1, 1);
    let writer = small.writer();
    g.throughput(Throughput::Elements(1));
    g.bench_function("append_commit_64B", |b| {
        b.iter(|| {
            let mut t = writer.begin(Some(2.0)).unwrap();
            t.append_step(&one.values()).unwrap();
            black_box(t.end().unwrap());
        })
    });
    let batch = Columns::new(56, 1, 256);
    let priorities = vec![2.0; 256];
    g.throughput(Throughput::Elements(256));
    g.bench_function("insert_batch_256x64B", |b| {
        b.iter(|| black_box(writer.insert_batch(256, 1, &batch.values(), Some(&priorities)).unwrap()))
    });

    let big = full_table(spec(4096, 128, 256), false);
    let traj = Columns::new(4096, 128, 1);
    let bytes = (128 * (4096 + 8)) as usize;
    let writer = big.writer();
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("append_commit_513KiB", |b| {
        b.iter(|| {
            let mut t = writer.begin(Some(1.0)).unwrap();
            for (c, v) in traj.values().into_iter().enumerate() {
                t.append_column(c, 128, v).unwrap();
            }
            black_box(t.end().unwrap());
        })
    });
    let src = vec![7u8; bytes];
    let mut dst = vec![1u8; bytes * 256];
    let mut slot = 0;
    g.bench_function("memcpy_513KiB", |b| {
        b.iter(|| {
            dst[slot * bytes..(slot + 1) * bytes].copy_from_slice(&src);
            slot = (slot + 1) % 256;
            black_box(&dst);
        })
    });
    g.finish();
}

fn bench_sample(c: &mut Criterion) {
    let mut g = c.benchmark_group("sample");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    let table = full_table(spec(56, 1, 100_000), true);
    let mut sampler = table.sampler(SampleConfig::new(256, WindowSpec::whole(1))).unwrap();
    g.throughput(Throughput::Elements(256));
    g.bench_function("prioritized_256x64B", |b| b.iter(|| black_box(sampler.sample().unwrap().rows())));

    let table = full_table(spec(4096, 128, 256), false);
    let mut sampler = table.sampler(SampleConfig::new(32, WindowSpec::whole(128))).unwrap();
    let sizes: Vec<usize> = (0..3).map(|i| sampler.layout().column_bytes(i) as usize).collect();
    let mut mine: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    g.throughput(Throughput::Bytes(sizes.iter().sum::<usize>() as u64));
    g.bench_function("uniform_32x513KiB_then_copy", |b| {
        b.iter(|| {
            let batch = sampler.sample().unwrap();
            for (i, out) in mine.iter_mut().enumerate() {
                out.copy_from_slice(batch.column_at(i).bytes);
            }
            black_box(&mine);
        })
    });
    g.bench_function("uniform_32x513KiB_into", |b| {
        b.iter(|| {
            let mut cols: Vec<&mut [u8]> = mine.iter_mut().map(|v| &mut v[..]).collect();
            black_box(sampler.sample_into(&mut cols).unwrap().rows());
        })
    });
    g.finish();
}

criterion_group!(benches, bench_write, bench_sample);
criterion_main!(benches);
