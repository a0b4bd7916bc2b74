//! A gathered batch put together in the caller's column buffers as the
//! shards' replies arrive.
//!
//! Each round of a cross-shard draw gives every shard a block of rows: the
//! blocks follow the rows already placed, in shard order, so a batch's row
//! order is the split's (shard order, then the shards drawn again after a
//! loss) whatever order the replies come in. Every block gets a
//! [`RowsMut`], a view of its own rows of every column, and the reply
//! decoder (`wire`) copies the shard's bytes into it straight from the
//! DATA frames, while the other shards' replies are still on the wire. A
//! shard that fails leaves a hole; [`Assembly::close_holes`] moves the
//! blocks after it down, in the caller's buffers, before the next round's
//! blocks are added after them.
//!
//! The blocks of one round are written at once by the replies' futures, so
//! each view holds raw pointers into the caller's buffers: the blocks'
//! rows are disjoint by construction (each is added after the last), a
//! view exists only while [`Assembly::targets`] holds the assembly's
//! unique borrow, and every write through a view is bounds-checked against
//! its block.

use super::ClusterSample;
use gear_core::TableSpec;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// Bytes of one row of each column `request` names (all, in the spec's
/// order, when it names none): `window.len` steps of the column. `None`
/// when the request is not valid for `spec`.
pub(crate) fn row_bytes(spec: &TableSpec, request: &ClusterSample) -> Option<Vec<usize>> {
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

/// The first byte of one of the caller's column buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ColumnBase(*mut MaybeUninit<u8>);

// SAFETY: a `ColumnBase` is only written through an `Assembly` (which holds
// the unique borrow of the buffer it points into for as long as the bases
// are used) and the `RowsMut` views it hands out, each to rows no other view
// covers; sending or sharing the address itself is harmless.
unsafe impl Send for ColumnBase {}
// SAFETY: as for `Send`: shared `ColumnBase`s are only read (copied).
unsafe impl Sync for ColumnBase {}

/// Where a block is in its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockState {
    /// Added this round; its reply is still to come.
    Pending,
    /// Its reply was decoded whole: every byte of its rows is written.
    Done,
    /// Its shard failed: its rows are a hole.
    Failed,
}

/// One shard's rows in the batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    /// First row.
    start: usize,
    /// Rows.
    rows: usize,
    /// The caller's name for the block (which reply it is).
    tag: usize,
    state: BlockState,
}

/// The caller's column buffers of one batch, filled block by block.
pub(crate) struct Assembly<'a> {
    /// Rows the batch holds when every block is in.
    rows: usize,
    /// Bytes of one row of each column.
    row_bytes: &'a [usize],
    /// Each column buffer's first byte. Invariant: buffer `c` holds at
    /// least `rows * row_bytes[c]` bytes, and the bytes of every `Done`
    /// block's rows are initialised.
    bases: &'a mut Vec<ColumnBase>,
    /// The blocks, in row order; rows `0..end` are covered with no gap
    /// once the holes are closed.
    blocks: &'a mut Vec<Block>,
    /// The unique borrow of the caller's buffers the bases point into.
    _buffers: PhantomData<&'a mut [MaybeUninit<u8>]>,
}

impl<'a> Assembly<'a> {
    /// An empty batch of `rows` rows in `columns` (column `c` holds
    /// `row_bytes[c]` bytes a row and may be longer than the batch needs).
    /// `bases` and `blocks` are scratch space kept between batches.
    pub(crate) fn new(
        columns: &'a mut [&mut [MaybeUninit<u8>]],
        row_bytes: &'a [usize],
        rows: usize,
        bases: &'a mut Vec<ColumnBase>,
        blocks: &'a mut Vec<Block>,
    ) -> Result<Self, String> {
        if columns.len() != row_bytes.len() {
            return Err(format!("{} column buffers for the {} columns requested", columns.len(), row_bytes.len()));
        }
        for (c, (buf, &rb)) in columns.iter().zip(row_bytes).enumerate() {
            let need = rb.checked_mul(rows).ok_or_else(|| format!("column {c}: the batch's size overflows"))?;
            if buf.len() < need {
                return Err(format!(
                    "column {c}: a buffer of {} bytes for {rows} rows of {rb} bytes ({need} bytes)",
                    buf.len()
                ));
            }
        }
        bases.clear();
        bases.extend(columns.iter_mut().map(|c| ColumnBase(c.as_mut_ptr())));
        blocks.clear();
        Ok(Assembly { rows, row_bytes, bases, blocks, _buffers: PhantomData })
    }

