//! Waiting writers and samplers are visible: `info()` lists who waits, on
//! which limit and since when (in every process: the list lives in the
//! shared control block), and a wait that lasts is logged as a warning.

use gear_api::{RateLimiterConfig, ReplayTable, SampleConfig, StepValue, WaitReason, WaitRole, Waiting};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every test here sees the same warning threshold (read once per process).
fn short_warning_threshold() {
    static SET: std::sync::Once = std::sync::Once::new();
    // Set before any wait of this test binary reads it, by whichever test
    // runs first.
    SET.call_once(|| std::env::set_var("GEAR_WAIT_WARNING_SECS", "0.3"));
}

fn spec(capacity: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("x", DType::I64, vec![])], 1, capacity).unwrap()
}

fn insert(table: &ReplayTable, x: i64, timeout: Duration) -> gear_api::Result<()> {
    let mut t = table.writer().with_timeout(timeout).begin(None)?;
    t.append_step(&[StepValue::typed(&[x])])?;
    t.end().map(|_| ())
}

fn sample(table: &ReplayTable, n: usize, timeout: Duration) -> gear_api::Result<usize> {
    let mut s = table.sampler(SampleConfig::new(n, WindowSpec::whole(1)).timeout(Some(timeout)))?;
    Ok(s.sample()?.rows())
}

/// Polls `info()` until `pred` holds of its waits (10 s at most).
fn until_waiting(table: &ReplayTable, pred: impl Fn(&[Waiting]) -> bool) -> Vec<Waiting> {
    let start = Instant::now();
    loop {
        let w = table.info().unwrap().waiting;
        if pred(&w) {
            return w;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "waits never became {w:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const LONG: Duration = Duration::from_secs(30);

#[test]
fn a_writer_held_by_the_ratio_is_listed_until_samples_release_it() {
    short_warning_threshold();
    // spi 1, min size 1, range [-1, 3]: at most 3 inserts ahead.
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    for i in 0..3 {
        insert(&table, i, LONG).unwrap();
    }
    assert!(table.info().unwrap().waiting.is_empty(), "nobody waits yet");
    let t2 = table.clone();
    let writer = std::thread::spawn(move || insert(&t2, 3, LONG));
    let w = until_waiting(&table, |w| w.len() == 1);
    assert_eq!(
        (w[0].role, w[0].reason, w[0].pid),
        (WaitRole::Writer, WaitReason::SamplesPerInsert, std::process::id())
    );
    std::thread::sleep(Duration::from_millis(200));
    let info = table.info().unwrap();
    assert!(info.waiting[0].waited >= Duration::from_millis(150), "{:?}", info.waiting);
    assert_eq!((info.waiting_writers(), info.waiting_samplers()), (1, 0));
    assert!(info.waiting_summary().starts_with("1 writer (samples per insert, "), "{}", info.waiting_summary());
    sample(&table, 1, LONG).unwrap();
    writer.join().unwrap().unwrap();
    assert!(table.info().unwrap().waiting.is_empty(), "the listing ends with the wait");
}

#[test]
fn a_sampler_is_listed_on_min_size_then_on_the_ratio() {
    short_warning_threshold();
    // spi 2, min size 2, range [1, 7].
    let limiter = RateLimiterConfig::sample_to_insert_ratio(2.0, 2, 3.0).unwrap();
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    insert(&table, 0, LONG).unwrap();
    let t2 = table.clone();
    // Four rows: below min size first, then (error 4 - 4 < 1) on the ratio.
    let sampler = std::thread::spawn(move || sample(&t2, 4, LONG));
    let w = until_waiting(&table, |w| w.len() == 1);
    assert_eq!((w[0].role, w[0].reason), (WaitRole::Sampler, WaitReason::MinSize));
    insert(&table, 1, LONG).unwrap();
    until_waiting(&table, |w| w.len() == 1 && w[0].reason == WaitReason::SamplesPerInsert);
    insert(&table, 2, LONG).unwrap(); // error 6: four rows leave 2 >= 1
    assert_eq!(sampler.join().unwrap().unwrap(), 4);
    assert!(table.info().unwrap().waiting.is_empty());
}

#[test]
fn a_writer_of_a_full_queue_is_listed_as_waiting_on_a_full_table() {
    short_warning_threshold();
    let table = ReplayTable::builder(spec(4)).queue(2).unwrap().build().unwrap();
    insert(&table, 0, LONG).unwrap();
    insert(&table, 1, LONG).unwrap();
    let t2 = table.clone();
    let writer = std::thread::spawn(move || insert(&t2, 2, LONG));
    let w = until_waiting(&table, |w| w.len() == 1);
    assert_eq!((w[0].role, w[0].reason), (WaitRole::Writer, WaitReason::FullTable));
    assert!(w[0].to_string().contains("writer in process") && w[0].to_string().contains("full table"), "{}", w[0]);
    sample(&table, 1, LONG).unwrap();
    writer.join().unwrap().unwrap();
}

/// Collects what `tracing` logs on the current thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_wait_past_the_threshold_is_logged_naming_the_limit_and_its_counters() {
    short_warning_threshold();
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || sink.clone()).with_ansi(false).finish();
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let name = format!("gear-waiting-{}", std::process::id());
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).shared_memory(name).build().unwrap();
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..3 {
            insert(&table, i, LONG).unwrap();
        }
        // Waits 1 s: past the 0.3 s threshold, so one warning (the next
        // would come at 1.2 s).
        assert!(insert(&table, 3, Duration::from_secs(1)).is_err());
    });
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(log.matches(" WARN ").count(), 1, "{log}");
    assert!(log.contains(&format!("a writer (process {}) has waited", std::process::id())), "{log}");
    assert!(log.contains(&format!("table `gear-waiting-{}`", std::process::id())), "{log}");
    assert!(log.contains("samples per insert") && log.contains("3 inserts, 0 samples"), "{log}");
    assert!(log.contains("Is a sampler running?") && log.contains("Writer::with_timeout"), "{log}");
}
