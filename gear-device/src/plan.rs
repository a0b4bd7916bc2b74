//! Host-side launch plans: the argument tables and grid sizes the kernels
//! get. Pure functions with no device calls, shared by the real launches and by
//! the CPU-shim tests (which run the same kernels compiled with g++), so the
//! tests check exactly what the device receives. Hidden from the docs: an
//! implementation detail that is public only for those tests.

use gear_core::{BatchLayout, Error, GatherRow, Layout, Result};

/// Threads per block of every launch.
pub const BLOCK: u32 = 256;

/// Bytes one block of a gather task moves before another block (grid y) is
/// given to the same task.
pub const BYTES_PER_BLOCK: u64 = 32 * 1024;

/// Most blocks sharing one gather task.
pub const MAX_BLOCKS_PER_TASK: u64 = 64;

/// Most blocks in grid x.
pub const MAX_GRID_X: u64 = 1 << 20;

/// Most blocks of one gather launch (grid x times grid y; x strides over
/// the tasks). A gather from pinned host memory is bound by the link, which
/// a few hundred blocks saturate; a grid of one block per task (12 288 for
/// 1024 windows of 128 KiB in three columns) queued every block slot of an
/// H200, so the trainer's next kernel, ready at the same moment, started
/// only after the whole gather: an H200 run of `train-bench` showed
/// prefetching trainers waiting exactly as long as the copy took. This many
/// blocks of [`BLOCK`] threads hold about a quarter of an H100's or H200's
/// thread slots and still keep 2 MB of loads in flight.
pub const MAX_GATHER_BLOCKS: u64 = 512;

/// Blocks for a 1-D grid-stride launch over `items` items.
pub fn grid_1d(items: u64) -> u32 {
    items.div_ceil(u64::from(BLOCK)).clamp(1, MAX_GRID_X) as u32
}

/// Everything `gear_gather` needs, as one word table plus scalars.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherPlan {
    /// `[row_src; rows] ++ [row_start << 32 | row_len; rows] ++ [col_off,
    /// step_bytes, dst; ncols]`.
    pub words: Vec<u64>,
    /// Rows in the batch.
    pub rows: u64,
    /// Requested columns.
    pub ncols: u64,
    /// Window offset.
    pub w_offset: i64,
    /// Window length.
    pub w_len: u64,
    /// 1 for head padding, 0 for tail.
    pub pad_head: u32,
    /// Grid (x, y); x strides over the tasks, y splits one task's bytes.
    pub grid: (u32, u32),
    /// Valid lengths, computed with `WindowSpec::resolve` (what the kernel
    /// must also write).
    pub lengths: Vec<u64>,
    /// Rows served from a device cache.
    pub cached_rows: usize,
    /// The device address of the table's data area the rows read.
    pub table_base: u64,
}

impl GatherPlan {
    /// Word index of the row-length table.
    pub fn row_len_at(&self) -> usize {
        self.rows as usize
    }

    /// Word index of the column table.
    pub fn cols_at(&self) -> usize {
        2 * self.rows as usize
    }

