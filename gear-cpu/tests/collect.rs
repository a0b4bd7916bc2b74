//! The CPU collector against a per-step reference written from SPEC.md's
//! window rule (not from `WindowSpec::resolve`), buffer reuse, threading,
//! and input validation.

mod common;

use common::pattern;
use gear_core::{
    BatchLayout, Collector, ColumnSpec, DType, Error as CoreError, GatherRow, Pad, TableRegion, TableSpec, TableView,
    WindowSpec,
};
use gear_cpu::{create_host_table, CpuCollector, HostBatch, HostPool};
use proptest::prelude::*;

/// A host table whose every slot holds `T` steps of `pattern` bytes (beyond
/// any length a row will claim, so reading too far shows up as wrong bytes).
fn filled_table(spec: &TableSpec) -> TableRegion<HostPool> {
    let table = create_host_table(spec).unwrap();
    for slot in 0..spec.capacity() as u32 {
        let rec = table.slot(slot).unwrap();
        let key = rec.begin_write(slot, 1, u64::from(slot), 1.0).unwrap();
        for c in 0..spec.columns().len() {
            let s = table.layout().step_bytes(c) as usize;
            let bytes: Vec<u8> = (0..spec.max_len()).flat_map(|t| pattern(u64::from(slot), c, t, s)).collect();
            table.write_steps(key, c, 0, &bytes).unwrap();
        }
        rec.publish_len(key, spec.max_len()).unwrap();
        rec.commit(key).unwrap();
    }
    table
}

/// SPEC.md, one output step at a time: start = s if s >= 0 else
/// max(k+s, 0); end = min(start+l, k); n = max(end-start, 0); tail padding
/// puts the n steps at [0, n), head padding at [l-n, l); zeros elsewhere.
/// A row that starts inside its slot (an item's window) is a trajectory of
/// `k` steps whose step 0 is the slot's step `row.start`.
fn reference(spec: &TableSpec, columns: &[usize], rows: &[GatherRow], w: WindowSpec) -> (Vec<Vec<u8>>, Vec<u64>) {
    let l = w.len as i64;
    let mut out = vec![Vec::new(); columns.len()];
    let mut lengths = Vec::new();
    for row in rows {
        let k = row.len as i64;
        let start = if w.offset >= 0 { w.offset } else { (k + w.offset).max(0) };
        let end = (start.saturating_add(l)).min(k);
        let n = (end - start).max(0);
        lengths.push(n as u64);
        for (i, &c) in columns.iter().enumerate() {
            let s = spec.columns()[c].step_bytes().unwrap() as usize;
            for j in 0..l {
                let idx = match w.pad {
                    Pad::Tail => j,
                    Pad::Head => j - (l - n),
                };
                if (0..n).contains(&idx) {
                    out[i].extend(pattern(u64::from(row.slot), c, u64::from(row.start) + (start + idx) as u64, s));
                } else {
                    out[i].extend(std::iter::repeat_n(0u8, s));
                }
            }
        }
    }
    (out, lengths)
}

fn gather(
    collector: &CpuCollector,
    table: &TableRegion<HostPool>,
    columns: &[usize],
    rows: &[GatherRow],
    window: WindowSpec,
) -> HostBatch {
    let layout = BatchLayout::new(table.layout(), columns, rows.len(), window).unwrap();
    let mut batch = collector.alloc_batch(&layout).unwrap();
    collector.gather(&table.view(), rows, &layout, &mut batch).unwrap();
    batch
}

fn assert_matches_reference(batch: &HostBatch, spec: &TableSpec, columns: &[usize], rows: &[GatherRow], w: WindowSpec) {
    let (want, lengths) = reference(spec, columns, rows, w);
    assert_eq!(batch.lengths(), &lengths[..]);
    for (i, want) in want.iter().enumerate() {
        assert_eq!(batch.column(i), &want[..], "column {i}");
    }
}

#[derive(Debug, Clone)]
struct Case {
    spec: TableSpec,
    columns: Vec<usize>,
    rows: Vec<GatherRow>,
    window: WindowSpec,
}