    /// Rows covered by blocks (placed, or pending this round).
    fn end(&self) -> usize {
        self.blocks.last().map_or(0, |b| b.start + b.rows)
    }

    /// Rows placed (decoded whole) so far.
    #[cfg(test)]
    pub(crate) fn placed(&self) -> usize {
        self.blocks.iter().filter(|b| b.state == BlockState::Done).map(|b| b.rows).sum()
    }

    /// Adds a block of `rows` rows after the last, for this round, named
    /// `tag`. Refused past the batch's end.
    pub(crate) fn add_block(&mut self, tag: usize, rows: usize) -> Result<(), String> {
        let start = self.end();
        if rows == 0 || start.checked_add(rows).is_none_or(|e| e > self.rows) {
            return Err(format!("rows {start}..+{rows} do not lie in a batch of {} rows", self.rows));
        }
        self.blocks.push(Block { start, rows, tag, state: BlockState::Pending });
        Ok(())
    }

    /// The pending blocks' tags and views, one each: the round's targets.
    pub(crate) fn targets(&mut self) -> impl Iterator<Item = (usize, RowsMut<'_>)> + '_ {
        let (bases, row_bytes) = (&self.bases[..], self.row_bytes);
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::Pending)
            .map(move |b| (b.tag, RowsMut { bases, row_bytes, start: b.start, rows: b.rows, _rows: PhantomData }))
    }

    /// Records how the pending block named `tag` ended: `done` when its
    /// reply was decoded whole (every byte of its rows written).
    pub(crate) fn settle(&mut self, tag: usize, done: bool) {
        if let Some(b) = self.blocks.iter_mut().find(|b| b.tag == tag && b.state == BlockState::Pending) {
            b.state = if done { BlockState::Done } else { BlockState::Failed };
        }
    }

    /// Ends the round: blocks not settled done are dropped and the blocks
    /// after each hole move down, so the placed rows are `0..placed()`.
    pub(crate) fn close_holes(&mut self) {
        self.blocks.retain(|b| b.state == BlockState::Done);
        let mut next = 0;
        for b in self.blocks.iter_mut() {
            if b.start != next {
                for (base, &rb) in self.bases.iter().zip(self.row_bytes) {
                    // SAFETY: both ranges lie in the column buffer (`start +
                    // rows <= self.rows` was checked when the block was
                    // added, `next <= start`, and the buffer holds `rows *
                    // rb` bytes); the source is the block's initialised
                    // bytes (it is done). `ptr::copy` allows overlap. No
                    // view is alive (`targets` borrows `self` mutably).
                    unsafe { std::ptr::copy(base.0.add(b.start * rb), base.0.add(next * rb), b.rows * rb) };
                }
                b.start = next;
            }
            next += b.rows;
        }
    }

    /// The tags of the placed blocks and their rows, in row order (after
    /// [`Assembly::close_holes`]).
    pub(crate) fn placed_blocks(&self) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        self.blocks.iter().filter(|b| b.state == BlockState::Done).map(|b| (b.tag, b.start..b.start + b.rows))
    }
}

/// One block's rows of every column: where its shard's reply is decoded.
pub(crate) struct RowsMut<'v> {
    bases: &'v [ColumnBase],
    row_bytes: &'v [usize],
    start: usize,
    rows: usize,
    /// A view is the only writer of its rows while it lives.
    _rows: PhantomData<&'v mut [MaybeUninit<u8>]>,
}

