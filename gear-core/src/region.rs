//! A table inside a memory region: header, slot records, data.
//!
//! ```text
//! 0              64             control_offset                        slots_offset            items_offset                         data_offset
//! | fixed header | encoded spec | ControlBlock | free list | change log | SlotRecord x capacity | ItemRecord x capacity x M | data |
//! ```
//!
//! (`M` is the spec's items per trajectory; the item area is empty when
//! it is 0.)
//!
//! The fixed header holds a magic, the format version, a `ready` word the
//! creator sets last (release) so an attacher never reads a half-written
//! header, and the offsets, which an attacher recomputes from the stored
//! spec and compares. Any mismatch is an error, never a panic or SIGBUS:
//! the region may come from another process or be a file that is not ours.

use crate::control::{log_entries, ControlBlock, LogEntry};
use crate::error::{Error, Result};
use crate::item::ItemRecord;
use crate::layout::Layout;
use crate::memory::MemoryRegion;
use crate::slot::{SlotKey, SlotRecord, SlotState};
use crate::spec::TableSpec;
use crate::sync::{AtomicU32, Ordering};
use std::ptr::NonNull;

/// First eight bytes of every table region.
pub const MAGIC: [u8; 8] = *b"GEARTBL\0";
/// Region format version; bumped on any layout change (4: the wait list;
/// 5: item records).
pub const FORMAT_VERSION: u32 = 5;
/// Bytes of the fixed header before the encoded spec.
pub const FIXED_HEADER_BYTES: u64 = 64;
/// Alignment of the data area (a page, so windows start page-aligned
/// when the slot stride is a page multiple).
pub const DATA_ALIGN: u64 = 4096;

const OFF_VERSION: usize = 8;
const OFF_READY: usize = 12;
const OFF_SPEC_LEN: usize = 16;
const OFF_SLOTS: usize = 24;
const OFF_DATA: usize = 32;
const OFF_TOTAL: usize = 40;
const OFF_CREATOR: usize = 48;

const READY: u32 = 1;

/// Where the parts of a table region are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionLayout {
    /// Encoded spec length.
    pub spec_bytes: u64,
    /// Offset of the [`ControlBlock`].
    pub control_offset: u64,
    /// Offset of the free list (`u32` x capacity).
    pub free_offset: u64,
    /// Offset of the change log.
    pub log_offset: u64,
    /// Entries in the change log ([`log_entries`] of the capacity).
    pub log_entries: u64,
    /// Offset of the slot records.
    pub slots_offset: u64,
    /// Offset of the item records (`capacity * items_per_trajectory` of
    /// them; none for a table without items).
    pub items_offset: u64,
    /// Offset of the data area.
    pub data_offset: u64,
    /// Bytes the whole region needs.
    pub total_bytes: u64,
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x / a * a)
}

impl RegionLayout {
    /// The region layout a spec needs.
    pub fn for_spec(spec: &TableSpec) -> Result<Self> {
        let overflow = || Error::SizeOverflow("table region".into());
        let spec_bytes = spec.encode().len() as u64;
        let control_offset = align_up(FIXED_HEADER_BYTES + spec_bytes, 64).ok_or_else(overflow)?;
        let free_offset = control_offset + std::mem::size_of::<ControlBlock>() as u64;
        let free_bytes = spec.capacity().checked_mul(4).ok_or_else(overflow)?;
        let log_offset =
            align_up(free_offset.checked_add(free_bytes).ok_or_else(overflow)?, 64).ok_or_else(overflow)?;
        // Each committed trajectory logs one entry per item: size the ring
        // by whichever is more, slots or items.
        let log_entries = log_entries(spec.capacity().max(spec.item_capacity()));
        let log_bytes = log_entries.checked_mul(std::mem::size_of::<LogEntry>() as u64).ok_or_else(overflow)?;
        let slots_offset =
            align_up(log_offset.checked_add(log_bytes).ok_or_else(overflow)?, 64).ok_or_else(overflow)?;
        let slots_bytes = spec.capacity().checked_mul(std::mem::size_of::<SlotRecord>() as u64).ok_or_else(overflow)?;
        let items_offset =
            align_up(slots_offset.checked_add(slots_bytes).ok_or_else(overflow)?, 64).ok_or_else(overflow)?;
        let items_bytes =
            spec.item_capacity().checked_mul(std::mem::size_of::<ItemRecord>() as u64).ok_or_else(overflow)?;
        let data_offset =
            align_up(items_offset.checked_add(items_bytes).ok_or_else(overflow)?, DATA_ALIGN).ok_or_else(overflow)?;
        let total_bytes = data_offset.checked_add(Layout::new(spec)?.total_bytes()).ok_or_else(overflow)?;
        usize::try_from(total_bytes).map_err(|_| overflow())?;
        Ok(RegionLayout {
            spec_bytes,
            control_offset,
            free_offset,
            log_offset,
            log_entries,
            slots_offset,
            items_offset,
            data_offset,
            total_bytes,
        })
    }
}

