//! What a trainer's `sample_into` allocates per batch in steady state,
//! end to end: a counting global allocator measures every allocation the
//! client makes (the shards run in a child process, so only the client's
//! allocations are in this one; the client runs on a current-thread
//! runtime, so they are all on the measuring thread, its connections'
//! tasks included). `GEAR_ALLOCATION_BACKTRACES=1` prints where each one
//! is made (with `RUST_MIN_STACK=67108864`: symbolising takes stack).
//!
//! The client itself allocates nothing per batch: its `SampleStream`
//! sessions send each request from a buffer they keep and decode each
//! answer into the caller's rows (`client::session`), its codec and
//! assembly reuse their vectors (`client::wire`'s unit test
//! `decoding_a_batch_into_caller_buffers_allocates_nothing_in_steady_state`),
//! and the shards' calls run side by side without a task each
//! (`client::concurrent`). What remains is h2's frame reader: it reads
//! each DATA frame into a buffer it sizes to the frame (tokio-util's
//! length-delimited reader), hands the frame over as a slice of that
//! buffer, and reads on into a fresh one while the frame is still queued
//! for the decoder. That is three allocations per shard reply, whatever
//! its rows (the fresh 8 KiB buffer, its growth to the frame, the handle
//! the slice shares), about one batch's bytes per batch. This test checks
//! that none of the batch's own buffers is allocated (against `sample`,
//! which allocates them, measured in the same run) and that nothing but
//! those three per shard reply is.

use gear_api::{ReplayTable, StepValue};
use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};
use gear_net::{AsyncClusterClient, BatchRows, ClusterConfig, ClusterSample, ServerConfig, ServerHandle, StrategyInfo};
use gear_sampler::{StrategyKind, StrategyParams};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Counts the allocations (and reallocations) of threads that ask to be counted.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    /// Prints where each counted allocation is made
    /// (`GEAR_ALLOCATION_BACKTRACES=1`, to find one that crept in).
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    // `try_with`: a thread being torn down has no thread locals left.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
            BYTES.with(|b| b.set(b.get() + size as u64));
            LARGEST.with(|l| l.set(l.get().max(size)));
            if TRACING.with(Cell::get) {
                // Not counted: the backtrace's own allocations.
                on.set(false);
                eprintln!("allocation of {size} bytes at\n{}", std::backtrace::Backtrace::force_capture());
                on.set(true);
            }
        }
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What one measured stretch of batches allocated.
#[derive(Debug)]
struct Allocated {
    per_batch: f64,
    bytes_per_batch: f64,
    largest: usize,
}

/// Starts counting this thread's allocations from zero.
fn start_counting() {
    ALLOCATIONS.with(|a| a.set(0));
    BYTES.with(|b| b.set(0));
    LARGEST.with(|l| l.set(0));
    TRACING.with(|t| t.set(std::env::var_os("GEAR_ALLOCATION_BACKTRACES").is_some()));
    COUNTING.with(|c| c.set(true));
}

/// Stops counting; what `batches` batches allocated.
fn stop_counting(batches: u64) -> Allocated {
    COUNTING.with(|c| c.set(false));
    Allocated {
        per_batch: ALLOCATIONS.with(Cell::get) as f64 / batches as f64,
        bytes_per_batch: BYTES.with(Cell::get) as f64 / batches as f64,
        largest: LARGEST.with(Cell::get),
    }
}

const TOKEN: &str = "allocation-test-token-0123";
const OBS: u64 = 1024;
const ROWS: u64 = 256;
const CHILD_ENV: &str = "GEAR_NET_ALLOCATION_TEST_SHARDS";

