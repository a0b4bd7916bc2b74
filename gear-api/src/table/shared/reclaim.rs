//! Slots back to the free list: repair after a dead lock holder, the
//! free list itself, and reclamation of dead writers' slots.

use super::{add, sub, Locked, REAP_INTERVAL, REAP_SLICE};
use crate::error::Result;
use gear_core::{target, Change, LogOp, SlotKey, SlotState};
use std::sync::atomic::Ordering;

impl Locked<'_> {
    /// After a lock holder died: recomputes what it may have left
    /// half-updated (free list, size, pending writers) from the slot
    /// records, and makes every process rebuild its mirrors.
    pub(in crate::table) fn repair(&mut self) {
        let sh = self.sh;
        let ctl = sh.region.control();
        let (mut free, mut size, mut pending) = (0u64, 0u64, 0u64);
        for (s, rec) in sh.region.slots().iter().enumerate() {
            let m = rec.meta(s as u32);
            match m.state {
                SlotState::Free => {
                    sh.region.free_list()[free as usize].store(s as u32, Ordering::Relaxed);
                    free += 1;
                }
                SlotState::Committed if sh.items_per_slot > 0 => size += sh.live_items(m.key, m.len),
                SlotState::Committed => size += 1,
                SlotState::Writing => {
                    pending += 1;
                    if sh.sample_while_writing && m.len > 0 {
                        size += 1;
                    }
                }
                SlotState::Retiring => {}
            }
        }
        ctl.free_len.store(free, Ordering::Relaxed);
        ctl.size.store(size, Ordering::Relaxed);
        ctl.pending_inserts.store(pending, Ordering::Relaxed);
        add(&ctl.rebuild_epoch, 1);
        self.rebuild();
    }

    /// Takes a slot off the free list. An entry that is out of range or
    /// names a slot that is not free (a corrupted list) makes the shared
    /// state be rebuilt from the slot records first.
    pub(in crate::table) fn pop_free(&mut self) -> Option<u32> {
        for _ in 0..2 {
            match self.try_pop_free() {
                Ok(slot) => return slot,
                Err(()) => self.repair(),
            }
        }
        None
    }

    pub(in crate::table) fn try_pop_free(&mut self) -> std::result::Result<Option<u32>, ()> {
        let sh = self.sh;
        let ctl = sh.region.control();
        let n = ctl.free_len.load(Ordering::Relaxed);
        if n > sh.region.spec().capacity() {
            return Err(());
        }
        if n == 0 {
            return Ok(None);
        }
        let slot = sh.region.free_list()[(n - 1) as usize].load(Ordering::Relaxed);
        match sh.region.slots().get(slot as usize) {
            Some(rec) if rec.key_state(slot).1 == SlotState::Free => {
                ctl.free_len.store(n - 1, Ordering::Relaxed);
                Ok(Some(slot))
            }
            _ => Err(()),
        }
    }

    pub(in crate::table) fn push_free(&mut self, slot: u32) {
        let ctl = self.sh.region.control();
        let n = ctl.free_len.load(Ordering::Relaxed);
        if let Some(w) = self.sh.region.free_list().get(n as usize) {
            w.store(slot, Ordering::Relaxed);
            ctl.free_len.store(n + 1, Ordering::Relaxed);
        }
    }

    /// Reclaims slots of dead writers and of dead samplers' retirements
    /// among `slots`. A slot whose owner token names no live process (an
    /// owner of 0 included: no correct writer leaves one) is dead.
    /// Returns how many slots changed.
    pub(in crate::table) fn reap(&mut self, slots: std::ops::Range<u64>) -> Result<u64> {
        let sh = self.sh;
        let ctl = sh.region.control();
        let mut alive: Vec<(u64, bool)> = Vec::new();
        let mut is_alive = |owner: u64| -> bool {
            if let Some(&(_, a)) = alive.iter().find(|(o, _)| *o == owner) {
                return a;
            }
            let a = u32::try_from(owner).is_ok_and(|t| sh.lease.is_alive(t, ctl));
            alive.push((owner, a));
            a
        };
        let mut changed = 0;
        let end = slots.end.min(sh.region.spec().capacity());
        for s in slots.start.min(end) as u32..end as u32 {
            let m = sh.region.slots()[s as usize].meta(s);
            match m.state {
                SlotState::Writing if !is_alive(m.owner) => {
                    self.reclaim_writer(m.key, m.len, m.priority)?;
                    changed += 1;
                }
                SlotState::Retiring if !is_alive(m.owner) && sh.region.slots()[s as usize].free(m.key).is_ok() => {
                    self.push_free(s);
                    add(&self.ctl().retired, 1);
                    changed += 1;
                }
                _ => {}
            }
        }
        if changed > 0 {
            self.wake();
        }
        Ok(changed)
    }

    /// A dead writer's slot: commit what it published, or free it.
    pub(in crate::table) fn reclaim_writer(&mut self, key: SlotKey, len: u64, priority: f64) -> Result<()> {
        let rec = self.sh.region.slot(key.slot)?;
        let ctl = self.sh.region.control();
        sub(&ctl.pending_inserts, 1);
        add(&ctl.reclaimed, 1);
        if self.sh.items_per_slot > 0 {
            return self.reclaim_items_writer(key, len, priority);
        }
        let in_sampler = self.local.in_sampler[key.slot as usize] == Some(key);
        if len == 0 {
            if in_sampler {
                self.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority })?;
                sub(&ctl.size, 1);
            }
            rec.free(key)?;
            self.push_free(key.slot);
            return Ok(());
        }
        rec.commit(key)?;
        let target = if in_sampler { target::REMOVER } else { target::BOTH };
        self.record(Change { key, op: LogOp::Insert, target, priority })?;
        if !in_sampler {
            add(&ctl.size, 1);
        }
        add(&ctl.inserts, 1);
        Ok(())
    }

    /// Gives back slots whose commit or abandon could not take the lock.
    pub(in crate::table) fn give_back_deferred(&mut self) {
        let keys = std::mem::take(&mut *self.sh.give_back.lock());
        if keys.is_empty() {
            return;
        }
        for key in keys {
            self.abandon(key);
        }
        self.wake();
    }

    /// Frees a slot whose writer gave up; the caller wakes waiters.
    pub(in crate::table) fn abandon(&mut self, key: SlotKey) {
        let sh = self.sh;
        let ctl = sh.region.control();
        if self.local.in_sampler.get(key.slot as usize) == Some(&Some(key)) {
            let _ = self.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
            sub(&ctl.size, 1);
        }
        if let Ok(rec) = sh.region.slot(key.slot) {
            if rec.free(key).is_ok() {
                // Its pending items die with it (their records name a
                // generation the slot no longer has anyway).
                self.clear_items_of(key);
                self.push_free(key.slot);
                sub(&ctl.pending_inserts, 1);
            }
        }
    }

    /// A full scan for dead writers, at most once per [`REAP_INTERVAL`]
    /// per process and once per hold of the lock. Returns the slots
    /// reclaimed.
    pub(in crate::table) fn maybe_reap(&mut self) -> Result<u64> {
        if std::mem::replace(&mut self.reap_checked, true) {
            return Ok(0);
        }
        let sh = self.sh;
        let now = sh.now_ms();
        let last = sh.last_reap_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < REAP_INTERVAL.as_millis() as u64 {
            return Ok(0);
        }
        sh.last_reap_ms.store(now, Ordering::Relaxed);
        self.reap(0..sh.region.spec().capacity())
    }

    /// The background reclamation every process does while it uses the
    /// table: every [`REAP_SLICE_INTERVAL`](super::REAP_SLICE_INTERVAL), the
    /// next [`REAP_SLICE`] slots, so a table nobody calls `reclaim_dead` on
    /// still gets its dead writers' slots back, at a cost that does not
    /// grow with capacity. Returns the slots it reclaimed.
    pub(in crate::table) fn maybe_reap_slice(&mut self) -> Result<u64> {
        let sh = self.sh;
        if !sh.reap_slice_due() {
            return Ok(0);
        }
        sh.last_slice_ms.store(sh.now_ms(), Ordering::Relaxed);
        let capacity = sh.region.spec().capacity();
        let start = sh.reap_cursor.load(Ordering::Relaxed) % capacity;
        let end = (start + REAP_SLICE).min(capacity);
        sh.reap_cursor.store(if end == capacity { 0 } else { end }, Ordering::Relaxed);
        self.reap(start..end)
    }
}
