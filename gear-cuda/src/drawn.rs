//! Selection that stays on the device until the gather: a table's slots
//! mirrored in device memory ([`DeviceSlots`]: per slot the key, the stored
//! length and the priority a [`SelectionRule`] draws by), draws queued by
//! kernel into per-batch buffers ([`DrawnRows`]), and a gather that reads
//! the drawn slots from device memory ([`CudaCollector::gather_drawn`]).
//! Nothing goes to the host and back between the draw and the gather.
//!
//! One batch on the collector's stream: the priority sync (scatters of the
//! changed slots), the draw (`gear_sample_draws` for uniform and
//! proportional rules, the top-k network for [`SelectionRule::TopK`]),
//! `gear_drawn_rows` (draws to the gather's row tables, and the rows' key,
//! length, probability and weight written straight into page-locked host
//! memory the host reads after the batch's event), the column table, the
//! gather, the event. The host then validates each row against its slot
//! generation like any other reader; a row the device could not draw
//! (nothing drawable, or a slot whose key went away) comes back without a
//! key and is drawn by the host.
//!
//! The mirror is kept in step by its owner: before each batch it passes
//! [`SlotUpdate`]s for the slots that changed since the last one (gear-api
//! reads them from the table's change log), and only those slots are
//! written.

use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::gather::{CudaBatch, CudaCollector};
use crate::kernels::KernelFn;
use crate::memory::{DeviceMemory, PinnedMemory};
use crate::plan;
use crate::select::DevicePriorities;
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use gear_core::{GatherRow, MemoryRegion, SelectionRule, SlotKey, TableView};
use std::collections::HashSet;
use std::sync::Arc;

/// Key word of a slot that holds nothing drawable (`GEAR_NO_KEY` in
/// `kernels/sample.cu`).
pub const NO_KEY: u64 = u64::MAX;

/// One slot as the device mirror must hold it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotUpdate {
    /// The slot.
    pub slot: u32,
    /// The trajectory the slot holds for selection, or `None`.
    pub key: Option<SlotKey>,
    /// Its priority (ignored without a key).
    pub priority: f64,
    /// Its stored length in steps (ignored without a key).
    pub len: u64,
}

/// What a rule draws by, for the priority each slot is given on the
/// device: only the kind matters (exponents are applied by the kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Basis {
    Uniform,
    Proportional,
    TopK,
}

impl Basis {
    fn of(rule: SelectionRule) -> Basis {
        match rule {
            SelectionRule::Uniform => Basis::Uniform,
            SelectionRule::Proportional { .. } => Basis::Proportional,
            SelectionRule::TopK => Basis::TopK,
        }
    }

    /// The device priority of a slot: negative (weight 0, sorted last)
    /// without a key. Uniform gives every held slot 1; proportional gives
    /// a zero priority no mass, as the host strategy does (`0^0` would be 1
    /// in the kernel); top-k ranks every held slot, zero priorities too.
    fn value(self, key: Option<SlotKey>, priority: f64) -> f64 {
        let p = if priority.is_finite() && priority >= 0.0 { priority } else { 0.0 };
        match (key, self) {
            (None, _) => -1.0,
            (Some(_), Basis::Uniform) => 1.0,
            (Some(_), Basis::Proportional) if p > 0.0 => p,
            (Some(_), Basis::Proportional) => -1.0,
            (Some(_), Basis::TopK) => p,
        }
    }
}

/// The host's copy of what the device mirror holds, and the uploads a batch
/// of [`SlotUpdate`]s needs. Pure bookkeeping (no CUDA), tested on its own.
#[derive(Debug)]
pub struct SlotMirror {
    keys: Vec<Option<SlotKey>>,
    priorities: Vec<f64>,
    lens: Vec<u64>,
    max_len: u64,
    held: usize,
    basis: Option<Basis>,
}

/// Writes one [`SlotMirror::apply`] asks of the device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorUploads {
    /// `(slot, device priority)`, one per slot.
    pub priorities: Vec<(u32, f64)>,
    /// `(slot, key word, length)`, one per slot; key word [`NO_KEY`] when
    /// the slot holds nothing drawable.
    pub rows: Vec<(u32, u64, u64)>,
}