/// The shards, in a child process (this test binary run again with
/// `CHILD_ENV` set): three in-process servers whose addresses go to stdout;
/// it ends when its stdin closes (the parent ended).
#[test]
fn shard_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let spec = TableSpec::new(
        vec![ColumnSpec::new("obs", DType::U8, vec![OBS]), ColumnSpec::new("id", DType::I64, vec![])],
        4,
        64,
    )
    .unwrap();
    let strategy = StrategyInfo { kind: StrategyKind::Uniform, params: StrategyParams::default() };
    let servers: Vec<ServerHandle> = (0..3u32)
        .map(|s| {
            let table = ReplayTable::builder(spec.clone()).seed(u64::from(s)).build().unwrap();
            for i in 0..32i64 {
                let mut t = table.writer().begin(None).unwrap();
                t.append_column(0, 4, StepValue::bytes(&vec![i as u8; 4 * OBS as usize])).unwrap();
                t.append_column(1, 4, StepValue::typed(&[i; 4])).unwrap();
                t.end().unwrap();
            }
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), s, TOKEN);
            ServerHandle::start(table, &config, strategy).unwrap()
        })
        .collect();
    for s in &servers {
        // On a line of its own: the harness's "test shard_child ..." may
        // precede the first.
        println!("\nshard-address {}", s.local_addr());
    }
    // Until the parent closes our stdin.
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {}
}

#[test]
fn sample_into_allocates_only_h2s_frame_buffers() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shard_child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut addresses = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok) {
        if let Some(a) = line.strip_prefix("shard-address ") {
            addresses.push(a.trim().to_owned());
        }
        if addresses.len() == 3 {
            break;
        }
    }
    assert_eq!(addresses.len(), 3, "the shard process did not start");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    const BATCHES: u64 = 50;
    let (into, small, fresh) = runtime.block_on(async {
        let mut config = ClusterConfig::new(addresses, TOKEN);
        config.call_timeout = Duration::from_secs(10);
        let cluster = AsyncClusterClient::new(config).unwrap();
        let request = ClusterSample { rows: ROWS, window: WindowSpec::last(4), columns: vec![], random_start: false };
        let sizes = cluster.column_bytes(&request).await.unwrap();
        let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
        let mut rows = BatchRows::default();
        // Warm up: connections, the client's scratch, the vectors of `rows`.
        for _ in 0..30 {
            cluster.sample_into(&request, &mut views, &mut rows).await.unwrap();
        }
        // Everything the client does runs on this thread (a current-thread
        // runtime: its connections' tasks too).
        start_counting();
        for _ in 0..BATCHES {
            cluster.sample_into(&request, &mut views, &mut rows).await.unwrap();
            assert_eq!(rows.keys.len() as u64, ROWS);
            assert!(rows.lost.is_empty(), "{:?}", rows.lost);
        }
        let into = stop_counting(BATCHES);
        // A quarter of the rows: the small allocations are per call, not
        // per row.
        let quarter = ClusterSample { rows: ROWS / 4, ..request.clone() };
        for _ in 0..30 {
            cluster.sample_into(&quarter, &mut views, &mut rows).await.unwrap();
        }
        start_counting();
        for _ in 0..BATCHES {
            cluster.sample_into(&quarter, &mut views, &mut rows).await.unwrap();
        }
        let small = stop_counting(BATCHES);
        start_counting();
        for _ in 0..BATCHES {
            assert_eq!(cluster.sample(&request).await.unwrap().keys.len() as u64, ROWS);
        }
        (into, small, stop_counting(BATCHES))
    });
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("sample_into: {into:?}\nsample_into, a quarter of the rows: {small:?}\nsample: {fresh:?}");
    let batch_bytes = (ROWS * 4 * (OBS + 8)) as f64;
    // `sample` allocates the batch's buffers (the counter sees them);
    // `sample_into` allocates none of them.
    assert!(fresh.largest >= (ROWS * 4 * OBS) as usize, "the counter missed sample's buffers: {fresh:?}");
    assert!(
        fresh.bytes_per_batch - into.bytes_per_batch >= batch_bytes,
        "sample_into allocated part of the batch's buffers: {into:?} against sample's {fresh:?}"
    );
    // Three per shard reply (h2's frame reader), whatever the rows; the
    // slack is for a mass refresh (`Info`, every 100 ms without a reply
    // from a shard) that may fall into the measured batches.
    let h2_reader = 3.0 * 3.0;
    for measured in [&into, &small] {
        assert!(measured.per_batch <= h2_reader + 0.5, "more than h2's frame reader allocates: {measured:?}");
    }
}