fn arb_case() -> impl Strategy<Value = Case> {
    let dtype = prop::sample::select(DType::ALL.to_vec());
    let column = (dtype, prop::collection::vec(1u64..5, 0..3));
    (prop::collection::vec(column, 1..4), 1u64..24, 1u64..6)
        .prop_map(|(cols, t, cap)| {
            let cols = cols.into_iter().enumerate().map(|(i, (d, s))| ColumnSpec::new(format!("c{i}"), d, s)).collect();
            TableSpec::new(cols, t, cap).unwrap()
        })
        .prop_flat_map(|spec| {
            let t = spec.max_len();
            let ncols = spec.columns().len();
            let cap = spec.capacity() as u32;
            // Whole trajectories and windows starting inside the slot
            // (items): `start + len <= T`.
            let rows = prop::collection::vec((0..cap, 0..=t, 0..=t, any::<bool>()), 0..9).prop_map(move |v| {
                // `t` is below 24: a start fits the row's 32 bits.
                v.into_iter()
                    .map(|(slot, a, b, item)| {
                        if item {
                            GatherRow { slot, start: a.min(b) as u32, len: a.max(b) - a.min(b) }
                        } else {
                            GatherRow::whole(slot, a)
                        }
                    })
                    .collect::<Vec<_>>()
            });
            let window = (-(t as i64) - 3..t as i64 + 3, 1..=t, any::<bool>()).prop_map(|(offset, len, head)| {
                WindowSpec { offset, len, pad: if head { Pad::Head } else { Pad::Tail } }
            });
            (Just(spec), prop::collection::vec(0..ncols, 1..4), rows, window)
        })
        .prop_map(|(spec, columns, rows, window)| Case { spec, columns, rows, window })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Byte-for-byte and length-for-length equal to the reference, on a
    /// buffer that held garbage before (as a reused one does), single- and
    /// multi-threaded.
    #[test]
    fn gather_matches_the_per_step_reference(case in arb_case()) {
        let Case { spec, columns, rows, window } = case;
        let table = filled_table(&spec);
        let layout = BatchLayout::new(table.layout(), &columns, rows.len(), window).unwrap();
        let (want, lengths) = reference(&spec, &columns, &rows, window);
        for collector in [CpuCollector::with_threads(1), CpuCollector::with_threads(3).with_bytes_per_thread(0)] {
            let mut batch = collector.alloc_batch(&layout).unwrap();
            for i in 0..batch.columns() {
                batch.column_mut(i).fill(0xa5);
            }
            collector.gather(&table.view(), &rows, &layout, &mut batch).unwrap();
            prop_assert_eq!(batch.lengths(), &lengths[..]);
            for (i, want) in want.iter().enumerate() {
                prop_assert_eq!(batch.column(i), &want[..], "column {} with {:?}", i, collector);
            }

            // The same into caller-owned buffers, longer than needed: the
            // batch bytes match, the bytes past them stay as they were.
            let mut bufs: Vec<Vec<u8>> = want.iter().map(|w| vec![0x5a; w.len() + 7]).collect();
            let mut lens = vec![u64::MAX; rows.len()];
            let mut cols: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            collector.gather_into(&table.view(), &rows, &layout, &mut cols, &mut lens).unwrap();
            prop_assert_eq!(&lens, &lengths);
            for (i, want) in want.iter().enumerate() {
                prop_assert_eq!(&bufs[i][..want.len()], &want[..], "caller column {} with {:?}", i, collector);
                prop_assert!(bufs[i][want.len()..].iter().all(|&b| b == 0x5a), "caller column {} overrun", i);
            }
        }
    }
}

#[test]
fn gather_into_refuses_wrong_buffers_before_writing() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let rows = [GatherRow::whole(1, 3), GatherRow::whole(0, 2)];
    let layout = BatchLayout::new(table.layout(), &[0, 1], rows.len(), WindowSpec::last(2)).unwrap();
    let c = CpuCollector::with_threads(1);
    let (n0, n1) = (layout.column_bytes(0) as usize, layout.column_bytes(1) as usize);
    let (mut a, mut b, mut short) = (vec![7u8; n0], vec![7u8; n1], vec![7u8; n1 - 1]);
    let mut lens = [9u64; 2];
    let mut refused = |cols: &mut [&mut [u8]], nlens: usize, words: &str| {
        let e = c.gather_into(&table.view(), &rows, &layout, cols, &mut lens[..nlens]).unwrap_err();
        assert!(e.to_string().contains(words), "`{e}` should say {words}");
    };
    refused(&mut [&mut a[..]], 2, "1 column buffers given");
    refused(&mut [&mut a[..], &mut short[..]], 2, "batch column 1");
    refused(&mut [&mut a[..], &mut b[..]], 1, "1 row lengths given");
    assert!(a.iter().chain(&b).chain(&short).all(|&x| x == 7) && lens == [9, 9], "nothing written");
}