impl SlotMirror {
    /// A mirror of `capacity` empty slots of at most `max_len` steps.
    pub fn new(capacity: u64, max_len: u64) -> Self {
        let n = capacity as usize;
        SlotMirror { keys: vec![None; n], priorities: vec![0.0; n], lens: vec![0; n], max_len, held: 0, basis: None }
    }

    /// Slots holding a drawable trajectory.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The key slot `slot` holds, if any.
    pub fn key(&self, slot: u32) -> Option<SlotKey> {
        self.keys.get(slot as usize).copied().flatten()
    }

    /// Applies `updates` (later ones win for a slot) for drawing by `rule`
    /// and returns the writes the device needs: the changed slots, or
    /// every slot when the rule's kind changed (the first call included).
    /// A key whose slot differs from the update's, or a length over the
    /// table's maximum (a corrupted record), makes the slot hold nothing.
    pub fn apply(&mut self, rule: SelectionRule, updates: &[SlotUpdate]) -> Result<MirrorUploads> {
        let capacity = self.keys.len() as u64;
        if let Some(u) = updates.iter().find(|u| u64::from(u.slot) >= capacity) {
            return Err(gear_core::Error::SlotOutOfRange { slot: u64::from(u.slot), capacity }.into());
        }
        let basis = Basis::of(rule);
        let everything = self.basis != Some(basis);
        self.basis = Some(basis);
        let mut seen = HashSet::with_capacity(updates.len());
        let mut changed = Vec::with_capacity(updates.len());
        for u in updates.iter().rev() {
            if !seen.insert(u.slot) {
                continue;
            }
            let i = u.slot as usize;
            let key = u.key.filter(|k| k.slot == u.slot && u.len <= self.max_len);
            self.held = self.held - usize::from(self.keys[i].is_some()) + usize::from(key.is_some());
            self.keys[i] = key;
            self.priorities[i] = u.priority;
            self.lens[i] = if key.is_some() { u.len } else { 0 };
            changed.push(u.slot);
        }
        if everything {
            changed = (0..capacity as u32).collect();
        }
        let mut up = MirrorUploads::default();
        for s in changed {
            let i = s as usize;
            let key = self.keys[i];
            up.priorities.push((s, basis.value(key, self.priorities[i])));
            up.rows.push((s, key.map_or(NO_KEY, SlotKey::to_u64), self.lens[i]));
        }
        Ok(up)
    }
}

/// A table's slots in device memory, drawn from by [`SelectionRule`]s on
/// the collector's stream.
pub struct DeviceSlots {
    device: CudaDevice,
    mirror: SlotMirror,
    priorities: DevicePriorities,
    /// Key word per slot (`generation << 32 | slot`, [`NO_KEY`] when none).
    keys: DeviceMemory,
    /// Stored length per slot.
    lens: DeviceMemory,
    upd_idx: Option<DeviceMemory>,
    upd_key: Option<DeviceMemory>,
    upd_len: Option<DeviceMemory>,
}

impl std::fmt::Debug for DeviceSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSlots").field("held", &self.mirror.held).finish()
    }
}

fn words(v: impl Iterator<Item = u64>) -> Vec<u8> {
    v.flat_map(u64::to_le_bytes).collect()
}

impl DeviceSlots {
    /// Mirrors of `capacity` empty slots of at most `max_len` steps, with
    /// their work queued on `stream`.
    pub fn new(device: &CudaDevice, stream: Arc<CudaStream>, capacity: u64, max_len: u64) -> Result<Self> {
        if max_len > u64::from(u32::MAX) {
            // The gather's row words hold a length in their low 32 bits.
            return Err(gear_core::Error::Unsupported("device draws read trajectories of fewer than 2^32 steps").into());
        }
        let priorities = DevicePriorities::on_stream(device, capacity, stream)?;
        let keys = device.alloc(capacity * 8)?;
        let lens = device.alloc_zeroed(capacity * 8)?;
        keys.write_async(0, &words(std::iter::repeat_n(NO_KEY, capacity as usize)), priorities.stream())?;
        Ok(DeviceSlots {
            device: device.clone(),
            mirror: SlotMirror::new(capacity, max_len),
            priorities,
            keys,
            lens,
            upd_idx: None,
            upd_key: None,
            upd_len: None,
        })
    }

