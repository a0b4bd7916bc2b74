//! Per-slot metadata and the keys handed to users.
//!
//! Each slot has a [`SlotRecord`] of atomics. Records live in the table's
//! region next to the data (so another process that maps the region sees
//! them) and follow a seqlock protocol (Lameter, "Effective synchronization
//! on Linux/NUMA systems", 2005; Boehm, "Can seqlocks get along with
//! programming language memory models?", 2012):
//!
//! * a slot's *generation* is bumped, with a release fence after it, before
//!   any byte of a reused slot is overwritten;
//! * a reader loads the generation (acquire), copies, issues an acquire fence
//!   and loads it again; if it changed the copy may be torn and is discarded.
//!
//! Keys carry `(slot, generation)`. Operations given a key whose generation
//! is no longer current are **refused** with [`Error::StaleKey`] when they
//! would write (appending, committing) and **ignored** (reported as not
//! applied) when they only adjust metadata (priority updates), as users of
//! prioritized replay expect for late priority updates.

use crate::error::{Error, Result};
use crate::sync::{fence, AtomicU64, Ordering};

/// A user-visible handle to one stored trajectory: the slot and the
/// generation the slot had when the trajectory was written; or, in a table
/// with items, to one item (see [`crate::item`]): then `slot` is the item's
/// index and `generation` the item's generation with [`ITEM_KEY_BIT`] set,
/// so the two kinds of key never name each other (slot generations never
/// carry that bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// Slot index, `< capacity` (an item key: the item's index).
    pub slot: u32,
    /// Generation of the slot when the key was made (an item key: the
    /// item's generation, with [`ITEM_KEY_BIT`]).
    pub generation: u32,
}

/// The bit of [`SlotKey::generation`] that marks an item's key. Slot
/// generations wrap below it (31 bits), item generations are kept in the
/// 31 bits under it.
pub const ITEM_KEY_BIT: u32 = 1 << 31;

impl SlotKey {
    /// The key of item `index` at `generation` (the low 31 bits are used).
    pub const fn item(index: u32, generation: u32) -> Self {
        SlotKey { slot: index, generation: (generation & !ITEM_KEY_BIT) | ITEM_KEY_BIT }
    }

    /// Whether this is an item's key (made by [`SlotKey::item`]) rather
    /// than a trajectory's.
    pub const fn is_item(self) -> bool {
        self.generation & ITEM_KEY_BIT != 0
    }

    /// An item key's generation without the tag bit (a trajectory key's
    /// generation as it is).
    pub const fn item_generation(self) -> u32 {
        self.generation & !ITEM_KEY_BIT
    }

    /// Packs the key into one `u64` (generation high, slot low), the form
    /// kept in device buffers and wire messages.
    pub const fn to_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.slot as u64
    }

    /// Unpacks [`SlotKey::to_u64`].
    pub const fn from_u64(v: u64) -> Self {
        SlotKey { slot: v as u32, generation: (v >> 32) as u32 }
    }
}

impl std::fmt::Display for SlotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_item() {
            write!(f, "item {}@{}", self.slot, self.item_generation())
        } else {
            write!(f, "{}@{}", self.slot, self.generation)
        }
    }
}

/// The life cycle of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SlotState {
    /// Holds nothing.
    Free = 0,
    /// A writer owns it and is appending; its published steps may be read.
    Writing = 1,
    /// Complete and selectable.
    Committed = 2,
    /// Complete, taken out of selection (it reached its maximum sample
    /// count) and about to be freed once the sampler that drew it last has
    /// copied it; `owner` is that sampler's process.
    Retiring = 3,
}

impl SlotState {
    fn from_bits(b: u64) -> SlotState {
        match b & 0xff {
            1 => SlotState::Writing,
            2 => SlotState::Committed,
            3 => SlotState::Retiring,
            _ => SlotState::Free,
        }
    }
}

impl std::fmt::Display for SlotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotState::Free => "free",
            SlotState::Writing => "writing",
            SlotState::Committed => "committed",
            SlotState::Retiring => "retiring",
        })
    }
}

