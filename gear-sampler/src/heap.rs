//! Priority-order strategies: [`MaxHeap`] (top-k, highest priority first)
//! and [`MinHeap`] (lowest first; the "evict the least useful" remover).
//!
//! An indexed binary heap (Sedgewick & Wayne, *Algorithms* 4th ed., section
//! 2.4, "index priority queue"; CLRS section 6.5) keeps each slot's position
//! so updates and removals by key are O(log n). Each entry's order is one
//! `u128` rank: the priority's bits (monotone for non-negative floats;
//! complemented for the min-heap) above the complemented insert sequence
//! number, so equal priorities put the older insert first and the heap
//! needs only integer comparisons. `sample(n)` reads the `n` best without
//! disturbing the heap by a best-first walk with a candidate heap,
//! O(n log n) (the simple form of Frederickson's heap selection, 1993).

use std::collections::BinaryHeap;

use gear_core::{check_priority, Error, RandomSource, Result, Sampled, SelectionRule, Selector, SlotKey};

use crate::keys::{check_capacity, filled, reserve_draws, SlotKeys, NONE};

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Larger ranks come first; see the module doc.
    rank: u128,
    slot: u32,
}

/// A max-heap of ranks over slots. `MAX_FIRST` picks whether higher
/// priorities rank higher.
#[derive(Clone, Debug, Default)]
struct IndexedHeap<const MAX_FIRST: bool> {
    keys: SlotKeys,
    /// Binary heap order: `heap[i].rank >= heap[2i+1].rank, heap[2i+2].rank`.
    heap: Vec<Entry>,
    /// Per slot: its index in `heap`, or [`NONE`]. Invariant:
    /// `heap[pos[s]].slot == s` for every held `s`.
    pos: Vec<u32>,
    /// Sequence number of the next insert.
    next_seq: u64,
    /// Largest priority recorded since `prepare`, 0 before any positive.
    max_priority: f64,
    /// Scratch for [`IndexedHeap::sample`]: (rank, heap index) of the
    /// candidates for the next best item.
    frontier: BinaryHeap<(u128, usize)>,
}

impl<const MAX_FIRST: bool> IndexedHeap<MAX_FIRST> {
    #[inline]
    fn rank(priority: f64, seq: u64) -> u128 {
        let bits = priority.to_bits();
        let p = if MAX_FIRST { bits } else { !bits };
        (u128::from(p) << 64) | u128::from(!seq)
    }

    #[inline]
    fn priority_of(rank: u128) -> f64 {
        let p = (rank >> 64) as u64;
        f64::from_bits(if MAX_FIRST { p } else { !p })
    }

    #[inline]
    fn with_priority(rank: u128, priority: f64) -> u128 {
        Self::rank(priority, !(rank as u64))
    }

    fn prepare(&mut self, capacity: u64, who: &str) -> Result<()> {
        let capacity = check_capacity(capacity, self.keys.len(), who)?;
        self.keys.prepare(capacity, who)?;
        self.pos = filled(capacity, NONE, who)?;
        self.heap = Vec::new();
        self.heap
            .try_reserve_exact(capacity)
            .map_err(|e| Error::Selection(format!("{who}: cannot allocate a heap of {capacity}: {e}")))?;
        self.next_seq = 0;
        self.max_priority = 0.0;
        Ok(())
    }

    fn default_priority(&self) -> f64 {
        if self.max_priority > 0.0 {
            self.max_priority
        } else {
            1.0
        }
    }

