//! DQN-style transitions gathered from item windows, each stored frame read
//! once per row: the [`TransitionCollector`] turns a row `[t, t + m]` of a
//! trajectory (an item made by `ItemPattern::Transitions`: `m <= n` steps
//! of return, fewer at the trajectory's end) into
//!
//! * per observation column, the frames `t - k + 1 ..= t + n` of the row
//!   laid out `[rows, k + n, *shape]` (`k` the frame stack): the
//!   observation is positions `0..k`, the next observation positions
//!   `n..n + k` of the same buffer, so both are strided views of frames
//!   gathered once ([`TransitionBatch::observation`],
//!   [`TransitionBatch::next_observation`]);
//! * per step column (the action, say), its value at step `t`;
//! * the `n`-step discounted return `sum_{i < m'} gamma^i r_{t+i}`, where
//!   `m'` stops after the first step whose done flag is set (a terminal
//!   transition: `done`, discount 0) and is otherwise `m` (discount
//!   `gamma^m'`); the next observation is the stack at `t + m'`.
//!
//! Episode starts: a frame stack that reaches before the trajectory's first
//! step, or before the step after a done flag (an episode that began inside
//! the trajectory), repeats the episode's first frame, as frame-stacking
//! environment wrappers do at a reset; no mask is needed.
//!
//! When the return stops short of `n` steps (`m' < n`: the end of the
//! trajectory, or a terminal step) and `n < k`, the stack at `t + m'` would
//! overlap the observation's positions: a batch holding such a row keeps
//! the next observations in a buffer of their own (`[rows, k, *shape]`),
//! the other rows' copied there from the frames already gathered.
//! [`TransitionBatch::next_observation`] says which buffer to read.

use crate::raw::{as_uninit, AlignedBytes, SharedBytes};
use gear_core::{BatchLayout, Collector, DType, Error, GatherRow, Layout, Result, TableSpec, TableView};

/// The columns a transition batch is made of (indices into the table's
/// spec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionColumns {
    /// Observation columns: stacked over the last `frame_stack` steps,
    /// observed at `t` and at `t + m'`.
    pub observations: Vec<usize>,
    /// Columns read at step `t` alone (the action, ...).
    pub step_columns: Vec<usize>,
    /// The reward column (one element per step, any numeric dtype).
    pub reward: usize,
    /// The done column (one element per step; non-zero: the episode ended
    /// after that step's action), if the table has one.
    pub done: Option<usize>,
}

/// How transitions are computed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransitionRule {
    /// Frames per observation (`k`, at least 1).
    pub frame_stack: u64,
    /// Steps of the return (`n`, at least 1).
    pub n_step: u64,
    /// Discount per step, in `[0, 1]`.
    pub gamma: f64,
}

/// A checked transition batch shape: columns, rule, rows, bytes per step.
#[derive(Clone, Debug, PartialEq)]
pub struct TransitionLayout {
    columns: TransitionColumns,
    rule: TransitionRule,
    rows: usize,
    obs_bytes: Vec<usize>,
    step_bytes: Vec<usize>,
    reward_dtype: DType,
    done_dtype: Option<DType>,
}

fn scalar_column(spec: &TableSpec, c: usize, role: &str) -> Result<DType> {
    let col = spec.columns().get(c).ok_or(Error::ColumnIndex { index: c, count: spec.columns().len() })?;
    if col.elements_per_step()? != 1 {
        return Err(Error::InvalidWindow(format!(
            "the {role} column `{}` has shape {:?}; it needs one element per step",
            col.name(),
            col.shape()
        )));
    }
    Ok(col.dtype())
}