    /// Slots holding a drawable trajectory.
    pub fn held(&self) -> usize {
        self.mirror.held()
    }

    /// The stream the mirror's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.priorities.stream()
    }

    /// Brings the device arrays in step with `updates` for drawing by
    /// `rule`: queues writes of the changed slots only (all slots the first
    /// time). Returns at once.
    pub fn sync(&mut self, rule: SelectionRule, updates: &[SlotUpdate]) -> Result<()> {
        let up = self.mirror.apply(rule, updates)?;
        if up.rows.is_empty() {
            return Ok(());
        }
        self.priorities.set(&up.priorities)?;
        let m = up.rows.len() as u64;
        let stream = self.priorities.stream().clone();
        let ensure = |mem: &mut Option<DeviceMemory>, bytes: u64| -> Result<u64> {
            if mem.as_ref().is_none_or(|d| d.len() < bytes) {
                // The old buffer may still be read by a queued scatter.
                if mem.is_some() {
                    stream.synchronize()?;
                }
                *mem = Some(self.device.alloc(bytes.max(8))?);
            }
            Ok(mem.as_ref().expect("just ensured").device_addr())
        };
        let idx = ensure(&mut self.upd_idx, m * 4)?;
        let key = ensure(&mut self.upd_key, m * 8)?;
        let len = ensure(&mut self.upd_len, m * 8)?;
        let slots: Vec<u8> = up.rows.iter().flat_map(|r| r.0.to_le_bytes()).collect();
        self.upd_idx.as_ref().expect("ensured").write_async(0, &slots, &stream)?;
        self.upd_key.as_ref().expect("ensured").write_async(0, &words(up.rows.iter().map(|r| r.1)), &stream)?;
        self.upd_len.as_ref().expect("ensured").write_async(0, &words(up.rows.iter().map(|r| r.2)), &stream)?;
        let f = self.device.function(KernelFn::ScatterU64)?;
        for (src, dst) in [(key, self.keys.device_addr()), (len, self.lens.device_addr())] {
            let mut b = stream.launch_builder(&f);
            b.arg(&idx).arg(&src).arg(&m).arg(&dst);
            // SAFETY: matches gear_scatter_u64(u32*, u64*, u64, u64*); the
            // index and value buffers hold `m` entries uploaded on this
            // stream just before; every index is < capacity (checked by
            // SlotMirror::apply) and distinct (one entry per slot), so the
            // writes stay in the per-slot arrays and never race.
            unsafe { b.launch(plan_1d(m)) }?;
        }
        Ok(())
    }
}

/// One batch's draw buffers: drawn slots, probabilities and weights in
/// device memory, and the rows' key, length, probability and weight in
/// page-locked host memory, written by `gear_drawn_rows`.
pub struct DrawnRows {
    rows: u64,
    slots: DeviceMemory,
    prob: DeviceMemory,
    weight: DeviceMemory,
    /// `[key; rows] [len; rows] [probability; rows] [weight; rows]`.
    host: PinnedMemory,
    /// Rows as last read back.
    read: Vec<DrawnRow>,
}

impl std::fmt::Debug for DrawnRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrawnRows").field("rows", &self.rows).finish()
    }
}

/// One row drawn on the device, as the host reads it after the gather.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrawnRow {
    /// The trajectory, or `None` when the device drew nothing for the row
    /// (its gather wrote zeros: the caller draws it itself).
    pub key: Option<SlotKey>,
    /// The stored length the gather used (after a random start's cut).
    pub len: u64,
    /// The probability it was drawn with.
    pub probability: f64,
    /// Its importance weight.
    pub weight: f64,
}

impl DrawnRows {
    /// Buffers for batches of `rows` rows.
    pub fn new(device: &CudaDevice, rows: usize) -> Result<Self> {
        let n = (rows as u64).max(1);
        Ok(DrawnRows {
            rows: rows as u64,
            slots: device.alloc(n * 4)?,
            prob: device.alloc(n * 8)?,
            weight: device.alloc(n * 8)?,
            host: device.alloc_pinned(n * 32)?,
            read: Vec::with_capacity(rows),
        })
    }