/// A short human summary of a spec for error messages.
pub fn summarize(spec: &TableSpec) -> String {
    let cols: Vec<String> =
        spec.columns().iter().map(|c| format!("{}:{}{:?}", c.name(), c.dtype(), c.shape())).collect();
    let items = match spec.items_per_trajectory() {
        0 => String::new(),
        m => format!(" with {m} items per trajectory"),
    };
    format!("[{}] x T={} x capacity={}{items}", cols.join(", "), spec.max_len(), spec.capacity())
}

/// A table laid out in a memory region. Owns the region; all access to the
/// slot records and data goes through it.
pub struct TableRegion<R: MemoryRegion> {
    region: R,
    base: NonNull<u8>,
    spec: TableSpec,
    layout: Layout,
    region_layout: RegionLayout,
}

// SAFETY: the raw base pointer is derived from `region`, which is Send+Sync
// (a MemoryRegion promise); concurrent access goes through atomics or the
// documented seqlock protocol.
unsafe impl<R: MemoryRegion> Send for TableRegion<R> {}
// SAFETY: see Send.
unsafe impl<R: MemoryRegion> Sync for TableRegion<R> {}

impl<R: MemoryRegion> std::fmt::Debug for TableRegion<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableRegion")
            .field("kind", &self.region.kind())
            .field("name", &self.region.name())
            .field("spec", &summarize(&self.spec))
            .finish()
    }
}

fn host_base<R: MemoryRegion>(region: &R) -> Result<NonNull<u8>> {
    let base = region.host_ptr().ok_or(Error::Unsupported("a table region needs host-addressable memory"))?;
    if !(base.as_ptr() as usize).is_multiple_of(64) {
        return Err(Error::Region("region is not 64-byte aligned".into()));
    }
    Ok(base)
}

