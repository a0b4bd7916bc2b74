//! Flow control with real threads: rate limiter, queues, max times sampled,
//! timeouts and close.

use gear_api::{Error, RateLimiterConfig, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, SlotKey, TableSpec, WindowSpec};
use std::sync::mpsc;
use std::time::Duration;

fn spec(capacity: u64) -> TableSpec {
    TableSpec::new(vec![ColumnSpec::new("x", DType::I64, vec![])], 1, capacity).unwrap()
}

fn insert(table: &ReplayTable, x: i64, timeout: Option<Duration>) -> gear_api::Result<SlotKey> {
    let w = table.writer();
    let w = match timeout {
        Some(t) => w.with_timeout(t),
        None => w,
    };
    let mut t = w.begin(None)?;
    t.append_step(&[StepValue::typed(&[x])])?;
    t.end()
}

fn sample_xs(table: &ReplayTable, n: usize, timeout: Option<Duration>) -> gear_api::Result<Vec<i64>> {
    let mut s = table.sampler(SampleConfig::new(n, WindowSpec::whole(1)).timeout(timeout))?;
    Ok(s.sample()?.column("x")?.as_slice::<i64>()?.to_vec())
}

const SHORT: Duration = Duration::from_millis(100);
const LONG: Duration = Duration::from_secs(20);