impl TransitionLayout {
    /// Checks `columns` and `rule` against a table's spec, for batches of
    /// `rows` rows.
    pub fn new(spec: &TableSpec, columns: TransitionColumns, rule: TransitionRule, rows: usize) -> Result<Self> {
        if columns.observations.is_empty() {
            return Err(Error::InvalidWindow("a transition needs at least one observation column".into()));
        }
        if rows == 0 {
            return Err(Error::InvalidWindow("a transition batch needs at least one row".into()));
        }
        if rule.frame_stack == 0 || rule.n_step == 0 {
            return Err(Error::InvalidWindow(format!(
                "frame stack {} and n_step {} must both be at least 1",
                rule.frame_stack, rule.n_step
            )));
        }
        if rule.n_step >= spec.max_len() || rule.frame_stack > spec.max_len() {
            return Err(Error::InvalidWindow(format!(
                "n_step {} and frame stack {} do not fit trajectories of at most {} steps",
                rule.n_step,
                rule.frame_stack,
                spec.max_len()
            )));
        }
        if !(rule.gamma.is_finite() && (0.0..=1.0).contains(&rule.gamma)) {
            return Err(Error::InvalidWindow(format!("discount gamma {} is not in [0, 1]", rule.gamma)));
        }
        let bytes = |c: usize| -> Result<usize> {
            let col = spec.columns().get(c).ok_or(Error::ColumnIndex { index: c, count: spec.columns().len() })?;
            Ok(col.step_bytes()? as usize)
        };
        let obs_bytes = columns.observations.iter().map(|&c| bytes(c)).collect::<Result<Vec<_>>>()?;
        let step_bytes = columns.step_columns.iter().map(|&c| bytes(c)).collect::<Result<Vec<_>>>()?;
        let reward_dtype = scalar_column(spec, columns.reward, "reward")?;
        let done_dtype = columns.done.map(|c| scalar_column(spec, c, "done")).transpose()?;
        let per_row = (rule.frame_stack + rule.n_step) as usize;
        let total = obs_bytes
            .iter()
            .map(|&s| s.checked_mul(per_row + rule.frame_stack as usize))
            .chain(step_bytes.iter().map(|&s| Some(s)))
            .try_fold(0usize, |acc, b| b.and_then(|b| acc.checked_add(b)))
            .and_then(|b| b.checked_mul(rows));
        if total.is_none_or(|b| b > isize::MAX as usize) {
            return Err(Error::SizeOverflow("transition batch bytes".into()));
        }
        Ok(TransitionLayout { columns, rule, rows, obs_bytes, step_bytes, reward_dtype, done_dtype })
    }

    /// Rows per batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The columns.
    pub fn columns(&self) -> &TransitionColumns {
        &self.columns
    }

    /// The rule.
    pub fn rule(&self) -> TransitionRule {
        self.rule
    }

    fn k(&self) -> usize {
        self.rule.frame_stack as usize
    }

    fn n(&self) -> usize {
        self.rule.n_step as usize
    }

    /// Whether a row whose return stops after `m` steps needs its next
    /// observation in a buffer of its own.
    fn overlaps(&self, m: u64) -> bool {
        m < self.rule.n_step && self.rule.n_step < self.rule.frame_stack
    }
}

/// A strided view of one observation column of a transition batch: row
/// `r`'s `frames` frames are the contiguous bytes `row(r)`, rows
/// `row_stride` bytes apart from `offset`.
#[derive(Clone, Copy, Debug)]
pub struct FrameView<'a> {
    /// The buffer the view reads.
    pub bytes: &'a [u8],
    /// Byte offset of row 0's first frame.
    pub offset: usize,
    /// Bytes from one row's first frame to the next row's.
    pub row_stride: usize,
    /// Rows.
    pub rows: usize,
    /// Frames per row (the frame stack).
    pub frames: usize,
    /// Bytes of one frame.
    pub frame_bytes: usize,
}

impl<'a> FrameView<'a> {
    /// The `frames` frames of row `r`, back to back. Panics if `r` is out
    /// of range.
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} out of range: the batch has {} rows", self.rows);
        let at = self.offset + r * self.row_stride;
        &self.bytes[at..at + self.frames * self.frame_bytes]
    }

    /// The view copied out as a contiguous `[rows, frames, frame]` buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        (0..self.rows).flat_map(|r| self.row(r).iter().copied()).collect()
    }
}

