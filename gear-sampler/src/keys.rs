//! Key bookkeeping every strategy shares: which slots are held and with
//! which generation ([`SlotKeys`]), or the same plus a per-slot value and a
//! dense list of the held keys ([`DenseKeys`], for random strategies).
//!
//! The dense list is the classic swap-remove set (an array of members plus
//! each member's position in it), which gives O(1) insert, remove and
//! uniform choice.

use gear_core::{Error, Result, Sampled, SlotKey};

/// Marks "no slot" / "no position" in `u32` index arrays.
pub(crate) const NONE: u32 = u32::MAX;

/// Marks a slot that is not held in [`SlotKeys::generation`].
const ABSENT: u64 = u64::MAX;

/// The largest capacity a strategy accepts: slots are `u32`.
const MAX_CAPACITY: u64 = 1 << 32;

/// A vector of `n` copies of `value`, or an error instead of an abort when
/// the memory cannot be had.
pub(crate) fn filled<T: Clone>(n: usize, value: T, who: &str) -> Result<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        Error::Selection(format!("{who}: cannot allocate {n} entries of {} bytes: {e}", std::mem::size_of::<T>()))
    })?;
    // Per-slot arrays are read at random by every draw: huge pages spare
    // those reads most of their TLB misses (advised before the first write
    // faults the pages in).
    gear_core::hint::advise_huge_pages(v.as_ptr().cast(), n.saturating_mul(std::mem::size_of::<T>()));
    v.resize(n, value);
    Ok(v)
}

/// Makes room for `n` more draws in `out`, refusing (rather than
/// panicking on) a count that cannot be allocated.
pub(crate) fn reserve_draws(out: &mut Vec<Sampled>, n: usize, who: &str) -> Result<()> {
    out.try_reserve(n).map_err(|e| Error::Selection(format!("{who}: cannot make room for {n} draws: {e}")))
}

/// Reads the 8-byte largest-priority state of prioritized and heap
/// strategies: a finite, non-negative `f64`.
pub(crate) fn decode_max_priority(state: &[u8], who: &str) -> Result<f64> {
    let bytes: [u8; 8] =
        state.try_into().map_err(|_| Error::Decode(format!("{who}: state of {} bytes, expected 8", state.len())))?;
    let p = f64::from_le_bytes(bytes);
    if p.is_finite() && p >= 0.0 {
        Ok(p)
    } else {
        Err(Error::Decode(format!("{who}: largest priority {p} is not a finite non-negative number")))
    }
}

/// Checks a capacity given to `prepare` and converts it to `usize`.
pub(crate) fn check_capacity(capacity: u64, held: usize, who: &str) -> Result<usize> {
    if held > 0 {
        return Err(Error::Selection(format!("{who}: prepare called while {held} items are held")));
    }
    if capacity > MAX_CAPACITY {
        return Err(Error::Selection(format!(
            "{who}: capacity {capacity} exceeds the {MAX_CAPACITY} slots a u32 slot index can name"
        )));
    }
    usize::try_from(capacity)
        .map_err(|_| Error::Selection(format!("{who}: capacity {capacity} does not fit in memory")))
}

fn out_of_range(key: SlotKey, capacity: usize) -> Error {
    Error::SlotOutOfRange { slot: u64::from(key.slot), capacity: capacity as u64 }
}

fn already_held(key: SlotKey, generation: u64, who: &str) -> Error {
    Error::Selection(format!(
        "{who}: cannot insert {key}: slot {} is already held by generation {generation}",
        key.slot
    ))
}

fn not_held(key: SlotKey, who: &str) -> Error {
    Error::Selection(format!("{who}: key {key} is not held (slot {} is empty)", key.slot))
}

fn stale(key: SlotKey) -> Error {
    Error::StaleKey { slot: key.slot, generation: key.generation }
}

/// Which slots are held and the generation each was inserted with.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlotKeys {
    /// Per slot: the generation of the held key, or [`ABSENT`].
    generation: Vec<u64>,
    /// Number of slots not [`ABSENT`].
    len: usize,
}

