//! Selection that stays on the device until the gather: a table's slots
//! mirrored in device memory ([`DeviceSlots`]: per slot the key, the stored
//! length and the priority a [`SelectionRule`] draws by), draws queued by
//! kernel into per-batch buffers ([`DrawnRows`]), and a gather that reads
//! the drawn slots from device memory ([`DeviceCollector::gather_drawn`]).
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
//! Ownership: the buffers a queued batch writes ([`DrawnRows`], the
//! [`DeviceSlots`] arrays) wait for that work before they are freed or read
//! (each holds an event recorded after its last use), so dropping them
//! early, or reading rows back through a batch other than the one they
//! were drawn for, never touches memory a kernel still writes.
//!
//! The mirror is kept in step by its owner: before each batch it passes
//! [`SlotUpdate`]s for the slots that changed since the last one (gear-api
//! reads them from the table's change log), and only those slots are
//! written.

use crate::gather::{mapped_base, DeviceBatch, DeviceCollector};
use crate::kernels::KernelFn;
use crate::launch::{grid_1d, launch};
use crate::plan;
use crate::priorities::DevicePriorities;
use gear_core::{Access, Device, DeviceApi, DeviceBuffer, GatherRow, KernelArg, SelectionRule, SlotKey, TableView};
use std::collections::HashSet;
use std::sync::Arc;