/// The shared metadata of one slot. `#[repr(C)]`, 64 bytes, made only of
/// atomics, so an all-zero record (a fresh mapping) is a valid free slot of
/// generation 0.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct SlotRecord {
    /// `generation << 32 | state`. The generation only grows (wrapping);
    /// it is bumped when a free slot is taken for writing.
    state_gen: AtomicU64,
    /// Published length: steps readable by samplers. Only grows while the
    /// slot is `Writing`; stored with release after the step bytes.
    len: AtomicU64,
    /// Priority as `f64` bits.
    priority: AtomicU64,
    /// How many times the trajectory was sampled.
    times_sampled: AtomicU64,
    /// Table-wide sequence number of the insert (the order FIFO-style
    /// strategies and tie-breaks use).
    insert_seq: AtomicU64,
    /// Identity of the writer that owns the slot while `Writing`
    /// (a process id; 0 when none).
    owner: AtomicU64,
    _reserved: [AtomicU64; 2],
}

/// A consistent-enough snapshot of a slot's metadata.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotMeta {
    /// The key of the current occupant.
    pub key: SlotKey,
    /// Life-cycle state.
    pub state: SlotState,
    /// Published length in steps.
    pub len: u64,
    /// Priority.
    pub priority: f64,
    /// Times sampled.
    pub times_sampled: u64,
    /// Insert sequence number.
    pub insert_seq: u64,
    /// Owner id while writing.
    pub owner: u64,
}

const fn pack(generation: u32, state: SlotState) -> u64 {
    ((generation as u64) << 32) | state as u64
}

impl SlotRecord {
    /// Current key and state.
    #[inline]
    pub fn key_state(&self, slot: u32) -> (SlotKey, SlotState) {
        let v = self.state_gen.load(Ordering::Acquire);
        (SlotKey { slot, generation: (v >> 32) as u32 }, SlotState::from_bits(v))
    }

    /// Snapshot of every field.
    pub fn meta(&self, slot: u32) -> SlotMeta {
        let (key, state) = self.key_state(slot);
        SlotMeta {
            key,
            state,
            len: self.len.load(Ordering::Acquire),
            priority: f64::from_bits(self.priority.load(Ordering::Relaxed)),
            times_sampled: self.times_sampled.load(Ordering::Relaxed),
            insert_seq: self.insert_seq.load(Ordering::Relaxed),
            owner: self.owner.load(Ordering::Relaxed),
        }
    }

    /// Takes a free slot for writing: bumps the generation, sets the state
    /// to `Writing`, length 0. The caller must hold the right to allocate
    /// (the table's allocator); refused if the slot is not free.
    pub fn begin_write(&self, slot: u32, owner: u64, insert_seq: u64, priority: f64) -> Result<SlotKey> {
        let cur = self.state_gen.load(Ordering::Acquire);
        let state = SlotState::from_bits(cur);
        if state != SlotState::Free {
            return Err(Error::SlotState { slot, op: "begin a trajectory", state });
        }
        // Slot generations stay below the item-key bit, so a trajectory's
        // key is never taken for an item's.
        let generation = ((cur >> 32) as u32).wrapping_add(1) & !ITEM_KEY_BIT;
        // The owner goes in before the state says `Writing`: a process killed
        // between the two leaves a free slot, never a writing one with no
        // owner to reclaim it from.
        self.owner.store(owner, Ordering::Relaxed);
        self.state_gen
            .compare_exchange(cur, pack(generation, SlotState::Writing), Ordering::AcqRel, Ordering::Acquire)
            .map_err(|v| Error::SlotState { slot, op: "begin a trajectory", state: SlotState::from_bits(v) })?;
        // Seqlock write side: the generation bump must be visible before any
        // byte of the reused slot changes.
        fence(Ordering::Release);
        self.len.store(0, Ordering::Release);
        self.priority.store(priority.to_bits(), Ordering::Relaxed);
        self.times_sampled.store(0, Ordering::Relaxed);
        self.insert_seq.store(insert_seq, Ordering::Relaxed);
        Ok(SlotKey { slot, generation })
    }