    /// Waits for `batch` (gathered by [`CudaCollector::gather_drawn`] with
    /// these buffers) and reads its rows back; sets the batch's host
    /// lengths. Rows naming a slot outside `capacity`, or a key word whose
    /// slot is not the row's drawn slot, read as keyless.
    pub fn read_back(&mut self, batch: &mut CudaBatch, capacity: u64) -> Result<&[DrawnRow]> {
        batch.synchronize()?;
        let n = self.rows as usize;
        if batch.layout.rows() != n {
            return Err(Error::InvalidArgument(format!("{n} drawn rows for a batch of {}", batch.layout.rows())));
        }
        let base = self.host.host_ptr().expect("pinned memory has a host address").as_ptr() as *const u64;
        // SAFETY: `host` holds 4 * rows u64 words (allocated as rows * 32
        // bytes, page-aligned), written by gear_drawn_rows on the batch's
        // stream before its event, which `synchronize` waited for; nothing
        // writes them again until the next gather_drawn, which needs
        // `&mut self`.
        let w = unsafe { std::slice::from_raw_parts(base, 4 * n) };
        self.read.clear();
        let window = batch.layout.window();
        for r in 0..n {
            let key = Some(SlotKey::from_u64(w[r])).filter(|k| w[r] != NO_KEY && u64::from(k.slot) < capacity);
            let len = if key.is_some() { w[n + r] } else { 0 };
            batch.lengths[r] = window.resolve(len).steps;
            self.read.push(DrawnRow {
                key,
                len,
                probability: f64::from_bits(w[2 * n + r]),
                weight: f64::from_bits(w[3 * n + r]),
            });
        }
        batch.cached_rows = 0;
        Ok(&self.read)
    }
}