impl<R: MemoryRegion> TableRegion<R> {
    /// Lays a new, empty table out in `region`: writes the header, clears
    /// the slot records, and marks the region ready.
    pub fn create(region: R, spec: &TableSpec) -> Result<Self> {
        let rl = RegionLayout::for_spec(spec)?;
        if region.len() < rl.total_bytes {
            return Err(Error::Region(format!(
                "region has {} bytes, the table needs {}",
                region.len(),
                rl.total_bytes
            )));
        }
        let base = host_base(&region)?;
        let encoded = spec.encode();
        let mut fixed = [0u8; FIXED_HEADER_BYTES as usize];
        fixed[..8].copy_from_slice(&MAGIC);
        fixed[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        fixed[OFF_SPEC_LEN..OFF_SPEC_LEN + 4].copy_from_slice(&(encoded.len() as u32).to_le_bytes());
        fixed[OFF_SLOTS..OFF_SLOTS + 8].copy_from_slice(&rl.slots_offset.to_le_bytes());
        fixed[OFF_DATA..OFF_DATA + 8].copy_from_slice(&rl.data_offset.to_le_bytes());
        fixed[OFF_TOTAL..OFF_TOTAL + 8].copy_from_slice(&rl.total_bytes.to_le_bytes());
        fixed[OFF_CREATOR..OFF_CREATOR + 8].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        // SAFETY: the region holds at least `total_bytes` >= header + spec +
        // slots bytes (checked above); nobody attaches before `ready` is set.
        unsafe {
            let p = base.as_ptr();
            std::ptr::write_bytes(p, 0, rl.data_offset as usize);
            std::ptr::copy_nonoverlapping(fixed.as_ptr(), p, fixed.len());
            std::ptr::copy_nonoverlapping(encoded.as_ptr(), p.add(FIXED_HEADER_BYTES as usize), encoded.len());
        }
        let t = TableRegion { region, base, spec: spec.clone(), layout: Layout::new(spec)?, region_layout: rl };
        t.ready_word().store(READY, Ordering::Release);
        Ok(t)
    }

    /// Opens a table another party laid out in `region`. With `expected`,
    /// the stored spec must equal it.
    pub fn open(region: R, expected: Option<&TableSpec>) -> Result<Self> {
        let len = region.len();
        if len < FIXED_HEADER_BYTES {
            return Err(Error::Decode(format!(
                "region has {len} bytes, too small for a table header ({FIXED_HEADER_BYTES})"
            )));
        }
        let base = host_base(&region)?;
        let mut fixed = [0u8; FIXED_HEADER_BYTES as usize];
        // SAFETY: len >= FIXED_HEADER_BYTES, checked above.
        unsafe { std::ptr::copy_nonoverlapping(base.as_ptr(), fixed.as_mut_ptr(), fixed.len()) };
        if fixed[..8] != MAGIC {
            return Err(Error::Decode("not a GEAR table (bad magic)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(fixed[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(fixed[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(OFF_VERSION);
        if version != FORMAT_VERSION {
            return Err(Error::Decode(format!("format version {version}, this build reads version {FORMAT_VERSION}")));
        }
        // SAFETY: the ready word is inside the checked header; it is an
        // aligned u32 (base is 64-byte aligned, offset 12).
        let ready = unsafe { &*base.as_ptr().add(OFF_READY).cast::<AtomicU32>() }.load(Ordering::Acquire);
        if ready != READY {
            return Err(Error::Decode("table is not initialised yet (its creator has not finished)".into()));
        }
        let spec_len = u64::from(u32_at(OFF_SPEC_LEN));
        if FIXED_HEADER_BYTES + spec_len > len {
            return Err(Error::Decode(format!("truncated: spec of {spec_len} bytes runs past the {len}-byte region")));
        }
        let mut encoded = vec![0u8; spec_len as usize];
        // SAFETY: header + spec_len <= len, checked above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                base.as_ptr().add(FIXED_HEADER_BYTES as usize),
                encoded.as_mut_ptr(),
                encoded.len(),
            )
        };
        let spec = TableSpec::decode(&encoded)?;
        let rl = RegionLayout::for_spec(&spec)?;
        if (u64_at(OFF_SLOTS), u64_at(OFF_DATA), u64_at(OFF_TOTAL)) != (rl.slots_offset, rl.data_offset, rl.total_bytes)
        {
            return Err(Error::Decode("header offsets disagree with the stored spec".into()));
        }
        if len < rl.total_bytes {
            return Err(Error::Decode(format!(
                "truncated: region has {len} bytes, the stored table needs {}",
                rl.total_bytes
            )));
        }
        if let Some(want) = expected {
            if *want != spec {
                return Err(Error::SpecMismatch { expected: summarize(want), found: summarize(&spec) });
            }
        }
        Ok(TableRegion { region, base, layout: Layout::new(&spec)?, spec, region_layout: rl })
    }

    fn ready_word(&self) -> &AtomicU32 {
        // SAFETY: offset 12 of a 64-byte aligned region of at least 64 bytes
        // is an aligned u32 that lives as long as `self.region`.
        unsafe { &*self.base.as_ptr().add(OFF_READY).cast::<AtomicU32>() }
    }

    /// The stored spec.
    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// The data layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Where header, slots and data are.
    pub fn region_layout(&self) -> &RegionLayout {
        &self.region_layout
    }

    /// The underlying memory region.
    pub fn region(&self) -> &R {
        &self.region
    }

    /// Process id of the creator, as stored in the header.
    pub fn creator_pid(&self) -> u64 {
        // SAFETY: offset 48 is inside the checked 64-byte header.
        unsafe { std::ptr::read_unaligned(self.base.as_ptr().add(OFF_CREATOR).cast::<u64>()) }
    }

    /// The shared control block.
    pub fn control(&self) -> &ControlBlock {
        // SAFETY: the control area lies inside the region (checked at
        // create/open), is 64-byte aligned, and any bit pattern is a valid
        // `ControlBlock` (atomics only).
        unsafe { &*self.base.as_ptr().add(self.region_layout.control_offset as usize).cast::<ControlBlock>() }
    }

    /// The shared free list (its first `control().free_len` entries are in
    /// use; guarded by the table lock).
    pub fn free_list(&self) -> &[AtomicU32] {
        // SAFETY: `capacity` u32 words inside the region, 4-byte aligned;
        // any bit pattern is a valid AtomicU32.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.region_layout.free_offset as usize).cast::<AtomicU32>(),
                self.spec.capacity() as usize,
            )
        }
    }