fn two_column_spec() -> TableSpec {
    TableSpec::new(
        vec![ColumnSpec::new("obs", DType::F32, vec![4, 3]), ColumnSpec::new("act", DType::I64, vec![])],
        20,
        8,
    )
    .unwrap()
}

#[test]
fn a_reused_batch_is_fully_overwritten() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let c = CpuCollector::with_threads(1);
    let layout = BatchLayout::new(table.layout(), &[0, 1], 4, WindowSpec::first(12)).unwrap();
    let mut batch = c.alloc_batch(&layout).unwrap();

    // First: every row full, so every byte is data.
    let full: Vec<GatherRow> = (0..4).map(|s| GatherRow::whole(s, 20)).collect();
    c.gather(&table.view(), &full, &layout, &mut batch).unwrap();
    assert!(batch.column(0).iter().all(|&b| b != 0));

    // Second: short rows, other slots, tail padding and an offset: most
    // bytes must now be zero.
    let w2 = WindowSpec { offset: -5, len: 12, pad: Pad::Tail };
    let layout2 = BatchLayout::new(table.layout(), &[0, 1], 4, w2).unwrap();
    let short = [GatherRow::whole(5, 3), GatherRow::whole(6, 0), GatherRow::whole(7, 20), GatherRow::whole(5, 9)];
    c.gather(&table.view(), &short, &layout2, &mut batch).unwrap();
    assert_eq!(batch.layout(), &layout2);
    assert_matches_reference(&batch, &spec, &[0, 1], &short, w2);
    assert_eq!(batch.lengths(), &[3, 0, 5, 5]);
    let fresh = gather(&c, &table, &[0, 1], &short, w2);
    assert_eq!(batch.column(0), fresh.column(0));
    assert_eq!(batch.column(1), fresh.column(1));

    // Third: fewer rows than the buffers were sized for.
    let layout3 = BatchLayout::new(table.layout(), &[0, 1], 2, WindowSpec::last(4)).unwrap();
    let rows3 = [GatherRow::whole(1, 2), GatherRow::whole(1, 2)];
    c.gather(&table.view(), &rows3, &layout3, &mut batch).unwrap();
    assert_eq!(batch.rows(), 2);
    assert_eq!(batch.column(0).len() as u64, layout3.column_bytes(0));
    assert_matches_reference(&batch, &spec, &[0, 1], &rows3, WindowSpec::last(4));
}

#[test]
#[cfg_attr(miri, ignore = "megabytes of copies; the small threaded test below covers the same code under Miri")]
fn threaded_gather_equals_single_threaded_on_a_large_batch() {
    let spec = TableSpec::new(
        vec![ColumnSpec::new("obs", DType::U8, vec![4096]), ColumnSpec::new("r", DType::F32, vec![])],
        64,
        24,
    )
    .unwrap();
    let table = filled_table(&spec);
    let rows: Vec<GatherRow> = (0..37).map(|i| GatherRow::whole((i * 7) % 24, u64::from(i * 5) % 65)).collect();
    let w = WindowSpec { offset: -40, len: 48, pad: Pad::Tail };
    let layout = BatchLayout::new(table.layout(), &[0, 1], rows.len(), w).unwrap();
    assert!(CpuCollector::with_threads(4).threads_for(&layout) == 4, "the batch must take the threaded path");
    let one = gather(&CpuCollector::with_threads(1), &table, &[0, 1], &rows, w);
    for threads in [2, 4, 64] {
        let many = gather(&CpuCollector::with_threads(threads), &table, &[0, 1], &rows, w);
        assert_eq!(many.lengths(), one.lengths());
        assert_eq!(many.column(0), one.column(0), "{threads} threads");
        assert_eq!(many.column(1), one.column(1), "{threads} threads");
    }
    assert_matches_reference(&one, &spec, &[0, 1], &rows, w);
}