/// The buffers of a transition batch (see the module doc).
pub struct TransitionBatch {
    layout: TransitionLayout,
    /// Per observation column: `[rows, k + n, *shape]`.
    frames: Vec<AlignedBytes>,
    /// Per observation column: `[rows, k, *shape]`, used when
    /// `separate_next` (allocated only when `n < k`).
    next: Vec<AlignedBytes>,
    separate_next: bool,
    /// Per row: its next observation does not fit the frames buffer.
    overlapping: Vec<bool>,
    /// Per step column: `[rows, *shape]`.
    columns: Vec<AlignedBytes>,
    rewards: Vec<f32>,
    dones: Vec<bool>,
    discounts: Vec<f32>,
    /// Steps of each row's return (`m'`).
    n_steps: Vec<u64>,
}

impl std::fmt::Debug for TransitionBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransitionBatch")
            .field("layout", &self.layout)
            .field("separate_next", &self.separate_next)
            .field("rewards", &self.rewards)
            .finish()
    }
}

fn alloc(bytes: usize, what: &str) -> Result<AlignedBytes> {
    AlignedBytes::zeroed(bytes, crate::BATCH_ALIGN)
        .map_err(|f| Error::Region(format!("cannot allocate {bytes} bytes for {what}: {}", f.reason())))
}

impl TransitionBatch {
    /// Zeroed buffers for `layout`.
    pub fn new(layout: &TransitionLayout) -> Result<Self> {
        let (rows, k, n) = (layout.rows, layout.k(), layout.n());
        let frames =
            layout.obs_bytes.iter().map(|&s| alloc(rows * (k + n) * s, "observation frames")).collect::<Result<_>>()?;
        let next = if n < k {
            layout.obs_bytes.iter().map(|&s| alloc(rows * k * s, "next observations")).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let columns = layout.step_bytes.iter().map(|&s| alloc(rows * s, "a step column")).collect::<Result<_>>()?;
        Ok(TransitionBatch {
            layout: layout.clone(),
            frames,
            next,
            separate_next: false,
            overlapping: vec![false; rows],
            columns,
            rewards: vec![0.0; rows],
            dones: vec![false; rows],
            discounts: vec![0.0; rows],
            n_steps: vec![0; rows],
        })
    }

    /// The layout.
    pub fn layout(&self) -> &TransitionLayout {
        &self.layout
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.layout.rows
    }

    /// The observations (the stack at `t`) of observation column `i`.
    /// Panics if `i` is out of range.
    pub fn observation(&self, i: usize) -> FrameView<'_> {
        let (k, n, s) = (self.layout.k(), self.layout.n(), self.layout.obs_bytes[i]);
        FrameView {
            bytes: self.frames[i].as_slice(),
            offset: 0,
            row_stride: (k + n) * s,
            rows: self.layout.rows,
            frames: k,
            frame_bytes: s,
        }
    }