#[test]
fn a_writer_blocked_by_the_ratio_is_released_by_sampling() {
    // spi 1, min size 1, range [1-2, 1+2] = [-1, 3]: at most 3 inserts ahead.
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    for i in 0..3 {
        insert(&table, i, Some(SHORT)).unwrap();
    }
    // The fourth insert would make the error 4 > 3: it waits, then times out.
    assert!(matches!(insert(&table, 3, Some(SHORT)), Err(Error::Timeout { .. })));
    // Now block a writer in a thread and release it by sampling.
    let (tx, rx) = mpsc::channel();
    let t2 = table.clone();
    let writer = std::thread::spawn(move || {
        tx.send("waiting").unwrap();
        insert(&t2, 4, Some(LONG))
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!writer.is_finished(), "the writer should be blocked by the rate limiter");
    sample_xs(&table, 1, Some(SHORT)).unwrap();
    writer.join().unwrap().unwrap();
    let info = table.info().unwrap();
    assert_eq!((info.inserts, info.samples), (4, 1));
    assert!(info.insert_wait >= SHORT, "waiting time is reported: {:?}", info.insert_wait);
}

#[test]
fn a_sampler_blocked_by_the_ratio_is_released_by_inserting() {
    // spi 2, min size 2, range [4-3, 4+3] = [1, 7]: samples may run at most
    // to an error of 1.
    let limiter = RateLimiterConfig::sample_to_insert_ratio(2.0, 2, 3.0).unwrap();
    let table = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    insert(&table, 0, None).unwrap();
    assert!(matches!(sample_xs(&table, 1, Some(SHORT)), Err(Error::Timeout { .. })), "below min size");
    insert(&table, 1, None).unwrap(); // error 4
    sample_xs(&table, 3, Some(SHORT)).unwrap(); // error 1
    assert!(matches!(sample_xs(&table, 1, Some(SHORT)), Err(Error::Timeout { .. })));
    let t2 = table.clone();
    let sampler = std::thread::spawn(move || sample_xs(&t2, 2, Some(LONG)));
    std::thread::sleep(Duration::from_millis(50));
    assert!(!sampler.is_finished());
    insert(&table, 2, None).unwrap(); // error 3
    assert_eq!(sampler.join().unwrap().unwrap().len(), 2);
    assert!(table.info().unwrap().sample_wait >= SHORT);
}

#[test]
fn close_wakes_every_blocked_writer_and_sampler() {
    let limiter = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 2.0).unwrap();
    let full = ReplayTable::builder(spec(16)).rate_limiter(limiter).build().unwrap();
    for i in 0..3 {
        insert(&full, i, None).unwrap();
    }
    let empty = ReplayTable::builder(spec(4)).build().unwrap();
    let writers: Vec<_> = (0..3)
        .map(|i| {
            let t = full.clone();
            std::thread::spawn(move || insert(&t, 10 + i, None).map(|_| ()))
        })
        .collect();
    let samplers: Vec<_> = (0..3)
        .map(|_| {
            let t = empty.clone();
            std::thread::spawn(move || sample_xs(&t, 1, None).map(|_| ()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    full.close();
    empty.close();
    for h in writers.into_iter().chain(samplers) {
        assert!(matches!(h.join().unwrap(), Err(Error::Closed)));
    }
    // Later calls fail at once.
    assert!(matches!(insert(&full, 99, None), Err(Error::Closed)));
    assert_eq!(full.info().unwrap().inserts, 3, "no insert happened after close");
}

#[test]
fn deadlocking_configurations_are_refused() {
    let e = RateLimiterConfig::sample_to_insert_ratio(3.0, 10, 2.0).unwrap_err().to_string();
    assert!(e.contains("can deadlock"), "{e}");
    let above = RateLimiterConfig { samples_per_insert: 1.0, min_size_to_sample: 1, min_diff: 10.0, max_diff: 20.0 };
    let e = ReplayTable::builder(spec(4)).rate_limiter(above).build().unwrap_err().to_string();
    assert!(e.contains("can deadlock"), "{e}");
    // A batch wider than the limiter's range can never be sampled.
    let table = ReplayTable::builder(spec(16)).queue(4).unwrap().build().unwrap();
    let e = sample_xs(&table, 5, Some(SHORT)).unwrap_err().to_string();
    assert!(e.contains("can never be sampled"), "{e}");
}

#[test]
fn a_queue_delivers_each_item_once_in_order_and_blocks_writers_when_full() {
    let table = ReplayTable::builder(spec(8)).queue(3).unwrap().build().unwrap();
    for i in 0..3 {
        insert(&table, i, None).unwrap();
    }
    assert!(matches!(insert(&table, 3, Some(SHORT)), Err(Error::Timeout { .. })), "full queue blocks writers");
    assert_eq!(sample_xs(&table, 2, Some(SHORT)).unwrap(), vec![0, 1]);
    insert(&table, 3, Some(SHORT)).unwrap();
    insert(&table, 4, Some(SHORT)).unwrap();
    assert_eq!(sample_xs(&table, 3, Some(SHORT)).unwrap(), vec![2, 3, 4]);
    assert!(matches!(sample_xs(&table, 1, Some(SHORT)), Err(Error::Timeout { .. })), "every item consumed");
    let info = table.info().unwrap();
    assert_eq!((info.size, info.retired, info.evictions), (0, 5, 0));

    let stack = ReplayTable::builder(spec(8)).stack(4).unwrap().build().unwrap();
    for i in 0..4 {
        insert(&stack, i, None).unwrap();
    }
    assert_eq!(sample_xs(&stack, 2, Some(SHORT)).unwrap(), vec![3, 2]);
    assert_eq!(sample_xs(&stack, 2, Some(SHORT)).unwrap(), vec![1, 0]);
}

#[test]
fn max_times_sampled_removes_at_the_right_count() {
    let table = ReplayTable::builder(spec(8))
        .sampler_kind(gear_sampler::StrategyKind::Fifo, Default::default())
        .max_times_sampled(3)
        .build()
        .unwrap();
    insert(&table, 7, None).unwrap();
    insert(&table, 8, None).unwrap();
    // FIFO always picks the oldest: item 7 is drawn three times, then gone.
    for _ in 0..3 {
        assert_eq!(sample_xs(&table, 1, Some(SHORT)).unwrap(), vec![7]);
    }
    assert_eq!(table.info().unwrap().size, 1);
    assert_eq!(sample_xs(&table, 1, Some(SHORT)).unwrap(), vec![8]);
    // Two draws of the same item in one batch count twice.
    assert_eq!(sample_xs(&table, 2, Some(SHORT)).unwrap(), vec![8, 8]);
    let info = table.info().unwrap();
    assert_eq!((info.size, info.retired), (0, 2));
    // Retired slots are reused.
    for i in 0..8 {
        insert(&table, i, None).unwrap();
    }
    assert_eq!(table.info().unwrap().evictions, 0);
}

#[test]
fn this_process_waits_are_counted_by_kind() {
    let table = ReplayTable::builder(spec(4)).queue(2).unwrap().build().unwrap();
    assert_eq!(table.wait_stats(), gear_api::WaitStats::default());
    // No wait: one free place in the queue, then one item to sample.
    insert(&table, 1, Some(SHORT)).unwrap();
    sample_xs(&table, 1, Some(SHORT)).unwrap();
    assert_eq!(table.wait_stats(), gear_api::WaitStats::default(), "calls that did not wait count nothing");
    // A sampler on the empty queue waits (and times out); a writer on the
    // full queue waits (and times out).
    assert!(matches!(sample_xs(&table, 1, Some(SHORT)), Err(Error::Timeout { .. })));
    insert(&table, 2, Some(SHORT)).unwrap();
    insert(&table, 3, Some(SHORT)).unwrap();
    assert!(matches!(insert(&table, 4, Some(SHORT)), Err(Error::Timeout { .. })));
    let w = table.wait_stats();
    assert_eq!((w.insert_waits, w.sample_waits), (1, 1), "{w:?}");
    assert!(w.insert_wait >= SHORT && w.sample_wait >= SHORT, "{w:?}");
    // A clone shares the counts; the table-wide figures include them.
    assert_eq!(table.clone().wait_stats(), w);
    let info = table.info().unwrap();
    assert!(info.insert_wait >= w.insert_wait && info.sample_wait >= w.sample_wait);
}

#[test]
fn takes_of_a_held_table_lock_are_counted() {
    let table = ReplayTable::builder(spec(4)).build().unwrap();
    insert(&table, 1, None).unwrap();
    assert_eq!(table.wait_stats().lock_waits, 0, "nothing contended yet");
    // One thread holds the lock for a few milliseconds at a time (a long
    // list of stale priority updates is walked under it) while another
    // takes it for `info`, until a take finds it held.
    let stale: Vec<(SlotKey, f64)> = (0..1_000_000).map(|_| (SlotKey { slot: 0, generation: 7 }, 1.0)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let (table, stop) = (table.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(table.update_priorities(&stale).unwrap(), 0);
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while table.wait_stats().lock_waits == 0 && std::time::Instant::now() < deadline {
        table.info().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    holder.join().unwrap();
    let w = table.wait_stats();
    assert!(w.lock_waits > 0 && w.lock_wait > Duration::ZERO, "no contended take was counted: {w:?}");
    assert_eq!((w.insert_waits, w.sample_waits), (0, 0));
}
