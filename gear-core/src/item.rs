//! Items: windows of stored trajectories, each with a priority of its own
//! (Reverb's model on GEAR's storage, SPEC.md "Items over stored
//! trajectories").
//!
//! A table whose spec has `items_per_trajectory = M > 0` keeps, after its
//! slot records, `M` [`ItemRecord`]s per slot: item `slot * M + j` is the
//! `j`-th item of whatever trajectory occupies `slot`. A record names a
//! window `[start, start + len)` of that trajectory and the slot
//! generation it was made for, so an item is valid only while its slot
//! still holds that trajectory: reusing a slot makes every record it had
//! stale at once, with no write to them, and an item can never name
//! another slot's bytes (its slot is its index divided by `M`, not a
//! stored field).
//!
//! Records follow the seqlock protocol of the slot records
//! ([`crate::slot`]): a record's generation is bumped, with a release
//! fence after it, before its fields are rewritten; a reader loads the
//! generation, reads the fields, issues an acquire fence and loads the
//! generation again. Keys of items are [`SlotKey::item`] keys (the item
//! index and generation, tagged), so they are told apart from trajectory
//! keys everywhere keys travel.
//!
//! Life cycle: `Free` (holds nothing, or was removed) -> `Pending` (added
//! by the trajectory's writer while writing; not selectable) -> `Live`
//! (selectable: committed with its trajectory, or added to a committed
//! one) -> `Free` (its trajectory was evicted, or it was sampled
//! `max_times_sampled` times). Only the writer of a slot being written
//! fills that slot's records; every other change happens under the table
//! lock.

use crate::slot::{SlotKey, ITEM_KEY_BIT};
use crate::sync::{fence, AtomicU64, Ordering};

/// The life cycle of an item record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ItemState {
    /// Holds no item.
    Free = 0,
    /// Added while its trajectory is being written; becomes `Live` when
    /// the trajectory commits (or is reclaimed from a dead writer, if its
    /// window lies inside the steps that writer published).
    Pending = 1,
    /// Selectable.
    Live = 2,
}

impl ItemState {
    fn from_bits(b: u64) -> ItemState {
        match b & 0xff {
            1 => ItemState::Pending,
            2 => ItemState::Live,
            _ => ItemState::Free,
        }
    }
}

impl std::fmt::Display for ItemState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ItemState::Free => "free",
            ItemState::Pending => "pending",
            ItemState::Live => "live",
        })
    }
}

/// The shared record of one item. `#[repr(C)]`, 32 bytes, atomics only,
/// so an all-zero record (a fresh mapping) is a free item of generation 0
/// and any bit pattern is a value (garbage reads as some state, and every
/// field is checked against the slot before use).
#[repr(C, align(32))]
#[derive(Debug, Default)]
pub struct ItemRecord {
    /// `generation << 32 | state`; the generation keeps 31 bits (the
    /// key's tag bit is not stored).
    state_gen: AtomicU64,
    /// `start << 32 | len`: the window, in steps of the trajectory.
    window: AtomicU64,
    /// Priority as `f64` bits; NaN on a `Pending` record means the
    /// sampling strategy chooses it at commit.
    priority: AtomicU64,
    /// `slot generation << 32 | times sampled` (the count saturates at
    /// `u32::MAX`).
    slot_sampled: AtomicU64,
}

/// A snapshot of an item record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ItemMeta {
    /// The item's key ([`SlotKey::item`]).
    pub key: SlotKey,
    /// Life-cycle state.
    pub state: ItemState,
    /// Generation of the slot the item was made for.
    pub slot_generation: u32,
    /// First step of the window.
    pub start: u64,
    /// Steps in the window.
    pub len: u64,
    /// Priority (NaN: not chosen yet).
    pub priority: f64,
    /// Times sampled.
    pub times_sampled: u64,
}