    /// The next observations (the stack at `t + m'`) of observation
    /// column `i`: positions `n..n + k` of the frames buffer, or the
    /// buffer of their own in a batch that needed one (module doc).
    /// Panics if `i` is out of range.
    pub fn next_observation(&self, i: usize) -> FrameView<'_> {
        let (k, n, s) = (self.layout.k(), self.layout.n(), self.layout.obs_bytes[i]);
        let rows = self.layout.rows;
        if self.separate_next {
            FrameView { bytes: self.next[i].as_slice(), offset: 0, row_stride: k * s, rows, frames: k, frame_bytes: s }
        } else {
            FrameView {
                bytes: self.frames[i].as_slice(),
                offset: n * s,
                row_stride: (k + n) * s,
                rows,
                frames: k,
                frame_bytes: s,
            }
        }
    }

    /// Whether the next observations are in a buffer of their own in this
    /// batch.
    pub fn next_is_separate(&self) -> bool {
        self.separate_next
    }

    /// The whole frames buffer of observation column `i`, `[rows, k + n,
    /// *shape]`.
    pub fn frames(&self, i: usize) -> &[u8] {
        self.frames[i].as_slice()
    }

    /// Step column `j` at each row's `t`, `[rows, *shape]`.
    pub fn column(&self, j: usize) -> &[u8] {
        self.columns[j].as_slice()
    }

    /// [`TransitionBatch::frames`], writable: for bindings that hand the
    /// batch's memory out as writable arrays (the next gather overwrites
    /// every byte of it). Panics if `i` is out of range.
    pub fn frames_mut(&mut self, i: usize) -> &mut [u8] {
        self.frames[i].as_mut_slice()
    }

    /// The buffer of their own that observation column `i`'s next
    /// observations use in a batch where [`TransitionBatch::next_is_separate`],
    /// `[rows, k, *shape]`, writable; `None` when the layout never needs one
    /// (`n >= k`). Panics if `i` is out of range.
    pub fn next_frames_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        if self.next.is_empty() {
            return None;
        }
        Some(self.next[i].as_mut_slice())
    }

    /// [`TransitionBatch::column`], writable (see
    /// [`TransitionBatch::frames_mut`]). Panics if `j` is out of range.
    pub fn column_mut(&mut self, j: usize) -> &mut [u8] {
        self.columns[j].as_mut_slice()
    }

    /// Each row's discounted return.
    pub fn rewards(&self) -> &[f32] {
        &self.rewards
    }

    /// Whether each row's return ended at a terminal step.
    pub fn dones(&self) -> &[bool] {
        &self.dones
    }

    /// What each row's bootstrap value is multiplied by: `gamma^m'`, or 0
    /// after a terminal step.
    pub fn discounts(&self) -> &[f32] {
        &self.discounts
    }

    /// Steps each row's return sums (`m'`, at most `n`).
    pub fn n_steps(&self) -> &[u64] {
        &self.n_steps
    }
}

/// Gathers transition batches (see the module doc) from a host-addressable
/// table, through gear-core's [`Collector`] trait so the table's draw,
/// copy, validate and redraw protocol runs unchanged.
#[derive(Clone, Debug)]
pub struct TransitionCollector {
    layout: TransitionLayout,
}

impl TransitionCollector {
    /// A collector of batches of `layout`.
    pub fn new(layout: TransitionLayout) -> Self {
        TransitionCollector { layout }
    }

    /// The layout of its batches.
    pub fn layout(&self) -> &TransitionLayout {
        &self.layout
    }
}

/// Reads one element of a scalar column as `f64`.
fn element(bytes: &[u8], dtype: DType) -> f64 {
    let b2 = || u16::from_le_bytes([bytes[0], bytes[1]]);
    match dtype {
        DType::Bool | DType::U8 => f64::from(bytes[0]),
        DType::I8 => f64::from(bytes[0] as i8),
        DType::I16 => f64::from(b2() as i16),
        DType::I32 => f64::from(i32::from_le_bytes(bytes[..4].try_into().unwrap_or([0; 4]))),
        DType::I64 => i64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])) as f64,
        DType::F16 => f64::from(f16_to_f32(b2())),
        DType::BF16 => f64::from(f32::from_bits(u32::from(b2()) << 16)),
        DType::F32 => f64::from(f32::from_le_bytes(bytes[..4].try_into().unwrap_or([0; 4]))),
        DType::F64 => f64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])),
    }
}

/// IEEE half precision bits to `f32`.
fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = u32::from((bits >> 10) & 0x1f);
    let frac = u32::from(bits & 0x3ff);
    let v = match exp {
        0 => frac as f32 * (-24f32).exp2(),
        31 if frac == 0 => f32::INFINITY,
        31 => f32::NAN,
        _ => f32::from_bits(((exp + 112) << 23) | (frac << 13)),
    };
    sign * v
}

/// What one row's copy needs, decided before any byte is written.
#[derive(Clone, Copy, Debug)]
struct RowPlan {
    slot: u64,
    t: u64,
    /// First step of the episode `t` belongs to (stacks repeat it).
    episode_start: u64,
    /// Steps of the return (`m'`).
    m: u64,
    terminal: bool,
    reward: f64,
}