/// Threads writing disjoint rows of one batch through raw pointers, on a
/// batch small enough for Miri: every batch is split across the threads.
#[test]
fn a_small_batch_split_across_threads_equals_one_thread() {
    let spec =
        TableSpec::new(vec![ColumnSpec::new("x", DType::U8, vec![3]), ColumnSpec::new("y", DType::F32, vec![])], 6, 5)
            .unwrap();
    let table = filled_table(&spec);
    let rows: Vec<GatherRow> = (0..7).map(|i| GatherRow::whole((i * 3) % 5, u64::from(i) % 7)).collect();
    let w = WindowSpec { offset: -4, len: 5, pad: Pad::Head };
    let one = gather(&CpuCollector::with_threads(1), &table, &[0, 1], &rows, w);
    for threads in [2, 3, 7] {
        let many = gather(&CpuCollector::with_threads(threads).with_bytes_per_thread(0), &table, &[0, 1], &rows, w);
        assert_eq!(many.lengths(), one.lengths());
        assert_eq!((many.column(0), many.column(1)), (one.column(0), one.column(1)), "{threads} threads");
    }
    assert_matches_reference(&one, &spec, &[0, 1], &rows, w);
}

#[test]
fn typed_views_and_rows() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let rows = [GatherRow::whole(2, 3)];
    let b = gather(&CpuCollector::new(), &table, &[1, 0], &rows, WindowSpec::first(4));
    let act: &[i64] = b.column_as(0).unwrap();
    assert_eq!(act.len(), 4);
    assert_eq!(act[0].to_le_bytes().to_vec(), pattern(2, 1, 0, 8));
    assert_eq!(act[3], 0);
    assert_eq!(b.column_as::<f32>(1).unwrap().len(), 4 * 12);
    assert_eq!(b.row(1, 0), b.column(1));

    // Steps of 3 bytes cannot be viewed as i16s.
    let odd = TableSpec::new(vec![ColumnSpec::new("rgb", DType::U8, vec![3])], 4, 2).unwrap();
    let table = filled_table(&odd);
    let b = gather(&CpuCollector::new(), &table, &[0], &[GatherRow::whole(1, 3)], WindowSpec::first(2));
    assert!(b.column_as::<i16>(0).is_none());
    assert!(b.column_as::<u8>(0).is_some());
}

#[test]
fn small_batches_stay_on_one_thread() {
    let table = filled_table(&two_column_spec());
    let layout = BatchLayout::new(table.layout(), &[0, 1], 8, WindowSpec::first(20)).unwrap();
    assert_eq!(CpuCollector::with_threads(8).threads_for(&layout), 1);
    assert_eq!(CpuCollector::with_threads(8).with_bytes_per_thread(0).threads_for(&layout), 8);
    assert_eq!(CpuCollector::with_threads(3).with_bytes_per_thread(0).threads_for(&layout), 3);
    let per_row = layout.total_bytes() / 8;
    assert_eq!(CpuCollector::with_threads(8).with_bytes_per_thread(2 * per_row).threads_for(&layout), 4);
    assert_eq!(CpuCollector::with_threads(0).threads(), 1);
}