    /// The change log ring (guarded by the table lock).
    pub fn log(&self) -> &[LogEntry] {
        // SAFETY: log_entries entries inside the region, 64-byte aligned;
        // any bit pattern is a valid LogEntry (atomics only).
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.region_layout.log_offset as usize).cast::<LogEntry>(),
                self.region_layout.log_entries as usize,
            )
        }
    }

    /// All slot records.
    pub fn slots(&self) -> &[SlotRecord] {
        // SAFETY: the slot area lies inside the region (checked at
        // create/open), is 64-byte aligned, and an all-zero or any other bit
        // pattern is a valid `SlotRecord` (it is made of atomics only).
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.region_layout.slots_offset as usize).cast::<SlotRecord>(),
                self.spec.capacity() as usize,
            )
        }
    }

    /// The record of one slot.
    pub fn slot(&self, slot: u32) -> Result<&SlotRecord> {
        self.slots()
            .get(slot as usize)
            .ok_or_else(|| Error::SlotOutOfRange { slot: u64::from(slot), capacity: self.spec.capacity() })
    }

    /// All item records (`capacity * items_per_trajectory`; empty for a
    /// table without items).
    pub fn items(&self) -> &[ItemRecord] {
        // SAFETY: the item area lies inside the region (its size is part
        // of the layout checked at create/open), is 64-byte aligned, and
        // any bit pattern is a valid `ItemRecord` (atomics only).
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.region_layout.items_offset as usize).cast::<ItemRecord>(),
                self.spec.item_capacity() as usize,
            )
        }
    }

    /// The item records of one slot (empty for a table without items).
    pub fn items_of(&self, slot: u32) -> &[ItemRecord] {
        let m = self.spec.items_per_trajectory() as usize;
        let first = slot as usize * m;
        self.items().get(first..first + m).unwrap_or(&[])
    }

    /// The slot an item index belongs to (`None` when the index is beyond
    /// the table's items).
    pub fn item_slot(&self, index: u32) -> Option<u32> {
        let m = self.spec.items_per_trajectory();
        (u64::from(index) < self.spec.item_capacity()).then(|| (u64::from(index) / m) as u32)
    }

    /// Host address of the data area.
    pub fn data_ptr(&self) -> NonNull<u8> {
        // SAFETY: data_offset < total_bytes <= region length.
        unsafe { self.base.add(self.region_layout.data_offset as usize) }
    }

    /// Device address of the data area, when the region is device-mapped.
    pub fn data_device_ptr(&self) -> Option<u64> {
        self.region.device_ptr().map(|p| p + self.region_layout.data_offset)
    }

    /// What a collector needs to read the data area.
    pub fn view(&self) -> TableView<'_> {
        TableView { host: Some(self.data_ptr()), device: self.data_device_ptr(), layout: &self.layout }
    }

    /// Copies whole steps of one column into a slot being written, starting
    /// at `first_step`. Refused unless `key` is current and `Writing`, the
    /// bytes are a whole number of steps and fit below `T`. Does not publish:
    /// see [`SlotRecord::publish_len`].
    pub fn write_steps(&self, key: SlotKey, column: usize, first_step: u64, bytes: &[u8]) -> Result<()> {
        let rec = self.slot(key.slot)?;
        rec.check(key, SlotState::Writing, "append steps")?;
        let col = self
            .spec
            .columns()
            .get(column)
            .ok_or_else(|| Error::ColumnIndex { index: column, count: self.spec.columns().len() })?;
        let s = self.layout.step_bytes(column);
        let n = bytes.len() as u64;
        if !n.is_multiple_of(s) {
            return Err(Error::StepSize { column: col.name().to_owned(), got: n, expected: s });
        }
        let steps = n / s;
        if first_step.checked_add(steps).is_none_or(|end| end > self.spec.max_len()) {
            return Err(Error::TrajectoryTooLong { column: col.name().to_owned(), max_len: self.spec.max_len() });
        }
        let off = self.layout.offset(u64::from(key.slot), column, first_step) as usize;
        // SAFETY: the range [off, off+n) lies inside this slot's column (the
        // checks above), inside the data area. The slot is `Writing`, so its
        // owner is the only writer; concurrent readers follow the seqlock
        // protocol and discard copies that raced with a reuse.
        unsafe { crate::copy::copy_bytes(bytes.as_ptr(), self.data_ptr().as_ptr().add(off), bytes.len()) };
        Ok(())
    }

    /// Writes trajectories `first..first + keys.len()` of a batch of
    /// trajectories of `steps` steps each into the slots of `keys` (being
    /// written), every column, and publishes their `steps` steps: column
    /// `c` of trajectory `i` is `columns[c][i * steps * s[c]..][..steps *
    /// s[c]]`. The small-item form of [`TableRegion::write_steps`] and
    /// [`SlotRecord::publish_len`]: the sizes are checked once per batch,
    /// each key once for all its columns, and nothing is divided.
    ///
    /// Refused, with nothing copied, unless `steps <= T`, there is one
    /// slice per column and each holds the batch's bytes. A key that is not
    /// current and `Writing` stops the batch with an error; the trajectories
    /// before it are written and published.
    pub fn write_batch(&self, keys: &[SlotKey], first: usize, steps: u64, columns: &[&[u8]]) -> Result<()> {
        if columns.len() != self.layout.columns() {
            return Err(Error::StepColumns { got: columns.len(), expected: self.layout.columns() });
        }
        if steps > self.spec.max_len() {
            let name = self.spec.columns().first().map_or("", |c| c.name()).to_owned();
            return Err(Error::TrajectoryTooLong { column: name, max_len: self.spec.max_len() });
        }
        let end = first.checked_add(keys.len());
        // Per column: bytes per trajectory and where the column starts in a
        // slot. `steps <= T`, so `per` is at most a slot's column and fits.
        let mut plan = Vec::with_capacity(columns.len());
        for (c, bytes) in columns.iter().enumerate() {
            let per = (self.layout.step_bytes(c) * steps) as usize;
            if end.and_then(|n| n.checked_mul(per)).is_none_or(|need| need > bytes.len()) {
                return Err(Error::StepSize {
                    column: self.spec.columns()[c].name().to_owned(),
                    got: bytes.len() as u64,
                    expected: (per as u64).saturating_mul(end.unwrap_or(usize::MAX) as u64),
                });
            }
            plan.push((bytes.as_ptr(), per, self.layout.offset(0, c, 0) as usize));
        }
        // The keys up to the first that is not current and `Writing`, whose
        // records exist: those are written and published.
        let mut records = Vec::with_capacity(keys.len());
        let mut refused = None;
        for &key in keys {
            match self.slot(key.slot).and_then(|rec| rec.check(key, SlotState::Writing, "append steps").map(|()| rec)) {
                Ok(rec) => records.push(rec),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let data = self.data_ptr().as_ptr();
        let stride = self.layout.slot_stride() as usize;
        // Column by column: each column's copies have one size, so the
        // size dispatch of `copy_bytes` is predicted for the whole batch.
        for &(src, per, base) in &plan {
            for (i, &key) in (first..).zip(&keys[..records.len()]) {
                // SAFETY: `i < first + keys.len()` and `(first + keys.len())
                // * per <= bytes.len()` (checked above), so the source range
                // is inside the column's bytes; the destination, steps
                // `0..steps <= T` of a column of a slot `< capacity` (its
                // record lookup checked it), lies inside the data area. The
                // slot is `Writing` and ours, as in `write_steps`; readers
                // follow the seqlock protocol.
                unsafe { crate::copy::copy_bytes(src.add(i * per), data.add(key.slot as usize * stride + base), per) };
            }
        }
        for rec in records {
            // Checked current and `Writing` above, and ours: only this
            // writer changes the slot's state while it writes.
            rec.publish_len_of_own(steps);
        }
        refused.map_or(Ok(()), Err)
    }

    /// Lets `fill` write `bytes` bytes (whole steps) of one column of a slot
    /// being written, in place from `first_step` (for example read straight
    /// from a file, with no staging copy). Checked as
    /// [`TableRegion::write_steps`] is; does not publish.
    pub fn fill_steps<T>(
        &self,
        key: SlotKey,
        column: usize,
        first_step: u64,
        bytes: usize,
        fill: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        let rec = self.slot(key.slot)?;
        rec.check(key, SlotState::Writing, "append steps")?;
        let col = self
            .spec
            .columns()
            .get(column)
            .ok_or_else(|| Error::ColumnIndex { index: column, count: self.spec.columns().len() })?;
        let s = self.layout.step_bytes(column);
        let n = bytes as u64;
        if !n.is_multiple_of(s) {
            return Err(Error::StepSize { column: col.name().to_owned(), got: n, expected: s });
        }
        if first_step.checked_add(n / s).is_none_or(|end| end > self.spec.max_len()) {
            return Err(Error::TrajectoryTooLong { column: col.name().to_owned(), max_len: self.spec.max_len() });
        }
        let off = self.layout.offset(u64::from(key.slot), column, first_step) as usize;
        // SAFETY: [off, off+bytes) lies inside this slot's column, inside
        // the data area (the checks above), so the slice is valid for the
        // region's lifetime, which outlives `&self`. The slot is `Writing`,
        // so its owner (the caller) is its only writer and no other
        // mutable slice of it exists; concurrent readers copy through raw
        // pointers under the seqlock protocol and discard what they read
        // from a slot that was reused, as with `write_steps`.
        let out = unsafe { std::slice::from_raw_parts_mut(self.data_ptr().as_ptr().add(off), bytes) };
        Ok(fill(out))
    }

    /// Copies `steps` steps of one column of `key`'s trajectory into `out`,
    /// with the seqlock check. Returns `Ok(false)` if the slot was reused
    /// while copying (the bytes in `out` are then garbage), an error if the
    /// key is not current or the range is not published.
    pub fn read_steps(&self, key: SlotKey, column: usize, first_step: u64, out: &mut [u8]) -> Result<bool> {
        let rec = self.slot(key.slot)?;
        let published = rec.read_begin(key).ok_or(Error::StaleKey { slot: key.slot, generation: key.generation })?;
        if column >= self.layout.columns() {
            return Err(Error::ColumnIndex { index: column, count: self.layout.columns() });
        }
        let s = self.layout.step_bytes(column);
        let n = out.len() as u64;
        let name = || self.spec.columns()[column].name().to_owned();
        if !n.is_multiple_of(s) {
            return Err(Error::StepSize { column: name(), got: n, expected: s });
        }
        if first_step.checked_add(n / s).is_none_or(|end| end > published) {
            return Err(Error::InvalidWindow(format!(
                "steps {first_step}..{} of column `{}` are not published (length {published})",
                first_step.saturating_add(n / s),
                name()
            )));
        }
        let off = self.layout.offset(u64::from(key.slot), column, first_step) as usize;
        // SAFETY: in bounds as for `write_steps`; a concurrent reuse is
        // detected by `read_validate` below and reported.
        unsafe { std::ptr::copy_nonoverlapping(self.data_ptr().as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(rec.read_validate(key))
    }
}

/// What a collector reads from: the data area's addresses and its layout.
///
/// Collectors copy from these addresses without further checks beyond the
/// layout's bounds, so a view can only be made from a live table
/// ([`TableRegion::view`]) or through the unsafe [`TableView::new`].
#[derive(Clone, Copy, Debug)]
pub struct TableView<'a> {
    host: Option<NonNull<u8>>,
    device: Option<u64>,
    layout: &'a Layout,
}

impl<'a> TableView<'a> {
    /// A view of a data area that is not inside a [`TableRegion`].
    ///
    /// # Safety
    /// While the view (or any copy) lives, `host` (when `Some`) must point
    /// to `layout.total_bytes()` readable bytes, and `device` (when `Some`)
    /// must be a device address of as many bytes.
    pub unsafe fn new(host: Option<NonNull<u8>>, device: Option<u64>, layout: &'a Layout) -> Self {
        TableView { host, device, layout }
    }

    /// Host address of the data area, if host-reachable.
    pub fn host(&self) -> Option<NonNull<u8>> {
        self.host
    }

    /// Device address of the data area, if device-mapped.
    pub fn device(&self) -> Option<u64> {
        self.device
    }

    /// The data layout.
    pub fn layout(&self) -> &'a Layout {
        self.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HeapRegion;
    use crate::spec::ColumnSpec;
    use crate::DType;
    use std::sync::Arc;

    fn spec() -> TableSpec {
        let columns = vec![ColumnSpec::new("obs", DType::U8, vec![3]), ColumnSpec::new("id", DType::I64, vec![])];
        TableSpec::new(columns, 4, 3).unwrap()
    }

    /// Every unsafe path of the region (header, control block, slot
    /// records and data through the base pointer) over heap memory that a
    /// second `TableRegion` opens too, as another process would: small
    /// enough for Miri, which checks the pointer accesses.
    #[test]
    fn a_table_in_heap_memory_is_written_opened_and_read() {
        let spec = spec();
        let bytes = RegionLayout::for_spec(&spec).unwrap().total_bytes as usize;
        let memory = Arc::new(HeapRegion::zeroed(bytes));
        let table = TableRegion::create(Arc::clone(&memory), &spec).unwrap();
        assert_eq!(table.creator_pid(), u64::from(std::process::id()));
        let rec = table.slot(1).unwrap();
        let key = rec.begin_write(1, 7, 1, 1.0).unwrap();
        table.write_steps(key, 0, 0, &[1, 2, 3, 4, 5, 6]).unwrap();
        let ids: Vec<u8> = [11i64, 12].iter().flat_map(|i| i.to_le_bytes()).collect();
        table.fill_steps(key, 1, 0, 16, |out| out.copy_from_slice(&ids)).unwrap();
        rec.publish_len(key, 2).unwrap();
        rec.commit(key).unwrap();
        let keys = [table.slot(0).unwrap().begin_write(0, 7, 2, 1.0).unwrap()];
        table.write_batch(&keys, 0, 1, &[&[9, 9, 9], &7i64.to_le_bytes()]).unwrap();

        let other = TableRegion::open(Arc::clone(&memory), Some(&spec)).unwrap();
        let mut obs = [0u8; 6];
        assert!(other.read_steps(key, 0, 0, &mut obs).unwrap());
        assert_eq!(obs, [1, 2, 3, 4, 5, 6]);
        let mut id = [0u8; 8];
        assert!(other.read_steps(key, 1, 1, &mut id).unwrap());
        assert_eq!(i64::from_le_bytes(id), 12);
        assert!(other.read_steps(keys[0], 0, 0, &mut obs[..3]).unwrap());
        assert_eq!(obs[..3], [9, 9, 9]);
        assert!(matches!(other.read_steps(key, 0, 1, &mut obs), Err(Error::InvalidWindow(_))), "past the published");
        assert_eq!(other.slots().len(), 3);
        assert_eq!(other.free_list().len(), 3);
        assert!(!other.log().is_empty());
        drop(table);
        drop(other);

        // Bytes that are not a table are refused, never trusted.
        assert!(TableRegion::open(Arc::new(HeapRegion::zeroed(32)), None).is_err());
        assert!(TableRegion::open(Arc::new(HeapRegion::zeroed(bytes)), None).is_err());
        assert!(TableRegion::create(Arc::new(HeapRegion::zeroed(bytes - 1)), &spec).is_err());
    }
}
