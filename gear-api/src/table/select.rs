//! The sampler's side: admitting a batch, drawing it (under the lock, or
//! under a read lock on the mirrors for strategies that draw through a
//! shared reference), checking what the strategy returned, and retiring
//! rows that reached `max_times_sampled`.

use super::shared::{add, process_salt, sub, LimiterWait, Locked, Shared, WaitFor};
use super::ReplayTable;
use crate::error::{Error, Result};
use gear_core::{target, Change, ItemState, LogOp, Sampled, SlotKey, WaitReason, WaitRole, Xoshiro256};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Draws of rows evicted between their draw and the read of their slot
/// record, before [`ReplayTable::select`] gives up on a strategy that keeps
/// returning keys the table does not hold.
pub(super) const STALE_DRAW_ATTEMPTS: usize = 8;

/// One drawn row: the draw, and the steps it reads (40 bytes: a batch's
/// rows are copied around on the sampling path).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Drawn {
    /// The draw (its key is an item's in a table with items).
    pub(crate) sampled: Sampled,
    /// Steps of the row's sequence: the trajectory's published length, or
    /// the item's length.
    pub(crate) len: u64,
    /// First step of the sequence: 0, or the item's start.
    pub(crate) start: u32,
    /// Generation of the trajectory the row reads (the key's own in a
    /// table without items), validated after the copy.
    pub(crate) slot_generation: u32,
}

impl Drawn {
    /// A drawn trajectory of `len` published steps.
    pub(crate) fn whole(sampled: Sampled, len: u64) -> Self {
        Drawn { sampled, len, start: 0, slot_generation: sampled.key.generation }
    }

    /// The trajectory whose bytes the row reads, in a table of `per_slot`
    /// items per trajectory: the drawn key itself, or its item's slot.
    #[inline]
    pub(crate) fn trajectory(&self, per_slot: u32) -> SlotKey {
        let key = self.sampled.key;
        let slot = if key.is_item() && per_slot > 0 { key.slot / per_slot } else { key.slot };
        SlotKey { slot, generation: self.slot_generation }
    }
}

/// What one sampler brings to [`ReplayTable::select`]: its own random
/// stream (so samplers on several threads draw independently, and a seeded
/// table draws the same rows run after run) and its reusable buffers.
#[derive(Debug)]
pub(crate) struct Selection {
    /// The seed of `rng`: the table's seed, the process's salt and the
    /// sampler's number; other streams of the sampler derive from it.
    pub(crate) seed: u64,
    pub(super) rng: Xoshiro256,
    pub(super) drawn: Vec<Sampled>,
    /// Drawn keys whose rows were evicted before their record was read.
    pub(super) stale: Vec<SlotKey>,
    /// Rows taken out by `max_times_sampled`, to be freed after the copy.
    pub(crate) retiring: Vec<SlotKey>,
    /// Items that reached `max_times_sampled` in the batch being drawn.
    retiring_items: Vec<SlotKey>,
}

impl ReplayTable {
    /// The table's `max_times_sampled`, if set: a drawn row may then be
    /// taken out of the table by the draw itself.
    pub fn max_times_sampled(&self) -> Option<u64> {
        self.shared.max_times_sampled
    }

    /// A sampler's random stream and buffers for [`ReplayTable::select`]:
    /// each sampler of a seeded table gets its own stream, the same one in
    /// every run.
    pub(crate) fn selection(&self) -> Selection {
        let sh = &*self.shared;
        let n = sh.samplers_made.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed() ^ process_salt(sh.creator, &sh.lease) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Selection {
            seed,
            rng: Xoshiro256::seed_from_u64(seed),
            drawn: Vec::new(),
            stale: Vec::new(),
            retiring: Vec::new(),
            retiring_items: Vec::new(),
        }
    }

    /// Refuses a batch the rate limiter can never admit.
    pub(super) fn check_batch(&self, n: usize) -> Result<()> {
        let cfg = self.shared.limiter().config;
        if (n as f64) > cfg.max_diff - cfg.min_diff {
            return Err(Error::Config(format!(
                "a batch of {n} can never be sampled: the rate limiter allows at most {} samples ahead",
                cfg.max_diff - cfg.min_diff
            )));
        }
        Ok(())
    }

