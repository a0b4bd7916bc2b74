//! This process's strategy mirrors kept in step with the change log:
//! changes applied and recorded, inserts logged, and rebuilds from the
//! slot records.

use super::Locked;
use crate::error::Result;
use gear_core::{check_priority, item_index, target, Change, ItemState, LogOp, SlotKey, SlotState};
use std::sync::atomic::Ordering;

impl Locked<'_> {
    /// Applies a change to this process's mirrors.
    pub(in crate::table) fn apply(&mut self, c: Change) -> gear_core::Result<()> {
        let slot = c.key.slot as usize;
        let l = &mut *self.local;
        for (bit, sel, present) in
            [(target::SAMPLER, &mut l.sampler, &mut l.in_sampler), (target::REMOVER, &mut l.remover, &mut l.in_remover)]
        {
            if c.target & bit == 0 {
                continue;
            }
            let entry = present
                .get_mut(slot)
                .ok_or_else(|| gear_core::Error::Selection(format!("log entry for slot {} beyond capacity", c.key)))?;
            match c.op {
                LogOp::Insert => {
                    sel.insert(c.key, Some(c.priority))?;
                    *entry = Some(c.key);
                }
                LogOp::Update => sel.update(c.key, c.priority)?,
                LogOp::Remove => {
                    sel.remove(c.key)?;
                    *entry = None;
                }
            }
        }
        Ok(())
    }

    /// Applies a change here and appends it to the log for other processes.
    pub(in crate::table) fn record(&mut self, c: Change) -> gear_core::Result<()> {
        self.apply(c)?;
        self.append_log(c);
        Ok(())
    }

    /// Appends a change this process has already applied to its mirrors.
    pub(in crate::table) fn append_log(&mut self, c: Change) {
        let ctl = self.sh.region.control();
        let seq = ctl.log_head.load(Ordering::Relaxed);
        let log = self.sh.region.log();
        log[(seq % log.len() as u64) as usize].store(seq, c);
        ctl.log_head.store(seq.wrapping_add(1), Ordering::Relaxed);
        self.local.applied = seq.wrapping_add(1);
    }

    /// [`Locked::append_log`] of an `Insert` into the strategies of
    /// `target` for each of `keys`, with `priorities[i]`: the ring position
    /// is found once for the batch, not by a division per entry.
    pub(in crate::table) fn append_inserts(&mut self, keys: &[SlotKey], priorities: &[f64], target: u8) {
        let ctl = self.sh.region.control();
        let log = self.sh.region.log();
        let mut seq = ctl.log_head.load(Ordering::Relaxed);
        let Some(mut at) = seq.checked_rem(log.len() as u64) else { return };
        for (&key, &priority) in keys.iter().zip(priorities) {
            if let Some(entry) = log.get(at as usize) {
                entry.store(seq, Change { key, op: LogOp::Insert, target, priority });
            }
            seq = seq.wrapping_add(1);
            at += 1;
            if at == log.len() as u64 {
                at = 0;
            }
        }
        ctl.log_head.store(seq, Ordering::Relaxed);
        self.local.applied = seq;
    }

    /// Inserts `key` into this process's sampler (which chooses the
    /// priority when `priority` is `None`) and, with `remover`, into the
    /// remover with the same priority; logs the insert. Returns the priority.
    pub(in crate::table) fn insert_new(&mut self, key: SlotKey, priority: Option<f64>, remover: bool) -> Result<f64> {
        let slot = key.slot as usize;
        let p = self.local.sampler.insert(key, priority)?;
        self.local.in_sampler[slot] = Some(key);
        if remover {
            if let Err(e) = self.local.remover.insert(key, Some(p)) {
                self.local.sampler.remove(key)?;
                self.local.in_sampler[slot] = None;
                return Err(e.into());
            }
            self.local.in_remover[slot] = Some(key);
        }
        let target = if remover { target::BOTH } else { target::SAMPLER };
        self.append_log(Change { key, op: LogOp::Insert, target, priority: p });
        Ok(p)
    }

    /// Replays log entries this process has not applied.
    pub(in crate::table) fn sync(&mut self) {
        let ctl = self.sh.region.control();
        if ctl.rebuild_epoch.load(Ordering::Relaxed) != self.local.rebuild_epoch {
            return self.rebuild();
        }
        let head = ctl.log_head.load(Ordering::Relaxed);
        let ring = self.sh.region.log().len() as u64;
        if head.saturating_sub(self.local.applied) > ring || self.local.applied > head {
            return self.rebuild();
        }
        while self.local.applied < head {
            let seq = self.local.applied;
            let change = self.sh.region.log()[(seq % ring) as usize].load(seq);
            match change.map(|c| self.apply(c)) {
                Some(Ok(())) => self.local.applied = seq.wrapping_add(1),
                _ => return self.rebuild(),
            }
        }
    }

    /// Rebuilds the mirrors from the slot records.
    pub(in crate::table) fn rebuild(&mut self) {
        let sh = self.sh;
        let l = &mut *self.local;
        for (sel, present) in [(&mut l.sampler, &mut l.in_sampler), (&mut l.remover, &mut l.in_remover)] {
            for entry in present.iter_mut() {
                if let Some(k) = entry.take() {
                    let _ = sel.remove(k);
                }
            }
        }
        let mut members: Vec<_> = (0..sh.region.spec().capacity() as u32)
            .map(|s| sh.region.slots()[s as usize].meta(s))
            .filter(|m| {
                m.state == SlotState::Committed
                    || (sh.sample_while_writing && m.state == SlotState::Writing && m.len > 0)
            })
            .collect();
        members.sort_by_key(|m| m.insert_seq);
        let per_slot = sh.items_per_slot;
        for m in members {
            let slot = m.key.slot as usize;
            if per_slot > 0 {
                // Items in the order of their trajectories' inserts, then
                // of their index; only those that name this trajectory's
                // published steps (anything else in a record is stale or
                // garbage).
                for (j, rec) in sh.region.items_of(m.key.slot).iter().enumerate() {
                    let index = item_index(m.key.slot, j as u32, per_slot);
                    let item = rec.meta(index);
                    if item.state == ItemState::Live
                        && item.belongs_to(m.key, m.len)
                        && check_priority(item.priority).is_ok()
                        && l.sampler.insert(item.key, Some(item.priority)).is_ok()
                    {
                        l.in_sampler[index as usize] = Some(item.key);
                    }
                }
            } else if l.sampler.insert(m.key, Some(m.priority)).is_ok() {
                l.in_sampler[slot] = Some(m.key);
            }
            if m.state == SlotState::Committed && l.remover.insert(m.key, Some(m.priority)).is_ok() {
                l.in_remover[slot] = Some(m.key);
            }
        }
        let ctl = sh.region.control();
        l.applied = ctl.log_head.load(Ordering::Relaxed);
        l.rebuild_epoch = ctl.rebuild_epoch.load(Ordering::Relaxed);
    }
}