#[test]
fn zero_rows_is_an_empty_batch() {
    let table = filled_table(&two_column_spec());
    let b = gather(&CpuCollector::new(), &table, &[0], &[], WindowSpec::first(3));
    assert!(b.column(0).is_empty());
    assert!(b.lengths().is_empty());
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let c = CpuCollector::new();
    let view = table.view();
    let layout = BatchLayout::new(table.layout(), &[0], 2, WindowSpec::first(5)).unwrap();
    let mut batch = c.alloc_batch(&layout).unwrap();
    let ok = [GatherRow::whole(0, 5), GatherRow::whole(1, 5)];

    let e = c.gather(&view, &ok[..1], &layout, &mut batch).unwrap_err();
    assert!(e.to_string().contains("1 rows given, the batch layout has 2"), "{e}");

    let e = c.gather(&view, &[ok[0], GatherRow::whole(8, 1)], &layout, &mut batch).unwrap_err();
    assert_eq!(e, CoreError::SlotOutOfRange { slot: 8, capacity: 8 });

    let e = c.gather(&view, &[ok[0], GatherRow::whole(1, 21)], &layout, &mut batch).unwrap_err();
    assert!(e.to_string().contains("steps 0..21 exceed"), "{e}");
    let past_the_end = GatherRow { slot: 1, start: 15, len: 6 };
    let e = c.gather(&view, &[ok[0], past_the_end], &layout, &mut batch).unwrap_err();
    assert!(e.to_string().contains("steps 15..21 exceed"), "{e}");

    let bigger = BatchLayout::new(table.layout(), &[0], 3, WindowSpec::first(5)).unwrap();
    let e = c.gather(&view, &[ok[0], ok[1], ok[0]], &bigger, &mut batch).unwrap_err();
    assert!(matches!(e, CoreError::BufferTooSmall { .. }), "{e}");

    let two_cols = BatchLayout::new(table.layout(), &[0, 1], 2, WindowSpec::first(5)).unwrap();
    let e = c.gather(&view, &ok, &two_cols, &mut batch).unwrap_err();
    assert!(e.to_string().contains("1 columns"), "{e}");

    // SAFETY: no host address, so a host collector has nothing to read;
    // the device address is never dereferenced by the CPU collector.
    let no_host = unsafe { TableView::new(None, Some(0x1000), table.layout()) };
    assert!(matches!(c.gather(&no_host, &ok, &layout, &mut batch), Err(CoreError::Unsupported(_))));

    // A layout made for another table.
    let other = TableSpec::new(
        vec![
            ColumnSpec::new("a", DType::U8, vec![]),
            ColumnSpec::new("b", DType::U8, vec![]),
            ColumnSpec::new("c", DType::U8, vec![]),
        ],
        20,
        8,
    )
    .unwrap();
    let other_layout = gear_core::Layout::new(&other).unwrap();
    let foreign = BatchLayout::new(&other_layout, &[2], 2, WindowSpec::first(5)).unwrap();
    let mut fb = c.alloc_batch(&foreign).unwrap();
    assert!(matches!(c.gather(&view, &ok, &foreign, &mut fb), Err(CoreError::ColumnIndex { index: 2, count: 2 })));
    let foreign = BatchLayout::new(&other_layout, &[1], 2, WindowSpec::first(5)).unwrap();
    assert!(matches!(c.gather(&view, &ok, &foreign, &mut fb), Err(CoreError::StepSize { .. })));
    let long_t = TableSpec::new(vec![ColumnSpec::new("obs", DType::F32, vec![4, 3])], 40, 8).unwrap();
    let long_layout = gear_core::Layout::new(&long_t).unwrap();
    let too_long = BatchLayout::new(&long_layout, &[0], 2, WindowSpec::first(30)).unwrap();
    let mut tb = c.alloc_batch(&too_long).unwrap();
    assert!(matches!(c.gather(&view, &ok, &too_long, &mut tb), Err(CoreError::InvalidWindow(_))));

    // The batch is still usable after refusals.
    c.gather(&view, &ok, &layout, &mut batch).unwrap();
    assert_matches_reference(&batch, &spec, &[0], &ok, WindowSpec::first(5));
}

#[test]
fn regather_replaces_only_the_listed_rows() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let c = CpuCollector::with_threads(1);
    let w = WindowSpec { offset: -6, len: 8, pad: Pad::Head };
    let mut rows: Vec<GatherRow> = (0..5).map(|s| GatherRow::whole(s, 4 + s as u64)).collect();
    let layout = BatchLayout::new(table.layout(), &[0, 1], rows.len(), w).unwrap();
    let mut batch = c.alloc_batch(&layout).unwrap();
    c.gather(&table.view(), &rows, &layout, &mut batch).unwrap();
    let before: Vec<Vec<u8>> = (0..2).map(|i| batch.column(i).to_vec()).collect();
    // Rows 1 and 3 are redrawn: other slots, other lengths.
    rows[1] = GatherRow::whole(7, 20);
    rows[3] = GatherRow::whole(6, 1);
    c.regather(&table.view(), &rows, &layout, &[1, 3], &mut batch).unwrap();
    assert_matches_reference(&batch, &spec, &[0, 1], &rows, w);
    for (i, old) in before.iter().enumerate() {
        let n = layout.row_bytes(i) as usize;
        for r in [0, 2, 4] {
            assert_eq!(&batch.column(i)[r * n..(r + 1) * n], &old[r * n..(r + 1) * n], "row {r} untouched");
        }
    }
    assert!(c.regather(&table.view(), &rows, &layout, &[5], &mut batch).is_err(), "row out of range");
}

