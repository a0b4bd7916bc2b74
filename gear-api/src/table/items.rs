//! Items over stored trajectories (gear-core's `item` module): the table's
//! side of them. A table whose spec has `M` items per trajectory keeps its
//! sampling strategy over items (keys `SlotKey::item`) and its remover over
//! trajectories (slots), and ties the two together here:
//!
//! * a trajectory's items become selectable when it commits: the items
//!   its writer added ([`crate::Trajectory::add_item`], `Pending` records
//!   until then), else the table's [`ItemPattern`] over its length; items
//!   are added to a committed trajectory with [`ReplayTable::add_items`];
//! * evicting a trajectory removes its items from the sampler and logs
//!   their removal under the same lock hold as the trajectory's, so every
//!   process's mirror follows;
//! * a dead writer's trajectory keeps the items whose windows lie inside
//!   the steps it published (a pending item never lies beyond them: items
//!   are added over steps already written), or gets the pattern's over
//!   those steps;
//! * the rate limiter, `size`, `inserts` and `samples` count items.

use super::builder::policy;
use super::shared::{add, sub, Local, Locked, Shared};
use super::ReplayTable;
use crate::error::{Error, Result};
use gear_core::{
    check_priority, item_index, target, Change, ControlBlock, ItemPattern, ItemState, LogOp, SlotKey, SlotState,
};
use std::sync::atomic::Ordering;

/// An item to add to a trajectory: a window of its steps and a priority
/// (`None`: the sampling strategy chooses, as for a trajectory begun
/// without one; prioritized replay gives the largest priority seen).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewItem {
    /// First step of the window.
    pub start: u64,
    /// Steps in the window (at least 1).
    pub len: u64,
    /// The item's priority.
    pub priority: Option<f64>,
}

impl NewItem {
    /// The window `[start, start + len)` with the default priority.
    pub fn new(start: u64, len: u64) -> Self {
        NewItem { start, len, priority: None }
    }

    /// The same window with a priority.
    pub fn with_priority(mut self, priority: f64) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// A live item of a stored trajectory, as [`ReplayTable::items_of`] lists it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoredItem {
    /// The item's key (for priority updates; sampled rows carry it).
    pub key: SlotKey,
    /// First step of its window.
    pub start: u64,
    /// Steps in its window.
    pub len: u64,
    /// Its priority.
    pub priority: f64,
    /// How many times it was sampled.
    pub times_sampled: u64,
}

/// The policy words of a pattern: code, two parameters, tail flag.
pub(super) fn pattern_words(p: &ItemPattern) -> (u64, u64, u64, bool) {
    match *p {
        ItemPattern::Whole => (0, 0, 0, false),
        ItemPattern::None => (1, 0, 0, false),
        ItemPattern::Windows { len, stride, tail } => (2, len, stride, tail),
        ItemPattern::Transitions { n_step } => (3, n_step, 0, false),
    }
}

/// The table's default item pattern from the policy words, validated
/// (the words are written once by the creator; anything else is
/// corruption).
pub(super) fn read_pattern(ctl: &ControlBlock) -> Result<ItemPattern> {
    let p = &ctl.policy;
    let (a, b) = (p[policy::ITEM_A].load(Ordering::Relaxed), p[policy::ITEM_B].load(Ordering::Relaxed));
    let tail = p[policy::FLAGS].load(Ordering::Relaxed) & policy::FLAG_ITEM_TAIL != 0;
    let pattern = match p[policy::ITEM_PATTERN].load(Ordering::Relaxed) {
        0 => ItemPattern::Whole,
        1 => ItemPattern::None,
        2 => ItemPattern::Windows { len: a, stride: b, tail },
        3 => ItemPattern::Transitions { n_step: a },
        code => return Err(Error::Corrupted(format!("its item pattern code {code} is unknown"))),
    };
    pattern.validate().map_err(|e| Error::Corrupted(format!("its item pattern is invalid ({e})")))?;
    Ok(pattern)
}

