//! A gathered batch put together from the shards' replies as they arrive.
//!
//! Each shard's block of rows is copied into the batch's column buffers
//! the moment its reply is decoded, while the other shards' replies are
//! still on the wire, instead of in one pass after the last reply (a pass
//! during which the shards and the network sat idle). A block goes to the
//! rows the split gave its shard, so a batch's row order is the split's
//! (shard order, then the shards drawn again after a loss) whatever order
//! the replies come in. A shard that failed leaves a hole;
//! [`Assembly::close_holes`] moves the blocks after it down before the
//! next round's blocks are placed after them.
//!
//! Everything about a block comes from the network and is checked before a
//! byte is copied: its rows lie inside the batch and overlap no other
//! block, and each requested column holds exactly its rows at the bytes
//! per row the table's spec gives the request (or, when the client could
//! not get the spec, at the first block's).

use super::ClusterSample;
use bytes::Bytes;
use gear_core::TableSpec;

/// Bytes of one row of each column `request` names (all, in the spec's
/// order, when it names none): `window.len` steps of the column. `None`
/// when the request is not valid for `spec` (the shards refuse it then).
pub(super) fn row_bytes(spec: &TableSpec, request: &ClusterSample) -> Option<Vec<usize>> {
    request.window.validate(spec.max_len()).ok()?;
    let columns: Vec<usize> = if request.columns.is_empty() {
        (0..spec.columns().len()).collect()
    } else {
        request.columns.iter().map(|n| spec.column_index(n)).collect::<gear_core::Result<_>>().ok()?
    };
    columns
        .iter()
        .map(|&c| {
            let bytes = spec.columns()[c].step_bytes().ok()?.checked_mul(request.window.len)?;
            usize::try_from(bytes).ok()
        })
        .collect()
}

/// One shard's rows placed in the batch, with what the caller keeps about
/// them (`M`: the reply's per-row fields).
#[derive(Debug)]
struct Block<M> {
    /// First row of the block.
    start: usize,
    /// Rows in the block.
    rows: usize,
    meta: M,
}

/// The column buffers of one batch, filled block by block in any order.
#[derive(Debug)]
pub(super) struct Assembly<M> {
    /// Rows the batch holds when every block is in.
    rows: usize,
    /// Bytes of one row of each column: from the spec, else fixed by the
    /// first block (`None` until then).
    row_bytes: Option<Vec<usize>>,
    /// Where `row_bytes` came from, for errors.
    expected_from: &'static str,
    /// Per column: capacity for `rows` rows, length 0 until
    /// [`Assembly::finish`]. Invariant: the bytes of every placed block's
    /// rows are initialised.
    columns: Vec<Vec<u8>>,
    /// Placed blocks: disjoint, in no particular order.
    blocks: Vec<Block<M>>,
}

impl<M> Assembly<M> {
    /// An empty batch of `rows` rows whose columns hold `row_bytes` bytes
    /// per row; `None`: as many as the first block's.
    pub(super) fn new(rows: usize, row_bytes: Option<Vec<usize>>) -> Self {
        let expected_from = if row_bytes.is_some() { "the table's spec" } else { "the first shard's reply" };
        Assembly { rows, row_bytes, expected_from, columns: Vec::new(), blocks: Vec::new() }
    }

    /// Rows placed so far.
    pub(super) fn placed(&self) -> usize {
        self.blocks.iter().map(|b| b.rows).sum()
    }

    /// Copies `rows` rows, whose column `c` is `columns[c]`, to rows
    /// `start..start + rows` of the batch. Refuses (with what was wrong)
    /// a block outside the batch, over another block, or with other bytes
    /// per row than expected; a refused block leaves the batch as it was.
    pub(super) fn place(
        &mut self,
        start: usize,
        rows: usize,
        columns: &[Bytes],
        meta: M,
    ) -> std::result::Result<(), String> {
        let end = start.checked_add(rows).filter(|&e| e <= self.rows && rows > 0);
        let Some(end) = end else {
            return Err(format!("rows {start}..+{rows} do not lie in a batch of {} rows", self.rows));
        };
        if let Some(b) = self.blocks.iter().find(|b| start < b.start + b.rows && b.start < end) {
            return Err(format!("rows {start}..{end} overlap rows {}..{} already placed", b.start, b.start + b.rows));
        }
        if columns.iter().any(|c| c.len() % rows != 0) {
            return Err("a column buffer is not a whole number of rows".into());
        }
        let got: Vec<usize> = columns.iter().map(|c| c.len() / rows).collect();
        if let Some(expected) = &self.row_bytes {
            if got != *expected {
                return Err(format!(
                    "bytes per row of each column {got:?} differ from the {expected:?} of {}",
                    self.expected_from
                ));
            }
        }
        if self.columns.len() != got.len() {
            self.columns = allocate(self.rows, &got)?;
        }
        let row_bytes = self.row_bytes.get_or_insert(got);
        for ((buf, src), &rb) in self.columns.iter_mut().zip(columns).zip(row_bytes.iter()) {
            let at = start * rb;
            debug_assert!(at + src.len() <= buf.capacity());
            // SAFETY: `buf` has capacity for `self.rows * rb` bytes
            // (`allocate`) and `end <= self.rows`, so `[at, at + rows * rb)`
            // lies inside it; `src` is another allocation. The range is
            // disjoint from every placed block's (checked above), so no
            // initialised byte another block owns is overwritten.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf.as_mut_ptr().add(at), src.len()) };
        }
        self.blocks.push(Block { start, rows, meta });
        Ok(())
    }