impl CudaCollector {
    /// Draws `out`'s rows on the device from `slots` by `rule` and gathers
    /// them, all queued on this collector's stream with no host wait and
    /// nothing copied to the host in between: the drawn slots go from the
    /// draw kernel through `gear_drawn_rows` into the gather's row tables.
    /// `seed` fixes the draws; `random_start` (a seed) cuts each row at a
    /// random step as `SampleConfig::random_start` does. Rows are read
    /// zero-copy from the table (a device cache is not consulted). Then
    /// [`DrawnRows::read_back`] gives the rows and their keys, which the
    /// caller validates against the slot generations.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_drawn(
        &self,
        src: &TableView<'_>,
        slots: &mut DeviceSlots,
        rule: SelectionRule,
        seed: u64,
        random_start: Option<u64>,
        drawn: &mut DrawnRows,
        out: &mut CudaBatch,
    ) -> Result<()> {
        let stream = self.stream.clone();
        if **slots.stream() != *stream {
            return Err(Error::InvalidArgument("device slots queue their work on another stream".into()));
        }
        let rows = out.layout.rows() as u64;
        if drawn.rows != rows {
            return Err(Error::InvalidArgument(format!("{} drawn rows for a batch of {rows}", drawn.rows)));
        }
        let capacity = slots.priorities.capacity();
        if src.layout().capacity() != capacity {
            return Err(Error::InvalidArgument(format!(
                "device slots for {capacity} slots, the table has {}",
                src.layout().capacity()
            )));
        }
        let data_base = src.device().ok_or_else(|| {
            Error::InvalidArgument("the table is not mapped for the device: register its region".into())
        })?;
        // The column table and grid do not depend on the rows.
        let dst_bases: Vec<u64> = out.columns.iter().map(|c| c.device_addr()).collect();
        let placeholder = vec![GatherRow::whole(0, 0); rows as usize];
        let plan = plan::plan_gather(src.layout(), &out.layout, &placeholder, data_base, &dst_bases, &[])?;
        if let Some(prev) = &out.last_stream {
            if **prev != *stream {
                stream.wait(&out.event)?;
            }
        }
        let (slot_buf, prob_buf, weight_buf) =
            (drawn.slots.device_addr(), drawn.prob.device_addr(), drawn.weight.device_addr());
        let (ndrawn, prob, weight) = match rule {
            SelectionRule::Uniform | SelectionRule::Proportional { .. } => {
                let (alpha, beta, stratified) = match rule {
                    SelectionRule::Proportional { alpha, beta, stratified } => (alpha, beta, stratified),
                    // Every held slot has priority 1: P = 1/N, weight 1.
                    _ => (1.0, 0.0, false),
                };
                // SAFETY: the three buffers hold `rows` entries each
                // (DrawnRows::new for this batch size, checked above) and
                // live in `drawn`, which the caller keeps until the batch's
                // event (read_back waits for it; CudaBatch's drop waits too).
                unsafe {
                    slots.priorities.queue_draws(rows, alpha, beta, seed, stratified, slot_buf, prob_buf, weight_buf)
                }?;
                (rows, prob_buf, weight_buf)
            }
            SelectionRule::TopK => {
                let k = rows.min(slots.held() as u64).min(capacity);
                if k > 0 {
                    // SAFETY: as above; `prob` serves as the priorities'
                    // scratch (k <= rows entries).
                    unsafe { slots.priorities.queue_top_k(k, slot_buf, prob_buf) }?;
                }
                (k, 0, 0)
            }
        };
        let table = out.args.device_addr();
        let host_rows = drawn.host.device_addr();
        let stride = src.layout().slot_stride();
        let w_len = out.layout.window().len;
        let (random, rs_seed) = (u32::from(random_start.is_some()), random_start.unwrap_or(0));
        let (keys, lens) = (slots.keys.device_addr(), slots.lens.device_addr());
        let f = self.device.function(KernelFn::DrawnRows)?;
        let mut b = stream.launch_builder(&f);
        b.arg(&slot_buf)
            .arg(&ndrawn)
            .arg(&rows)
            .arg(&keys)
            .arg(&lens)
            .arg(&capacity)
            .arg(&data_base)
            .arg(&stride)
            .arg(&w_len)
            .arg(&random)
            .arg(&rs_seed)
            .arg(&prob)
            .arg(&weight)
            .arg(&table)
            .arg(&host_rows);
        // SAFETY: matches gear_drawn_rows(u32*, u64, u64, u64*, u64*, u64,
        // u64, u64, u64, u32, u64, f64*, f64*, u64*, u64*). `drawn` holds
        // `rows` slots (ndrawn <= rows written above), probabilities and
        // weights (or null for top-k); keys/lens hold `capacity` entries and
        // the kernel reads them only at slots < capacity; every length there
        // is <= T (SlotMirror::apply), so each row's window lies in its slot;
        // `out.args` holds 2 * rows + 3 * ncols words (CudaCollector::alloc),
        // of which the first 2 * rows are written here; `host` is mapped
        // page-locked memory of 4 * rows words.
        unsafe { b.launch(plan_1d(rows)) }?;
        let cols = &plan.words[plan.cols_at()..];
        let bytes: Vec<u8> = cols.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.args.write_async(8 * plan.cols_at() as u64, &bytes, &stream)?;
        let lengths = out.lengths_dev.device_addr();
        // SAFETY: the row tables were written by gear_drawn_rows just
        // before on this stream (bases of slots < capacity, or the data
        // area's start with length 0, and lengths <= T), the column table
        // was uploaded after it and checked by plan_gather against the
        // layouts, so every source range lies in the mapped data area and
        // every destination in this batch's buffers, which are reused only
        // after its event.
        unsafe { self.launch_gather_kernel(&stream, &plan, table, lengths) }?;
        out.event.record(&stream)?;
        out.last_stream = Some(stream);
        out.cached_rows = 0;
        Ok(())
    }
}