impl RowsMut<'_> {
    /// Rows of the block.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub(crate) fn columns(&self) -> usize {
        self.bases.len()
    }

    /// Bytes of one row of each column.
    pub(crate) fn row_bytes(&self) -> &[usize] {
        self.row_bytes
    }

    /// Bytes of the block's rows of column `c` (0 for no such column).
    pub(crate) fn column_len(&self, c: usize) -> usize {
        self.row_bytes.get(c).map_or(0, |&rb| rb * self.rows)
    }

    /// Copies `bytes` to byte `at` of the block's rows of column `c`;
    /// refused if that runs past them.
    pub(crate) fn write(&mut self, c: usize, at: usize, bytes: &[u8]) -> Result<(), String> {
        let len = self.column_len(c);
        if c >= self.bases.len() || at.checked_add(bytes.len()).is_none_or(|e| e > len) {
            return Err(format!("{} bytes at byte {at} of column {c}, whose block holds {len}", bytes.len()));
        }
        let first = self.start * self.row_bytes[c];
        // SAFETY: `first + at + bytes.len() <= (start + rows) * rb`, within
        // the column buffer (`Assembly::new` checked it holds the batch's
        // rows, `add_block` that the block lies in the batch); the block's
        // rows are written through this view only (module doc); `bytes` is
        // another allocation (a received frame).
        unsafe {
            let dst = self.bases[c].0.add(first + at).cast::<u8>();
            gear_core::copy::copy_bytes(bytes.as_ptr(), dst, bytes.len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Column `c` of row `r` of a block drawn as `draw`: `bytes[c]` bytes.
    fn row_value(draw: usize, r: usize, c: usize) -> u8 {
        (draw * 37 + r * 7 + c * 31 + 1) as u8
    }

    fn fill(view: &mut RowsMut<'_>, draw: usize) {
        for c in 0..view.columns() {
            let rb = view.row_bytes()[c];
            for r in 0..view.rows() {
                view.write(c, r * rb, &vec![row_value(draw, r, c); rb]).unwrap();
            }
        }
    }

    proptest! {
        /// Blocks settled in any order, some failing, come out in split
        /// order with the holes closed, in the caller's buffers.
        #[test]
        fn blocks_in_any_order_come_out_in_split_order(
            sizes in prop::collection::vec(1usize..6, 1..6),
            bytes in prop::collection::vec(1usize..9, 1..4),
            order in any::<prop::sample::Index>(),
            lost in prop::collection::vec(any::<bool>(), 6),
        ) {
            let total: usize = sizes.iter().sum();
            let mut buffers: Vec<Vec<MaybeUninit<u8>>> =
                bytes.iter().map(|&b| vec![MaybeUninit::new(0xEE); b * total + 3]).collect();
            let mut views: Vec<&mut [MaybeUninit<u8>]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
            let (mut bases, mut blocks) = (Vec::new(), Vec::new());
            let mut a = Assembly::new(&mut views, &bytes, total, &mut bases, &mut blocks).unwrap();
            for (i, &n) in sizes.iter().enumerate() {
                a.add_block(i, n).unwrap();
            }
            let mut ids: Vec<usize> = (0..sizes.len()).collect();
            ids.rotate_left(order.index(sizes.len()));
            {
                let mut targets: Vec<(usize, RowsMut<'_>)> = a.targets().collect();
                for &i in &ids {
                    if !lost[i] {
                        fill(&mut targets[i].1, i);
                    }
                }
            }
            for &i in &ids {
                a.settle(i, !lost[i]);
            }
            a.close_holes();
            let kept: Vec<usize> = (0..sizes.len()).filter(|&i| !lost[i]).collect();
            prop_assert_eq!(a.placed(), kept.iter().map(|&i| sizes[i]).sum::<usize>());
            let order: Vec<usize> = a.placed_blocks().map(|(t, _)| t).collect();
            prop_assert_eq!(&order, &kept);
            let placed = a.placed();
            for (c, &b) in bytes.iter().enumerate() {
                let want: Vec<u8> = kept
                    .iter()
                    .flat_map(|&i| (0..sizes[i]).flat_map(move |r| std::iter::repeat_n(row_value(i, r, c), b)))
                    .collect();
                // SAFETY: the placed rows were written (or were 0xEE).
                let got: Vec<u8> = buffers[c][..placed * b].iter().map(|x| unsafe { x.assume_init() }).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn a_second_round_fills_in_after_the_holes_are_closed() {
        let bytes = [3usize, 5];
        let mut buffers: Vec<Vec<MaybeUninit<u8>>> = bytes.iter().map(|&b| vec![MaybeUninit::new(0); 6 * b]).collect();
        let mut views: Vec<&mut [MaybeUninit<u8>]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        let (mut bases, mut blocks) = (Vec::new(), Vec::new());
        let mut a = Assembly::new(&mut views, &bytes, 6, &mut bases, &mut blocks).unwrap();
        for (tag, n) in [(0, 2), (1, 2), (2, 2)] {
            a.add_block(tag, n).unwrap();
        }
        for (tag, mut view) in a.targets() {
            fill(&mut view, tag);
        }
        a.settle(2, true);
        a.settle(0, true);
        a.settle(1, false);
        a.close_holes();
        assert_eq!(a.placed(), 4);
        // Rows 2..4 were lost; drawn again after the others.
        a.add_block(3, 2).unwrap();
        for (tag, mut view) in a.targets() {
            assert_eq!(tag, 3);
            fill(&mut view, 100);
        }
        a.settle(3, true);
        a.close_holes();
        let blocks: Vec<_> = a.placed_blocks().collect();
        assert_eq!(blocks, [(0, 0..2), (2, 2..4), (3, 4..6)]);
        // SAFETY: every row was written.
        let col1: Vec<u8> = buffers[1].iter().map(|x| unsafe { x.assume_init() }).collect();
        let want: Vec<u8> = [(0, 0), (0, 1), (2, 0), (2, 1), (100, 0), (100, 1)]
            .iter()
            .flat_map(|&(d, r)| std::iter::repeat_n(row_value(d, r, 1), 5))
            .collect();
        assert_eq!(col1, want);
    }

    #[test]
    fn buffers_and_writes_are_checked_before_a_byte_is_copied() {
        let bytes = [4usize, 2];
        let mut short: Vec<Vec<MaybeUninit<u8>>> = vec![vec![MaybeUninit::new(0); 32], vec![MaybeUninit::new(0); 15]];
        let mut views: Vec<&mut [MaybeUninit<u8>]> = short.iter_mut().map(|b| &mut b[..]).collect();
        let (mut bases, mut blocks) = (Vec::new(), Vec::new());
        let e = Assembly::new(&mut views, &bytes, 8, &mut bases, &mut blocks).err().unwrap();
        assert!(e.contains("column 1: a buffer of 15 bytes for 8 rows of 2 bytes"), "{e}");
        let e = Assembly::new(&mut views[..1], &bytes, 8, &mut bases, &mut blocks).err().unwrap();
        assert!(e.contains("1 column buffers for the 2 columns"), "{e}");

        let mut buffers: Vec<Vec<MaybeUninit<u8>>> = vec![vec![MaybeUninit::new(0); 32], vec![MaybeUninit::new(0); 16]];
        let mut views: Vec<&mut [MaybeUninit<u8>]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        let mut a = Assembly::new(&mut views, &bytes, 8, &mut bases, &mut blocks).unwrap();
        a.add_block(0, 5).unwrap();
        assert!(a.add_block(1, 4).unwrap_err().contains("do not lie in a batch of 8 rows"));
        assert!(a.add_block(1, 0).is_err());
        let (_, mut view) = a.targets().next().unwrap();
        assert!(view.write(0, 16, &[1; 4]).is_ok());
        assert!(view.write(0, 17, &[1; 4]).unwrap_err().contains("whose block holds 20"));
        assert!(view.write(2, 0, &[1]).is_err());
        assert!(view.write(1, usize::MAX, &[1]).is_err());
    }

    #[test]
    fn the_spec_gives_the_bytes_per_row() {
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
            random_start: false,
        };
        assert_eq!(row_bytes(&spec, &request(&[], 4)), Some(vec![48, 4]));
        assert_eq!(row_bytes(&spec, &request(&["act", "obs"], 2)), Some(vec![2, 24]));
        assert_eq!(row_bytes(&spec, &request(&["reward"], 2)), None, "no such column");
        assert_eq!(row_bytes(&spec, &request(&[], 11)), None, "a window longer than a trajectory");
    }
}