#[test]
fn caller_buffers_through_the_collector_trait_match_a_host_batch() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let rows = [GatherRow::whole(1, 3), GatherRow::whole(0, 2), GatherRow::whole(1, 1)];
    let layout = BatchLayout::new(table.layout(), &[0, 1], rows.len(), WindowSpec::last(2)).unwrap();
    let host = CpuCollector::with_threads(1);
    let mut expected = host.alloc_batch(&layout).unwrap();
    host.gather(&table.view(), &rows, &layout, &mut expected).unwrap();

    let into = host.into_caller_buffers();
    assert!(into.alloc_batch(&layout).unwrap_err().to_string().contains("sized by the caller"));
    // Uninitialised buffers, as an encode buffer's spare capacity is: a
    // gather that succeeds writes every byte of them.
    let uninit = |n: u64| vec![std::mem::MaybeUninit::<u8>::uninit(); n as usize];
    let (mut a, mut b) = (uninit(layout.column_bytes(0)), uninit(layout.column_bytes(1)));
    let mut lens = [9u64; 3];
    let mut cols = [&mut a[..], &mut b[..]];
    let mut batch = gear_cpu::CallerBatch { columns: &mut cols, lengths: &mut lens };
    into.gather(&table.view(), &rows, &layout, &mut batch).unwrap();
    // Row 2 again from another slot: only its bytes change.
    let again = [rows[0], rows[1], GatherRow::whole(0, 2)];
    into.regather(&table.view(), &again, &layout, &[2], &mut batch).unwrap();
    host.regather(&table.view(), &again, &layout, &[2], &mut expected).unwrap();
    assert_eq!(into.lengths(&batch), host.lengths(&expected));
    let written = |c: &[std::mem::MaybeUninit<u8>]| -> Vec<u8> {
        c.iter()
            .map(|x| {
                // SAFETY: the gather succeeded, which wrote every byte of both
                // columns (`CallerBatch`'s contract; Miri would flag a byte
                // left unwritten).
                unsafe { x.assume_init() }
            })
            .collect()
    };
    assert_eq!((written(&a), written(&b)), (expected.column(0).to_vec(), expected.column(1).to_vec()));
}

#[test]
fn a_deferred_batch_is_allocated_by_its_first_gather_or_by_allocate() {
    let spec = two_column_spec();
    let table = filled_table(&spec);
    let c = CpuCollector::with_threads(1);
    let w = WindowSpec { offset: -5, len: 12, pad: Pad::Head };
    let layout = BatchLayout::new(table.layout(), &[0, 1], 3, w).unwrap();
    let rows = [GatherRow::whole(2, 20), GatherRow::whole(4, 3), GatherRow::whole(7, 9)];

    let mut by_gather = HostBatch::deferred(&layout);
    assert_eq!(by_gather.columns(), 0, "nothing allocated yet");
    c.gather(&table.view(), &rows, &layout, &mut by_gather).unwrap();
    assert_eq!(by_gather.columns(), 2);
    assert_matches_reference(&by_gather, &spec, &[0, 1], &rows, w);

    let mut by_allocate = HostBatch::deferred(&layout);
    by_allocate.allocate().unwrap();
    assert_eq!(by_allocate.columns(), 2);
    assert_eq!(by_allocate.column(0).len() as u64, layout.column_bytes(0));
    assert!(by_allocate.column(0).iter().all(|&b| b == 0), "zeroed");
    c.gather(&table.view(), &rows, &layout, &mut by_allocate).unwrap();
    assert_eq!(by_allocate.column(0), by_gather.column(0));
    assert_eq!(by_allocate.column(1), by_gather.column(1));
    by_allocate.allocate().unwrap();
    assert_eq!(by_allocate.column(1), by_gather.column(1), "allocate on an allocated batch keeps its bytes");
}
