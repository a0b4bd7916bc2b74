//! The client's codec and assembly allocate nothing per batch once their
//! buffers have grown: a counting allocator (this crate's unit-test build
//! only) counts every allocation of the decoding thread while batches of
//! three shards' replies, split into DATA frames, are decoded into caller
//! buffers with the scratch a `sample_into` call reuses.

use super::*;
use crate::client::assemble::Assembly;
use crate::client::weights::WeightNorm;
use crate::client::BatchRows;
use crate::proto::{Key, SampleReply};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::mem::MaybeUninit;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
    });
}

// SAFETY: every call goes to the system allocator unchanged; the
// counters are thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Shard `s`'s reply of `rows` rows, framed, cut into 1000-byte frames.
fn frames(s: u32, rows: usize, row_bytes: &[usize]) -> Vec<Vec<u8>> {
    let reply = SampleReply {
        shard: s,
        incarnation: 7,
        keys: (0..rows as u32).map(|i| Key { shard: s, incarnation: 7, slot: i, generation: 1 }).collect(),
        lengths: vec![1; rows],
        starts: vec![0; rows],
        probabilities: vec![0.25; rows],
        weights: vec![1.0; rows],
        columns: row_bytes.iter().map(|&b| bytes::Bytes::from(vec![s as u8; b * rows])).collect(),
        size: 4,
        total_mass: 4.0,
        min_mass: 1.0,
        row_ranges: Vec::new(),
        outcome: None,
    };
    let body = reply.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend_from_slice(&body);
    framed.chunks(1000).map(<[u8]>::to_vec).collect()
}

#[test]
fn decoding_a_batch_into_caller_buffers_allocates_nothing_in_steady_state() {
    let row_bytes = [96usize, 8];
    let rows_per_shard = [40usize, 30, 58];
    let rows: usize = rows_per_shard.iter().sum();
    let replies: Vec<Vec<Vec<u8>>> =
        rows_per_shard.iter().enumerate().map(|(s, &n)| frames(s as u32, n, &row_bytes)).collect();
    let mut columns: Vec<Vec<MaybeUninit<u8>>> =
        row_bytes.iter().map(|&b| vec![MaybeUninit::new(0); b * rows]).collect();
    // The scratch one `sample_into` keeps between calls.
    let (mut bases, mut blocks, mut metas, mut settled) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut out = BatchRows::default();
    let mut batch = |count: bool| {
        COUNTING.with(|c| c.set(count));
        let mut views: Vec<&mut [MaybeUninit<u8>]> = Vec::new();
        COUNTING.with(|c| c.set(false));
        views.extend(columns.iter_mut().map(|c| &mut c[..]));
        COUNTING.with(|c| c.set(count));
        let mut a = Assembly::new(&mut views, &row_bytes, rows, &mut bases, &mut blocks).unwrap();
        for (s, &n) in rows_per_shard.iter().enumerate() {
            a.add_block(s, n).unwrap();
        }
        if metas.len() < 3 {
            metas.resize_with(3, ReplyMeta::default);
        }
        settled.clear();
        for ((tag, target), meta) in a.targets().zip(metas.iter_mut()) {
            let mut d = ReplyDecoder::new(target, meta, 1 << 30);
            for f in &replies[tag] {
                d.feed(f).unwrap();
            }
            d.finish().unwrap();
            settled.push(tag);
        }
        for &tag in &settled {
            a.settle(tag, true);
        }
        a.close_holes();
        out.clear();
        let mut norm = WeightNorm::default();
        for (tag, _) in a.placed_blocks() {
            let m = &metas[tag];
            out.keys.extend_from_slice(&m.keys);
            out.lengths.extend_from_slice(&m.lengths);
            out.starts.extend_from_slice(&m.starts);
            for &p in &m.probabilities {
                norm.row(p / 3.0);
                out.probabilities.push(p / 3.0);
            }
        }
        out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, 0.5)));
        COUNTING.with(|c| c.set(false));
        drop(views);
    };
    for _ in 0..3 {
        batch(false);
    }
    ALLOCATIONS.with(|a| a.set(0));
    for _ in 0..20 {
        batch(true);
    }
    assert_eq!(out.keys.len(), rows);
    assert_eq!(ALLOCATIONS.with(Cell::get), 0, "allocations in 20 batches");
    // SAFETY: every row was written (the columns were initialised anyway).
    let first = unsafe { columns[0][0].assume_init() };
    // SAFETY: as above.
    let last = unsafe { columns[0][96 * rows - 1].assume_init() };
    assert_eq!((first, last), (0, 2));
}