impl ItemMeta {
    /// Whether the record names a window of trajectory `slot` (the slot's
    /// current key) whose `published` steps cover it: made for that
    /// generation, not free, at least one step, inside the published
    /// steps.
    pub fn belongs_to(&self, slot: SlotKey, published: u64) -> bool {
        self.state != ItemState::Free
            && self.slot_generation == slot.generation
            && self.len > 0
            && self.start.checked_add(self.len).is_some_and(|end| end <= published)
    }
}

/// Where a live item's steps are, as one consistent read of its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemWindow {
    /// Generation of the slot the item was made for.
    pub slot_generation: u32,
    /// First step.
    pub start: u64,
    /// Steps.
    pub len: u64,
}

const GEN_MASK: u32 = !ITEM_KEY_BIT;

const fn pack(generation: u32, state: ItemState) -> u64 {
    (((generation & GEN_MASK) as u64) << 32) | state as u64
}

fn generation_of(v: u64) -> u32 {
    (v >> 32) as u32 & GEN_MASK
}

/// The index of the `j`-th item of `slot` in a table of `per_slot` items
/// per trajectory (the caller keeps `j < per_slot`; the table's spec
/// bounds `capacity * per_slot` by `u32::MAX`).
pub const fn item_index(slot: u32, j: u32, per_slot: u32) -> u32 {
    slot.wrapping_mul(per_slot).wrapping_add(j)
}

impl ItemRecord {
    /// Current key and state.
    #[inline]
    pub fn key_state(&self, index: u32) -> (SlotKey, ItemState) {
        let v = self.state_gen.load(Ordering::Acquire);
        (SlotKey::item(index, generation_of(v)), ItemState::from_bits(v))
    }

    /// Snapshot of every field.
    pub fn meta(&self, index: u32) -> ItemMeta {
        let (key, state) = self.key_state(index);
        let window = self.window.load(Ordering::Relaxed);
        let slot_sampled = self.slot_sampled.load(Ordering::Relaxed);
        ItemMeta {
            key,
            state,
            slot_generation: (slot_sampled >> 32) as u32,
            start: window >> 32,
            len: window & 0xffff_ffff,
            priority: f64::from_bits(self.priority.load(Ordering::Relaxed)),
            times_sampled: slot_sampled & 0xffff_ffff,
        }
    }

    /// Makes the record hold a new item: the next generation, then the
    /// fields, then `state` (`Pending` or `Live`). Only the record's
    /// owner calls it: the writer of the slot while it writes, or a
    /// holder of the table lock. `priority` NaN leaves the choice to the
    /// strategy (pending items only). `start` and `len` must fit 32 bits
    /// (the table's spec bounds `T` so). Returns the item's key.
    pub fn fill(
        &self,
        index: u32,
        slot_generation: u32,
        start: u64,
        len: u64,
        priority: f64,
        state: ItemState,
    ) -> SlotKey {
        let generation = generation_of(self.state_gen.load(Ordering::Acquire)).wrapping_add(1) & GEN_MASK;
        self.fill_as(index, generation, slot_generation, start, len, priority, state)
    }

    /// [`ItemRecord::fill`] with a given generation (restoring a
    /// checkpoint into a fresh table, so item keys handed out before it
    /// name the same items after it).
    #[allow(clippy::too_many_arguments)]
    pub fn fill_as(
        &self,
        index: u32,
        generation: u32,
        slot_generation: u32,
        start: u64,
        len: u64,
        priority: f64,
        state: ItemState,
    ) -> SlotKey {
        // Seqlock write side: the new generation is visible before any
        // field changes, so a reader that copied with the old key and saw
        // a new field sees the new generation on its second load.
        self.state_gen.store(pack(generation, ItemState::Free), Ordering::Relaxed);
        fence(Ordering::Release);
        self.window.store((start << 32) | (len & 0xffff_ffff), Ordering::Relaxed);
        self.priority.store(priority.to_bits(), Ordering::Relaxed);
        self.slot_sampled.store(u64::from(slot_generation) << 32, Ordering::Relaxed);
        self.state_gen.store(pack(generation, state), Ordering::Release);
        SlotKey::item(index, generation)
    }

