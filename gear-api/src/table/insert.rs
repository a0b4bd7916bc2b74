//! The writer's side: admitting writers, handing out slots (reclaiming or
//! evicting when none is free), publishing, committing and abandoning.

use super::select::{not_stored, strategy_error};
use super::shared::{add, sub, LimiterWait, Local, Locked, WaitFor};
use super::ReplayTable;
use crate::error::{Error, Result};
use gear_core::{target, Change, LogOp, SlotKey, SlotState, WaitReason, WaitRole};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Longest a dropped trajectory waits for the lock to give its slot back
/// before leaving that to the next call that takes the lock.
pub(super) const ABANDON_PATIENCE: Duration = Duration::from_millis(200);

/// A writer's wait for the rate limiter: on the samples-per-insert ratio,
/// or, with a queue's limiter (every item sampled once), on a full table.
fn insert_wait() -> WaitFor<impl Fn(&Locked<'_>) -> WaitReason> {
    WaitFor {
        op: "insert (rate limiter)",
        role: WaitRole::Writer,
        reason: |l: &Locked<'_>| {
            let c = l.limiter().config;
            if c.min_diff == 0.0 && c.samples_per_insert == 1.0 {
                WaitReason::FullTable
            } else {
                WaitReason::SamplesPerInsert
            }
        },
        kind: LimiterWait::Insert,
    }
}

