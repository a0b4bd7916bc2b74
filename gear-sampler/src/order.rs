//! Insertion-order strategies: FIFO (oldest first) and LIFO (newest
//! first), as samplers (queues, stacks) or removers (evict the oldest).
//!
//! An intrusive doubly linked list threaded through per-slot `prev`/`next`
//! arrays (the "index-linked list" of CLRS 3rd ed. section 10.3, "Implementing
//! pointers and objects") keeps insert, remove and each step of a walk O(1)
//! with no allocation after `prepare`.

use gear_core::{
    check_priority, insert_batch_ignoring_priorities, Error, RandomSource, Result, Sampled, Selector, SlotKey,
};

use crate::keys::{check_capacity, filled, reserve_draws, SlotKeys, NONE};

/// Held slots in insertion order.
#[derive(Clone, Debug)]
struct InsertionList {
    keys: SlotKeys,
    /// Per slot: the next newer held slot, or [`NONE`].
    next: Vec<u32>,
    /// Per slot: the next older held slot, or [`NONE`].
    prev: Vec<u32>,
    /// Oldest held slot, or [`NONE`] when empty.
    head: u32,
    /// Newest held slot, or [`NONE`] when empty.
    tail: u32,
}

impl Default for InsertionList {
    fn default() -> Self {
        InsertionList { keys: SlotKeys::default(), next: Vec::new(), prev: Vec::new(), head: NONE, tail: NONE }
    }
}

impl InsertionList {
    fn prepare(&mut self, capacity: u64, who: &str) -> Result<()> {
        let capacity = check_capacity(capacity, self.keys.len(), who)?;
        self.keys.prepare(capacity, who)?;
        self.next = filled(capacity, NONE, who)?;
        self.prev = filled(capacity, NONE, who)?;
        self.head = NONE;
        self.tail = NONE;
        Ok(())
    }

    #[inline]
    fn insert(&mut self, key: SlotKey, priority: Option<f64>, who: &str) -> Result<f64> {
        self.keys.check_insert(key, who)?;
        let p = check_priority(priority.unwrap_or(1.0))?;
        self.link_newest(key);
        Ok(p)
    }

    /// [`InsertionList::insert`] of each key in order, in one loop (the
    /// remover of every table takes each batch of small inserts here).
    fn insert_batch(
        &mut self,
        keys: &[SlotKey],
        priorities: Option<&[f64]>,
        recorded: &mut Vec<f64>,
        who: &str,
    ) -> Result<()> {
        insert_batch_ignoring_priorities(keys, priorities, recorded, |key| {
            self.keys.check_insert(key, who)?;
            self.link_newest(key);
            Ok(())
        })
    }

    /// Marks `key` held and links it in as the newest. Call after
    /// [`SlotKeys::check_insert`].
    #[inline]
    fn link_newest(&mut self, key: SlotKey) {
        self.keys.mark(key);
        let s = key.slot;
        self.prev[s as usize] = self.tail;
        self.next[s as usize] = NONE;
        match self.tail {
            NONE => self.head = s,
            t => self.next[t as usize] = s,
        }
        self.tail = s;
    }

    fn update(&mut self, key: SlotKey, priority: f64, who: &str) -> Result<()> {
        self.keys.check_held(key, who)?;
        check_priority(priority)?;
        Ok(())
    }

    fn remove(&mut self, key: SlotKey, who: &str) -> Result<()> {
        self.keys.check_held(key, who)?;
        self.keys.unmark(key.slot);
        let s = key.slot as usize;
        let (p, n) = (self.prev[s], self.next[s]);
        match p {
            NONE => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NONE => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[s] = NONE;
        self.next[s] = NONE;
        Ok(())
    }

    /// Appends `n` keys walking from `start` along `step`, wrapping to
    /// `start` at the end of the list.
    fn walk(&self, n: usize, oldest_first: bool, out: &mut Vec<Sampled>, who: &str) -> Result<()> {
        let (start, step) = if oldest_first { (self.head, &self.next) } else { (self.tail, &self.prev) };
        if start == NONE {
            return Err(Error::Empty(format!("{who}: no items held")));
        }
        reserve_draws(out, n, who)?;
        let mut s = start;
        for _ in 0..n {
            out.push(Sampled { key: self.keys.key(s as usize), probability: 1.0, weight: 1.0 });
            s = match step[s as usize] {
                NONE => start,
                next => next,
            };
        }
        Ok(())
    }

    /// The oldest (or newest) held key.
    fn end(&self, oldest: bool) -> Option<SlotKey> {
        match if oldest { self.head } else { self.tail } {
            NONE => None,
            s => Some(self.keys.key(s as usize)),
        }
    }
}

macro_rules! insertion_order_selector {
    ($ty:ident, $name:literal, $oldest_first:literal, $doc:literal, $peek_doc:literal) => {
        #[doc = $doc]
        ///
        /// Deterministic: `sample(n)` returns the held items in order,
        /// distinct while they last, then starting again from the first;
        /// probability and weight are 1. Priorities are checked but do not
        /// influence the order; an insert without one records 1.0. Insert,
        /// remove and each item drawn are O(1).
        #[derive(Clone, Debug, Default)]
        pub struct $ty {
            list: InsertionList,
        }

        impl $ty {
            /// An empty strategy; the table sizes it with
            /// [`Selector::prepare`].
            pub fn new() -> Self {
                Self::default()
            }

            #[doc = $peek_doc]
            pub fn peek(&self) -> Option<SlotKey> {
                self.list.end($oldest_first)
            }
        }

        impl Selector for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn prepare(&mut self, capacity: u64) -> Result<()> {
                self.list.prepare(capacity, $name)
            }

            fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> Result<f64> {
                self.list.insert(key, priority, $name)
            }

            fn insert_batch(
                &mut self,
                keys: &[SlotKey],
                priorities: Option<&[f64]>,
                recorded: &mut Vec<f64>,
            ) -> Result<()> {
                self.list.insert_batch(keys, priorities, recorded, $name)
            }

            fn update(&mut self, key: SlotKey, priority: f64) -> Result<()> {
                self.list.update(key, priority, $name)
            }

            fn remove(&mut self, key: SlotKey) -> Result<()> {
                self.list.remove(key, $name)
            }

            fn len(&self) -> usize {
                self.list.keys.len()
            }

            fn sample(&mut self, n: usize, _rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> Result<()> {
                self.list.walk(n, $oldest_first, out, $name)
            }
        }
    };
}

insertion_order_selector!(
    Fifo,
    "fifo",
    true,
    "First in, first out: the oldest insert first (a queue sampler; the usual remover).",
    "The oldest held key, the one `sample(1)` returns."
);
insertion_order_selector!(
    Lifo,
    "lifo",
    false,
    "Last in, first out: the newest insert first (a stack sampler).",
    "The newest held key, the one `sample(1)` returns."
);
