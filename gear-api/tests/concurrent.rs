//! Several sampler threads of one process drawing at once, while a writer
//! evicts under them: random strategies draw under a shared read lock,
//! deterministic ones under the table's exclusive lock, and every batch
//! holds whole rows either way.

use gear_api::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, Sampled, Selector, SlotKey, TableSpec, WindowSpec};
use gear_sampler::StrategyKind;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Mixed into the second value of each row, so a row made of two
/// trajectories' bytes is seen.
const CHECK: i64 = 0x5bd1_e995;

fn spec(capacity: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("x", DType::I64, vec![2])], 1, capacity).unwrap()
}

fn insert(table: &ReplayTable, i: i64) {
    let mut t = table.writer().begin(Some(1.0 + (i % 7) as f64)).unwrap();
    t.append_step(&[StepValue::typed(&[i, i ^ CHECK])]).unwrap();
    t.end().unwrap();
}

fn sample_while_evicting(kind: StrategyKind) {
    const THREADS: usize = 3;
    const ROWS: usize = 32;
    const WRITES: i64 = 20_000;
    // Small, so that the writer's evictions hit rows just drawn (and the
    // redraw of rows evicted between draw and record read runs).
    const CAPACITY: u64 = 8;
    let table = ReplayTable::builder(spec(CAPACITY)).sampler_kind(kind, Default::default()).seed(9).build().unwrap();
    for i in 0..CAPACITY as i64 {
        insert(&table, i);
    }
    let writing = AtomicBool::new(true);
    let batches = AtomicU64::new(0);
    let sample_until_written = || {
        let config = SampleConfig::new(ROWS, WindowSpec::whole(1)).timeout(Some(Duration::from_secs(20)));
        let mut sampler = table.sampler(config).unwrap();
        let mut whole = 0;
        // At least 20 batches, and on for as long as the writer evicts.
        while whole < 20 || writing.load(Ordering::Relaxed) {
            batches.fetch_add(1, Ordering::Relaxed);
            // Rows overwritten during every one of the copy's attempts end
            // the batch with `Torn` (this writer turns the table over
            // every few microseconds); what must never come back is a
            // mixed row.
            let batch = match sampler.sample() {
                Err(gear_api::Error::Torn { .. }) => continue,
                other => other.unwrap(),
            };
            whole += 1;
            let x = batch.column("x").unwrap().as_slice::<i64>().unwrap();
            for (r, key) in batch.keys().iter().enumerate() {
                let (a, b) = (x[2 * r], x[2 * r + 1]);
                assert_eq!(b, a ^ CHECK, "{kind:?}: row {r} ({key}) mixes two trajectories");
                assert!(u64::from(key.slot) < CAPACITY);
            }
            assert!(batch.weights().iter().all(|w| *w > 0.0 && *w <= 1.0));
        }
    };
    std::thread::scope(|scope| {
        let samplers: Vec<_> = (0..THREADS).map(|_| scope.spawn(sample_until_written)).collect();
        for i in 0..WRITES {
            insert(&table, CAPACITY as i64 + i);
        }
        writing.store(false, Ordering::Relaxed);
        for s in samplers {
            s.join().unwrap();
        }
    });
    let info = table.info().unwrap();
    assert_eq!(info.evictions, WRITES as u64);
    let rows = batches.load(Ordering::Relaxed) * ROWS as u64;
    assert_eq!(info.samples, rows, "{kind:?}: each batch counted once against the limiter");
    assert_eq!(info.size, CAPACITY);
}

#[test]
fn uniform_threads_draw_at_once_while_a_writer_evicts() {
    sample_while_evicting(StrategyKind::Uniform);
}

#[test]
fn prioritized_threads_draw_at_once_while_a_writer_evicts() {
    sample_while_evicting(StrategyKind::Prioritized);
}

#[test]
fn fifo_threads_take_the_exclusive_path_while_a_writer_evicts() {
    sample_while_evicting(StrategyKind::Fifo);
}