    /// Whether there is nothing to launch (no rows).
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// Builds the gather plan. `data_base` is the device address of the table's
/// data area (slot `i` starts at `data_base + i * stride`); `dst_bases[i]`
/// the device address of requested column `i`'s batch buffer; `cached[r]`,
/// when given and `Some`, the device address of row `r`'s slot copy in a
/// cache (same layout as a table slot). Validates everything the kernel
/// relies on: slot in range, stored length at most `T`, batch layout made
/// for this table layout.
pub fn plan_gather(
    layout: &Layout,
    batch: &BatchLayout,
    rows: &[GatherRow],
    data_base: u64,
    dst_bases: &[u64],
    cached: &[Option<u64>],
) -> Result<GatherPlan> {
    batch.window().validate(layout.max_len())?;
    if rows.len() != batch.rows() {
        return Err(Error::InvalidWindow(format!(
            "batch was laid out for {} rows, {} rows given",
            batch.rows(),
            rows.len()
        )));
    }
    if dst_bases.len() != batch.columns().len() {
        return Err(Error::InvalidWindow(format!(
            "{} column buffers for {} requested columns",
            dst_bases.len(),
            batch.columns().len()
        )));
    }
    if !cached.is_empty() && cached.len() != rows.len() {
        return Err(Error::InvalidWindow(format!("{} cache entries for {} rows", cached.len(), rows.len())));
    }
    let mut words = Vec::with_capacity(2 * rows.len() + 3 * batch.columns().len());
    let mut cached_rows = 0;
    for (r, row) in rows.iter().enumerate() {
        layout.check_slot(u64::from(row.slot))?;
        match cached.get(r).copied().flatten() {
            Some(base) => {
                cached_rows += 1;
                words.push(base);
            }
            None => words.push(data_base + u64::from(row.slot) * layout.slot_stride()),
        }
    }
    let mut lengths = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        row.check_len(r, layout.max_len())?;
        // The kernel reads `start << 32 | len` (an item's window, or a
        // whole trajectory from step 0).
        if row.len > u64::from(u32::MAX) {
            return Err(Error::Unsupported("the device gather reads rows of fewer than 2^32 steps"));
        }
        words.push(u64::from(row.start) << 32 | row.len);
        lengths.push(row.resolve(&batch.window()).steps);
    }
    let mut max_row_bytes = 0;
    for (i, (&c, &s)) in batch.columns().iter().zip(batch.step_bytes()).enumerate() {
        if c >= layout.columns() {
            return Err(Error::ColumnIndex { index: c, count: layout.columns() });
        }
        if layout.step_bytes(c) != s {
            return Err(Error::InvalidWindow(format!(
                "batch column {i} (table column {c}) has {s} bytes per step, the table {}",
                layout.step_bytes(c)
            )));
        }
        words.push(layout.offset(0, c, 0));
        words.push(s);
        words.push(dst_bases[i]);
        max_row_bytes = max_row_bytes.max(batch.row_bytes(i));
    }
    let tasks = rows.len() as u64 * batch.columns().len() as u64;
    let grid_y = max_row_bytes.div_ceil(BYTES_PER_BLOCK).clamp(1, MAX_BLOCKS_PER_TASK);
    let grid_x = tasks.clamp(1, (MAX_GATHER_BLOCKS / grid_y).clamp(1, MAX_GRID_X)) as u32;
    let grid_y = grid_y as u32;
    Ok(GatherPlan {
        words,
        rows: rows.len() as u64,
        ncols: batch.columns().len() as u64,
        w_offset: batch.window().offset,
        w_len: batch.window().len,
        pad_head: u32::from(batch.window().pad == gear_core::Pad::Head),
        grid: (grid_x, grid_y),
        lengths,
        cached_rows,
        table_base: data_base,
    })
}

/// How `gear_gather` moves one copy of `n` bytes from `src` to `dst`
/// (mirrors `gear_copy` in `kernels/gather.cu`): single bytes up to the
/// 16-byte alignment of `dst`, then whole 16-byte words, each stored
/// aligned and loaded aligned (with two loads and a funnel shift when `src`
/// sits at another offset modulo 16: `realigned`), then single bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyShape {
    /// Bytes copied one at a time before the first word.
    pub head: u64,
    /// 16-byte words.
    pub words: u64,
    /// Bytes copied one at a time after the last word.
    pub tail: u64,
    /// Whether each word takes two aligned loads and a shift.
    pub realigned: bool,
}

impl CopyShape {
    /// The shape of a copy of `n` bytes.
    pub fn of(dst: u64, src: u64, n: u64) -> Self {
        let head = ((16 - (dst & 15)) & 15).min(n);
        let words = (n - head) / 16;
        let tail = n - head - words * 16;
        CopyShape { head, words, tail, realigned: words > 0 && (src + head) & 15 != 0 }
    }