    /// Moves the item `key` names from `from` to `to` (under the table
    /// lock); false when the key is not current or the state is not
    /// `from`.
    pub fn transition(&self, key: SlotKey, from: ItemState, to: ItemState) -> bool {
        self.state_gen
            .compare_exchange(
                pack(key.item_generation(), from),
                pack(key.item_generation(), to),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Frees the record whatever item it holds, keeping its generation
    /// (under the table lock: an evicted trajectory's items, or garbage
    /// found by a repair).
    pub fn clear(&self) {
        let v = self.state_gen.load(Ordering::Acquire);
        if ItemState::from_bits(v) != ItemState::Free {
            self.state_gen.store(pack(generation_of(v), ItemState::Free), Ordering::Release);
        }
    }

    /// Seqlock read side, first half: the window of the live item `key`,
    /// read consistently, or `None` when the key is not current or the
    /// item is not live.
    #[inline]
    pub fn read(&self, key: SlotKey) -> Option<ItemWindow> {
        let v = self.state_gen.load(Ordering::Acquire);
        if generation_of(v) != key.item_generation() || ItemState::from_bits(v) != ItemState::Live {
            return None;
        }
        let window = self.window.load(Ordering::Relaxed);
        let slot_sampled = self.slot_sampled.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if generation_of(self.state_gen.load(Ordering::Relaxed)) != key.item_generation() {
            return None;
        }
        Some(ItemWindow {
            slot_generation: (slot_sampled >> 32) as u32,
            start: window >> 32,
            len: window & 0xffff_ffff,
        })
    }

    /// Seqlock read side, second half: whether the record still holds the
    /// item `key` names (its generation did not move on).
    #[inline]
    pub fn read_validate(&self, key: SlotKey) -> bool {
        fence(Ordering::Acquire);
        generation_of(self.state_gen.load(Ordering::Relaxed)) == key.item_generation()
    }

    /// Stores a priority if `key` is current; returns whether it was.
    pub fn set_priority(&self, key: SlotKey, priority: f64) -> bool {
        if self.key_state(key.slot).0 != key {
            return false;
        }
        self.priority.store(priority.to_bits(), Ordering::Relaxed);
        true
    }

    /// Counts one more sample of the current item; returns the new count
    /// (saturating at `u32::MAX`, which the record keeps).
    pub fn add_sampled(&self) -> u64 {
        let mut cur = self.slot_sampled.load(Ordering::Relaxed);
        loop {
            if cur & 0xffff_ffff == 0xffff_ffff {
                return u64::from(u32::MAX);
            }
            match self.slot_sampled.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return (cur & 0xffff_ffff) + 1,
                Err(v) => cur = v,
            }
        }
    }

    /// Sets the times sampled of the current item (restoring a
    /// checkpoint); false when `key` is not current.
    pub fn set_times_sampled(&self, key: SlotKey, times: u64) -> bool {
        if self.key_state(key.slot).0 != key {
            return false;
        }
        let times = times.min(u64::from(u32::MAX));
        let slot = self.slot_sampled.load(Ordering::Relaxed) & !0xffff_ffff;
        self.slot_sampled.store(slot | times, Ordering::Relaxed);
        true
    }
}

/// Which items a trajectory gets from its length alone: a table's default
/// for trajectories committed without items of their own, or what a
/// writer asks for explicitly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ItemPattern {
    /// No item (items are added explicitly, or later to the committed
    /// trajectory).
    None,
    /// One item spanning the whole trajectory: trajectories sampled as
    /// rows, as in a table without items (and one item per transition for
    /// batches of one-step transitions).
    #[default]
    Whole,
    /// Windows of `len` steps starting every `stride` steps from step 0
    /// (R2D2: 80 every 40), each window that fits whole. With `tail`, the
    /// steps after the last whole window get one more, shorter, window
    /// (starting at the next stride, running to the end; sampling pads it
    /// as the sampler's window says), so every step is in some window; a
    /// trajectory shorter than `len` then gets one window of all its steps.
    Windows {
        /// Steps per window.
        len: u64,
        /// Steps between window starts.
        stride: u64,
        /// Whether the short window at the end is made.
        tail: bool,
    },
    /// One item per transition for DQN-style learners: for every step `t`
    /// that has a next step, the window `[t, t + n_step]`, cut at the
    /// trajectory's last step (fewer steps near the end). A trajectory of
    /// `k` steps (write the observation after the last action as a last
    /// step) gets `k - 1` items; frame stacks are read before the window
    /// at sample time, so they need no steps of their own here.
    Transitions {
        /// Steps of the return (1: one-step TD).
        n_step: u64,
    },
}