    /// Takes a free slot for writing with a given generation, as
    /// [`SlotRecord::begin_write`] does with the next one: for restoring a
    /// checkpoint into a fresh table, so that keys handed out before the
    /// checkpoint name the same trajectories after it. The caller must hold
    /// the right to allocate and must not restore a generation the slot
    /// already had since its bytes were last read (a fresh table's slots
    /// have had none); refused if the slot is not free.
    pub fn begin_restore(&self, key: SlotKey, owner: u64, insert_seq: u64, priority: f64) -> Result<()> {
        let cur = self.state_gen.load(Ordering::Acquire);
        let state = SlotState::from_bits(cur);
        if state != SlotState::Free {
            return Err(Error::SlotState { slot: key.slot, op: "restore a trajectory", state });
        }
        self.owner.store(owner, Ordering::Relaxed);
        self.state_gen
            .compare_exchange(cur, pack(key.generation, SlotState::Writing), Ordering::AcqRel, Ordering::Acquire)
            .map_err(|v| Error::SlotState {
                slot: key.slot,
                op: "restore a trajectory",
                state: SlotState::from_bits(v),
            })?;
        fence(Ordering::Release);
        self.len.store(0, Ordering::Release);
        self.priority.store(priority.to_bits(), Ordering::Relaxed);
        self.times_sampled.store(0, Ordering::Relaxed);
        self.insert_seq.store(insert_seq, Ordering::Relaxed);
        Ok(())
    }

    /// Sets how many times the current occupant was sampled (restoring a
    /// checkpoint); ignored, returning false, when `key` is not current.
    pub fn set_times_sampled(&self, key: SlotKey, times: u64) -> bool {
        if self.key_state(key.slot).0 != key {
            return false;
        }
        self.times_sampled.store(times, Ordering::Relaxed);
        true
    }

    /// Checks that `key` is current and in `state`.
    pub fn check(&self, key: SlotKey, state: SlotState, op: &'static str) -> Result<()> {
        let (cur, s) = self.key_state(key.slot);
        if cur.generation != key.generation {
            return Err(Error::StaleKey { slot: key.slot, generation: key.generation });
        }
        if s != state {
            return Err(Error::SlotState { slot: key.slot, op, state: s });
        }
        Ok(())
    }

    /// Publishes `len` steps of a slot being written. Release: the step
    /// bytes written before are visible to a reader that sees the length.
    pub fn publish_len(&self, key: SlotKey, len: u64) -> Result<()> {
        self.check(key, SlotState::Writing, "publish steps")?;
        self.len.store(len, Ordering::Release);
        Ok(())
    }

    /// [`SlotRecord::publish_len`] for a caller that has just checked that
    /// its key is current and `Writing` and owns the slot (nobody else
    /// changes the state of a slot being written but its writer).
    #[inline]
    pub(crate) fn publish_len_of_own(&self, len: u64) {
        self.len.store(len, Ordering::Release);
    }