    /// Waits (with `l` released meanwhile, at most until `deadline`) until
    /// `n` rows may be drawn: the rate limiter admits them when
    /// `count_against_limiter`, else the sampler holds something (a redraw
    /// of rows evicted under a batch waits for the table to refill rather
    /// than fail while the caller's time lasts).
    pub(super) fn admit<'a>(
        &'a self,
        l: Locked<'a>,
        n: usize,
        deadline: Option<Instant>,
        count_against_limiter: bool,
    ) -> Result<Locked<'a>> {
        if count_against_limiter {
            self.check_batch(n)?;
            let what = WaitFor {
                op: "sample (empty table or rate limiter)",
                role: WaitRole::Sampler,
                reason: |l: &Locked<'_>| {
                    let size = l.ctl().size.load(Ordering::Relaxed);
                    if size == 0 || size < l.limiter().config.min_size_to_sample {
                        WaitReason::MinSize
                    } else {
                        WaitReason::SamplesPerInsert
                    }
                },
                kind: LimiterWait::Sample,
            };
            self.wait_until(l, deadline, what, |l| l.can_sample(n as u64))
        } else {
            let what = WaitFor {
                op: "sample (table emptied while a batch was redrawn)",
                role: WaitRole::Sampler,
                reason: |_: &Locked<'_>| WaitReason::EmptyTable,
                kind: LimiterWait::Sample,
            };
            self.wait_until(l, deadline, what, |l| !l.local.sampler.is_empty())
        }
    }

    /// Waits for the rate limiter (at most until `deadline`), draws `n`
    /// rows and appends to `out`, for each, its key, probability, weight
    /// and published length. Rows that reached `max_times_sampled` are
    /// taken out of the strategies and listed in `sel.retiring`; the caller
    /// frees them after copying. Keys the strategy returns are checked: one
    /// outside the table is an error, not a panic.
    pub(crate) fn select(
        &self,
        n: usize,
        deadline: Option<Instant>,
        count_against_limiter: bool,
        sel: &mut Selection,
        out: &mut Vec<Drawn>,
    ) -> Result<()> {
        let sh = &*self.shared;
        if sh.shared_draws && sh.max_times_sampled.is_none() {
            return self.select_shared(n, deadline, count_against_limiter, sel, out);
        }
        let mut l = self.admit(sh.lock(deadline)?, n, deadline, count_against_limiter)?;
        sel.drawn.clear();
        l.local.sampler.sample(n, &mut sel.rng, &mut sel.drawn)?;
        check_drawn(l.local.sampler.name(), n, &sel.drawn, sh.selectable())?;
        let ctl = sh.region.control();
        let (retiring, retiring_items) = (&mut sel.retiring, &mut sel.retiring_items);
        retiring_items.clear();
        read_drawn(sh, &sel.drawn, out, &mut sel.stale, |key, times| {
            let Some(max) = sh.max_times_sampled else { return Ok(()) };
            if times < max {
                return Ok(());
            }
            if key.is_item() {
                // Taken out after every row of the batch was read: a batch
                // that drew the item twice reads it twice.
                if !retiring_items.contains(&key) {
                    retiring_items.push(key);
                }
            } else if !retiring.contains(&key)
                && sh.region.slots()[key.slot as usize].retire(key, u64::from(sh.lease.token())).is_ok()
            {
                l.record(Change { key, op: LogOp::Remove, target: target::BOTH, priority: 0.0 })?;
                sub(&ctl.size, 1);
                retiring.push(key);
            }
            Ok(())
        })?;
        for &key in &sel.retiring_items {
            // An item's bytes are its trajectory's, which stays: the item
            // leaves the sampler now and its record is free for another.
            if sh.region.items()[key.slot as usize].transition(key, ItemState::Live, ItemState::Free) {
                l.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 })?;
                sub(&ctl.size, 1);
                add(&ctl.retired, 1);
            }
        }
        if let Some(&key) = sel.stale.first() {
            // Under the lock the strategy's rows are the table's: this one
            // returned a key it does not hold.
            return Err(not_stored(l.local.sampler.name(), key));
        }
        if count_against_limiter {
            add(&ctl.samples, n as u64);
        }
        l.wake();
        Ok(())
    }

    /// [`ReplayTable::select`] for strategies that draw through a shared
    /// reference, without `max_times_sampled`: the lock is held only to
    /// admit the batch and count it; the draw runs under a read lock on this
    /// process's mirrors, so several threads draw at once, and the slot
    /// records are read under no lock at all. A row evicted between the
    /// draw and the read of its record is drawn again.
    pub(super) fn select_shared(
        &self,
        n: usize,
        deadline: Option<Instant>,
        count_against_limiter: bool,
        sel: &mut Selection,
        out: &mut Vec<Drawn>,
    ) -> Result<()> {
        let sh = &*self.shared;
        let (mut want, mut count) = (n, count_against_limiter);
        for _ in 0..STALE_DRAW_ATTEMPTS {
            self.draw_shared(want, deadline, count, sel)?;
            read_drawn(sh, &sel.drawn, out, &mut sel.stale, |_, _| Ok(()))?;
            if sel.stale.is_empty() {
                return Ok(());
            }
            // Evicted after the draw, by a writer of any process: draw as
            // many again, already counted against the limiter.
            (want, count) = (sel.stale.len(), false);
        }
        Err(not_stored(sh.local.read().sampler.name(), sel.stale[0]))
    }

    /// Admits `n` rows (counting them against the rate limiter when asked)
    /// and draws them into `sel.drawn` under a read lock on the mirrors.
    pub(super) fn draw_shared(
        &self,
        n: usize,
        deadline: Option<Instant>,
        count: bool,
        sel: &mut Selection,
    ) -> Result<()> {
        let sh = &*self.shared;
        if count {
            self.check_batch(n)?;
        }
        let (guard, local) = sh.lock_read(deadline)?;
        let ready = if count {
            sh.ctl().closed.load(Ordering::Acquire) == 0 && sh.can_sample(n as u64)
        } else {
            !local.sampler.is_empty()
        };
        let (guard, local) = if ready {
            (guard, local)
        } else {
            drop((guard, local));
            self.admit(sh.lock(deadline)?, n, deadline, count)?.downgrade()
        };
        if count {
            // `can_sample` or `admit` said the batch fits.
            add(&sh.ctl().samples, n as u64);
        }
        sh.wake();
        drop(guard);
        sel.drawn.clear();
        let drawn = local
            .sampler
            .sample_shared(n, &mut sel.rng, &mut sel.drawn)
            .unwrap_or_else(|| {
                Err(gear_core::Error::Selection(format!(
                    "strategy `{}` drew 0 rows through a shared reference but refuses to draw {n}",
                    local.sampler.name()
                )))
            })
            .map_err(Error::from)
            .and_then(|()| check_drawn(local.sampler.name(), n, &sel.drawn, sh.selectable()));
        drop(local);
        if let Err(e) = drawn {
            if count {
                // Nothing was drawn: give the batch back to the limiter.
                let l = sh.lock(None)?;
                sub(&l.ctl().samples, n as u64);
                l.wake();
            }
            return Err(e);
        }
        Ok(())
    }

    /// Frees slots taken out by `max_times_sampled`, after their bytes were
    /// copied.
    pub(crate) fn retire(&self, keys: &[SlotKey]) {
        if keys.is_empty() {
            return;
        }
        let Ok(mut l) = self.shared.lock(None) else { return };
        for &key in keys {
            if let Ok(rec) = self.shared.region.slot(key.slot) {
                if rec.free(key).is_ok() {
                    l.push_free(key.slot);
                    add(&l.ctl().retired, 1);
                }
            }
        }
        l.wake();
    }
}

