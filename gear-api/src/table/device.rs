//! Keeping a device's copy of the selection state in step with the table:
//! which slots a device mirror must rewrite before its next draw.
//!
//! The change log (`gear_core::control`) already tells every process what
//! changed, in order; this process's strategy mirrors replay it under the
//! table lock. A device mirror keeps its own cursor into the same log
//! ([`DeviceCursor`]). Before each device draw, with the table lock held
//! and this process's mirrors in step, [`ReplayTable::admit_device_draw`]
//! admits the batch (rate limiter, as a host draw) and lists the slots the
//! log touched since the cursor (every slot the first time, after a
//! rebuild of the mirrors, or when the cursor fell more than the log's
//! length behind). Each listed slot is described as it is now, from this
//! process's sampler mirror (which key it holds) and the slot record (its
//! priority and published length), so replaying is idempotent and an
//! update from any process reaches the device before the next draw.

use super::shared::{add, sub};
use super::ReplayTable;
use crate::error::Result;
use gear_core::{target, SelectionRule, SlotKey, SlotState};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Where a device mirror stands in the table's change log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceCursor {
    /// Log entries the mirror has seen.
    applied: u64,
    /// The `rebuild_epoch` it was built for.
    rebuild_epoch: u64,
    /// Whether it was ever filled.
    started: bool,
}

/// One slot as a device mirror must hold it now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DeviceSlot {
    pub(crate) slot: u32,
    /// The trajectory it holds for selection, or `None`.
    pub(crate) key: Option<SlotKey>,
    /// Its priority (finite and non-negative; 0 without a key).
    pub(crate) priority: f64,
    /// Its stored length (0 without a key).
    pub(crate) len: u64,
}

impl ReplayTable {
    /// The rule a device can draw this table's batches by, or `None` when
    /// the host must select: the strategy names no [`SelectionRule`], the
    /// table has `max_times_sampled` (a draw retires rows under the lock),
    /// or it samples trajectories still being written (their lengths grow
    /// after the device copied them).
    pub(crate) fn device_rule(&self) -> Option<SelectionRule> {
        let sh = &*self.shared;
        // The device mirror holds slots; a table with items selects on the
        // host.
        if sh.max_times_sampled.is_some() || sh.sample_while_writing || sh.items_per_slot > 0 {
            return None;
        }
        sh.local.read().sampler.selection_rule()
    }

