//! CPU gather throughput next to a plain `memcpy` of the same byte count.
//!
//! `cpu_gather_b32_whole`: 32 whole trajectories of 128 steps x 4096-byte
//! observations (16 MiB per batch) from a host table; `memcpy_same_bytes`
//! copies 16 MiB between two buffers, the ceiling the gather can reach.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gear_core::{BatchLayout, Collector, ColumnSpec, DType, GatherRow, TableSpec, WindowSpec};
use gear_cpu::{create_host_table, CpuCollector};
use std::hint::black_box;

const T: u64 = 128;
const OBS: u64 = 4096;
const CAPACITY: u64 = 256;
const BATCH: usize = 32;

fn bench_gather(c: &mut Criterion) {
    let spec = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, vec![OBS])], T, CAPACITY).unwrap();
    let table = create_host_table(&spec).unwrap();
    for slot in 0..CAPACITY as u32 {
        let rec = table.slot(slot).unwrap();
        let key = rec.begin_write(slot, 1, u64::from(slot), 1.0).unwrap();
        table.write_steps(key, 0, 0, &vec![slot as u8 | 1; (T * OBS) as usize]).unwrap();
        rec.publish_len(key, T).unwrap();
        rec.commit(key).unwrap();
    }
    // Spread rows over the table so the source is not one hot range.
    let rows: Vec<GatherRow> = (0..BATCH as u32).map(|i| GatherRow::whole((i * 37) % CAPACITY as u32, T)).collect();
    let layout = BatchLayout::new(table.layout(), &[0], BATCH, WindowSpec::whole(T)).unwrap();
    let bytes = layout.total_bytes();

    let mut g = c.benchmark_group("gather");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(30);

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, collector) in [
        ("cpu_gather_b32_whole".to_owned(), CpuCollector::new()),
        ("cpu_gather_b32_whole_1thread".to_owned(), CpuCollector::with_threads(1)),
    ] {
        let mut batch = collector.alloc_batch(&layout).unwrap();
        g.bench_function(format!("{name} ({} threads)", collector.threads().min(threads)), |b| {
            b.iter(|| collector.gather(&table.view(), black_box(&rows), &layout, &mut batch).unwrap())
        });
    }

    // Short head-padded windows of the last 16 steps: small copies, the
    // per-window overhead dominates.
    let w = WindowSpec::last(16);
    let small = BatchLayout::new(table.layout(), &[0], 256, w).unwrap();
    let rows256: Vec<GatherRow> = (0..256u32).map(|i| GatherRow::whole(i, 8 + u64::from(i) % (T - 8))).collect();
    let collector = CpuCollector::new();
    let mut batch = collector.alloc_batch(&small).unwrap();
    g.throughput(Throughput::Bytes(small.total_bytes()));
    g.bench_function("cpu_gather_b256_last16", |b| {
        b.iter(|| collector.gather(&table.view(), black_box(&rows256), &small, &mut batch).unwrap())
    });

    g.throughput(Throughput::Bytes(bytes));
    let src = vec![7u8; bytes as usize];
    let mut dst = vec![0u8; bytes as usize];
    g.bench_function("memcpy_same_bytes", |b| b.iter(|| dst.copy_from_slice(black_box(&src))));
    g.finish();
}

criterion_group!(benches, bench_gather);
criterion_main!(benches);