/// Checks that `pattern` gives a trajectory of `len` steps at most
/// `per_slot` items.
pub(crate) fn check_pattern_fits(pattern: &ItemPattern, len: u64, per_slot: u32) -> Result<()> {
    let n = pattern.count(len);
    if n > u64::from(per_slot) {
        return Err(Error::Trajectory(format!(
            "{pattern:?} makes {n} items of a trajectory of {len} steps; the table keeps at most {per_slot} per \
             trajectory (TableSpec::with_items_per_trajectory)"
        )));
    }
    Ok(())
}

/// Checks a window against a trajectory of `published` steps.
fn check_window(start: u64, len: u64, published: u64) -> Result<()> {
    if len == 0 {
        return Err(Error::Trajectory(format!("an item needs at least one step (start {start}, length 0)")));
    }
    if start.checked_add(len).is_none_or(|end| end > published) {
        return Err(Error::Trajectory(format!(
            "item steps {start}..{} lie past the {published} steps written",
            start.saturating_add(len)
        )));
    }
    Ok(())
}

impl Shared {
    /// Items of trajectory `key` (of `len` published steps) whose records
    /// are live and name its steps.
    pub(super) fn live_items(&self, key: SlotKey, len: u64) -> u64 {
        let per_slot = self.items_per_slot;
        self.region
            .items_of(key.slot)
            .iter()
            .enumerate()
            .filter(|(j, rec)| {
                let m = rec.meta(item_index(key.slot, *j as u32, per_slot));
                m.state == ItemState::Live && m.belongs_to(key, len)
            })
            .count() as u64
    }

    /// The items a trajectory committed without items of its own gets.
    pub(crate) fn item_pattern(&self) -> ItemPattern {
        self.item_pattern
    }

    /// Refuses an operation on items in a table without them.
    pub(crate) fn check_has_items(&self, op: &str) -> Result<()> {
        if self.items_per_slot == 0 {
            return Err(Error::Config(format!(
                "cannot {op}: the table has no items (TableSpec::with_items_per_trajectory)"
            )));
        }
        Ok(())
    }
}