fn refuse<A: DeviceApi>(msg: impl Into<String>) -> A::Error {
    A::Error::from(gear_core::Error::Device(msg.into()))
}

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
    pub fn apply(&mut self, rule: SelectionRule, updates: &[SlotUpdate]) -> gear_core::Result<MirrorUploads> {
        let capacity = self.keys.len() as u64;
        if let Some(u) = updates.iter().find(|u| u64::from(u.slot) >= capacity) {
            return Err(gear_core::Error::SlotOutOfRange { slot: u64::from(u.slot), capacity });
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
pub struct DeviceSlots<A: DeviceApi> {
    device: A::Device,
    mirror: SlotMirror,
    priorities: DevicePriorities<A>,
    /// Key word per slot (`generation << 32 | slot`, [`NO_KEY`] when none).
    keys: A::Buffer,
    /// Stored length per slot.
    lens: A::Buffer,
    upd_idx: Option<A::Buffer>,
    upd_key: Option<A::Buffer>,
    upd_len: Option<A::Buffer>,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceSlots<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSlots").field("held", &self.mirror.held).finish()
    }
}

fn words(v: impl Iterator<Item = u64>) -> Vec<u8> {
    v.flat_map(u64::to_le_bytes).collect()
}

impl<A: DeviceApi> DeviceSlots<A> {
    /// Mirrors of `capacity` empty slots of at most `max_len` steps, with
    /// their work queued on `stream`.
    pub fn new(device: &A::Device, stream: A::Stream, capacity: u64, max_len: u64) -> Result<Self, A::Error> {
        if max_len > u64::from(u32::MAX) {
            // The gather's row words hold a length in their low 32 bits.
            return Err(gear_core::Error::Unsupported("device draws read trajectories of fewer than 2^32 steps").into());
        }
        let priorities = DevicePriorities::<A>::on_stream(device, capacity, stream)?;
        let keys = device.alloc(capacity * 8)?;
        let lens = device.alloc(capacity * 8)?;
        let s = priorities.stream();
        device.write(s, &keys, 0, &words(std::iter::repeat_n(NO_KEY, capacity as usize)))?;
        device.write(s, &lens, 0, &words(std::iter::repeat_n(0, capacity as usize)))?;
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
    pub fn stream(&self) -> &A::Stream {
        self.priorities.stream()
    }

    /// Brings the device arrays in step with `updates` for drawing by
    /// `rule`: queues writes of the changed slots only (all slots the first
    /// time). Returns at once.
    pub fn sync(&mut self, rule: SelectionRule, updates: &[SlotUpdate]) -> Result<(), A::Error> {
        let up = self.mirror.apply(rule, updates)?;
        if up.rows.is_empty() {
            return Ok(());
        }
        self.priorities.set(&up.priorities)?;
        let m = up.rows.len() as u64;
        let stream = self.priorities.stream().clone();
        let d = &self.device;
        let idx = crate::priorities::ensure::<A>(&mut self.upd_idx, d, &stream, m * 4)?;
        let key = crate::priorities::ensure::<A>(&mut self.upd_key, d, &stream, m * 8)?;
        let len = crate::priorities::ensure::<A>(&mut self.upd_len, d, &stream, m * 8)?;
        let slots: Vec<u8> = up.rows.iter().flat_map(|r| r.0.to_le_bytes()).collect();
        d.write(&stream, self.upd_idx.as_ref().expect("ensured"), 0, &slots)?;
        d.write(&stream, self.upd_key.as_ref().expect("ensured"), 0, &words(up.rows.iter().map(|r| r.1)))?;
        d.write(&stream, self.upd_len.as_ref().expect("ensured"), 0, &words(up.rows.iter().map(|r| r.2)))?;
        for (src, dst) in [(key, self.keys.device_addr()), (len, self.lens.device_addr())] {
            let args = [
                KernelArg::Ptr(idx, Access::Read),
                KernelArg::Ptr(src, Access::Read),
                KernelArg::U64(m),
                KernelArg::Ptr(dst, Access::Write),
            ];
            // SAFETY: gear_scatter_u64's arguments (checked by `launch`); the
            // index and value buffers hold `m` entries written on this
            // stream just before; every index is < capacity (checked by
            // SlotMirror::apply) and distinct (one entry per slot), so the
            // writes stay in the per-slot arrays and never race.
            unsafe { launch::<A>(d, &stream, KernelFn::ScatterU64, grid_1d(m), &args, &[]) }?;
        }
        Ok(())
    }
}

impl<A: DeviceApi> Drop for DeviceSlots<A> {
    fn drop(&mut self) {
        // Queued scatters and draws read the arrays about to be freed.
        let _ = self.device.stream_synchronize(self.priorities.stream());
    }
}

/// One batch's draw buffers: drawn slots, probabilities and weights in
/// device memory, and the rows' key, length, probability and weight in
/// page-locked host memory, written by `gear_drawn_rows`.
pub struct DrawnRows<A: DeviceApi> {
    device: A::Device,
    rows: u64,
    slots: A::Buffer,
    prob: A::Buffer,
    weight: A::Buffer,
    /// `[key; rows] [len; rows] [probability; rows] [weight; rows]`.
    host: Arc<A::Pinned>,
    /// Recorded after the last gather that wrote these buffers: waited for
    /// before they are read back or freed.
    last_use: A::Event,
    /// Rows as last read back.
    read: Vec<DrawnRow>,
}

impl<A: DeviceApi> std::fmt::Debug for DrawnRows<A> {
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

/// The rows' host copy of a [`DrawnRows`], readable from a host function
/// queued after the gather (see [`DrawnRows::keys_handle`]).
pub struct DrawnKeys<A: DeviceApi> {
    device: A::Device,
    host: Arc<A::Pinned>,
    rows: u64,
    capacity: u64,
}

impl<A: DeviceApi> DrawnKeys<A> {
    /// The keys the device drew (`None` for a keyless row).
    ///
    /// # Safety
    /// Call it only once the gather that filled the rows has completed: in
    /// a [`Device::host_fn`] queued after it on its stream, or after its
    /// event was waited for (the CPU device checks).
    pub unsafe fn keys(&self) -> Result<Vec<Option<SlotKey>>, A::Error> {
        let mut bytes = vec![0u8; 8 * self.rows as usize];
        // SAFETY: the caller's contract: the writes are complete.
        unsafe { self.device.read_pinned(&self.host, 0, &mut bytes) }?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .map(|w| Some(SlotKey::from_u64(w)).filter(|k| w != NO_KEY && u64::from(k.slot) < self.capacity))
            .collect())
    }
}

impl<A: DeviceApi> DrawnRows<A> {
    /// Buffers for batches of `rows` rows.
    pub fn new(device: &A::Device, rows: usize) -> Result<Self, A::Error> {
        let n = (rows as u64).max(1);
        Ok(DrawnRows {
            device: device.clone(),
            rows: rows as u64,
            slots: device.alloc(n * 4)?,
            prob: device.alloc(n * 8)?,
            weight: device.alloc(n * 8)?,
            host: Arc::new(device.alloc_pinned(n * 32)?),
            last_use: device.new_event()?,
            read: Vec::with_capacity(rows),
        })
    }

    /// A handle on the rows' host copy for a host function queued after
    /// the gather on its stream, for a table of `capacity` slots.
    pub fn keys_handle(&self, capacity: u64) -> DrawnKeys<A> {
        DrawnKeys { device: self.device.clone(), host: self.host.clone(), rows: self.rows, capacity }
    }

    /// Waits for the gather that last wrote these rows and reads them back
    /// into `batch` (the batch gathered with them), setting its host
    /// lengths. Rows naming a slot outside `capacity`, or a key word whose
    /// slot is not the row's drawn slot, read as keyless.
    pub fn read_back(&mut self, batch: &mut DeviceBatch<A>, capacity: u64) -> Result<&[DrawnRow], A::Error> {
        self.device.event_synchronize(&self.last_use)?;
        let n = self.rows as usize;
        if batch.layout.rows() != n {
            return Err(refuse::<A>(format!("{n} drawn rows for a batch of {}", batch.layout.rows())));
        }
        let mut bytes = vec![0u8; 32 * n];
        // SAFETY: gear_drawn_rows wrote the rows before `last_use`, which
        // was waited for just now; nothing writes them again until the next
        // gather_drawn, which needs `&mut self`.
        unsafe { self.device.read_pinned(&self.host, 0, &mut bytes) }?;
        let w: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
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

impl<A: DeviceApi> Drop for DrawnRows<A> {
    fn drop(&mut self) {
        // A queued draw and gather may still write these buffers.
        let _ = self.device.event_synchronize(&self.last_use);
    }
}

impl<A: DeviceApi> DeviceCollector<A> {
    /// Draws `out`'s rows on the device from `slots` by `rule` and gathers
    /// them, all queued on this collector's stream with no host wait and
    /// nothing copied to the host in between: the drawn slots go from the
    /// draw kernel through `gear_drawn_rows` into the gather's row tables.
    /// `seed` fixes the draws; `random_start` (a seed) cuts each row at a
    /// random step as `SampleConfig::random_start` does. Rows are read
    /// zero-copy from the table (a device cache is not consulted). Then
    /// [`DrawnRows::read_back`] gives the rows and their keys, which the
    /// caller validates against the slot generations.
    ///
    /// `drawn` and `out` wait for this work before they are reused or
    /// freed; `slots` before it is freed. The table seen through `src` must
    /// stay mapped until `out`'s event (the view's contract).
    #[allow(clippy::too_many_arguments)]
    pub fn gather_drawn(
        &self,
        src: &TableView<'_>,
        slots: &mut DeviceSlots<A>,
        rule: SelectionRule,
        seed: u64,
        random_start: Option<u64>,
        drawn: &mut DrawnRows<A>,
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        let queued = self.queue_drawn(src, slots, rule, seed, random_start, drawn, out);
        // Whatever part was queued, the buffers' owners wait for it.
        let marked = self
            .device
            .record(&out.event, &self.stream)
            .and_then(|()| self.device.record(&drawn.last_use, &self.stream));
        if let Err(e) = marked {
            // Unmarked work must still finish before the buffers go.
            self.device.stream_synchronize(&self.stream)?;
            queued?;
            return Err(e);
        }
        out.last_stream = Some(self.stream.clone());
        queued
    }

    #[allow(clippy::too_many_arguments)]
    fn queue_drawn(
        &self,
        src: &TableView<'_>,
        slots: &mut DeviceSlots<A>,
        rule: SelectionRule,
        seed: u64,
        random_start: Option<u64>,
        drawn: &mut DrawnRows<A>,
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        let stream = self.stream.clone();
        let d = &self.device;
        if !d.same_stream(slots.stream(), &stream) {
            return Err(refuse::<A>("device slots queue their work on another stream"));
        }
        let rows = out.layout.rows() as u64;
        if drawn.rows != rows {
            return Err(refuse::<A>(format!("{} drawn rows for a batch of {rows}", drawn.rows)));
        }
        let capacity = slots.priorities.capacity();
        if src.layout().capacity() != capacity {
            return Err(refuse::<A>(format!(
                "device slots for {capacity} slots, the table has {}",
                src.layout().capacity()
            )));
        }
        let data_base = mapped_base::<A>(src)?;
        // The column table and grid do not depend on the rows.
        let dst_bases: Vec<u64> = out.columns.iter().map(|c| c.device_addr()).collect();
        let placeholder = vec![GatherRow::whole(0, 0); rows as usize];
        let plan = plan::plan_gather(src.layout(), &out.layout, &placeholder, data_base, &dst_bases, &[])?;
        out.order_after_last(&stream)?;
        // The rows' buffers were last written by a batch that may have run
        // on another stream.
        d.wait(&stream, &drawn.last_use)?;
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
                // live in `drawn`, which waits for `last_use` (recorded
                // below, after this work) before it is freed.
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
        let (random, rs_seed) = (u32::from(random_start.is_some()), random_start.unwrap_or(0));
        use Access::{Read, Write};
        let args = [
            KernelArg::Ptr(slot_buf, Read),
            KernelArg::U64(ndrawn),
            KernelArg::U64(rows),
            KernelArg::Ptr(slots.keys.device_addr(), Read),
            KernelArg::Ptr(slots.lens.device_addr(), Read),
            KernelArg::U64(capacity),
            KernelArg::U64(data_base),
            KernelArg::U64(src.layout().slot_stride()),
            KernelArg::U64(out.layout.window().len),
            KernelArg::U32(random),
            KernelArg::U64(rs_seed),
            KernelArg::Ptr(prob, Read),
            KernelArg::Ptr(weight, Read),
            KernelArg::Ptr(table, Write),
            KernelArg::Ptr(drawn.host.device_addr(), Write),
        ];
        // SAFETY: gear_drawn_rows's arguments (checked by `launch`).
        // `drawn` holds `rows` slots (ndrawn <= rows written above),
        // probabilities and weights (or null for top-k); keys/lens hold
        // `capacity` entries and the kernel reads them only at slots <
        // capacity; every length there is <= T (SlotMirror::apply), so each
        // row's window lies in its slot; `out.args` holds 2 * rows + 3 *
        // ncols words (DeviceCollector::alloc), of which the first 2 * rows
        // are written here; `host` is mapped page-locked memory of 4 * rows
        // words.
        unsafe { launch::<A>(d, &stream, KernelFn::DrawnRows, grid_1d(rows), &args, &[]) }?;
        let cols = &plan.words[plan.cols_at()..];
        let bytes: Vec<u8> = cols.iter().flat_map(|w| w.to_le_bytes()).collect();
        d.write(&stream, &out.args, 8 * plan.cols_at() as u64, &bytes)?;
        let lengths = out.lengths_dev.device_addr();
        // SAFETY: the row tables were written by gear_drawn_rows just
        // before on this stream (bases of slots < capacity, or the data
        // area's start with length 0, and lengths <= T), the column table
        // was written after it and checked by plan_gather against the
        // layouts, so every source range lies in the mapped data area and
        // every destination in this batch's buffers, which wait for its
        // event before they are reused or freed.
        unsafe { self.launch_gather_kernel(&stream, &plan, table, lengths, data_base, &out.columns, &[]) }?;
        out.cached_rows = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gear_core::SelectionRule;

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