impl ReplayTable {
    /// Admits one writer (rate limiter) and hands it a slot in `Writing`
    /// state, evicting with the remover when no slot is free.
    pub(crate) fn begin_slot(&self, priority: f64, timeout: Option<Duration>) -> Result<SlotKey> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let l = self.shared.lock(deadline)?;
        let mut l = self.wait_until(l, deadline, insert_wait(), |l| l.can_insert())?;
        self.take_slot(&mut l, priority, 0)
    }

    /// [`ReplayTable::begin_slot`] for up to `count` trajectories, the
    /// `i`-th with `priority(i)`, under one lock: waits for the rate
    /// limiter to admit the first, then takes one more slot while the limiter
    /// admits it without waiting and a slot is free or evictable (a batch
    /// never holds slots while it waits, so it cannot wait on samples of
    /// its own uncommitted rows, nor fill a table with them).
    /// Returns at least one key; on an error, none is left taken.
    pub(crate) fn begin_slots(
        &self,
        count: usize,
        priority: impl Fn(usize) -> f64,
        timeout: Option<Duration>,
    ) -> Result<Vec<SlotKey>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let l = self.shared.lock(deadline)?;
        let mut l = self.wait_until(l, deadline, insert_wait(), |l| l.can_insert())?;
        let mut keys = Vec::with_capacity(count);
        self.make_room(&mut l, count)?;
        keys.push(self.take_slot(&mut l, priority(0), 0)?);
        self.take_free_slots(&l, count, &priority, &mut keys);
        for i in keys.len()..count {
            let ctl = l.sh.region.control();
            let room = ctl.free_len.load(Ordering::Relaxed) > 0 || !l.local.remover.is_empty();
            // Without room, the next slot must come from this batch's own
            // rows once they commit: stop here and let the caller commit.
            if ctl.closed.load(Ordering::Acquire) != 0 || !l.can_insert() || !room {
                break;
            }
            match self.take_slot(&mut l, priority(i), keys.len() as u64) {
                Ok(key) => keys.push(key),
                Err(e) => {
                    for &key in &keys {
                        self.abandon_locked(&mut l, key);
                    }
                    l.wake();
                    return Err(e);
                }
            }
        }
        Ok(keys)
    }

    /// Takes free slots for the rest of a batch (`keys.len()..count`)
    /// straight off the free list, with the control block's counters read
    /// and stored once: what `take_slot` does per row when a slot is free,
    /// for a table whose rate limiter never holds writers back. Stops at
    /// the first list entry that is not a free slot, leaving it to
    /// `take_slot` (which rebuilds a corrupted list). A process killed part
    /// way leaves counters that disagree with the records: the next lock
    /// holder rebuilds them from the records, as after any death under the
    /// lock.
    fn take_free_slots(&self, l: &Locked<'_>, count: usize, priority: &impl Fn(usize) -> f64, keys: &mut Vec<SlotKey>) {
        let (sh, ctl) = (l.sh, l.ctl());
        if sh.limiter_config.max_diff != f64::INFINITY || ctl.closed.load(Ordering::Acquire) != 0 {
            return;
        }
        let mut free = ctl.free_len.load(Ordering::Relaxed);
        if free > self.spec().capacity() {
            return;
        }
        let (list, slots) = (sh.region.free_list(), sh.region.slots());
        let (token, first_seq) = (u64::from(sh.lease.token()), ctl.next_seq.load(Ordering::Relaxed));
        let mut seq = first_seq;
        while keys.len() < count && free > 0 {
            let slot = list[(free - 1) as usize].load(Ordering::Relaxed);
            let Some(rec) = slots.get(slot as usize) else { break };
            let Ok(key) = rec.begin_write(slot, token, seq, priority(keys.len())) else { break };
            keys.push(key);
            free -= 1;
            seq = seq.wrapping_add(1);
        }
        ctl.free_len.store(free, Ordering::Relaxed);
        ctl.next_seq.store(seq, Ordering::Relaxed);
        add(&ctl.pending_inserts, seq.wrapping_sub(first_seq));
    }

    /// Hands out a slot in `Writing` state to a writer the rate limiter
    /// admitted, evicting with the remover when no slot is free. `taken`:
    /// slots the calling batch holds already (alive: not worth a scan).
    pub(super) fn take_slot(&self, l: &mut Locked<'_>, priority: f64, taken: u64) -> Result<SlotKey> {
        // No free slot: dead writers' slots come back before anything
        // committed is evicted (a full scan, at most every REAP_INTERVAL),
        // when some other writer holds a slot (a full table written by one
        // batch would otherwise scan every slot twice a second under the
        // lock, for nothing).
        let mut slot = l.pop_free();
        if slot.is_none() && l.ctl().pending_inserts.load(Ordering::Relaxed) > taken && l.maybe_reap()? > 0 {
            slot = l.pop_free();
        }
        let slot = match slot {
            Some(slot) => slot,
            None => match self.evict_one(l)? {
                Some(slot) => slot,
                None => {
                    // Nothing committed to evict: dead writers may hold the
                    // slots; scan now, whenever the last scan was.
                    l.reap(0..self.spec().capacity())?;
                    match l.pop_free() {
                        Some(slot) => slot,
                        None => {
                            self.evict_one(l)?.ok_or_else(|| Error::TableFull { capacity: self.spec().capacity() })?
                        }
                    }
                }
            },
        };
        let ctl = self.shared.region.control();
        let seq = ctl.next_seq.load(Ordering::Relaxed);
        let rec = self.shared.region.slot(slot)?;
        let key = match rec.begin_write(slot, u64::from(self.shared.lease.token()), seq, priority) {
            Ok(key) => key,
            Err(e) => {
                l.push_free(slot);
                return Err(e.into());
            }
        };
        ctl.next_seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        add(&ctl.pending_inserts, 1);
        Ok(key)
    }

    /// Frees enough slots for a batch of `count` in a full table at once
    /// (a table without items whose rate limiter never holds writers back,
    /// so the batch will take them all): dead writers' slots first (a scan,
    /// when another writer holds a slot), then evictions by the remover as
    /// one batch ([`ReplayTable::evict_many`]). Otherwise each row evicts
    /// for itself, as `take_slot` does.
    fn make_room(&self, l: &mut Locked<'_>, count: usize) -> Result<()> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        let free = ctl.free_len.load(Ordering::Relaxed) as usize;
        if count <= free || sh.items_per_slot > 0 || sh.limiter_config.max_diff != f64::INFINITY {
            return Ok(());
        }
        if ctl.pending_inserts.load(Ordering::Relaxed) > 0 {
            l.maybe_reap()?;
        }
        let free = ctl.free_len.load(Ordering::Relaxed) as usize;
        let need = count.saturating_sub(free).min(l.local.remover.len());
        self.evict_many(l, need).map(|_| ())
    }

    /// Evicts up to `n` trajectories of a table without items in one go:
    /// the remover's draws, each strategy's removals as one batch
    /// (`Selector::remove_batch`: prioritized replay refreshes each
    /// sum-tree node once), the log, the freed slots on the free list, the
    /// counters once. A victim drawn twice is evicted once. Returns how
    /// many were evicted.
    pub(super) fn evict_many(&self, l: &mut Locked<'_>, n: usize) -> Result<usize> {
        if n == 0 || l.local.remover.is_empty() {
            return Ok(0);
        }
        let Local { remover, sampler, in_sampler, in_remover, rng, scratch, item_keys, .. } = &mut *l.local;
        scratch.clear();
        remover.sample(n.min(remover.len()), rng, scratch)?;
        // The distinct victims the remover holds (a random remover may draw
        // one twice), and those the sampler holds too.
        let mut keys: Vec<SlotKey> =
            scratch.iter().map(|s| s.key).filter(|k| in_remover.get(k.slot as usize) == Some(&Some(*k))).collect();
        keys.sort_unstable();
        keys.dedup();
        let Some(&first) = keys.first() else {
            let drawn = scratch.first().map_or(SlotKey { slot: 0, generation: 0 }, |s| s.key);
            return Err(not_stored(remover.name(), drawn));
        };
        item_keys.clear();
        item_keys.extend(keys.iter().filter(|k| in_sampler.get(k.slot as usize) == Some(&Some(**k))));
        let removed = remover
            .remove_batch(&keys)
            .map_err(|e| strategy_error(remover.name(), &format!("refused to remove {first}: {e}")))
            .and_then(|()| sampler.remove_batch(item_keys).map_err(Error::from));
        if let Err(e) = removed {
            // A strategy refused part way (user code): start the mirrors
            // again from the records.
            l.rebuild();
            return Err(e);
        }
        for &key in &keys {
            in_remover[key.slot as usize] = None;
        }
        for &key in item_keys.iter() {
            in_sampler[key.slot as usize] = None;
        }
        let in_both = std::mem::take(&mut l.local.item_keys);
        for &key in &keys {
            let target = if in_both.binary_search(&key).is_ok() { target::BOTH } else { target::REMOVER };
            l.append_log(Change { key, op: LogOp::Remove, target, priority: 0.0 });
        }
        let ctl = self.shared.region.control();
        for &key in &keys {
            if self.shared.region.slot(key.slot).and_then(|rec| rec.free(key)).is_ok() {
                l.push_free(key.slot);
            }
        }
        sub(&ctl.size, in_both.len() as u64);
        add(&ctl.evictions, keys.len() as u64);
        l.local.item_keys = in_both;
        Ok(keys.len())
    }

    pub(super) fn evict_one(&self, l: &mut Locked<'_>) -> Result<Option<u32>> {
        if l.local.remover.is_empty() {
            return Ok(None);
        }
        let Local { remover, rng, scratch, .. } = &mut *l.local;
        scratch.clear();
        remover.sample(1, rng, scratch)?;
        let Some(victim) = scratch.first().map(|s| s.key) else {
            return Err(strategy_error(remover.name(), "drew no row to evict from a non-empty strategy"));
        };
        if self.shared.items_per_slot > 0 {
            // The remover holds trajectories, the sampler their items: the
            // trajectory and its items go in this one hold of the lock.
            if l.local.in_remover.get(victim.slot as usize) != Some(&Some(victim)) {
                return Err(not_stored(l.local.remover.name(), victim));
            }
            l.record(Change { key: victim, op: LogOp::Remove, target: target::REMOVER, priority: 0.0 })?;
            l.remove_items_of(victim.slot)?;
            self.shared.region.slot(victim.slot)?.free(victim)?;
            add(&self.shared.region.control().evictions, 1);
            return Ok(Some(victim.slot));
        }
        let Some(&held) = l.local.in_sampler.get(victim.slot as usize) else {
            return Err(not_stored(l.local.remover.name(), victim));
        };
        let in_sampler = held == Some(victim);
        let target = if in_sampler { target::BOTH } else { target::REMOVER };
        l.record(Change { key: victim, op: LogOp::Remove, target, priority: 0.0 })?;
        self.shared.region.slot(victim.slot)?.free(victim)?;
        let ctl = self.shared.region.control();
        if in_sampler {
            sub(&ctl.size, 1);
        }
        add(&ctl.evictions, 1);
        Ok(Some(victim.slot))
    }

    /// Makes a trajectory being written selectable (tables that sample while
    /// writing, at its first published step). Returns the priority the
    /// strategy assigned.
    pub(crate) fn publish_first(&self, key: SlotKey, priority: Option<f64>) -> Result<Option<f64>> {
        if !self.shared.sample_while_writing {
            return Ok(None);
        }
        let mut l = self.shared.lock(None)?;
        let rec = self.shared.region.slot(key.slot)?;
        rec.check(key, SlotState::Writing, "publish steps")?;
        if l.local.in_sampler[key.slot as usize] == Some(key) {
            // A rebuild in another process already picked it up.
            return Ok(Some(rec.meta(key.slot).priority));
        }
        let assigned = l.insert_new(key, priority, false)?;
        rec.set_priority(key, assigned);
        add(&l.ctl().size, 1);
        l.wake();
        Ok(Some(assigned))
    }

    /// Commits a written trajectory and makes it selectable. On any error
    /// the slot is given back, so nothing is left half-inserted. In a table
    /// with items, `pattern` says whether a trajectory with no pending
    /// items gets the table's pattern (its writer chose none otherwise).
    pub(crate) fn commit_slot(
        &self,
        key: SlotKey,
        priority: Option<f64>,
        timeout: Option<Duration>,
        pattern: bool,
    ) -> Result<()> {
        let mut l = match self.shared.lock(timeout.map(|t| Instant::now() + t)) {
            Ok(l) => l,
            Err(e) => {
                self.shared.give_back_later(&[key]);
                return Err(e);
            }
        };
        let result = self.commit_locked(&mut l, key, priority, pattern);
        l.wake();
        result
    }

    /// [`ReplayTable::commit_slot`] for many trajectories under one lock,
    /// in order. At the first that fails, it and every later one are given
    /// back and the error is returned: what precedes it stays committed.
    pub(crate) fn commit_slots(
        &self,
        keys: &[SlotKey],
        priorities: Option<&[f64]>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let mut l = match self.shared.lock(timeout.map(|t| Instant::now() + t)) {
            Ok(l) => l,
            Err(e) => {
                self.shared.give_back_later(keys);
                return Err(e);
            }
        };
        let result = if self.shared.items_per_slot > 0 {
            sub(&l.ctl().pending_inserts, keys.len() as u64);
            self.commit_items_batch_locked(&mut l, keys, priorities)
        } else if self.shared.sample_while_writing {
            // Rows may already be in the sampler: one at a time.
            let mut result = Ok(());
            for (i, &key) in keys.iter().enumerate() {
                if let Err(e) = self.commit_locked(&mut l, key, priorities.map(|p| p[i]), true) {
                    for &later in &keys[i + 1..] {
                        self.abandon_locked(&mut l, later);
                    }
                    result = Err(e);
                    break;
                }
            }
            result
        } else {
            self.commit_batch_locked(&mut l, keys, priorities)
        };
        l.wake();
        result
    }

    /// [`ReplayTable::commit_locked`] of a batch whose rows are in no
    /// strategy yet (tables that do not sample while writing), with the
    /// same outcome, done phase by phase: every slot record committed,
    /// then one [`gear_core::Selector::insert_batch`] per strategy, one
    /// pass over the change log, the counters once. At the first row that
    /// fails, it and every later one are given back; those before stay
    /// committed, in the strategies and in the log.
    fn commit_batch_locked(&self, l: &mut Locked<'_>, keys: &[SlotKey], priorities: Option<&[f64]>) -> Result<()> {
        let region = &self.shared.region;
        let ctl = region.control();
        sub(&ctl.pending_inserts, keys.len() as u64);
        let mut error = None;
        let mut committed = keys.len();
        for (i, &key) in keys.iter().enumerate() {
            if let Err(e) = region.slot(key.slot).and_then(|rec| rec.commit(key)) {
                error = Some(Error::from(e));
                committed = i;
                break;
            }
        }
        let keys_in = &keys[..committed];
        let priorities_in = priorities.map(|p| &p[..committed]);
        let Local { sampler, remover, in_sampler, in_remover, recorded, recorded_remover, .. } = &mut *l.local;
        recorded.clear();
        if let Err(e) = sampler.insert_batch(keys_in, priorities_in, recorded) {
            error = Some(e.into());
        }
        let mut inserted = recorded.len().min(committed);
        recorded_remover.clear();
        if let Err(e) = remover.insert_batch(&keys_in[..inserted], Some(&recorded[..inserted]), recorded_remover) {
            // As one row at a time would: the rows the remover refused
            // come out of the sampler again.
            let kept = recorded_remover.len().min(inserted);
            error = Some(e.into());
            for &key in &keys_in[kept..inserted] {
                if let Err(e) = sampler.remove(key) {
                    error = Some(e.into());
                }
            }
            inserted = kept;
        }
        for &key in &keys_in[..inserted] {
            in_sampler[key.slot as usize] = Some(key);
            in_remover[key.slot as usize] = Some(key);
        }
        let recorded = std::mem::take(&mut l.local.recorded);
        let recorded_in = &recorded[..inserted.min(recorded.len())];
        l.append_inserts(&keys_in[..recorded_in.len()], recorded_in, target::BOTH);
        for (i, (&key, &p)) in keys_in.iter().zip(recorded_in).enumerate() {
            // `begin_write` stored the priority the writer gave (0 when
            // none); the strategy's choice replaces it.
            let given = priorities.and_then(|p| p.get(i).copied()).unwrap_or(0.0);
            if p.to_bits() != given.to_bits() {
                if let Ok(rec) = region.slot(key.slot) {
                    rec.set_priority(key, p);
                }
            }
        }
        l.local.recorded = recorded;
        add(&ctl.size, inserted as u64);
        add(&ctl.inserts, inserted as u64);
        for &key in &keys[inserted..] {
            if region.slot(key.slot).and_then(|rec| rec.free(key)).is_ok() {
                l.push_free(key.slot);
            }
        }
        error.map_or(Ok(()), Err)
    }

    /// Commits one trajectory under the lock; on an error gives its slot
    /// back. The caller wakes waiters.
    pub(super) fn commit_locked(
        &self,
        l: &mut Locked<'_>,
        key: SlotKey,
        priority: Option<f64>,
        pattern: bool,
    ) -> Result<()> {
        let ctl = self.shared.region.control();
        let rec = self.shared.region.slot(key.slot)?;
        sub(&ctl.pending_inserts, 1);
        if self.shared.items_per_slot > 0 {
            return self.commit_items_locked(l, key, priority, pattern);
        }
        let in_sampler = l.local.in_sampler[key.slot as usize] == Some(key);
        let inserted = rec.commit(key).map_err(Error::from).and_then(|()| {
            if in_sampler {
                let p = rec.meta(key.slot).priority;
                l.record(Change { key, op: LogOp::Insert, target: target::REMOVER, priority: p })?;
                return Ok(p);
            }
            // The strategy chooses the priority when none was given
            // (max-seen for prioritized replay); the log carries its choice.
            let p = l.insert_new(key, priority, true)?;
            add(&ctl.size, 1);
            Ok(p)
        });
        match inserted {
            Ok(p) => {
                rec.set_priority(key, p);
                add(&ctl.inserts, 1);
                Ok(())
            }
            Err(e) => {
                if in_sampler {
                    let _ = l.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
                    sub(&ctl.size, 1);
                }
                if rec.free(key).is_ok() {
                    l.push_free(key.slot);
                }
                Err(e)
            }
        }
    }

    /// Frees a slot whose writer gave up (dropped without ending).
    /// Never blocks longer than [`ABANDON_PATIENCE`]: when the lock
    /// cannot be had by then (a stopped holder), the slot is given back by
    /// whichever call of this process takes the lock next.
    pub(crate) fn abandon_slot(&self, key: SlotKey) {
        match self.shared.lock(Some(Instant::now() + ABANDON_PATIENCE)) {
            Ok(mut l) => {
                self.abandon_locked(&mut l, key);
                l.wake();
            }
            Err(_) => self.shared.give_back_later(&[key]),
        }
    }

    /// [`ReplayTable::abandon_slot`] under the lock; the caller wakes
    /// waiters.
    pub(super) fn abandon_locked(&self, l: &mut Locked<'_>, key: SlotKey) {
        l.abandon(key);
    }
}