impl ItemPattern {
    /// Checks the pattern's parameters.
    pub fn validate(&self) -> crate::Result<()> {
        match *self {
            ItemPattern::Windows { len, stride, .. } if len == 0 || stride == 0 => Err(crate::Error::InvalidSpec(
                format!("item windows need a length and a stride of at least 1 (got {len} every {stride})"),
            )),
            ItemPattern::Transitions { n_step: 0 } => {
                Err(crate::Error::InvalidSpec("transition items need n_step of at least 1".into()))
            }
            _ => Ok(()),
        }
    }

    /// The items of a trajectory of `len` steps, as `(start, len)`
    /// windows in order. The count is [`ItemPattern::count`].
    pub fn windows(&self, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let k = len;
        let (n, step, size, tail): (u64, u64, u64, Option<u64>) = match *self {
            ItemPattern::None => (0, 1, 0, None),
            ItemPattern::Whole => (u64::from(k > 0), 1, k, None),
            ItemPattern::Windows { len, stride, tail } => {
                let stride = stride.max(1);
                let full = if k >= len { (k - len) / stride + 1 } else { 0 };
                let covered = if full == 0 { 0 } else { (full - 1) * stride + len };
                let extra = (tail && covered < k).then(|| full * stride).filter(|&s| s < k || full == 0);
                (full, stride, len, extra)
            }
            ItemPattern::Transitions { n_step } => (k.saturating_sub(1), 1, n_step.saturating_add(1), None),
        };
        let transitions = matches!(self, ItemPattern::Transitions { .. });
        (0..n)
            .map(move |i| {
                let start = i * step;
                // Transition windows are cut at the last step.
                let len = if transitions { size.min(k - start) } else { size };
                (start, len)
            })
            .chain(tail.map(|start| (start.min(k.saturating_sub(1)), k - start.min(k.saturating_sub(1)))))
            .filter(|&(_, len)| len > 0)
    }