struct Source<'a> {
    bytes: SharedBytes<'a>,
    table: &'a Layout,
}

impl Source<'_> {
    fn scalar(&self, slot: u64, c: usize, step: u64, dtype: DType) -> f64 {
        let n = dtype.size() as usize;
        let mut buf = [0u8; 8];
        // SAFETY: `copy_to` writes copies of initialised bytes only.
        self.bytes.copy_to(self.table.offset(slot, c, step) as usize, unsafe { as_uninit(&mut buf[..n]) });
        element(&buf[..n], dtype)
    }

    fn steps(&self, slot: u64, c: usize, first: u64, dst: &mut [u8]) {
        // SAFETY: `copy_to` writes copies of initialised bytes only.
        self.bytes.copy_to(self.table.offset(slot, c, first) as usize, unsafe { as_uninit(dst) });
    }
}

impl TransitionCollector {
    fn check(&self, table: &Layout, rows: &[GatherRow], out: &TransitionBatch) -> Result<()> {
        if out.layout != self.layout {
            return Err(Error::InvalidWindow("the transition batch was made for another layout".into()));
        }
        if rows.len() != self.layout.rows {
            return Err(Error::InvalidWindow(format!(
                "{} rows given, the transition batch has {}",
                rows.len(),
                self.layout.rows
            )));
        }
        let cols = &self.layout.columns;
        let all =
            cols.observations.iter().chain(&cols.step_columns).chain(std::iter::once(&cols.reward)).chain(&cols.done);
        for (i, &c) in all.enumerate() {
            let want = match i {
                i if i < cols.observations.len() => self.layout.obs_bytes[i],
                i if i < cols.observations.len() + cols.step_columns.len() => {
                    self.layout.step_bytes[i - cols.observations.len()]
                }
                i if i == cols.observations.len() + cols.step_columns.len() => self.layout.reward_dtype.size() as usize,
                _ => self.layout.done_dtype.map_or(0, |d| d.size() as usize),
            };
            if c >= table.columns() || table.step_bytes(c) as usize != want {
                return Err(Error::InvalidWindow(format!(
                    "column {c} is not the one the transition layout was made for"
                )));
            }
        }
        for (r, row) in rows.iter().enumerate() {
            table.check_slot(u64::from(row.slot))?;
            row.check_len(r, table.max_len())?;
            if row.len < 2 {
                return Err(Error::InvalidWindow(format!(
                    "row {r} (slot {}) spans {} step(s) from step {}: a transition needs at least 2 (items made \
                     by ItemPattern::Transitions)",
                    row.slot, row.len, row.start
                )));
            }
        }
        Ok(())
    }

    fn plan(&self, src: &Source<'_>, row: &GatherRow) -> RowPlan {
        let rule = self.layout.rule;
        let cols = &self.layout.columns;
        let (slot, t) = (u64::from(row.slot), u64::from(row.start));
        let m = (row.len - 1).min(rule.n_step);
        let done = |step: u64| match (cols.done, self.layout.done_dtype) {
            (Some(c), Some(d)) => src.scalar(slot, c, step, d) != 0.0,
            _ => false,
        };
        // The episode of `t` began after the last done flag before it
        // (looking back only as far as the stack reaches).
        let lowest = t.saturating_sub(rule.frame_stack - 1);
        let episode_start = (lowest..t).rev().find(|&j| done(j)).map_or(0, |j| j + 1);
        let (mut steps, mut terminal) = (m, false);
        if let Some(i) = (0..m).find(|&i| done(t + i)) {
            steps = i + 1;
            terminal = true;
        }
        let mut reward = 0.0;
        let mut scale = 1.0;
        for i in 0..steps {
            reward += scale * src.scalar(slot, cols.reward, t + i, self.layout.reward_dtype);
            scale *= rule.gamma;
        }
        RowPlan { slot, t, episode_start, m: steps, terminal, reward }
    }