impl SlotKeys {
    /// Resets to `capacity` empty slots (`capacity` already checked).
    pub(crate) fn prepare(&mut self, capacity: usize, who: &str) -> Result<()> {
        self.generation = filled(capacity, ABSENT, who)?;
        self.len = 0;
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Ok when `key` may be inserted: its slot is in range and not held.
    #[inline]
    pub(crate) fn check_insert(&self, key: SlotKey, who: &str) -> Result<()> {
        match self.generation.get(key.slot as usize) {
            None => Err(out_of_range(key, self.generation.len())),
            Some(&ABSENT) => Ok(()),
            Some(&g) => Err(already_held(key, g, who)),
        }
    }

    /// Ok when `key` is held with exactly this generation.
    pub(crate) fn check_held(&self, key: SlotKey, who: &str) -> Result<()> {
        match self.generation.get(key.slot as usize) {
            None => Err(out_of_range(key, self.generation.len())),
            Some(&ABSENT) => Err(not_held(key, who)),
            Some(&g) if g == u64::from(key.generation) => Ok(()),
            Some(_) => Err(stale(key)),
        }
    }

    /// Records `key` as held. Call after [`SlotKeys::check_insert`].
    #[inline]
    pub(crate) fn mark(&mut self, key: SlotKey) {
        debug_assert!(self.check_insert(key, "").is_ok());
        self.generation[key.slot as usize] = u64::from(key.generation);
        self.len += 1;
    }

    /// Forgets `slot`. Call after [`SlotKeys::check_held`].
    pub(crate) fn unmark(&mut self, slot: u32) {
        debug_assert_ne!(self.generation[slot as usize], ABSENT);
        self.generation[slot as usize] = ABSENT;
        self.len -= 1;
    }

    /// The key held in `slot` (which must be held).
    #[inline]
    pub(crate) fn key(&self, slot: usize) -> SlotKey {
        debug_assert_ne!(self.generation[slot], ABSENT);
        SlotKey { slot: slot as u32, generation: self.generation[slot] as u32 }
    }
}

/// One slot of [`DenseKeys`]: all a strategy reads about a slot, in one
/// small record so a random access costs one cache line.
#[derive(Clone, Copy, Debug)]
struct DenseEntry<T> {
    /// Generation of the held key (meaningful only where held).
    generation: u32,
    /// Index in [`DenseKeys::items`], or [`NONE`] when the slot is not held.
    pos: u32,
    /// The strategy's own per-slot value.
    value: T,
}

/// Held slots with their generations and a per-slot value `T`, plus a
/// dense array of the held keys for O(1) uniform choice (swap-remove).
#[derive(Clone, Debug, Default)]
pub(crate) struct DenseKeys<T> {
    entries: Vec<DenseEntry<T>>,
    /// The held keys in no particular order. Invariant: for every held slot
    /// `s`, `items[entries[s].pos].slot == s`.
    items: Vec<SlotKey>,
}

impl<T: Copy + Default> DenseKeys<T> {
    /// Resets to `capacity` empty slots (`capacity` already checked).
    pub(crate) fn prepare(&mut self, capacity: usize, who: &str) -> Result<()> {
        let empty = DenseEntry { generation: 0, pos: NONE, value: T::default() };
        self.entries = filled(capacity, empty, who)?;
        self.items = Vec::new();
        self.items
            .try_reserve_exact(capacity)
            .map_err(|e| Error::Selection(format!("{who}: cannot allocate {capacity} keys: {e}")))?;
        // Read at random by uniform draws, like the per-slot arrays.
        let bytes = capacity.saturating_mul(std::mem::size_of::<SlotKey>());
        gear_core::hint::advise_huge_pages(self.items.as_ptr().cast(), bytes);
        // Fault the reserved array in now, as `filled` does for the other
        // per-slot arrays: otherwise the first inserts into each 2 MiB of
        // it take a huge-page fault (and its zeroing) while the table lock
        // is held. No reallocation: the capacity is reserved.
        self.items.resize(capacity, SlotKey { slot: 0, generation: 0 });
        self.items.clear();
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Ok when `key` may be inserted: its slot is in range and not held.
    #[inline]
    pub(crate) fn check_insert(&self, key: SlotKey, who: &str) -> Result<()> {
        match self.entries.get(key.slot as usize) {
            None => Err(out_of_range(key, self.entries.len())),
            Some(e) if e.pos == NONE => Ok(()),
            Some(e) => Err(already_held(key, u64::from(e.generation), who)),
        }
    }

    /// Ok when `key` is held with exactly this generation.
    pub(crate) fn check_held(&self, key: SlotKey, who: &str) -> Result<()> {
        match self.entries.get(key.slot as usize) {
            None => Err(out_of_range(key, self.entries.len())),
            Some(e) if e.pos == NONE => Err(not_held(key, who)),
            Some(e) if e.generation == key.generation => Ok(()),
            Some(_) => Err(stale(key)),
        }
    }

    /// Whether `key` is held with exactly this generation.
    #[inline]
    pub(crate) fn holds(&self, key: SlotKey) -> bool {
        self.entries.get(key.slot as usize).is_some_and(|e| e.pos != NONE && e.generation == key.generation)
    }

    /// Loads the slot's record (nothing when out of range) so that its cache
    /// miss can overlap other work; pass the result to `black_box`.
    #[inline]
    pub(crate) fn touch(&self, slot: usize) -> u32 {
        self.entries.get(slot).map_or(0, |e| e.generation)
    }

    /// Starts loading the entry of `slot` (a hint; out of range is a no-op).
    #[inline]
    pub(crate) fn prefetch(&self, slot: usize) {
        if let Some(e) = self.entries.get(slot) {
            gear_core::hint::prefetch(e);
        }
    }

    /// Adds `key` with `value`. Call after [`DenseKeys::check_insert`].
    #[inline]
    pub(crate) fn insert(&mut self, key: SlotKey, value: T) {
        debug_assert!(self.check_insert(key, "").is_ok());
        let pos = self.items.len() as u32;
        self.entries[key.slot as usize] = DenseEntry { generation: key.generation, pos, value };
        self.items.push(key);
    }

    /// Removes `slot`. Call after [`DenseKeys::check_held`].
    pub(crate) fn remove(&mut self, slot: u32) {
        let entry = &mut self.entries[slot as usize];
        let at = std::mem::replace(&mut entry.pos, NONE) as usize;
        entry.value = T::default();
        self.items.swap_remove(at);
        if let Some(moved) = self.items.get(at) {
            self.entries[moved.slot as usize].pos = at as u32;
        }
    }

    /// The key held in `slot` (which must be held).
    #[inline]
    pub(crate) fn key(&self, slot: usize) -> SlotKey {
        debug_assert_ne!(self.entries[slot].pos, NONE);
        SlotKey { slot: slot as u32, generation: self.entries[slot].generation }
    }

    /// The value of `slot` (the default when not held).
    #[inline]
    pub(crate) fn value(&self, slot: usize) -> T {
        self.entries[slot].value
    }

    /// Sets the value of held `slot`.
    #[inline]
    pub(crate) fn set_value(&mut self, slot: usize, value: T) {
        self.entries[slot].value = value;
    }

    /// Appends the held keys in dense order to `out`, each as
    /// [`SlotKey::to_u64`] in little-endian bytes (a checkpoint's record of
    /// the order uniform draws index).
    pub(crate) fn export_order(&self, out: &mut Vec<u8>) {
        out.reserve(self.items.len() * 8);
        for key in &self.items {
            out.extend_from_slice(&key.to_u64().to_le_bytes());
        }
    }

    /// Puts the held keys into the order [`DenseKeys::export_order`] wrote:
    /// keys of `state` that are held come first, in its order (keys not
    /// held, or named twice, are skipped), then the held keys it did not
    /// name, in their present order.
    pub(crate) fn import_order(&mut self, state: &[u8], who: &str) -> Result<()> {
        if !state.len().is_multiple_of(8) {
            return Err(Error::Decode(format!(
                "{who}: a key order of {} bytes is not a whole number of 8-byte keys",
                state.len()
            )));
        }
        let mut order = Vec::with_capacity(self.items.len());
        let mut placed = vec![false; self.entries.len()];
        for chunk in state.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            let key = SlotKey::from_u64(u64::from_le_bytes(b));
            if self.holds(key) && !std::mem::replace(&mut placed[key.slot as usize], true) {
                order.push(key);
            }
        }
        for &key in &self.items {
            if !placed[key.slot as usize] {
                order.push(key);
            }
        }
        for (i, key) in order.iter().enumerate() {
            self.entries[key.slot as usize].pos = i as u32;
        }
        self.items = order;
        Ok(())
    }

    /// The `i`-th held key in the dense order (`i < len()`).
    #[inline]
    pub(crate) fn nth(&self, i: usize) -> SlotKey {
        self.items[i]
    }
}