    /// Moves the blocks down over the holes failed shards left, so the
    /// placed rows are `0..placed()`, in the order of their starts.
    pub(super) fn close_holes(&mut self) {
        self.blocks.sort_by_key(|b| b.start);
        let mut next = 0;
        for b in &mut self.blocks {
            if b.start != next {
                for (buf, &rb) in self.columns.iter_mut().zip(self.row_bytes.as_deref().unwrap_or_default()) {
                    // SAFETY: both ranges lie in `buf`'s capacity (`start +
                    // rows <= self.rows` was checked when the block was
                    // placed, and `next <= start`); the source is the
                    // block's initialised bytes. `ptr::copy` allows the
                    // ranges to overlap. The destination overlaps no block
                    // still to be read: those start at or after `b.start`.
                    unsafe {
                        let base = buf.as_mut_ptr();
                        std::ptr::copy(base.add(b.start * rb), base.add(next * rb), b.rows * rb);
                    }
                }
                b.start = next;
            }
            next += b.rows;
        }
    }

    /// The column buffers holding rows `0..placed()`, and each block's
    /// `meta` in row order.
    pub(super) fn finish(mut self) -> (Vec<Vec<u8>>, Vec<M>) {
        self.close_holes();
        let placed = self.placed();
        for (buf, &rb) in self.columns.iter_mut().zip(self.row_bytes.as_deref().unwrap_or_default()) {
            // SAFETY: after `close_holes` the blocks cover rows
            // `0..placed` with no gap, and their bytes are initialised (the
            // field invariant); `placed * rb` is within the capacity.
            unsafe { buf.set_len(placed * rb) };
        }
        (self.columns, self.blocks.into_iter().map(|b| b.meta).collect())
    }
}

