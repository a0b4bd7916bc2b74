//! Criterion benches of the CUDA collector: zero-copy gather from pinned
//! host memory and gather from the device cache, batches of 32 and 256
//! windows of 64 steps x 4 KiB. Each iteration waits for the batch's event,
//! so device work is inside the timed region. Without a CUDA device the
//! benches print "skipped: no CUDA device" and register nothing.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gear_core::{
    BatchLayout, ColumnSpec, DType, GatherRow, RandomSource, TableRegion, TableSpec, WindowSpec, Xoshiro256,
};
use gear_cuda::{CudaCollector, CudaDevice, DeviceCache};
use std::sync::Arc;

fn benches(c: &mut Criterion) {
    let dev = match CudaDevice::new(0).and_then(|d| d.warm_up().map(|_| d)) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let spec = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, [4096])], 128, 512).unwrap();
    let bytes = gear_core::RegionLayout::for_spec(&spec).unwrap().total_bytes;
    let table = Arc::new(TableRegion::create(dev.alloc_pinned(bytes).unwrap(), &spec).unwrap());
    for slot in 0..spec.capacity() as u32 {
        let rec = table.slot(slot).unwrap();
        let key = rec.begin_write(slot, 1, u64::from(slot), 1.0).unwrap();
        rec.publish_len(key, spec.max_len()).unwrap();
        rec.commit(key).unwrap();
    }
    let mut rng = Xoshiro256::seed_from_u64(1);
    for batch in [32usize, 256] {
        let rows: Vec<GatherRow> =
            (0..batch).map(|_| GatherRow::whole(rng.below(spec.capacity()) as u32, spec.max_len())).collect();
        let layout = BatchLayout::new(table.layout(), &[0], batch, WindowSpec::last(64)).unwrap();
        let mut group = c.benchmark_group("cuda");
        group.throughput(Throughput::Bytes(layout.total_bytes()));

        let zc = CudaCollector::new(&dev);
        let mut out = zc.alloc(&layout).unwrap();
        group.bench_function(format!("cuda_gather_b{batch}"), |b| {
            b.iter(|| {
                zc.gather_into(&table.view(), &rows, &mut out).unwrap();
                out.synchronize().unwrap();
            })
        });

        let cache = Arc::new(DeviceCache::new(&dev, table.clone(), batch).unwrap());
        for r in &rows {
            cache.insert(table.slot(r.slot).unwrap().key_state(r.slot).0).unwrap();
        }
        let dc = CudaCollector::new(&dev).with_cache(cache).unwrap();
        let mut out = dc.alloc(&layout).unwrap();
        group.bench_function(format!("cuda_gather_cached_b{batch}"), |b| {
            b.iter(|| {
                dc.gather_into(&table.view(), &rows, &mut out).unwrap();
                out.synchronize().unwrap();
            })
        });
        group.finish();
    }
}

criterion_group!(cuda, benches);
criterion_main!(cuda);