impl Locked<'_> {
    /// Frees every item record of `key`'s slot that names `key`'s
    /// trajectory (its items are in no strategy: pending, or already
    /// removed).
    pub(super) fn clear_items_of(&mut self, key: SlotKey) {
        let per_slot = self.sh.items_per_slot;
        for (j, rec) in self.sh.region.items_of(key.slot).iter().enumerate() {
            if rec.meta(item_index(key.slot, j as u32, per_slot)).slot_generation == key.generation {
                rec.clear();
            }
        }
    }

    /// Removes the items of an evicted trajectory in `slot` from this
    /// process's sampler, logs each removal, and frees their records.
    /// Returns how many were selectable.
    pub(super) fn remove_items_of(&mut self, slot: u32) -> gear_core::Result<u64> {
        let per_slot = self.sh.items_per_slot;
        let mut removed = 0;
        for j in 0..per_slot {
            let index = item_index(slot, j, per_slot);
            if let Some(&Some(key)) = self.local.in_sampler.get(index as usize) {
                self.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 })?;
                removed += 1;
            }
        }
        for rec in self.sh.region.items_of(slot) {
            rec.clear();
        }
        sub(&self.ctl().size, removed);
        Ok(removed)
    }

    /// Inserts live item records into this process's sampler in order,
    /// `priorities[i]` for `keys[i]` (`None`: the strategy chooses), logs
    /// them for other processes and stores each recorded priority in its
    /// record; counts them in `size` and `inserts`. Returns how many went
    /// in; on an error the keys before the failing one are in, it and the
    /// rest are not.
    pub(super) fn insert_items(&mut self, keys: &[SlotKey], priorities: &[Option<f64>]) -> (usize, Option<Error>) {
        let Local { sampler, in_sampler, recorded, item_priorities, .. } = &mut *self.local;
        recorded.clear();
        let mut error = None;
        let all_given = priorities.iter().all(Option::is_some);
        if all_given || priorities.iter().all(Option::is_none) {
            // One batch: prioritized replay refreshes each tree node once.
            item_priorities.clear();
            item_priorities.extend(priorities.iter().flatten());
            if let Err(e) = sampler.insert_batch(keys, all_given.then_some(&item_priorities[..]), recorded) {
                error = Some(e.into());
            }
        } else {
            for (&key, &p) in keys.iter().zip(priorities) {
                match sampler.insert(key, p) {
                    Ok(r) => recorded.push(r),
                    Err(e) => {
                        error = Some(e.into());
                        break;
                    }
                }
            }
        }
        let n = recorded.len().min(keys.len());
        for key in &keys[..n] {
            in_sampler[key.slot as usize] = Some(*key);
        }
        let recorded = std::mem::take(&mut self.local.recorded);
        self.append_inserts(&keys[..n], &recorded[..n], target::SAMPLER);
        let items = self.sh.region.items();
        for (key, &p) in keys.iter().zip(&recorded) {
            if let Some(rec) = items.get(key.slot as usize) {
                rec.set_priority(*key, p);
            }
        }
        self.local.recorded = recorded;
        let ctl = self.ctl();
        add(&ctl.size, n as u64);
        add(&ctl.inserts, n as u64);
        (n, error)
    }

    /// Makes the items of trajectory `key` (just committed with `len`
    /// steps) selectable: its pending items whose windows lie inside
    /// those steps, or when it has none and `pattern` the table's pattern
    /// over them (cut at the items a slot holds when `reclaiming` a dead
    /// writer's steps, refused otherwise). Items without a priority of
    /// their own get `priority`. On an error nothing of the trajectory's
    /// items is left selectable. Returns how many items it got.
    pub(super) fn activate_items(
        &mut self,
        key: SlotKey,
        len: u64,
        priority: Option<f64>,
        reclaiming: bool,
        pattern: bool,
    ) -> Result<u64> {
        let sh = self.sh;
        let per_slot = sh.items_per_slot;
        let records = sh.region.items_of(key.slot);
        let mut keys = std::mem::take(&mut self.local.item_keys);
        keys.clear();
        let mut priorities = Vec::new();
        let mut pending = false;
        for (j, rec) in records.iter().enumerate() {
            let index = item_index(key.slot, j as u32, per_slot);
            let m = rec.meta(index);
            if m.state != ItemState::Pending || m.slot_generation != key.generation {
                continue;
            }
            pending = true;
            if m.belongs_to(key, len) && rec.transition(m.key, ItemState::Pending, ItemState::Live) {
                keys.push(m.key);
                priorities.push(check_priority(m.priority).ok().or(priority));
            } else {
                rec.clear();
            }
        }
        if !pending && pattern {
            if !reclaiming {
                check_pattern_fits(&sh.item_pattern, len, per_slot)?;
            }
            for (j, (start, n)) in sh.item_pattern.windows(len).take(per_slot as usize).enumerate() {
                let index = item_index(key.slot, j as u32, per_slot);
                keys.push(records[j].fill(index, key.generation, start, n, f64::NAN, ItemState::Live));
                priorities.push(priority);
            }
        }
        let (inserted, error) = self.insert_items(&keys, &priorities);
        let result = match error {
            None => Ok(inserted as u64),
            Some(e) => {
                for &k in &keys[..inserted] {
                    let _ = self.record(Change { key: k, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
                }
                sub(&self.ctl().size, inserted as u64);
                sub(&self.ctl().inserts, inserted as u64);
                self.clear_items_of(key);
                Err(e)
            }
        };
        self.local.item_keys = keys;
        result
    }

    /// [`Locked::reclaim_writer`] for a table with items: the dead
    /// writer's published steps are committed with the items it added
    /// over them (or the pattern's), or its slot freed.
    pub(super) fn reclaim_items_writer(&mut self, key: SlotKey, len: u64, priority: f64) -> Result<()> {
        let rec = self.sh.region.slot(key.slot)?;
        if len == 0 {
            self.clear_items_of(key);
            rec.free(key)?;
            self.push_free(key.slot);
            return Ok(());
        }
        rec.commit(key)?;
        self.record(Change { key, op: LogOp::Insert, target: target::REMOVER, priority })?;
        if let Err(e) = self.activate_items(key, len, None, true, true) {
            // The trajectory stays, with no item: the remover evicts it in
            // its turn.
            tracing::warn!("the items of reclaimed trajectory {key} could not be inserted: {e}");
        }
        Ok(())
    }
}

impl ReplayTable {
    /// Commits one trajectory of a table with items under the lock: into
    /// the remover, its items into the sampler. On an error its slot is
    /// given back. The caller has taken it off `pending_inserts`.
    pub(super) fn commit_items_locked(
        &self,
        l: &mut Locked<'_>,
        key: SlotKey,
        priority: Option<f64>,
        pattern: bool,
    ) -> Result<()> {
        let rec = self.shared.region.slot(key.slot)?;
        let committed = rec.commit(key).map_err(Error::from).and_then(|()| {
            let p = l.local.remover.insert(key, priority)?;
            l.local.in_remover[key.slot as usize] = Some(key);
            l.append_log(Change { key, op: LogOp::Insert, target: target::REMOVER, priority: p });
            rec.set_priority(key, p);
            let len = rec.meta(key.slot).len;
            if let Err(e) = l.activate_items(key, len, priority, false, pattern) {
                let _ = l.record(Change { key, op: LogOp::Remove, target: target::REMOVER, priority: 0.0 });
                return Err(e);
            }
            Ok(())
        });
        if committed.is_err() {
            l.clear_items_of(key);
            if rec.free(key).is_ok() {
                l.push_free(key.slot);
            }
        }
        committed
    }

    /// [`ReplayTable::commit_items_locked`] for a batch of trajectories of
    /// `steps` steps each (from `Writer::insert_batch`), done phase by
    /// phase as for a table without items: every slot record, one
    /// `insert_batch` into the remover, the pattern's items of every
    /// trajectory in one `insert_batch` into the sampler, the log, the
    /// counters. At the first trajectory that fails, it and every later
    /// one are given back; those before stay committed with their items.
    pub(super) fn commit_items_batch_locked(
        &self,
        l: &mut Locked<'_>,
        keys: &[SlotKey],
        priorities: Option<&[f64]>,
    ) -> Result<()> {
        let region = &self.shared.region;
        let per_slot = self.shared.items_per_slot;
        let pattern = self.shared.item_pattern;
        let mut error = None;
        let mut committed = keys.len();
        let mut steps = 0;
        for (i, &key) in keys.iter().enumerate() {
            match region.slot(key.slot).and_then(|rec| rec.commit(key).map(|()| rec.meta(key.slot).len)) {
                Ok(len) => steps = len,
                Err(e) => {
                    error = Some(Error::from(e));
                    committed = i;
                    break;
                }
            }
        }
        let keys_in = &keys[..committed];
        let priorities_in = priorities.map(|p| &p[..committed]);
        let Local { remover, in_remover, recorded_remover, item_keys, item_priorities, .. } = &mut *l.local;
        recorded_remover.clear();
        if let Err(e) = remover.insert_batch(keys_in, priorities_in, recorded_remover) {
            error = Some(e.into());
        }
        let mut kept = recorded_remover.len().min(committed);
        for &key in &keys_in[..kept] {
            in_remover[key.slot as usize] = Some(key);
        }
        // Every trajectory of a batch has `steps` steps: the same windows.
        let windows: Vec<(u64, u64)> = pattern.windows(steps).take(per_slot as usize).collect();
        item_keys.clear();
        item_priorities.clear();
        for (i, &key) in keys_in[..kept].iter().enumerate() {
            let records = region.items_of(key.slot);
            for (j, &(start, n)) in windows.iter().enumerate() {
                let index = item_index(key.slot, j as u32, per_slot);
                item_keys.push(records[j].fill(index, key.generation, start, n, f64::NAN, ItemState::Live));
                if let Some(p) = priorities {
                    item_priorities.push(p[i]);
                }
            }
        }
        let recorded_r = std::mem::take(recorded_remover);
        l.append_inserts(&keys_in[..kept], &recorded_r[..kept], target::REMOVER);
        for (&key, &p) in keys_in.iter().zip(&recorded_r) {
            if let Ok(rec) = region.slot(key.slot) {
                rec.set_priority(key, p);
            }
        }
        l.local.recorded_remover = recorded_r;
        let item_keys = std::mem::take(&mut l.local.item_keys);
        let given: Vec<Option<f64>> = match priorities {
            Some(_) => l.local.item_priorities.iter().map(|&p| Some(p)).collect(),
            None => vec![None; item_keys.len()],
        };
        let (inserted, item_error) = l.insert_items(&item_keys, &given);
        if let Some(e) = item_error {
            // Keep the trajectories whose items all went in; the one whose
            // items stopped part way, and the rest, are given back.
            error = Some(e);
            let whole = if windows.is_empty() { kept } else { inserted / windows.len() };
            for &k in &item_keys[whole * windows.len()..inserted] {
                let _ = l.record(Change { key: k, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
            }
            let partial = (inserted - whole * windows.len()) as u64;
            sub(&l.ctl().size, partial);
            sub(&l.ctl().inserts, partial);
            for &key in &keys_in[whole..kept] {
                let _ = l.record(Change { key, op: LogOp::Remove, target: target::REMOVER, priority: 0.0 });
            }
            kept = whole;
        }
        l.local.item_keys = item_keys;
        for &key in &keys[kept..] {
            l.clear_items_of(key);
            if region.slot(key.slot).and_then(|rec| rec.free(key)).is_ok() {
                l.push_free(key.slot);
            }
        }
        error.map_or(Ok(()), Err)
    }

    /// Adds items to the committed trajectory `trajectory` (its key, as
    /// [`crate::Trajectory::end`] returned it): each a window of its steps
    /// with a priority (see [`NewItem`]). They are selectable when this returns, and count as inserts for the rate
    /// limiter. Refused, changing nothing: a stale or uncommitted key
    /// ([`gear_core::Error::StaleKey`]), a window past the trajectory's
    /// steps, a bad priority, more items than the trajectory has records
    /// left for. Returns the new items' keys.
    pub fn add_items(&self, trajectory: SlotKey, items: &[NewItem]) -> Result<Vec<SlotKey>> {
        let sh = &*self.shared;
        sh.check_has_items("add items")?;
        if trajectory.is_item() {
            return Err(Error::Config(format!("{trajectory} is an item's key; items are added to a trajectory's")));
        }
        for it in items {
            if let Some(p) = it.priority {
                check_priority(p)?;
            }
        }
        let mut l = sh.lock(None)?;
        let rec = sh.region.slot(trajectory.slot)?;
        rec.check(trajectory, SlotState::Committed, "add items")?;
        let meta = rec.meta(trajectory.slot);
        for it in items {
            check_window(it.start, it.len, meta.len)?;
        }
        let per_slot = sh.items_per_slot;
        let records = sh.region.items_of(trajectory.slot);
        // Records free for this trajectory: free ones, and ones naming a
        // trajectory the slot held before.
        let free: Vec<usize> = (0..records.len())
            .filter(|&j| {
                let m = records[j].meta(item_index(trajectory.slot, j as u32, per_slot));
                m.state == ItemState::Free || m.slot_generation != trajectory.generation
            })
            .take(items.len())
            .collect();
        if free.len() < items.len() {
            return Err(Error::Trajectory(format!(
                "trajectory {trajectory} has room for {} more items (the table keeps {per_slot} per trajectory), \
                 {} were given",
                free.len(),
                items.len()
            )));
        }
        let mut keys = Vec::with_capacity(items.len());
        let mut priorities = Vec::with_capacity(items.len());
        for (&j, it) in free.iter().zip(items) {
            let index = item_index(trajectory.slot, j as u32, per_slot);
            keys.push(records[j].fill(index, trajectory.generation, it.start, it.len, f64::NAN, ItemState::Live));
            priorities.push(it.priority);
        }
        let (inserted, error) = l.insert_items(&keys, &priorities);
        if let Some(e) = error {
            for &k in &keys[..inserted] {
                let _ = l.record(Change { key: k, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
            }
            sub(&l.ctl().size, inserted as u64);
            sub(&l.ctl().inserts, inserted as u64);
            for &j in &free {
                records[j].clear();
            }
            return Err(e);
        }
        l.wake();
        Ok(keys)
    }

    /// [`ReplayTable::add_items`] of the windows `pattern` gives the
    /// committed trajectory's steps, each with `priority`.
    pub fn add_pattern_items(
        &self,
        trajectory: SlotKey,
        pattern: ItemPattern,
        priority: Option<f64>,
    ) -> Result<Vec<SlotKey>> {
        pattern.validate()?;
        let len = self
            .shared
            .region
            .slot(trajectory.slot)?
            .read_begin(trajectory)
            .ok_or(gear_core::Error::StaleKey { slot: trajectory.slot, generation: trajectory.generation })?;
        let items: Vec<NewItem> = pattern.windows(len).map(|(start, len)| NewItem { start, len, priority }).collect();
        self.add_items(trajectory, &items)
    }

    /// The trajectory a sampled row's key reads (the key itself, or an
    /// item's trajectory) and how many times the key was sampled; `None`
    /// when the key is stale or out of range.
    pub(crate) fn trajectory_sampled(&self, key: SlotKey) -> Option<(SlotKey, u64)> {
        let region = &self.shared.region;
        if !key.is_item() {
            let meta = region.slots().get(key.slot as usize)?.meta(key.slot);
            return (meta.key == key).then_some((key, meta.times_sampled));
        }
        let rec = region.items().get(key.slot as usize)?;
        let w = rec.read(key)?;
        let trajectory = SlotKey { slot: region.item_slot(key.slot)?, generation: w.slot_generation };
        Some((trajectory, rec.meta(key.slot).times_sampled))
    }

    /// The live items of the stored trajectory `trajectory`, in record
    /// order; empty when the key is stale.
    pub fn items_of(&self, trajectory: SlotKey) -> Result<Vec<StoredItem>> {
        let sh = &*self.shared;
        sh.check_has_items("list items")?;
        let rec = sh.region.slot(trajectory.slot)?;
        let meta = rec.meta(trajectory.slot);
        if meta.key != trajectory || meta.state == SlotState::Free {
            return Ok(Vec::new());
        }
        let per_slot = sh.items_per_slot;
        Ok(sh
            .region
            .items_of(trajectory.slot)
            .iter()
            .enumerate()
            .map(|(j, r)| r.meta(item_index(trajectory.slot, j as u32, per_slot)))
            .filter(|m| m.state == ItemState::Live && m.belongs_to(trajectory, meta.len))
            .map(|m| StoredItem {
                key: m.key,
                start: m.start,
                len: m.len,
                priority: m.priority,
                times_sampled: m.times_sampled,
            })
            .collect())
    }
}

/// The writer's side: an item added while the trajectory is written, as
/// a `Pending` record of its slot that becomes live when it commits.
pub(crate) fn add_pending_item(
    table: &ReplayTable,
    trajectory: SlotKey,
    j: u32,
    start: u64,
    len: u64,
    published: u64,
    priority: Option<f64>,
) -> Result<SlotKey> {
    let sh = &*table.shared;
    sh.check_has_items("add an item")?;
    check_window(start, len, published)?;
    if let Some(p) = priority {
        check_priority(p)?;
    }
    let per_slot = sh.items_per_slot;
    if j >= per_slot {
        return Err(Error::Trajectory(format!(
            "trajectory {trajectory} already has the {per_slot} items the table keeps per trajectory"
        )));
    }
    let rec = sh.region.slot(trajectory.slot)?;
    rec.check(trajectory, SlotState::Writing, "add an item")?;
    let index = item_index(trajectory.slot, j, per_slot);
    let record = &sh.region.items_of(trajectory.slot)[j as usize];
    // The slot is ours while we write it: nobody else writes its records.
    Ok(record.fill(index, trajectory.generation, start, len, priority.unwrap_or(f64::NAN), ItemState::Pending))
}