    /// How many items [`ItemPattern::windows`] gives a trajectory of
    /// `len` steps.
    pub fn count(&self, len: u64) -> u64 {
        self.windows(len).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_give_the_documented_windows() {
        let w = |p: ItemPattern, k| p.windows(k).collect::<Vec<_>>();
        assert_eq!(w(ItemPattern::None, 5), vec![]);
        assert_eq!(w(ItemPattern::Whole, 5), vec![(0, 5)]);
        assert_eq!(w(ItemPattern::Whole, 0), vec![]);
        let r2d2 = ItemPattern::Windows { len: 80, stride: 40, tail: false };
        assert_eq!(w(r2d2, 200), vec![(0, 80), (40, 80), (80, 80), (120, 80)]);
        assert_eq!(w(r2d2, 79), vec![]);
        let tail = ItemPattern::Windows { len: 80, stride: 40, tail: true };
        assert_eq!(w(tail, 210), vec![(0, 80), (40, 80), (80, 80), (120, 80), (160, 50)]);
        assert_eq!(w(tail, 200), w(r2d2, 200), "whole windows reach the end: no tail");
        assert_eq!(w(tail, 30), vec![(0, 30)]);
        assert_eq!(w(ItemPattern::Windows { len: 3, stride: 5, tail: true }, 12), vec![(0, 3), (5, 3), (10, 2)]);
        assert_eq!(w(ItemPattern::Windows { len: 3, stride: 5, tail: false }, 12), vec![(0, 3), (5, 3)]);
        let dqn = ItemPattern::Transitions { n_step: 3 };
        assert_eq!(w(dqn, 5), vec![(0, 4), (1, 4), (2, 3), (3, 2)]);
        assert_eq!(w(ItemPattern::Transitions { n_step: 1 }, 3), vec![(0, 2), (1, 2)]);
        assert_eq!(w(dqn, 1), vec![]);
        assert_eq!(dqn.count(5), 4);
        assert!(ItemPattern::Transitions { n_step: 0 }.validate().is_err());
        assert!(ItemPattern::Windows { len: 0, stride: 1, tail: false }.validate().is_err());
    }

    #[test]
    fn record_is_32_bytes_and_zero_is_free() {
        assert_eq!(std::mem::size_of::<ItemRecord>(), 32);
        let r = ItemRecord::default();
        assert_eq!(r.key_state(9), (SlotKey::item(9, 0), ItemState::Free));
        assert_eq!(r.read(SlotKey::item(9, 0)), None);
    }

    #[test]
    fn life_cycle_and_stale_keys() {
        let r = ItemRecord::default();
        let k1 = r.fill(4, 7, 10, 80, f64::NAN, ItemState::Pending);
        assert_eq!(k1, SlotKey::item(4, 1));
        assert!(k1.is_item());
        assert_eq!(r.read(k1), None, "a pending item is not readable");
        assert!(r.transition(k1, ItemState::Pending, ItemState::Live));
        assert_eq!(r.read(k1), Some(ItemWindow { slot_generation: 7, start: 10, len: 80 }));
        assert!(r.set_priority(k1, 2.5));
        assert_eq!(r.add_sampled(), 1);
        assert_eq!(r.add_sampled(), 2);
        let m = r.meta(4);
        assert_eq!(
            (m.state, m.slot_generation, m.start, m.len, m.priority, m.times_sampled),
            (ItemState::Live, 7, 10, 80, 2.5, 2)
        );
        assert!(m.belongs_to(SlotKey { slot: 0, generation: 7 }, 90));
        assert!(!m.belongs_to(SlotKey { slot: 0, generation: 7 }, 89), "window past the published steps");
        assert!(!m.belongs_to(SlotKey { slot: 0, generation: 8 }, 90), "another trajectory in the slot");
        r.clear();
        assert_eq!(r.read(k1), None);
        assert!(r.read_validate(k1), "clearing keeps the generation: copies made before stay valid");
        let k2 = r.fill(4, 8, 0, 1, 1.0, ItemState::Live);
        assert_eq!(k2.item_generation(), 2);
        assert!(!r.read_validate(k1));
        assert!(!r.set_priority(k1, 9.0), "stale priority update is ignored");
        assert!(!r.set_times_sampled(k1, 3));
        assert!(r.set_times_sampled(k2, 3));
        assert_eq!(r.meta(4).times_sampled, 3);
        assert_eq!(r.meta(4).slot_generation, 8);
    }

    #[test]
    fn counts_saturate_and_generations_wrap_below_the_tag() {
        let r = ItemRecord::default();
        let k = r.fill_as(1, GEN_MASK, 3, 0, 2, 1.0, ItemState::Live);
        assert_eq!(k.item_generation(), GEN_MASK);
        assert!(r.set_times_sampled(k, u64::MAX));
        assert_eq!(r.add_sampled(), u64::from(u32::MAX));
        assert_eq!(r.meta(1).slot_generation, 3, "a saturated count leaves the slot generation alone");
        let k2 = r.fill(1, 3, 0, 2, 1.0, ItemState::Live);
        assert_eq!(k2.item_generation(), 0);
        assert_eq!(item_index(3, 2, 5), 17);
    }
}