    #[inline]
    fn place(&mut self, i: usize, e: Entry) {
        self.heap[i] = e;
        self.pos[e.slot as usize] = i as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        let e = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].rank >= e.rank {
                break;
            }
            self.place(i, self.heap[parent]);
            i = parent;
        }
        self.place(i, e);
    }

    fn sift_down(&mut self, mut i: usize) {
        let e = self.heap[i];
        let n = self.heap.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.heap[right].rank > self.heap[left].rank { right } else { left };
            if self.heap[child].rank <= e.rank {
                break;
            }
            self.place(i, self.heap[child]);
            i = child;
        }
        self.place(i, e);
    }

    fn insert(&mut self, key: SlotKey, priority: Option<f64>, who: &str) -> Result<f64> {
        self.keys.check_insert(key, who)?;
        let p = match priority {
            Some(p) => check_priority(p)? + 0.0,
            None => self.default_priority(),
        };
        self.keys.mark(key);
        self.max_priority = self.max_priority.max(p);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { rank: Self::rank(p, seq), slot: key.slot });
        let last = self.heap.len() - 1;
        self.sift_up(last);
        Ok(p)
    }

    fn update(&mut self, key: SlotKey, priority: f64, who: &str) -> Result<()> {
        self.keys.check_held(key, who)?;
        let p = check_priority(priority)? + 0.0;
        self.max_priority = self.max_priority.max(p);
        let i = self.pos[key.slot as usize] as usize;
        let old = self.heap[i].rank;
        let new = Self::with_priority(old, p);
        self.heap[i].rank = new;
        if new > old {
            self.sift_up(i);
        } else {
            self.sift_down(i);
        }
        Ok(())
    }

    fn remove(&mut self, key: SlotKey, who: &str) -> Result<()> {
        self.keys.check_held(key, who)?;
        self.keys.unmark(key.slot);
        let i = std::mem::replace(&mut self.pos[key.slot as usize], NONE) as usize;
        let last = self.heap.pop().expect("a held key has a heap entry");
        if i < self.heap.len() {
            let old = self.heap[i].rank;
            self.place(i, last);
            if last.rank > old {
                self.sift_up(i);
            } else {
                self.sift_down(i);
            }
        }
        Ok(())
    }

    fn push_sampled(&self, e: Entry, out: &mut Vec<Sampled>) {
        out.push(Sampled { key: self.keys.key(e.slot as usize), probability: 1.0, weight: 1.0 });
    }

    fn sample(&mut self, n: usize, out: &mut Vec<Sampled>, who: &str) -> Result<()> {
        let len = self.heap.len();
        if len == 0 {
            return Err(Error::Empty(format!("{who}: no items held")));
        }
        reserve_draws(out, n, who)?;
        if n >= len {
            // Every item, then again from the first.
            let mut all = self.heap.clone();
            all.sort_unstable_by_key(|e| std::cmp::Reverse(e.rank));
            for i in 0..n {
                self.push_sampled(all[i % len], out);
            }
            return Ok(());
        }
        // Best-first walk: the next best is always the root of the part not
        // yet taken, i.e. a child of something taken.
        let mut frontier = std::mem::take(&mut self.frontier);
        frontier.clear();
        frontier.push((self.heap[0].rank, 0usize));
        for _ in 0..n {
            let Some((_, i)) = frontier.pop() else { break };
            self.push_sampled(self.heap[i], out);
            for child in [2 * i + 1, 2 * i + 2] {
                if let Some(e) = self.heap.get(child) {
                    frontier.push((e.rank, child));
                }
            }
        }
        self.frontier = frontier;
        Ok(())
    }

    fn peek(&self) -> Option<(SlotKey, f64)> {
        self.heap.first().map(|e| (self.keys.key(e.slot as usize), Self::priority_of(e.rank)))
    }

    fn priority(&self, key: SlotKey, who: &str) -> Result<f64> {
        self.keys.check_held(key, who)?;
        Ok(Self::priority_of(self.heap[self.pos[key.slot as usize] as usize].rank))
    }
}

macro_rules! heap_selector {
    ($ty:ident, $name:literal, $max_first:literal, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Deterministic: `sample(n)` returns the held items in order
        /// (ties: the older insert first), distinct while they last, then
        /// starting again from the first; probability and weight are 1. An
        /// insert without a priority gets the largest positive priority
        /// seen so far (1.0 before any), as in prioritized replay.
        /// Insert, update and remove are O(log n); `sample(n)` is
        /// O(min(n, len) log) and leaves the heap unchanged.
        #[derive(Clone, Debug, Default)]
        pub struct $ty {
            heap: IndexedHeap<$max_first>,
        }

        impl $ty {
            /// An empty strategy; the table sizes it with
            /// [`Selector::prepare`].
            pub fn new() -> Self {
                Self::default()
            }

            /// The first key in order and its priority, the one
            /// `sample(1)` returns.
            pub fn peek(&self) -> Option<(SlotKey, f64)> {
                self.heap.peek()
            }

            /// The recorded priority of `key`.
            pub fn priority(&self, key: SlotKey) -> Result<f64> {
                self.heap.priority(key, $name)
            }
        }

        impl Selector for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn prepare(&mut self, capacity: u64) -> Result<()> {
                self.heap.prepare(capacity, $name)
            }

            /// Records `key`; returns the priority recorded.
            fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
                self.heap.insert(key, priority, $name)
            }

            fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
                self.heap.update(key, priority, $name)
            }

            fn remove(&mut self, key: SlotKey) -> Result<()> {
                self.heap.remove(key, $name)
            }

            fn len(&self) -> usize {
                self.heap.heap.len()
            }

            fn sample(&mut self, n: usize, _rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
                self.heap.sample(n, out, $name)
            }

            /// [`SelectionRule::TopK`] for the max-heap (ties between equal
            /// priorities may be broken differently by another
            /// implementation); none for the min-heap.
            fn selection_rule(&self) -> Option<SelectionRule> {
                $max_first.then_some(SelectionRule::TopK)
            }

            /// The largest priority seen (8 bytes), which later inserts
            /// without a priority get; the order itself follows from the
            /// members re-inserted in insertion order.
            fn export_state(&self, out: &mut Vec<u8>) -> Result<()> {
                out.extend_from_slice(&self.heap.max_priority.to_le_bytes());
                Ok(())
            }

            fn import_state(&mut self, state: &[u8]) -> Result<()> {
                let p = crate::keys::decode_max_priority(state, $name)?;
                self.heap.max_priority = self.heap.max_priority.max(p);
                Ok(())
            }
        }
    };
}

heap_selector!(MaxHeap, "max-heap", true, "Top-k: the highest priority first.");
heap_selector!(
    MinHeap,
    "min-heap",
    false,
    "The lowest priority first: as a remover, evicts the least useful trajectory."
);