    /// `Writing` -> `Committed`.
    pub fn commit(&self, key: SlotKey) -> Result<()> {
        self.transition(key, SlotState::Writing, SlotState::Committed, "commit")?;
        self.owner.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// `Committed` -> `Retiring`, owned by the sampler process `owner`.
    pub fn retire(&self, key: SlotKey, owner: u64) -> Result<()> {
        self.transition(key, SlotState::Committed, SlotState::Retiring, "retire")?;
        self.owner.store(owner, Ordering::Relaxed);
        Ok(())
    }

    /// Frees the slot (eviction, or an abandoned trajectory). The bytes stay
    /// until the slot is reused, which bumps the generation first.
    pub fn free(&self, key: SlotKey) -> Result<()> {
        let cur = self.state_gen.load(Ordering::Acquire);
        let state = SlotState::from_bits(cur);
        if (cur >> 32) as u32 != key.generation {
            return Err(Error::StaleKey { slot: key.slot, generation: key.generation });
        }
        if state == SlotState::Free {
            return Err(Error::SlotState { slot: key.slot, op: "free", state });
        }
        self.transition(key, state, SlotState::Free, "free")?;
        self.owner.store(0, Ordering::Relaxed);
        Ok(())
    }

    fn transition(&self, key: SlotKey, from: SlotState, to: SlotState, op: &'static str) -> Result<()> {
        self.state_gen
            .compare_exchange(pack(key.generation, from), pack(key.generation, to), Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|v| {
                if (v >> 32) as u32 != key.generation {
                    Error::StaleKey { slot: key.slot, generation: key.generation }
                } else {
                    Error::SlotState { slot: key.slot, op, state: SlotState::from_bits(v) }
                }
            })
    }

    /// Stores a priority if `key` is still current; returns whether it was
    /// applied (stale keys are ignored, see the module doc).
    pub fn set_priority(&self, key: SlotKey, priority: f64) -> bool {
        if self.key_state(key.slot).0 != key {
            return false;
        }
        self.priority.store(priority.to_bits(), Ordering::Relaxed);
        true
    }

    /// Counts one more sample of the current occupant; returns the new count.
    pub fn add_sampled(&self) -> u64 {
        self.times_sampled.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// Seqlock read side, first half: the published length if `key` is
    /// current and readable (`Writing` or `Committed`).
    #[inline]
    pub fn read_begin(&self, key: SlotKey) -> Option<u64> {
        let (cur, state) = self.key_state(key.slot);
        (cur == key && state != SlotState::Free).then(|| self.len.load(Ordering::Acquire))
    }

    /// Seqlock read side, second half: whether the bytes copied since
    /// [`SlotRecord::read_begin`] belong to `key`'s trajectory.
    #[inline]
    pub fn read_validate(&self, key: SlotKey) -> bool {
        fence(Ordering::Acquire);
        (self.state_gen.load(Ordering::Relaxed) >> 32) as u32 == key.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_is_64_bytes_and_zero_is_free() {
        assert_eq!(std::mem::size_of::<SlotRecord>(), 64);
        let r = SlotRecord::default();
        assert_eq!(r.key_state(3), (SlotKey { slot: 3, generation: 0 }, SlotState::Free));
    }

    #[test]
    fn life_cycle_and_stale_keys() {
        let r = SlotRecord::default();
        let k1 = r.begin_write(7, 42, 1, 1.0).unwrap();
        assert_eq!(k1, SlotKey { slot: 7, generation: 1 });
        assert!(r.begin_write(7, 42, 2, 1.0).is_err(), "slot already taken");
        r.publish_len(k1, 3).unwrap();
        assert_eq!(r.read_begin(k1), Some(3));
        r.commit(k1).unwrap();
        assert!(r.publish_len(k1, 4).is_err(), "committed slots take no more steps");
        assert!(r.set_priority(k1, 2.0));
        r.free(k1).unwrap();
        assert_eq!(r.read_begin(k1), None);
        let k2 = r.begin_write(7, 43, 3, 0.5).unwrap();
        assert_eq!(k2.generation, 2);
        assert!(!r.set_priority(k1, 9.0), "stale priority update is ignored");
        assert_eq!(r.meta(7).priority, 0.5);
        assert!(matches!(r.publish_len(k1, 1), Err(Error::StaleKey { .. })));
        assert!(matches!(r.commit(k1), Err(Error::StaleKey { .. })));
        assert!(!r.read_validate(k1));
        assert!(r.read_validate(k2));
    }

    #[test]
    fn restore_keeps_the_given_generation() {
        let r = SlotRecord::default();
        let key = SlotKey { slot: 4, generation: 77 };
        r.begin_restore(key, 9, 12, 0.25).unwrap();
        r.publish_len(key, 5).unwrap();
        r.commit(key).unwrap();
        assert!(r.set_times_sampled(key, 3));
        let m = r.meta(4);
        assert_eq!(
            (m.key, m.state, m.len, m.priority, m.times_sampled, m.insert_seq),
            (key, SlotState::Committed, 5, 0.25, 3, 12)
        );
        assert!(r.begin_restore(key, 9, 13, 1.0).is_err(), "only a free slot is restored into");
        assert!(!r.set_times_sampled(SlotKey { slot: 4, generation: 76 }, 1));
    }

    #[test]
    fn slot_generations_wrap_below_the_item_bit() {
        let r = SlotRecord::default();
        r.state_gen.store(pack(ITEM_KEY_BIT - 1, SlotState::Free), Ordering::Relaxed);
        let k = r.begin_write(2, 1, 1, 0.0).unwrap();
        assert_eq!(k.generation, 0);
        assert!(!k.is_item());
        let item = SlotKey::item(5, u32::MAX);
        assert!(item.is_item());
        assert_eq!(item.item_generation(), ITEM_KEY_BIT - 1);
        assert_eq!(SlotKey::from_u64(item.to_u64()), item);
        assert_eq!(item.to_string(), format!("item 5@{}", ITEM_KEY_BIT - 1));
    }

    #[test]
    fn key_packs_into_u64() {
        let k = SlotKey { slot: 0xdead_beef, generation: 0x1234_5678 };
        assert_eq!(SlotKey::from_u64(k.to_u64()), k);
    }
}