/// Reads the record of every drawn row: appends the draw and the steps it
/// reads to `out`, counts the sample on the slot (on the item, in a table
/// with items), and calls `taken` with the key and its count of samples so
/// far. Rows evicted since the draw (items whose trajectory was, or whose
/// record names no steps of it) are listed in `stale` instead.
fn read_drawn(
    sh: &Shared,
    drawn: &[Sampled],
    out: &mut Vec<Drawn>,
    stale: &mut Vec<SlotKey>,
    mut taken: impl FnMut(SlotKey, u64) -> Result<()>,
) -> Result<()> {
    prefetch_records(sh, drawn);
    stale.clear();
    if sh.items_per_slot > 0 {
        return read_drawn_items(sh, drawn, out, stale, taken);
    }
    for s in drawn {
        let rec = &sh.region.slots()[s.key.slot as usize];
        match rec.read_begin(s.key) {
            Some(len) => {
                out.push(Drawn::whole(*s, len));
                let times = rec.add_sampled();
                taken(s.key, times)?;
            }
            None => stale.push(s.key),
        }
    }
    Ok(())
}

/// [`read_drawn`] in a table with items: each item's record read with its
/// seqlock, then its trajectory's slot record; the window must lie inside
/// the trajectory's published steps (a record can hold anything another
/// process wrote; its slot is its index's, never a stored field).
fn read_drawn_items(
    sh: &Shared,
    drawn: &[Sampled],
    out: &mut Vec<Drawn>,
    stale: &mut Vec<SlotKey>,
    mut taken: impl FnMut(SlotKey, u64) -> Result<()>,
) -> Result<()> {
    let items = sh.region.items();
    let per_slot = sh.items_per_slot;
    for s in drawn {
        let key = s.key;
        let read = key.is_item().then(|| items.get(key.slot as usize)).flatten().and_then(|rec| {
            let w = rec.read(key)?;
            let slot = SlotKey { slot: key.slot / per_slot, generation: w.slot_generation };
            let published = sh.region.slots()[slot.slot as usize].read_begin(slot)?;
            // The record's window fits 32 bits (read as two halves of a word).
            let row = Drawn { sampled: *s, len: w.len, start: w.start as u32, slot_generation: slot.generation };
            (w.len > 0 && w.start.checked_add(w.len).is_some_and(|end| end <= published)).then_some((rec, row))
        });
        match read {
            Some((rec, row)) => {
                out.push(row);
                let times = rec.add_sampled();
                taken(key, times)?;
            }
            None => stale.push(key),
        }
    }
    Ok(())
}