    /// Bytes copied.
    pub fn bytes(&self) -> u64 {
        self.head + 16 * self.words + self.tail
    }

    /// Source loads issued: (1-byte loads, 16-byte loads).
    pub fn loads(&self) -> (u64, u64) {
        (self.head + self.tail, if self.realigned { 2 * self.words } else { self.words })
    }
}

/// The shape of every non-empty copy `plan` makes (row-major over rows,
/// then requested columns), from the addresses in its tables.
pub fn copy_shapes(plan: &GatherPlan) -> Vec<CopyShape> {
    let window = gear_core::WindowSpec {
        offset: plan.w_offset,
        len: plan.w_len,
        pad: if plan.pad_head != 0 { gear_core::Pad::Head } else { gear_core::Pad::Tail },
    };
    let cols = &plan.words[plan.cols_at()..];
    let mut out = Vec::new();
    for r in 0..plan.rows as usize {
        let word = plan.words[plan.row_len_at() + r];
        let w = window.resolve(word & 0xffff_ffff);
        let start = word >> 32;
        for c in cols.chunks_exact(3) {
            let (col_off, s, dst_base) = (c[0], c[1], c[2]);
            if w.steps == 0 || s == 0 {
                continue;
            }
            let src = plan.words[r] + col_off + (start + w.src_step) * s;
            let dst = dst_base + r as u64 * plan.w_len * s + w.dst_step * s;
            out.push(CopyShape::of(dst, src, w.steps * s));
        }
    }
    out
}

/// Chunking of the prefix-sum passes over `n` priorities: (chunk length,
/// chunks). At most 4096 chunks, so the one-thread scan stays short.
pub fn prio_chunks(n: u64) -> (u64, u64) {
    const MAX_CHUNKS: u64 = 4096;
    if n == 0 {
        return (1, 0);
    }
    let nchunks = n.min(MAX_CHUNKS);
    let chunk_len = n.div_ceil(nchunks);
    (chunk_len, n.div_ceil(chunk_len))
}

/// The top-k sorting network over `n` priorities: the padded width `m`
/// (the next power of two, at least 2) and every `(size, stride)` step of
/// Batcher's bitonic sort, in launch order. Depends on `n` only, never on
/// `k`: log2(m)(log2(m)+1)/2 steps of m/2 compare-exchanges each.
pub fn topk_network(n: u64) -> (u64, Vec<(u64, u64)>) {
    let m = n.max(2).next_power_of_two();
    let mut steps = Vec::new();
    let mut size = 2;
    while size <= m {
        let mut stride = size / 2;
        while stride > 0 {
            steps.push((size, stride));
            stride /= 2;
        }
        size *= 2;
    }
    (m, steps)
}

