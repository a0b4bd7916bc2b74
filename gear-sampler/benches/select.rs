//! Selection strategy costs at 10^3, 10^5 and 10^6 held items: one insert,
//! one priority update, one batch of 256 draws, and (prioritized) one
//! batched update of as many priorities as items. Names read
//! `<strategy>/<op>/<items>`, e.g. `prioritized/sample256/1000000`.
//!
//! Targets on a 2-core machine: prioritized `sample256` at 10^6 under
//! 50 us; `update_batch` of 10^6 under 0.25 s; uniform and FIFO flat in the
//! number of items.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use gear_core::{RandomSource, Selector, SlotKey, Xoshiro256};
use gear_sampler::{build, Prioritized, StrategyKind, StrategyParams};

const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];

/// Priorities spread over four decades.
fn priority(r: &mut Xoshiro256) -> f64 {
    10f64.powf(4.0 * r.next_f64() - 2.0)
}

/// A strategy holding `n` items in slots `0..n` (generation 1), capacity
/// `n`, and the keys it holds.
fn filled(s: &mut dyn Selector, n: usize, r: &mut Xoshiro256) -> Vec<SlotKey> {
    s.prepare(n as u64).unwrap();
    (0..n as u32)
        .map(|slot| {
            let k = SlotKey { slot, generation: 1 };
            s.insert(k, Some(priority(r))).unwrap();
            k
        })
        .collect()
}

fn tune(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    if n >= 1_000_000 {
        group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    } else {
        group.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    }
}

fn strategy(c: &mut Criterion, kind: StrategyKind) {
    let mut group = c.benchmark_group(kind.name());
    for n in SIZES {
        tune(&mut group, n);
        let mut r = Xoshiro256::seed_from_u64(n as u64);
        let mut s = build(kind, &StrategyParams::default()).unwrap();
        let mut keys = filled(s.as_mut(), n, &mut r);

        // One insert into a strategy holding n - 1 items: removals to make
        // room happen outside the timed region, in chunks.
        group.bench_function(BenchmarkId::new("insert", n), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters as usize;
                let mut chunk = Vec::with_capacity(1024);
                while left > 0 {
                    let k = left.min(1024).min(n / 10);
                    chunk.clear();
                    for _ in 0..k {
                        let i = r.below(keys.len() as u64) as usize;
                        let key = keys.swap_remove(i);
                        s.remove(key).unwrap();
                        chunk.push((SlotKey { slot: key.slot, generation: key.generation + 1 }, priority(&mut r)));
                    }
                    let start = Instant::now();
                    for &(key, p) in &chunk {
                        black_box(s.insert(key, Some(p)).unwrap());
                    }
                    timed += start.elapsed();
                    keys.extend(chunk.iter().map(|&(key, _)| key));
                    left -= k;
                }
                timed
            })
        });

        let updates: Vec<(SlotKey, f64)> =
            (0..4096).map(|_| (keys[r.below(n as u64) as usize], priority(&mut r))).collect();
        let mut next = 0;
        group.bench_function(BenchmarkId::new("update", n), |b| {
            b.iter(|| {
                let (key, p) = updates[next % updates.len()];
                next += 1;
                s.update(key, p).unwrap();
            })
        });

        let mut out = Vec::with_capacity(256);
        group.bench_function(BenchmarkId::new("sample256", n), |b| {
            b.iter(|| {
                out.clear();
                s.sample(256, &mut r, &mut out).unwrap();
                black_box(&out);
            })
        });
    }
    group.finish();
}

fn prioritized_update_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("prioritized");
    for n in SIZES {
        tune(&mut group, n);
        let mut r = Xoshiro256::seed_from_u64(7);
        let mut s = Prioritized::default();
        let keys = filled(&mut s, n, &mut r);
        let updates: Vec<(SlotKey, f64)> =
            (0..n).map(|_| (keys[r.below(n as u64) as usize], priority(&mut r))).collect();
        group.bench_function(BenchmarkId::new("update_batch", n), |b| {
            b.iter(|| black_box(s.update_batch(&updates).unwrap()))
        });
    }
    group.finish();
}

fn all(c: &mut Criterion) {
    for kind in StrategyKind::ALL {
        strategy(c, kind);
    }
    prioritized_update_batch(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
