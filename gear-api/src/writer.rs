//! Actors write trajectories: begin, append steps (all columns at once or
//! column by column), end. Every step is checked against the spec before a
//! byte is copied, so a refused step leaves the table as it was.

use crate::error::{Error, Result};
use crate::table::ReplayTable;
use gear_core::{as_bytes, check_priority, DType, Element, ItemPattern, SlotKey, TableSpec};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The data of one column for one or more steps: bytes, and optionally the
/// dtype and shape they claim to have (checked against the spec).
#[derive(Clone, Copy, Debug)]
pub struct StepValue<'a> {
    bytes: &'a [u8],
    dtype: Option<DType>,
    shape: Option<&'a [u64]>,
}

impl<'a> StepValue<'a> {
    /// Raw bytes; only their length is checked.
    pub fn bytes(bytes: &'a [u8]) -> Self {
        StepValue { bytes, dtype: None, shape: None }
    }

    /// Typed elements; the element type must match the column's dtype.
    pub fn typed<T: Element>(values: &'a [T]) -> Self {
        StepValue { bytes: as_bytes(values), dtype: Some(T::DTYPE), shape: None }
    }

    /// Raw bytes with an explicit dtype (for f16/bf16 bit patterns).
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Declares the per-step shape; it must equal the column's.
    pub fn with_shape(mut self, shape: &'a [u64]) -> Self {
        self.shape = Some(shape);
        self
    }

    /// Checks this value as `steps` steps of column `c`.
    fn check(&self, table: &ReplayTable, c: usize, steps: u64) -> Result<()> {
        let col = &table.spec().columns()[c];
        if let Some(d) = self.dtype {
            if d != col.dtype() {
                return Err(
                    gear_core::Error::StepDType { column: col.name().into(), got: d, expected: col.dtype() }.into()
                );
            }
        }
        if let Some(shape) = self.shape {
            if shape != col.shape() {
                return Err(gear_core::Error::StepShape {
                    column: col.name().into(),
                    got: shape.to_vec(),
                    expected: col.shape().to_vec(),
                }
                .into());
            }
        }
        if col.dtype() == DType::Bool {
            if let Some(i) = self.bytes.iter().position(|&b| b > 1) {
                return Err(Error::Trajectory(format!(
                    "column `{}` is bool, but byte {i} is {} (bools are stored as 0 or 1)",
                    col.name(),
                    self.bytes[i]
                )));
            }
        }
        // Per step from the precomputed layout; `steps` is the caller's, so
        // the product is checked.
        let expected = table.shared.region.layout().step_bytes(c).saturating_mul(steps);
        if self.bytes.len() as u64 != expected {
            return Err(gear_core::Error::StepSize {
                column: col.name().into(),
                got: self.bytes.len() as u64,
                expected,
            }
            .into());
        }
        Ok(())
    }
}

/// A column named by index or by name.
pub trait ColumnId {
    /// The column's index in `spec`.
    fn index_in(&self, spec: &TableSpec) -> Result<usize>;
}

impl ColumnId for usize {
    fn index_in(&self, spec: &TableSpec) -> Result<usize> {
        if *self < spec.columns().len() {
            Ok(*self)
        } else {
            Err(gear_core::Error::ColumnIndex { index: *self, count: spec.columns().len() }.into())
        }
    }
}

impl ColumnId for &str {
    fn index_in(&self, spec: &TableSpec) -> Result<usize> {
        Ok(spec.column_index(self)?)
    }
}

/// Hands out trajectory writers. One per actor thread.
#[derive(Clone, Debug)]
pub struct Writer {
    table: ReplayTable,
    timeout: Option<Duration>,
}

impl Writer {
    pub(crate) fn new(table: ReplayTable) -> Self {
        Writer { table, timeout: None }
    }