/// Column buffers with capacity for `rows` rows of `row_bytes`; a batch
/// too large to allocate is an error, not an abort.
fn allocate(rows: usize, row_bytes: &[usize]) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut columns = Vec::with_capacity(row_bytes.len());
    for &rb in row_bytes {
        let mut buf = Vec::new();
        let len = rb.checked_mul(rows).ok_or_else(|| "the batch's size overflows".to_string())?;
        buf.try_reserve_exact(len).map_err(|e| format!("a batch column of {len} bytes: {e}"))?;
        columns.push(buf);
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Column `c` of row `r` of block `b`: `bytes[c]` bytes of one value.
    fn block(first_row: usize, rows: usize, bytes: &[usize]) -> Vec<Bytes> {
        bytes
            .iter()
            .enumerate()
            .map(|(c, &n)| {
                let v: Vec<u8> = (first_row..first_row + rows)
                    .flat_map(|r| std::iter::repeat_n((r * 7 + c * 31 + 1) as u8, n))
                    .collect();
                Bytes::from(v)
            })
            .collect()
    }

    proptest! {
        /// Blocks placed in any order, some of them then failing (never
        /// placed), come out in split order with the holes closed.
        #[test]
        fn blocks_in_any_order_come_out_in_split_order(
            sizes in prop::collection::vec(1usize..6, 1..6),
            bytes in prop::collection::vec(0usize..9, 1..4),
            order in any::<prop::sample::Index>(),
            lost in prop::collection::vec(any::<bool>(), 6),
        ) {
            let total: usize = sizes.iter().sum();
            let mut starts = Vec::new();
            let mut at = 0;
            for &n in &sizes {
                starts.push(at);
                at += n;
            }
            let mut ids: Vec<usize> = (0..sizes.len()).collect();
            ids.rotate_left(order.index(sizes.len()));
            let mut a = Assembly::new(total, None);
            for &i in &ids {
                if !lost[i] {
                    a.place(starts[i], sizes[i], &block(starts[i], sizes[i], &bytes), i).unwrap();
                }
            }
            let kept: Vec<usize> = (0..sizes.len()).filter(|&i| !lost[i]).collect();
            prop_assert_eq!(a.placed(), kept.iter().map(|&i| sizes[i]).sum::<usize>());
            let (columns, metas) = a.finish();
            prop_assert_eq!(&metas, &kept);
            if kept.is_empty() {
                prop_assert!(columns.iter().all(Vec::is_empty));
            } else {
                for (c, col) in columns.iter().enumerate() {
                    let want: Vec<u8> = kept.iter().flat_map(|&i| block(starts[i], sizes[i], &bytes)[c].to_vec()).collect();
                    prop_assert_eq!(col, &want);
                }
            }
        }
    }

    #[test]
    fn a_second_round_fills_in_after_the_holes_are_closed() {
        let bytes = [3, 5];
        let mut a = Assembly::new(6, None);
        a.place(4, 2, &block(4, 2, &bytes), "c").unwrap();
        a.place(0, 2, &block(0, 2, &bytes), "a").unwrap();
        // Rows 2..4 were lost; close the hole and draw them again.
        a.close_holes();
        assert_eq!(a.placed(), 4);
        a.place(4, 2, &block(100, 2, &bytes), "b again").unwrap();
        let (columns, metas) = a.finish();
        assert_eq!(metas, ["a", "c", "b again"]);
        let want: Vec<u8> = [block(0, 2, &bytes), block(4, 2, &bytes), block(100, 2, &bytes)]
            .iter()
            .flat_map(|b| b[1].to_vec())
            .collect();
        assert_eq!(columns[1], want);
    }

    #[test]
    fn blocks_from_the_network_are_checked_before_a_byte_is_copied() {
        let mut a = Assembly::new(8, None);
        a.place(2, 3, &block(2, 3, &[4, 2]), 0).unwrap();
        let cases: [(usize, usize, Vec<Bytes>, &str); 8] = [
            (6, 3, block(6, 3, &[4, 2]), "do not lie in a batch of 8 rows"),
            (usize::MAX, 2, block(0, 2, &[4, 2]), "do not lie in a batch"),
            (0, 0, block(0, 0, &[4, 2]), "do not lie in a batch"),
            (4, 2, block(4, 2, &[4, 2]), "overlap rows 2..5"),
            (0, 2, block(0, 2, &[4]), "[4] differ from the [4, 2] of the first shard's reply"),
            (0, 2, block(0, 2, &[4, 2, 1]), "differ from the [4, 2] of the first shard's reply"),
            (0, 2, block(0, 2, &[4, 3]), "differ from the [4, 2]"),
            (0, 2, vec![Bytes::from(vec![0u8; 8]), Bytes::from(vec![0u8; 3])], "not a whole number of rows"),
        ];
        for (start, rows, columns, want) in cases {
            let e = a.place(start, rows, &columns, 9).unwrap_err();
            assert!(e.contains(want), "{start}..+{rows}: {e}");
        }
        assert_eq!(a.placed(), 3, "refused blocks left the batch as it was");
        a.place(5, 3, &block(5, 3, &[4, 2]), 1).unwrap();
        let (columns, metas) = a.finish();
        assert_eq!(metas, [0, 1]);
        assert_eq!(columns[0].len(), 6 * 4);
    }

    #[test]
    fn the_spec_fixes_the_bytes_per_row_before_any_reply() {
        use gear_core::{ColumnSpec, DType, WindowSpec};
        let spec = TableSpec::new(
            vec![ColumnSpec::new("obs", DType::F32, vec![3]), ColumnSpec::new("act", DType::U8, vec![])],
            10,
            4,
        )
        .unwrap();
        let request = |columns: &[&str], len: u64| ClusterSample {
            rows: 2,
            window: WindowSpec::first(len),
            columns: columns.iter().map(|c| c.to_string()).collect(),
        };
        assert_eq!(row_bytes(&spec, &request(&[], 4)), Some(vec![48, 4]));
        assert_eq!(row_bytes(&spec, &request(&["act", "obs"], 2)), Some(vec![2, 24]));
        assert_eq!(row_bytes(&spec, &request(&["reward"], 2)), None, "no such column");
        assert_eq!(row_bytes(&spec, &request(&[], 11)), None, "a window longer than a trajectory");

        let mut a = Assembly::new(4, row_bytes(&spec, &request(&["act"], 2)));
        // The first reply to come is the wrong one: it is refused by the
        // spec, not taken as the measure of the others.
        let e = a.place(0, 2, &block(0, 2, &[3]), ()).unwrap_err();
        assert!(e.contains("[3] differ from the [2] of the table's spec"), "{e}");
        a.place(2, 2, &block(2, 2, &[2]), ()).unwrap();
        assert_eq!(a.finish().0[0], block(2, 2, &[2])[0].to_vec());
    }

    #[test]
    fn an_absurd_row_size_is_an_error_not_an_abort() {
        let mut a: Assembly<()> = Assembly::new(1 << 40, None);
        let e = a.place(0, 1, &[Bytes::from(vec![0u8; 1 << 20])], ()).unwrap_err();
        assert!(e.contains("batch column") || e.contains("overflows"), "{e}");
    }
}
