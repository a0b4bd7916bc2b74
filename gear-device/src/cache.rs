//! [`DeviceCache`]: a chosen set of trajectories copied into device memory,
//! so collection reads them at device bandwidth and only the rest over the
//! bus.
//!
//! Each entry holds one slot's columns in the table's own slot layout, so a
//! cached row differs from a zero-copy row only in its base address: the
//! gather kernel takes a per-row source table and serves both in one launch.
//!
//! Which trajectories to keep is the caller's choice (the most recent, the
//! highest priority, ...): it calls [`DeviceCache::insert`] for them; when
//! the cache is full the entry inserted first is replaced (FIFO).
//!
//! Correctness against slot reuse: an entry remembers the key (slot and
//! generation) and the published length it copied. A lookup serves a row
//! from the cache only if the slot's *current* key, read from the table's
//! slot records at gather time, is the entry's key and the entry holds at
//! least the row's length; otherwise the row is read zero-copy. The copy in
//! `insert` is validated with the slot's seqlock. An entry is never
//! overwritten while a gather that may read it is queued: gathers record an
//! event under the cache lock, and `insert` waits for it before reusing an
//! entry.

use gear_core::{Device, DeviceApi, DeviceBuffer, GatherRow, Layout, MemoryRegion, SlotKey, TableRegion};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// What [`RowCache::with_rows`] calls with each row's cached address (or
/// `None`) to queue the gather.
pub type LaunchRows<'a, A> = dyn FnMut(&[Option<u64>]) -> Result<(), <A as DeviceApi>::Error> + 'a;

/// A device-memory source of rows for [`crate::DeviceCollector`].
pub trait RowCache<A: DeviceApi>: Send + Sync {
    /// Whether the cached memory lives on `device`.
    fn is_on(&self, device: &A::Device) -> bool;

    /// Looks up `rows` (for a table of `layout`) and calls `launch` with,
    /// per row, the device address of the cached slot copy or `None`, while
    /// holding the cache's entries fixed; then records that `stream` may
    /// read them until its queued work completes.
    fn with_rows(
        &self,
        layout: &Layout,
        rows: &[GatherRow],
        stream: &A::Stream,
        launch: &mut LaunchRows<'_, A>,
    ) -> Result<(), A::Error>;
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: SlotKey,
    /// Steps copied (the published length at insert).
    len: u64,
}

struct CacheState<A: DeviceApi> {
    /// Entry `i` occupies bytes `[i * stride, (i+1) * stride)` of `mem`.
    entries: Vec<Option<Entry>>,
    /// Slot -> entry index, for every `Some` entry.
    by_slot: HashMap<u32, usize>,
    /// Occupied entries, oldest insert first.
    order: VecDeque<usize>,
    /// Per stream that gathered from `mem`: an event recorded after its
    /// latest such gather. All are waited for before an entry is overwritten.
    in_use: Vec<(A::Stream, A::Event)>,
    /// Entries an `insert` is copying into (not in `by_slot` or `order`).
    filling: Vec<usize>,
}

/// A fixed number of trajectories of one table, copied to device memory.
pub struct DeviceCache<A: DeviceApi, R: MemoryRegion> {
    device: A::Device,
    table: Arc<TableRegion<R>>,
    mem: A::Buffer,
    /// The stream entry copies are queued on (waited for by `insert`).
    fill_stream: A::Stream,
    capacity: usize,
    state: Mutex<CacheState<A>>,
}

impl<A: DeviceApi, R: MemoryRegion> std::fmt::Debug for DeviceCache<A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCache").field("capacity", &self.capacity).field("len", &self.len()).finish()
    }
}

fn refuse<A: DeviceApi>(msg: impl Into<String>) -> A::Error {
    A::Error::from(gear_core::Error::Device(msg.into()))
}