    /// Writes row `r` of every buffer but the separate next buffer.
    fn write_row(&self, src: &Source<'_>, p: &RowPlan, r: usize, out: &mut TransitionBatch) {
        let (k, n) = (self.layout.k(), self.layout.n());
        let rule = self.layout.rule;
        out.rewards[r] = p.reward as f32;
        out.dones[r] = p.terminal;
        out.discounts[r] = if p.terminal { 0.0 } else { rule.gamma.powi(p.m as i32) as f32 };
        out.n_steps[r] = p.m;
        out.overlapping[r] = self.layout.overlaps(p.m);
        for (j, &c) in self.layout.columns.step_columns.iter().enumerate() {
            let s = self.layout.step_bytes[j];
            src.steps(p.slot, c, p.t, &mut out.columns[j].as_mut_slice()[r * s..(r + 1) * s]);
        }
        // Position q of a row holds step `first + q` (obs part), clamped
        // to the episode's first step.
        let first = p.t as i64 - (k as i64 - 1);
        let lo = first.max(p.episode_start as i64) as u64;
        let p0 = (lo as i64 - first) as usize;
        for (i, &c) in self.layout.columns.observations.iter().enumerate() {
            let s = self.layout.obs_bytes[i];
            let row = &mut out.frames[i].as_mut_slice()[r * (k + n) * s..(r + 1) * (k + n) * s];
            src.steps(p.slot, c, lo, &mut row[p0 * s..k * s]);
            for q in 0..p0 {
                row.copy_within(p0 * s..(p0 + 1) * s, q * s);
            }
            if p.m == rule.n_step {
                // The common case: one run from t + 1 to t + n.
                src.steps(p.slot, c, p.t + 1, &mut row[k * s..(k + n) * s]);
            } else if n >= k {
                row[k * s..n * s].fill(0);
                for q in 0..k {
                    let step = next_step(p, k, q);
                    place(src, p, c, s, row, step, first, n + q);
                }
            } else {
                // The next stack overlaps the observation's positions: it
                // goes to the batch's own next buffer.
                row[k * s..(k + n) * s].fill(0);
            }
        }
    }

    /// Writes row `r` of the separate next buffer: from the frames already
    /// gathered, and the table for steps after `t`.
    fn write_next(&self, src: &Source<'_>, p: &RowPlan, r: usize, out: &mut TransitionBatch) {
        let (k, n) = (self.layout.k(), self.layout.n());
        let first = p.t as i64 - (k as i64 - 1);
        for (i, &c) in self.layout.columns.observations.iter().enumerate() {
            let s = self.layout.obs_bytes[i];
            let frames = &out.frames[i].as_slice()[r * (k + n) * s..(r + 1) * (k + n) * s];
            let next = &mut out.next[i].as_mut_slice()[r * k * s..(r + 1) * k * s];
            if !out.overlapping[r] {
                next.copy_from_slice(&frames[n * s..(n + k) * s]);
                continue;
            }
            for q in 0..k {
                let step = next_step(p, k, q);
                let dst = &mut next[q * s..(q + 1) * s];
                if step <= p.t {
                    let at = (step as i64 - first) as usize;
                    dst.copy_from_slice(&frames[at * s..(at + 1) * s]);
                } else {
                    src.steps(p.slot, c, step, dst);
                }
            }
        }
    }