fn plan_1d(items: u64) -> LaunchConfig {
    LaunchConfig { grid_dim: (plan::grid_1d(items), 1, 1), block_dim: (plan::BLOCK, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(slot: u32, generation: u32) -> Option<SlotKey> {
        Some(SlotKey { slot, generation })
    }

    fn up(slot: u32, k: Option<SlotKey>, priority: f64, len: u64) -> SlotUpdate {
        SlotUpdate { slot, key: k, priority, len }
    }

    const PROP: SelectionRule = SelectionRule::Proportional { alpha: 0.6, beta: 0.4, stratified: true };

    #[test]
    fn the_first_sync_writes_every_slot_then_only_changed_ones() {
        let mut m = SlotMirror::new(4, 10);
        let first = m.apply(PROP, &[up(1, key(1, 3), 2.0, 5)]).unwrap();
        assert_eq!(first.rows.len(), 4, "every slot the first time");
        assert_eq!(first.priorities[1], (1, 2.0));
        assert_eq!(first.rows[1], (1, key(1, 3).unwrap().to_u64(), 5));
        assert_eq!(first.priorities[0], (0, -1.0));
        assert_eq!(first.rows[0], (0, NO_KEY, 0));
        assert_eq!(m.held(), 1);
        let next = m.apply(PROP, &[up(2, key(2, 1), 0.5, 3), up(1, key(1, 3), 4.0, 5)]).unwrap();
        let mut slots: Vec<u32> = next.rows.iter().map(|r| r.0).collect();
        slots.sort();
        assert_eq!(slots, [1, 2], "only the changed slots");
        assert_eq!(m.held(), 2);
        assert!(m.apply(PROP, &[]).unwrap().rows.is_empty());
    }

    #[test]
    fn the_last_update_of_a_slot_wins_and_removals_empty_it() {
        let mut m = SlotMirror::new(3, 10);
        m.apply(PROP, &[]).unwrap();
        let u = m.apply(PROP, &[up(0, key(0, 1), 1.0, 2), up(0, key(0, 1), 3.0, 2), up(0, None, 0.0, 0)]).unwrap();
        assert_eq!(u.priorities, [(0, -1.0)]);
        assert_eq!(u.rows, [(0, NO_KEY, 0)]);
        assert_eq!(m.held(), 0);
        assert_eq!(m.key(0), None);
    }

    #[test]
    fn device_priorities_follow_the_rule() {
        for (rule, zero, two) in [
            (SelectionRule::Uniform, 1.0, 1.0),
            // A zero priority has no mass under the proportional rule.
            (PROP, -1.0, 2.0),
            (SelectionRule::TopK, 0.0, 2.0),
        ] {
            let mut m = SlotMirror::new(2, 10);
            let u = m.apply(rule, &[up(0, key(0, 1), 0.0, 1), up(1, key(1, 1), 2.0, 1)]).unwrap();
            assert_eq!(u.priorities, [(0, zero), (1, two)], "{rule:?}");
            // A change of kind rewrites every slot.
            let other = if rule == SelectionRule::TopK { PROP } else { SelectionRule::TopK };
            assert_eq!(m.apply(other, &[]).unwrap().rows.len(), 2);
            // Exponents alone change nothing on the device.
            assert!(m.apply(other, &[]).unwrap().rows.is_empty());
        }
        let mut m = SlotMirror::new(1, 10);
        m.apply(PROP, &[]).unwrap();
        let changed = SelectionRule::Proportional { alpha: 0.6, beta: 1.0, stratified: true };
        assert!(m.apply(changed, &[]).unwrap().rows.is_empty(), "beta is applied by the kernel");
    }

    #[test]
    fn bad_updates_are_refused_or_hold_nothing() {
        let mut m = SlotMirror::new(2, 10);
        assert!(m.apply(PROP, &[up(2, key(2, 1), 1.0, 1)]).is_err(), "slot beyond capacity");
        // A length over T or a key naming another slot: nothing drawable.
        let u = m.apply(PROP, &[up(0, key(0, 1), 1.0, 11), up(1, key(0, 1), 1.0, 1)]).unwrap();
        assert_eq!(u.rows, [(0, NO_KEY, 0), (1, NO_KEY, 0)]);
        assert_eq!(m.held(), 0);
        // Non-finite priorities count as zero.
        let u = m.apply(SelectionRule::TopK, &[up(0, key(0, 2), f64::NAN, 1)]).unwrap();
        assert_eq!(u.priorities[0], (0, 0.0));
    }
}