impl<A: DeviceApi, R: MemoryRegion> DeviceCache<A, R> {
    /// A cache of `capacity` trajectories of `table` on `device`
    /// (`capacity * slot_stride` bytes of device memory).
    pub fn new(device: &A::Device, table: Arc<TableRegion<R>>, capacity: usize) -> Result<Self, A::Error> {
        if capacity == 0 {
            return Err(refuse::<A>("a device cache needs at least one entry"));
        }
        let bytes = (capacity as u64)
            .checked_mul(table.layout().slot_stride())
            .ok_or_else(|| refuse::<A>("device cache size overflows 64 bits"))?;
        let mem = device.alloc(bytes)?;
        let fill_stream = device.new_stream()?;
        let state = CacheState {
            entries: vec![None; capacity],
            by_slot: HashMap::new(),
            order: VecDeque::new(),
            in_use: Vec::new(),
            filling: Vec::new(),
        };
        Ok(DeviceCache { device: device.clone(), table, mem, fill_stream, capacity, state: Mutex::new(state) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState<A>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().by_slot.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most entries held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries free to take (neither held nor being filled).
    pub fn free_entries(&self) -> usize {
        let st = self.lock();
        (0..st.entries.len()).filter(|&i| st.entries[i].is_none() && !st.filling.contains(&i)).count()
    }

    /// The table this cache copies from.
    pub fn table(&self) -> &Arc<TableRegion<R>> {
        &self.table
    }

    /// Whether `key` is cached (with any length).
    pub fn contains(&self, key: SlotKey) -> bool {
        let st = self.lock();
        st.by_slot.get(&key.slot).is_some_and(|&i| st.entries[i].is_some_and(|e| e.key == key))
    }

    /// Copies `key`'s trajectory (its published steps of every column) into
    /// the cache, replacing an older copy of the same slot or, when full,
    /// the oldest entry. Returns the key evicted to make room, if any.
    /// Errors with `StaleKey` if the slot no longer holds `key`: before the
    /// copy (the cache is then unchanged) or during it (the chosen entry is
    /// then left empty, free for the next insert). Any other failure leaves
    /// the cache as it was, or with the chosen entry empty and free.
    ///
    /// Blocks the caller, not the samplers: the entry is taken out of use
    /// under the cache lock, then, with the lock released, the call waits
    /// for gathers queued before that may still read the entry and copies
    /// the trajectory; gathers meanwhile read that row zero-copy. Call it
    /// off the training loop's critical path (a fill thread, as gear-api's
    /// device sampler does).
    pub fn insert(&self, key: SlotKey) -> Result<Option<SlotKey>, A::Error> {
        let rec = self.table.slot(key.slot)?;
        let stale = || gear_core::Error::StaleKey { slot: key.slot, generation: key.generation };
        // Refuse a stale key before touching any entry.
        let len = rec.read_begin(key).ok_or_else(stale)?;
        let (idx, evicted, waits) = {
            let mut st = self.lock();
            // Gathers queued so far may still read the entry about to be
            // chosen: mark each stream's position now (under the lock, so no
            // gather can be queued between the marks and taking the entry
            // out), and wait outside the lock. Marked first, so a failure
            // to mark leaves every entry as it was.
            let mut waits = Vec::with_capacity(st.in_use.len());
            for (stream, _) in &st.in_use {
                let e = self.device.new_event()?;
                self.device.record(&e, stream)?;
                waits.push(e);
            }
            // Pick the entry: the slot's own, a free one, or the oldest;
            // never one another insert is filling.
            let mut evicted = None;
            let idx = if let Some(&i) = st.by_slot.get(&key.slot) {
                i
            } else if let Some(i) = (0..st.entries.len()).find(|&i| st.entries[i].is_none() && !st.filling.contains(&i))
            {
                i
            } else if let Some(i) = st.order.pop_front() {
                let old = st.entries[i].expect("ordered entries are occupied");
                evicted = Some(old.key);
                i
            } else {
                return Err(refuse::<A>("every cache entry is being filled"));
            };
            // Take the entry out of the index while it is rewritten: no new
            // gather reads it, and a failed copy leaves it free.
            if let Some(old) = st.entries[idx].take() {
                st.by_slot.remove(&old.key.slot);
            }
            st.order.retain(|&j| j != idx);
            st.filling.push(idx);
            (idx, evicted, waits)
        };
        let filled = waits
            .iter()
            .try_for_each(|e| self.device.event_synchronize(e))
            .and_then(|()| self.copy_slot(key.slot, idx, len));
        let mut st = self.lock();
        st.filling.retain(|&i| i != idx);
        filled?;
        if !rec.read_validate(key) {
            return Err(stale().into());
        }
        // The same slot may have been inserted meanwhile by another call:
        // keep one entry per slot.
        if let Some(&other) = st.by_slot.get(&key.slot) {
            st.entries[other] = None;
            st.order.retain(|&j| j != other);
        }
        st.entries[idx] = Some(Entry { key, len });
        st.by_slot.insert(key.slot, idx);
        st.order.push_back(idx);
        Ok(evicted)
    }

    /// Copies the first `len` steps of every column of `slot` to entry
    /// `idx`, and waits for the copies.
    fn copy_slot(&self, slot: u32, idx: usize, len: u64) -> Result<(), A::Error> {
        let layout = self.table.layout();
        let entry = idx as u64 * layout.slot_stride();
        let data = self.table.data_ptr().as_ptr();
        for c in 0..layout.columns() {
            let bytes = len * layout.step_bytes(c);
            if bytes == 0 {
                continue;
            }
            let src_off = layout.offset(u64::from(slot), c, 0) as usize;
            // SAFETY: slot < capacity (checked by `table.slot`) and len <= T
            // (a published length), so the source range lies in the table's
            // data area, alive while `self.table` is, which outlives the
            // copy (waited for below); the destination lies in entry `idx`.
            // Bytes that change during the copy are detected by the
            // caller's read_validate.
            unsafe {
                self.device.upload(
                    &self.fill_stream,
                    &self.mem,
                    entry + layout.offset(0, c, 0),
                    data.add(src_off),
                    bytes,
                )
            }?;
        }
        self.device.stream_synchronize(&self.fill_stream)
    }

    /// Drops the entry of `slot`, if any. Returns whether one was held.
    pub fn remove(&self, slot: u32) -> bool {
        let mut st = self.lock();
        let Some(i) = st.by_slot.remove(&slot) else { return false };
        st.entries[i] = None;
        st.order.retain(|&j| j != i);
        true
    }

    /// Drops entries whose slot was reused since they were copied. Returns
    /// how many were dropped. (Lookups already ignore such entries; this
    /// frees their room.)
    pub fn retain_current(&self) -> usize {
        let mut st = self.lock();
        let stale: Vec<u32> = st
            .entries
            .iter()
            .flatten()
            .filter(|e| self.table.slot(e.key.slot).map(|r| r.key_state(e.key.slot).0 != e.key).unwrap_or(true))
            .map(|e| e.key.slot)
            .collect();
        for slot in &stale {
            if let Some(i) = st.by_slot.remove(slot) {
                st.entries[i] = None;
                st.order.retain(|&j| j != i);
            }
        }
        stale.len()
    }

    /// The cached keys, oldest insert first.
    pub fn keys(&self) -> Vec<SlotKey> {
        let st = self.lock();
        st.order.iter().filter_map(|&i| st.entries[i].map(|e| e.key)).collect()
    }
}

impl<A: DeviceApi, R: MemoryRegion> Drop for DeviceCache<A, R> {
    fn drop(&mut self) {
        // Queued gathers may still read the memory about to be freed.
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, event) in &st.in_use {
            let _ = self.device.event_synchronize(event);
        }
        let _ = self.device.stream_synchronize(&self.fill_stream);
    }
}

impl<A: DeviceApi, R: MemoryRegion> RowCache<A> for DeviceCache<A, R> {
    fn is_on(&self, device: &A::Device) -> bool {
        device.ordinal() == self.device.ordinal()
    }

    fn with_rows(
        &self,
        layout: &Layout,
        rows: &[GatherRow],
        stream: &A::Stream,
        launch: &mut LaunchRows<'_, A>,
    ) -> Result<(), A::Error> {
        if layout != self.table.layout() {
            return Err(refuse::<A>("the cache was built for a table of another layout"));
        }
        let mut st = self.lock();
        let stride = layout.slot_stride();
        let base = self.mem.device_addr();
        let cached: Vec<Option<u64>> = rows
            .iter()
            .map(|row| {
                let &i = st.by_slot.get(&row.slot)?;
                let e = st.entries[i]?;
                let current = self.table.slot(row.slot).ok()?.key_state(row.slot).0;
                // The copy must hold every step the row reads (an item's
                // window ends `start + len` steps into its slot).
                (current == e.key && e.len >= u64::from(row.start).saturating_add(row.len))
                    .then_some(base + i as u64 * stride)
            })
            .collect();
        if cached.iter().all(Option::is_none) {
            drop(st);
            return launch(&cached);
        }
        launch(&cached)?;
        let marked = match st.in_use.iter().position(|(s, _)| self.device.same_stream(s, stream)) {
            Some(i) => self.device.record(&st.in_use[i].1, stream),
            None => self.device.new_event().and_then(|event| {
                self.device.record(&event, stream)?;
                st.in_use.push((stream.clone(), event));
                Ok(())
            }),
        };
        if let Err(e) = marked {
            // Unmarked, the gather could read an entry an insert rewrites:
            // wait for it here instead.
            self.device.stream_synchronize(stream)?;
            return Err(e);
        }
        Ok(())
    }
}