    /// Gathers rows `which` (all rows when `None`).
    fn gather_rows(
        &self,
        view: &TableView<'_>,
        rows: &[GatherRow],
        which: Option<&[usize]>,
        out: &mut TransitionBatch,
    ) -> Result<()> {
        let table = view.layout();
        self.check(table, rows, out)?;
        if let Some(w) = which {
            if let Some(&r) = w.iter().find(|&&r| r >= rows.len()) {
                return Err(Error::InvalidWindow(format!("row {r} to gather again is out of range")));
            }
        }
        let bytes = SharedBytes::of_view(view).ok_or(Error::Unsupported(
            "the transition collector reads host memory, and this table has no host address",
        ))?;
        let src = Source { bytes, table };
        let all: Vec<usize>;
        let which = match which {
            Some(w) => w,
            None => {
                all = (0..rows.len()).collect();
                &all
            }
        };
        let plans: Vec<RowPlan> = which.iter().map(|&r| self.plan(&src, &rows[r])).collect();
        for (p, &r) in plans.iter().zip(which) {
            self.write_row(&src, p, r, out);
        }
        let separate = out.overlapping.iter().any(|&o| o);
        if separate {
            if !out.separate_next || which.len() == rows.len() {
                // Every row's next observation moves to the next buffer
                // (the rows not gathered now have theirs in their frames).
                let kept: Vec<RowPlan> = (0..rows.len())
                    .map(|r| match which.iter().position(|&w| w == r) {
                        Some(i) => plans[i],
                        None => self.plan(&src, &rows[r]),
                    })
                    .collect();
                for (r, p) in kept.iter().enumerate() {
                    self.write_next(&src, p, r, out);
                }
            } else {
                for (p, &r) in plans.iter().zip(which) {
                    self.write_next(&src, p, r, out);
                }
            }
        }
        out.separate_next = separate;
        Ok(())
    }
}

/// The step the next observation's position `q` holds: the stack at
/// `t + m'`, clamped to the episode's first step.
fn next_step(p: &RowPlan, k: usize, q: usize) -> u64 {
    let step = (p.t + p.m) as i64 - (k as i64 - 1) + q as i64;
    step.max(p.episode_start as i64) as u64
}

/// Copies `step` into position `to` of a frames row: from the row's own
/// observation part when the step is there (read once), else the table.
#[allow(clippy::too_many_arguments)]
fn place(src: &Source<'_>, p: &RowPlan, c: usize, s: usize, row: &mut [u8], step: u64, first: i64, to: usize) {
    if step <= p.t {
        let at = (step as i64 - first) as usize;
        row.copy_within(at * s..(at + 1) * s, to * s);
    } else {
        src.steps(p.slot, c, step, &mut row[to * s..(to + 1) * s]);
    }
}

impl Collector for TransitionCollector {
    type Batch = TransitionBatch;
    type Error = Error;

    fn alloc_batch(&self, layout: &BatchLayout) -> Result<TransitionBatch> {
        if layout.rows() != self.layout.rows {
            return Err(Error::InvalidWindow(format!(
                "a batch of {} rows asked of a transition collector of {}",
                layout.rows(),
                self.layout.rows
            )));
        }
        TransitionBatch::new(&self.layout)
    }

    fn gather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        _layout: &BatchLayout,
        out: &mut TransitionBatch,
    ) -> Result<()> {
        self.gather_rows(src, rows, None, out)
    }

    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        _layout: &BatchLayout,
        which: &[usize],
        out: &mut TransitionBatch,
    ) -> Result<()> {
        self.gather_rows(src, rows, Some(which), out)
    }

    fn lengths<'b>(&self, out: &'b TransitionBatch) -> &'b [u64] {
        &out.n_steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // Safe arithmetic, and Miri perturbs the float operations the reference
    // values use (its non-deterministic float precision), so the subnormal
    // case differs there only.
    #[cfg_attr(miri, ignore = "Miri's float operations are not exact")]
    fn half_floats_convert() {
        for v in [0.0f32, 1.0, -2.5, 0.5, 65504.0, 6.1035156e-5] {
            // Round-trip through the bit pattern half-precision stores.
            let bits = half_bits(v);
            assert_eq!(f16_to_f32(bits), v, "{v}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x0001), 5.9604645e-8, "subnormal");
        assert_eq!(element(&[0x80, 0x3f], DType::BF16), 1.0);
        assert_eq!(element(&[0xff], DType::I8), -1.0);
    }

    /// Half-precision bits of a value exactly representable in it.
    fn half_bits(v: f32) -> u16 {
        if v == 0.0 {
            return 0;
        }
        let b = v.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        let frac = ((b >> 13) & 0x3ff) as u16;
        sign | ((exp as u16) << 10) | frac
    }
}