    /// Admits a batch of `n` rows to be drawn on a device (waiting for the
    /// rate limiter up to `deadline`, and counting the batch as a host draw
    /// does), appends to `out` every slot whose state changed since
    /// `cursor` and moves the cursor. Returns the rule to draw by, read
    /// under the same lock (an annealed `beta` is followed); `None` (with
    /// nothing admitted or counted) when the host must select after all.
    pub(crate) fn admit_device_draw(
        &self,
        n: usize,
        deadline: Option<Instant>,
        cursor: &mut DeviceCursor,
        out: &mut Vec<DeviceSlot>,
    ) -> Result<Option<SelectionRule>> {
        let sh = &*self.shared;
        if self.device_rule().is_none() {
            return Ok(None);
        }
        self.check_batch(n)?;
        let (guard, local) = sh.lock_read(deadline)?;
        let ready = sh.ctl().closed.load(Ordering::Acquire) == 0 && sh.can_sample(n as u64);
        let (guard, local) = if ready {
            (guard, local)
        } else {
            drop((guard, local));
            self.admit(sh.lock(deadline)?, n, deadline, true)?.downgrade()
        };
        let Some(rule) = local.sampler.selection_rule() else { return Ok(None) };
        add(&sh.ctl().samples, n as u64);
        sh.wake();
        // The table lock is held: the log does not move, and the mirrors
        // (in step with it) say which key each slot holds.
        let ctl = sh.ctl();
        let head = ctl.log_head.load(Ordering::Relaxed);
        let epoch = ctl.rebuild_epoch.load(Ordering::Relaxed);
        let log = sh.region.log();
        let ring = log.len() as u64;
        let capacity = sh.region.spec().capacity();
        let mut dirty: Vec<u32> = Vec::new();
        let mut everything =
            !cursor.started || cursor.rebuild_epoch != epoch || cursor.applied > head || head - cursor.applied > ring;
        if !everything {
            for seq in cursor.applied..head {
                match log[(seq % ring) as usize].load(seq) {
                    Some(c) if u64::from(c.key.slot) < capacity => {
                        if c.target & target::SAMPLER != 0 {
                            dirty.push(c.key.slot);
                        }
                    }
                    // Overwritten or garbage: describe every slot.
                    _ => {
                        everything = true;
                        break;
                    }
                }
            }
        }
        if everything {
            dirty = (0..capacity as u32).collect();
        } else {
            dirty.sort_unstable();
            dirty.dedup();
        }
        let slots = sh.region.slots();
        let t = sh.region.spec().max_len();
        for slot in dirty {
            let held = local.in_sampler.get(slot as usize).copied().flatten();
            let meta = slots[slot as usize].meta(slot);
            let current = held.filter(|&k| meta.key == k && meta.state == SlotState::Committed && meta.len <= t);
            let priority = if meta.priority.is_finite() && meta.priority >= 0.0 { meta.priority } else { 0.0 };
            out.push(match current {
                Some(key) => DeviceSlot { slot, key: Some(key), priority, len: meta.len },
                None => DeviceSlot { slot, key: None, priority: 0.0, len: 0 },
            });
        }
        *cursor = DeviceCursor { applied: head, rebuild_epoch: epoch, started: true };
        drop(local);
        drop(guard);
        Ok(Some(rule))
    }
}