#[test]
fn samplers_of_a_seeded_table_draw_the_same_rows_in_every_run() {
    let draw = || {
        let table = ReplayTable::builder(spec(32))
            .sampler_kind(StrategyKind::Prioritized, Default::default())
            .seed(4)
            .build()
            .unwrap();
        for i in 0..32 {
            insert(&table, i);
        }
        let mut a = table.sampler(SampleConfig::new(16, WindowSpec::whole(1))).unwrap();
        let mut b = table.sampler(SampleConfig::new(16, WindowSpec::whole(1))).unwrap();
        let ka = a.sample().unwrap().keys().to_vec();
        let kb = b.sample().unwrap().keys().to_vec();
        assert_ne!(ka, kb, "two samplers of one table draw from different streams");
        (ka, kb)
    };
    assert_eq!(draw(), draw());
}

/// Uniform selection whose first `bad_draws` shared draws name a
/// generation the table does not hold, as a draw racing an eviction in
/// another process does (or, when they never stop, a strategy bug the table
/// must report, not act on).
struct WrongGeneration {
    uniform: gear_sampler::Uniform,
    bad_draws: AtomicUsize,
}

impl WrongGeneration {
    fn new(bad_draws: usize) -> Self {
        WrongGeneration { uniform: gear_sampler::Uniform::new(), bad_draws: AtomicUsize::new(bad_draws) }
    }
}

impl Selector for WrongGeneration {
    fn name(&self) -> &str {
        "wrong-generation"
    }
    fn prepare(&mut self, capacity: u64) -> gear_core::Result<()> {
        self.uniform.prepare(capacity)
    }
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> gear_core::Result<f64> {
        self.uniform.insert(key, priority)
    }
    fn update(&mut self, key: SlotKey, priority: f64) -> gear_core::Result<()> {
        self.uniform.update(key, priority)
    }
    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.uniform.remove(key)
    }
    fn len(&self) -> usize {
        self.uniform.len()
    }
    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        self.uniform.sample(n, rng, out)
    }
    fn sample_shared(
        &self,
        n: usize,
        rng: &mut dyn RandomSource,
        out: &mut Vec<Sampled>,
    ) -> Option<gear_core::Result<()>> {
        let start = out.len();
        let result = self.uniform.sample_shared(n, rng, out)?;
        let bad =
            n > 0 && self.bad_draws.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1)).is_ok();
        if bad {
            for s in &mut out[start..] {
                s.key.generation = s.key.generation.wrapping_add(1);
            }
        }
        Some(result)
    }
}

#[test]
fn rows_evicted_between_draw_and_record_read_are_drawn_again_and_counted_once() {
    let table = ReplayTable::builder(spec(8)).sampler(WrongGeneration::new(3)).build().unwrap();
    for i in 0..4 {
        insert(&table, i);
    }
    let mut sampler = table.sampler(SampleConfig::new(6, WindowSpec::whole(1))).unwrap();
    let batch = sampler.sample().unwrap();
    let x = batch.column("x").unwrap().as_slice::<i64>().unwrap();
    for r in 0..6 {
        assert_eq!(x[2 * r + 1], x[2 * r] ^ CHECK);
        assert!((0..4).contains(&x[2 * r]));
    }
    assert_eq!(table.info().unwrap().samples, 6);
}

#[test]
fn a_strategy_drawing_keys_the_table_does_not_hold_is_a_clear_error_and_harms_nothing() {
    let table = ReplayTable::builder(spec(8)).sampler(WrongGeneration::new(usize::MAX)).build().unwrap();
    for i in 0..4 {
        insert(&table, i);
    }
    let mut sampler = table.sampler(SampleConfig::new(2, WindowSpec::whole(1))).unwrap();
    let err = sampler.sample().unwrap_err().to_string();
    assert!(err.contains("wrong-generation") && err.contains("not stored"), "{err}");
    // The table still takes and holds trajectories.
    insert(&table, 4);
    let info = table.info().unwrap();
    assert_eq!((info.size, info.inserts), (5, 5));
}