/// Resolves duplicate indices in a batch of priority updates: keeps the
/// last occurrence of each index (what a sequential loop of writes leaves),
/// ordered by the position of that last occurrence. The scatter kernel then
/// writes each index once.
pub fn last_write_wins(updates: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let mut last = std::collections::HashMap::with_capacity(updates.len());
    for (i, &(slot, _)) in updates.iter().enumerate() {
        last.insert(slot, i);
    }
    updates.iter().enumerate().filter(|&(i, &(slot, _))| last[&slot] == i).map(|(_, &u)| u).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gear_core::{ColumnSpec, DType, TableSpec, WindowSpec};

    fn layout() -> Layout {
        let spec =
            TableSpec::new(vec![ColumnSpec::new("a", DType::U8, [3]), ColumnSpec::new("b", DType::F32, [4])], 10, 4)
                .unwrap();
        Layout::new(&spec).unwrap()
    }

    #[test]
    fn a_large_gather_keeps_to_the_block_limit() {
        let spec = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, [4096])], 64, 2048).unwrap();
        let l = Layout::new(&spec).unwrap();
        let b = BatchLayout::new(&l, &[0], 1024, WindowSpec::last(32)).unwrap();
        let rows: Vec<GatherRow> = (0..1024).map(|i| GatherRow::whole(i, 64)).collect();
        let p = plan_gather(&l, &b, &rows, 0, &[1 << 40], &[]).unwrap();
        // 128 KiB rows: 4 blocks per task; 1024 tasks strided over 128.
        assert_eq!(p.grid, (128, 4));
        assert!(u64::from(p.grid.0) * u64::from(p.grid.1) <= MAX_GATHER_BLOCKS);
        // Rows longer than MAX_BLOCKS_PER_TASK blocks still get one x block.
        let spec = TableSpec::new(vec![ColumnSpec::new("obs", DType::U8, [1 << 20])], 8, 4).unwrap();
        let l = Layout::new(&spec).unwrap();
        let b = BatchLayout::new(&l, &[0], 2, WindowSpec::last(8)).unwrap();
        let p = plan_gather(&l, &b, &[GatherRow::whole(0, 8), GatherRow::whole(1, 8)], 0, &[1 << 40], &[]).unwrap();
        assert_eq!(p.grid, (2, 64));
    }

    #[test]
    fn plan_tables_follow_the_layout() {
        let l = layout();
        let b = BatchLayout::new(&l, &[1, 0], 2, WindowSpec::last(4)).unwrap();
        let rows = [GatherRow::whole(3, 10), GatherRow::whole(1, 2)];
        let p = plan_gather(&l, &b, &rows, 1000, &[7, 9], &[None, Some(55)]).unwrap();
        let stride = l.slot_stride();
        assert_eq!(p.words[..2], [1000 + 3 * stride, 55]);
        assert_eq!(p.words[2..4], [10, 2]);
        assert_eq!(p.words[4..], [l.offset(0, 1, 0), 16, 7, 0, 3, 9]);
        assert_eq!(p.lengths, vec![4, 2]);
        assert_eq!((p.cached_rows, p.pad_head, p.grid), (1, 1, (4, 1)));
    }

    #[test]
    fn plan_refuses_what_the_kernel_cannot_check() {
        let l = layout();
        let b = BatchLayout::new(&l, &[0], 1, WindowSpec::first(3)).unwrap();
        let bad_slot = plan_gather(&l, &b, &[GatherRow::whole(4, 1)], 0, &[0], &[]);
        assert!(matches!(bad_slot, Err(Error::SlotOutOfRange { .. })));
        let too_long = plan_gather(&l, &b, &[GatherRow::whole(0, 11)], 0, &[0], &[]).unwrap_err();
        assert!(too_long.to_string().contains("exceed"), "{too_long}");
        let past_the_end = plan_gather(&l, &b, &[GatherRow { slot: 0, start: 8, len: 3 }], 0, &[0], &[]).unwrap_err();
        assert!(past_the_end.to_string().contains("steps 8..11 exceed"), "{past_the_end}");
        let item = plan_gather(&l, &b, &[GatherRow { slot: 1, start: 6, len: 4 }], 0, &[0], &[]).unwrap();
        assert_eq!(item.words[1], 6 << 32 | 4, "start and length share the row word");
        let wrong_rows = plan_gather(&l, &b, &[], 0, &[0], &[]).unwrap_err();
        assert!(wrong_rows.to_string().contains("1 rows"), "{wrong_rows}");
    }

    #[test]
    fn duplicates_keep_the_last_write() {
        let u = [(1, 1.0), (2, 2.0), (1, 3.0), (3, 4.0), (2, 5.0)];
        assert_eq!(last_write_wins(&u), vec![(1, 3.0), (3, 4.0), (2, 5.0)]);
    }

    #[test]
    fn chunkings_cover_every_item() {
        for n in [1u64, 2, 7, 4096, 4097, 1_000_003] {
            let (len, c) = prio_chunks(n);
            assert!(len * c >= n && len * (c - 1) < n && c <= 4096, "{n}");
        }
    }

    /// Unpadded layouts the old equal-alignment rule copied in 8- or 4-byte
    /// words (odd T with [4096, 4, 4] columns; f32 [17]): now every copy
    /// moves all but at most 30 of its bytes in 16-byte loads and stores.
    #[test]
    fn unpadded_layouts_copy_in_16_byte_words() {
        let cases = [
            (
                vec![
                    ColumnSpec::new("obs", DType::U8, [4096]),
                    ColumnSpec::new("a", DType::I32, [1]),
                    ColumnSpec::new("r", DType::F32, [1]),
                ],
                127u64,
            ),
            (vec![ColumnSpec::new("x", DType::F32, [17])], 33),
        ];
        for (columns, t) in cases {
            let spec = TableSpec::new(columns, t, 64).unwrap();
            let l = Layout::new(&spec).unwrap();
            let cols: Vec<usize> = (0..l.columns()).collect();
            let batch = BatchLayout::new(&l, &cols, 32, WindowSpec::last(t - 4)).unwrap();
            let rows: Vec<GatherRow> =
                (0..32).map(|r| GatherRow::whole((r * 7 % 64) as u32, t - (r % 3) as u64)).collect();
            let dst: Vec<u64> = (0..cols.len() as u64).map(|i| 0x7f00_0000_0000 + (i << 30)).collect();
            let p = plan_gather(&l, &batch, &rows, 0x7e00_0000_0000, &dst, &[]).unwrap();
            let shapes = copy_shapes(&p);
            assert_eq!(shapes.len(), 32 * cols.len());
            let (mut bytes, mut wide, mut old_wide, mut loads16, mut realigned) = (0, 0, 0, 0, 0);
            for sh in &shapes {
                assert!(sh.head + sh.tail <= 30, "{sh:?}");
                bytes += sh.bytes();
                wide += 16 * sh.words;
                loads16 += sh.loads().1;
                realigned += u64::from(sh.realigned);
            }
            // What the old rule (16-byte words only when src and dst agree
            // modulo 16) would have moved in 16-byte words.
            let win = batch.window();
            for (r, row) in rows.iter().enumerate() {
                let w = win.resolve(row.len);
                for (i, &c) in cols.iter().enumerate() {
                    let s = l.step_bytes(c);
                    let src =
                        0x7e00_0000_0000 + u64::from(row.slot) * l.slot_stride() + l.offset(0, c, 0) + w.src_step * s;
                    let d = dst[i] + r as u64 * batch.row_bytes(i) + w.dst_step * s;
                    if (src ^ d) & 15 == 0 {
                        old_wide += CopyShape::of(d, src, w.steps * s).words * 16;
                    }
                }
            }
            println!(
                "T {t}, step bytes {:?}: {bytes} bytes, {:.1}% in 16-byte loads/stores ({loads16} loads of 16 bytes, \
                 {realigned} of {} copies realigned); the equal-alignment rule: {:.1}%",
                (0..l.columns()).map(|c| l.step_bytes(c)).collect::<Vec<_>>(),
                100.0 * wide as f64 / bytes as f64,
                shapes.len(),
                100.0 * old_wide as f64 / bytes as f64,
            );
            assert!(wide as f64 >= 0.95 * bytes as f64);
            assert!(realigned > 0, "the cases must exercise the realigned path");
            assert!((old_wide as f64) < 0.9 * bytes as f64, "these layouts defeated the old rule");
        }
    }

    #[test]
    fn topk_network_is_batchers_and_independent_of_k() {
        assert_eq!(topk_network(1), (2, vec![(2, 1)]));
        assert_eq!(topk_network(3), (4, vec![(2, 1), (4, 2), (4, 1)]));
        let (m, steps) = topk_network(1_000_000);
        assert_eq!(m, 1 << 20);
        assert_eq!(steps.len(), 20 * 21 / 2);
        assert!(steps.iter().all(|&(size, stride)| stride < size && size <= m && size.is_power_of_two()));
    }
}