impl ReplayTable {
    /// Gives back to the rate limiter a batch of `n` rows that
    /// [`ReplayTable::admit_device_draw`] admitted but the device never
    /// drew (its draw or gather failed to queue).
    pub(crate) fn unadmit_device_draw(&self, n: usize) {
        if let Ok(l) = self.shared.lock(None) {
            sub(&l.ctl().samples, n as u64);
            l.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ReplayTable;
    use crate::writer::StepValue;
    use gear_core::{ColumnSpec, DType, TableSpec};
    use gear_sampler::{StrategyKind, StrategyParams};

    fn spec(capacity: u64) -> TableSpec {
        TableSpec::new(vec![ColumnSpec::new("x", DType::U8, [4])], 8, capacity).unwrap()
    }

    fn table(kind: StrategyKind, capacity: u64) -> ReplayTable {
        ReplayTable::builder(spec(capacity)).sampler_kind(kind, StrategyParams::default()).build().unwrap()
    }

    fn insert(t: &ReplayTable, steps: u64, priority: f64) -> SlotKey {
        let mut tr = t.writer().begin(Some(priority)).unwrap();
        for _ in 0..steps {
            tr.append_step(&[StepValue::bytes(&[1u8, 2, 3, 4])]).unwrap();
        }
        tr.end().unwrap()
    }

    fn admit(t: &ReplayTable, c: &mut DeviceCursor) -> Vec<DeviceSlot> {
        let mut out = Vec::new();
        let rule = t.admit_device_draw(1, None, c, &mut out).unwrap();
        assert!(rule.is_some());
        out
    }

    #[test]
    fn the_first_draw_describes_every_slot_then_only_what_changed() {
        let t = table(StrategyKind::Prioritized, 6);
        let a = insert(&t, 3, 2.0);
        let mut c = DeviceCursor::default();
        let all = admit(&t, &mut c);
        assert_eq!(all.len(), 6);
        assert_eq!(all[a.slot as usize], DeviceSlot { slot: a.slot, key: Some(a), priority: 2.0, len: 3 });
        assert_eq!(all.iter().filter(|s| s.key.is_some()).count(), 1);
        assert!(admit(&t, &mut c).is_empty(), "nothing changed");
        let b = insert(&t, 5, 0.5);
        assert_eq!(t.update_priorities(&[(a, 7.0)]).unwrap(), 1);
        let changed = admit(&t, &mut c);
        let mut want = vec![
            DeviceSlot { slot: a.slot, key: Some(a), priority: 7.0, len: 3 },
            DeviceSlot { slot: b.slot, key: Some(b), priority: 0.5, len: 5 },
        ];
        want.sort_by_key(|s| s.slot);
        assert_eq!(changed, want);
    }

    #[test]
    fn changes_made_through_another_handle_reach_the_cursor() {
        let name = format!("gear-device-sync-{}", std::process::id());
        let t = ReplayTable::builder(spec(4))
            .sampler_kind(StrategyKind::Prioritized, StrategyParams::default())
            .shared_memory(name.clone())
            .build()
            .unwrap();
        let a = insert(&t, 2, 1.0);
        let other = ReplayTable::attach(&name, Default::default()).unwrap();
        let mut c = DeviceCursor::default();
        admit(&other, &mut c);
        // The creator updates and evicts; the attached handle's cursor sees it.
        assert_eq!(t.update_priorities(&[(a, 9.0)]).unwrap(), 1);
        assert_eq!(admit(&other, &mut c), [DeviceSlot { slot: a.slot, key: Some(a), priority: 9.0, len: 2 }]);
        let keys: Vec<SlotKey> = (0..4).map(|_| insert(&t, 1, 1.0)).collect();
        let changed = admit(&other, &mut c);
        assert!(
            changed.iter().any(|s| s.slot == a.slot && s.key != Some(a)),
            "the evicted key is gone from slot {}: {changed:?}",
            a.slot
        );
        for k in keys {
            assert!(changed.contains(&DeviceSlot { slot: k.slot, key: Some(k), priority: 1.0, len: 1 }), "{k}");
        }
    }

    #[test]
    fn a_batch_the_device_never_drew_is_given_back_to_the_limiter() {
        let t = table(StrategyKind::Uniform, 3);
        insert(&t, 1, 1.0);
        let mut c = DeviceCursor::default();
        admit(&t, &mut c);
        assert_eq!(t.info().unwrap().samples, 1);
        t.unadmit_device_draw(1);
        assert_eq!(t.info().unwrap().samples, 0);
    }

    #[test]
    fn a_cursor_that_fell_behind_the_log_describes_every_slot() {
        let t = table(StrategyKind::Uniform, 3);
        let a = insert(&t, 1, 1.0);
        let mut c = DeviceCursor::default();
        admit(&t, &mut c);
        let ring = t.shared.region.log().len();
        for _ in 0..=ring {
            t.update_priorities(&[(a, 2.0)]).unwrap();
        }
        assert_eq!(admit(&t, &mut c).len(), 3);
    }

    #[test]
    fn strategies_without_a_rule_and_retiring_tables_select_on_the_host() {
        for kind in [StrategyKind::Fifo, StrategyKind::Lifo, StrategyKind::MinHeap] {
            let t = table(kind, 2);
            insert(&t, 1, 1.0);
            let mut out = Vec::new();
            assert_eq!(t.device_rule(), None, "{kind}");
            assert_eq!(t.admit_device_draw(1, None, &mut DeviceCursor::default(), &mut out).unwrap(), None);
            assert_eq!(t.info().unwrap().samples, 0, "{kind}: nothing admitted or counted");
        }
        for kind in [StrategyKind::Uniform, StrategyKind::Prioritized, StrategyKind::MaxHeap] {
            assert!(table(kind, 2).device_rule().is_some(), "{kind}");
        }
        let queue = ReplayTable::builder(spec(2)).max_times_sampled(1).build().unwrap();
        assert_eq!(queue.device_rule(), None);
        let online = ReplayTable::builder(spec(2)).sample_while_writing(true).build().unwrap();
        assert_eq!(online.device_rule(), None);
    }
}