    /// How long `begin` may wait for the rate limiter (default: forever).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Inserts `count` trajectories of `steps` steps each in one call: the
    /// batched form of [`Writer::begin`], [`Trajectory::append_column`] and
    /// [`Trajectory::end`] for small items (transitions from vectorised
    /// environments), which takes the table's lock twice per batch instead
    /// of twice per trajectory.
    ///
    /// `columns[c]` holds column `c` of every trajectory, one after the
    /// other: `count * steps` steps. `priorities`, when given, holds one
    /// priority per trajectory; `None` lets the strategy choose, as
    /// `begin(None)` does. Returns the keys in order.
    ///
    /// Every check (column count, dtypes, shapes, byte lengths, priorities)
    /// runs before a slot is taken, so bad input changes nothing. The
    /// trajectories go in whole, in order; when the rate limiter makes the
    /// call wait, those before are already committed. On an error after
    /// the checks (a timeout, a closed table, a strategy refusing an item)
    /// the call stops: the trajectories before the failing one stay, it
    /// and the rest are not inserted.
    pub fn insert_batch(
        &self,
        count: usize,
        steps: u64,
        columns: &[StepValue<'_>],
        priorities: Option<&[f64]>,
    ) -> Result<Vec<SlotKey>> {
        self.check_batch(count, steps, columns, priorities)?;
        let mut keys = Vec::with_capacity(count);
        while keys.len() < count {
            let batch = self.insert_round(keys.len(), count, steps, columns, priorities)?;
            keys.extend(batch);
        }
        Ok(keys)
    }

    /// One round of [`Writer::insert_batch`], for callers that must regain
    /// control between waits (the Python binding runs signal handlers
    /// there): inserts trajectories `first..count` of the batch, as many as
    /// the rate limiter admits after one wait, at least one, and returns
    /// their keys. On a timeout (of the wait or of the table lock) nothing
    /// of this round was inserted, so the round can be retried; other
    /// errors are those of [`Writer::insert_batch`]. Rounds before it stay.
    pub fn insert_batch_round(
        &self,
        first: usize,
        count: usize,
        steps: u64,
        columns: &[StepValue<'_>],
        priorities: Option<&[f64]>,
    ) -> Result<Vec<SlotKey>> {
        self.check_batch(count, steps, columns, priorities)?;
        if first >= count {
            return Err(Error::Trajectory(format!("round starts at trajectory {first} of a batch of {count}")));
        }
        self.insert_round(first, count, steps, columns, priorities)
    }

    /// Every check of [`Writer::insert_batch`], before a slot is taken.
    fn check_batch(
        &self,
        count: usize,
        steps: u64,
        columns: &[StepValue<'_>],
        priorities: Option<&[f64]>,
    ) -> Result<()> {
        let spec = self.table.spec();
        if columns.len() != spec.columns().len() {
            return Err(gear_core::Error::StepColumns { got: columns.len(), expected: spec.columns().len() }.into());
        }
        if steps == 0 {
            return Err(Error::Trajectory("an empty trajectory cannot be committed".into()));
        }
        if count as u64 > spec.capacity() {
            return Err(Error::Trajectory(format!(
                "a batch of {count} trajectories does not fit a table of {} slots: later ones would evict \
                 earlier ones of the same call",
                spec.capacity()
            )));
        }
        if steps > spec.max_len() {
            return Err(gear_core::Error::TrajectoryTooLong {
                column: spec.columns()[0].name().into(),
                max_len: spec.max_len(),
            }
            .into());
        }
        let total = (count as u64).checked_mul(steps).ok_or_else(|| {
            Error::Trajectory(format!("{count} trajectories of {steps} steps overflow a 64-bit step count"))
        })?;
        for (c, v) in columns.iter().enumerate() {
            v.check(&self.table, c, total)?;
        }
        if let Some(p) = priorities {
            if p.len() != count {
                return Err(Error::Trajectory(format!("{} priorities given for {count} trajectories", p.len())));
            }
            if !gear_core::all_priorities_valid(p) {
                for &p in p {
                    check_priority(p)?;
                }
            }
        }
        let sh = &self.table.shared;
        if sh.items_per_slot > 0 {
            crate::table::items::check_pattern_fits(&sh.item_pattern(), steps, sh.items_per_slot)?;
        }
        Ok(())
    }

    /// Takes slots for trajectories `done..count` (at least one, after one
    /// rate-limiter wait), writes and commits them.
    fn insert_round(
        &self,
        done: usize,
        count: usize,
        steps: u64,
        columns: &[StepValue<'_>],
        priorities: Option<&[f64]>,
    ) -> Result<Vec<SlotKey>> {
        let priority = |i: usize| priorities.map_or(0.0, |p| p[done + i]);
        let batch = self.table.begin_slots(count - done, priority, self.timeout)?;
        if let Err(e) = self.write_batch(&batch, done, steps, columns) {
            for &key in &batch {
                self.table.abandon_slot(key);
            }
            return Err(e);
        }
        self.table.commit_slots(&batch, priorities.map(|p| &p[done..done + batch.len()]), self.timeout)?;
        Ok(batch)
    }

    /// Writes and publishes trajectories `first..` of a checked batch into
    /// the slots of `keys` ([`gear_core::TableRegion::write_batch`]: sizes
    /// checked once, each key once for all its columns).
    fn write_batch(&self, keys: &[SlotKey], first: usize, steps: u64, columns: &[StepValue<'_>]) -> Result<()> {
        let region = &self.table.shared.region;
        let bytes: Vec<&[u8]> = columns.iter().map(|v| v.bytes).collect();
        region.write_batch(keys, first, steps, &bytes)?;
        // Checked by `insert_batch`: `count * steps` steps of every column
        // fit in the spec's sizes, so this product does too.
        let per_item = region.layout().row_bytes() * steps;
        region.control().bytes_written.fetch_add(per_item * keys.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Starts a trajectory. `priority` is used when the trajectory commits;
    /// with `None` the sampling strategy chooses (prioritized replay gives
    /// the largest priority seen). Waits while the rate limiter holds
    /// writers back; takes a free slot or evicts one.
    pub fn begin(&self, priority: Option<f64>) -> Result<Trajectory> {
        if let Some(p) = priority {
            check_priority(p)?;
        }
        let key = self.table.begin_slot(priority.unwrap_or(0.0), self.timeout)?;
        let columns = self.table.spec().columns().len();
        Ok(Trajectory {
            table: self.table.clone(),
            key,
            priority,
            timeout: self.timeout,
            written: StepCounts::zeros(columns),
            unflushed_bytes: 0,
            published: 0,
            items: 0,
            own_items: false,
            done: false,
        })
    }
}

/// A trajectory being written. Dropping it without [`Trajectory::end`]
/// abandons it: its slot is freed and nothing else changes.
#[derive(Debug)]
pub struct Trajectory {
    table: ReplayTable,
    key: SlotKey,
    priority: Option<f64>,
    /// The writer's timeout, which the commit honours too.
    timeout: Option<Duration>,
    /// Steps written per column.
    written: StepCounts,
    /// Bytes written but not yet added to the table's `bytes_written`
    /// counter (added once per trajectory: the counter's cache line is
    /// shared by every writer process).
    unflushed_bytes: u64,
    /// Steps published (readable by samplers): the minimum of `written`.
    published: u64,
    /// Items added with [`Trajectory::add_item`] (the next one's record).
    items: u32,
    /// Whether the writer chose the items itself ([`Trajectory::add_item`]
    /// or [`Trajectory::add_items`], even of no window): the table's
    /// pattern then does not apply.
    own_items: bool,
    done: bool,
}

impl Trajectory {
    /// Changes how long [`Trajectory::end`] may wait for the table lock
    /// (by default, the timeout of the writer that began it; `None`: as
    /// long as it takes).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
    }

    /// The key this trajectory will be stored under.
    pub fn key(&self) -> SlotKey {
        self.key
    }

    /// Steps complete in every column.
    pub fn len(&self) -> u64 {
        self.published
    }

    /// Whether no complete step was written yet.
    pub fn is_empty(&self) -> bool {
        self.published == 0
    }

    /// Adds an item over steps `[start, start + len)` of this trajectory,
    /// which must already be written (in every column): the item becomes
    /// selectable when the trajectory commits, with `priority` (`None`:
    /// the trajectory's priority if it was begun with one, else the
    /// sampling strategy's choice). A trajectory with items of its own
    /// does not get the table's [`ItemPattern`]. Returns the item's key.
    /// If the writer dies before committing, the items it added are kept
    /// with the steps it published (they lie inside them).
    pub fn add_item(&mut self, start: u64, len: u64, priority: Option<f64>) -> Result<SlotKey> {
        if self.done {
            return Err(Error::Trajectory(format!("trajectory {} already ended", self.key)));
        }
        let key = crate::table::items::add_pending_item(
            &self.table,
            self.key,
            self.items,
            start,
            len,
            self.published,
            priority,
        )?;
        self.items += 1;
        self.own_items = true;
        Ok(key)
    }

    /// [`Trajectory::add_item`] of each window `pattern` gives the steps
    /// written so far (for example at the end of an episode), each with
    /// `priority`. The trajectory's items are then the writer's, even
    /// when the pattern gives none (the table's pattern does not apply).
    /// Returns the items' keys; on an error, those added before it stay.
    pub fn add_items(&mut self, pattern: ItemPattern, priority: Option<f64>) -> Result<Vec<SlotKey>> {
        self.table.shared.check_has_items("add items")?;
        pattern.validate()?;
        self.own_items = true;
        let room = self.table.shared.items_per_slot.saturating_sub(self.items);
        crate::table::items::check_pattern_fits(&pattern, self.published, room)?;
        pattern.windows(self.published).map(|(start, len)| self.add_item(start, len, priority)).collect()
    }

    /// Appends one step of every column, in spec order. All columns are
    /// checked before any is written.
    pub fn append_step(&mut self, values: &[StepValue<'_>]) -> Result<()> {
        let spec = self.table.spec();
        if values.len() != spec.columns().len() {
            return Err(gear_core::Error::StepColumns { got: values.len(), expected: spec.columns().len() }.into());
        }
        for (c, v) in values.iter().enumerate() {
            v.check(&self.table, c, 1)?;
            self.check_room(c, 1)?;
        }
        for (c, v) in values.iter().enumerate() {
            self.write(c, v.bytes, 1)?;
        }
        self.publish()
    }

    /// Appends `steps` steps of one column (`value` holds them back to
    /// back). Steps become readable once every column has them.
    pub fn append_column(&mut self, column: impl ColumnId, steps: u64, value: StepValue<'_>) -> Result<()> {
        let c = column.index_in(self.table.spec())?;
        self.check_room(c, steps)?;
        value.check(&self.table, c, steps)?;
        self.write(c, value.bytes, steps)?;
        self.publish()
    }

    fn check_room(&self, c: usize, steps: u64) -> Result<()> {
        if self.done {
            return Err(Error::Trajectory(format!("trajectory {} already ended", self.key)));
        }
        let spec = self.table.spec();
        if self.written[c].checked_add(steps).is_none_or(|n| n > spec.max_len()) {
            return Err(gear_core::Error::TrajectoryTooLong {
                column: spec.columns()[c].name().into(),
                max_len: spec.max_len(),
            }
            .into());
        }
        Ok(())
    }

    fn write(&mut self, c: usize, bytes: &[u8], steps: u64) -> Result<()> {
        let region = &self.table.shared.region;
        region.write_steps(self.key, c, self.written[c], bytes)?;
        self.written[c] += steps;
        self.unflushed_bytes += bytes.len() as u64;
        Ok(())
    }

    fn publish(&mut self) -> Result<()> {
        let complete = self.written.iter().copied().min().unwrap_or(0);
        if complete != self.published {
            self.table.shared.region.slot(self.key.slot)?.publish_len(self.key, complete)?;
            if self.published == 0 {
                // Tables that sample while writing make it selectable now.
                if let Some(assigned) = self.table.publish_first(self.key, self.priority)? {
                    self.priority = Some(assigned);
                }
            }
            self.published = complete;
        }
        Ok(())
    }

    /// Commits the trajectory: it becomes selectable and its key is
    /// returned. Every column must have the same number of steps, at least
    /// one. On a length error nothing changes and the trajectory can be
    /// completed and ended again.
    pub fn end(&mut self) -> Result<SlotKey> {
        if self.done {
            return Err(Error::Trajectory(format!("trajectory {} already ended", self.key)));
        }
        let longest = self.written.iter().copied().max().unwrap_or(0);
        if longest != self.published {
            let spec = self.table.spec();
            let short = self.written.iter().position(|&w| w == self.published).unwrap_or(0);
            let long = self.written.iter().position(|&w| w == longest).unwrap_or(0);
            return Err(Error::Trajectory(format!(
                "column `{}` has {} steps but column `{}` has {}; every column needs the same length",
                spec.columns()[short].name(),
                self.published,
                spec.columns()[long].name(),
                longest
            )));
        }
        if self.published == 0 {
            return Err(Error::Trajectory("an empty trajectory cannot be committed".into()));
        }
        let sh = &self.table.shared;
        if sh.items_per_slot > 0 && !self.own_items {
            // Checked before the commit, so a trajectory the table's
            // pattern cannot cover stays open instead of being lost.
            crate::table::items::check_pattern_fits(&sh.item_pattern(), self.published, sh.items_per_slot)?;
        }
        // Whatever commit_slot returns, the slot is no longer ours: on error
        // it has already been given back.
        self.done = true;
        self.flush_bytes();
        self.table.commit_slot(self.key, self.priority, self.timeout, !self.own_items)?;
        Ok(self.key)
    }
}

impl Trajectory {
    /// Adds the bytes written so far to the table's counter.
    fn flush_bytes(&mut self) {
        let n = std::mem::take(&mut self.unflushed_bytes);
        if n > 0 {
            self.table.shared.region.control().bytes_written.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Steps written per column: inline for tables of up to
/// [`StepCounts::INLINE`] columns, so beginning a trajectory allocates
/// nothing (small-item workloads begin millions per second).
#[derive(Clone, Debug)]
enum StepCounts {
    Inline { len: usize, counts: [u64; StepCounts::INLINE] },
    Heap(Vec<u64>),
}

impl StepCounts {
    const INLINE: usize = 8;

    fn zeros(columns: usize) -> Self {
        if columns <= Self::INLINE {
            StepCounts::Inline { len: columns, counts: [0; Self::INLINE] }
        } else {
            StepCounts::Heap(vec![0; columns])
        }
    }
}

impl std::ops::Deref for StepCounts {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            StepCounts::Inline { len, counts } => &counts[..*len],
            StepCounts::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for StepCounts {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            StepCounts::Inline { len, counts } => &mut counts[..*len],
            StepCounts::Heap(v) => v,
        }
    }
}

impl Drop for Trajectory {
    fn drop(&mut self) {
        self.flush_bytes();
        if !self.done {
            self.table.abandon_slot(self.key);
        }
    }
}