/// Starts loading every drawn row's record, so that the misses overlap
/// instead of following one another.
pub(super) fn prefetch_records(sh: &Shared, drawn: &[Sampled]) {
    if sh.items_per_slot > 0 {
        let items = sh.region.items();
        for s in drawn {
            if let Some(rec) = items.get(s.key.slot as usize) {
                gear_core::hint::prefetch(rec);
            }
        }
        return;
    }
    let slots = sh.region.slots();
    for s in drawn {
        if let Some(rec) = slots.get(s.key.slot as usize) {
            gear_core::hint::prefetch(rec);
        }
    }
}

/// A strategy misbehaved (strategies are user code: the table checks
/// what they return).
pub(super) fn strategy_error(strategy: &str, what: &str) -> Error {
    Error::Core(gear_core::Error::Selection(format!("strategy `{strategy}` {what}")))
}

impl Shared {
    /// How many keys the sampling strategy can hold, and what they are:
    /// slots, or items in a table with items.
    pub(super) fn selectable(&self) -> (u64, &'static str) {
        if self.items_per_slot > 0 {
            (self.region.spec().item_capacity(), "items")
        } else {
            (self.region.spec().capacity(), "slots")
        }
    }
}

/// Checks what a strategy drew: `n` rows, every slot inside the table.
pub(super) fn check_drawn(strategy: &str, n: usize, drawn: &[Sampled], (capacity, what): (u64, &str)) -> Result<()> {
    if drawn.len() != n {
        return Err(strategy_error(strategy, &format!("drew {} rows when asked for {n}", drawn.len())));
    }
    match drawn.iter().find(|s| u64::from(s.key.slot) >= capacity) {
        Some(s) => Err(strategy_error(strategy, &format!("returned key {} beyond the {capacity} {what}", s.key))),
        None => Ok(()),
    }
}

/// A strategy returned a key the table does not hold.
pub(super) fn not_stored(strategy: &str, key: SlotKey) -> Error {
    Error::Core(gear_core::Error::Selection(format!("strategy `{strategy}` returned key {key} that is not stored")))
}
