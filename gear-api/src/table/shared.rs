//! The protocol over the shared control block: the table lock, this
//! process's strategy mirrors kept in step with the change log, repair
//! after a dead lock holder, reclamation of dead writers' slots, and waits.

use super::attach::read_limiter;
use super::builder::{policy, Opened};
use super::ReplayTable;
use crate::error::{Error, Result};
use crate::limiter::{RateLimiter, RateLimiterConfig};
use gear_core::{
    target, Change, ControlBlock, LogOp, MemoryRegion, Sampled, Selector, SlotKey, SlotState, TableRegion, Xoshiro256,
};
use gear_core::{WaitReason, WaitRole};
use gear_cpu::sync::{
    futex_wait, futex_wake_all, wait_warning_after, LockState, ProcessLease, TableLock, TableLockGuard, WaitListing,
};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a waiter sleeps before re-checking the server and dead writers.
pub(super) const WAIT_SLICE: Duration = Duration::from_millis(50);
/// Least time between two full scans for dead writers by one process
/// (when a writer finds no free slot, or while waiting).
pub(super) const REAP_INTERVAL: Duration = Duration::from_millis(500);
/// Least time between two background slices of the dead-writer scan.
pub(super) const REAP_SLICE_INTERVAL: Duration = Duration::from_millis(100);
/// Slots one background slice checks.
pub(super) const REAP_SLICE: u64 = 8192;

/// State one process keeps: strategy mirrors in step with the change log.
pub(super) struct Local {
    pub(super) sampler: Box<dyn Selector>,
    pub(super) remover: Box<dyn Selector>,
    /// The key each mirror holds per slot (for rebuilds and idempotence).
    pub(super) in_sampler: Vec<Option<SlotKey>>,
    pub(super) in_remover: Vec<Option<SlotKey>>,
    /// Log entries applied so far.
    pub(super) applied: u64,
    /// The `rebuild_epoch` the mirrors were built for.
    pub(super) rebuild_epoch: u64,
    /// The remover's random stream (samplers bring their own).
    pub(super) rng: Xoshiro256,
    pub(super) scratch: Vec<Sampled>,
    /// The priorities the sampler and the remover recorded for a batch
    /// being committed (kept to reuse their allocations).
    pub(super) recorded: Vec<f64>,
    pub(super) recorded_remover: Vec<f64>,
}

impl Local {
    /// Whether the mirrors have applied every change in the log.
    pub(super) fn in_step_with(&self, ctl: &ControlBlock) -> bool {
        self.applied == ctl.log_head.load(Ordering::Relaxed)
            && self.rebuild_epoch == ctl.rebuild_epoch.load(Ordering::Relaxed)
    }
}

pub(crate) struct Shared {
    pub(crate) region: TableRegion<Box<dyn MemoryRegion>>,
    /// The lock over the control block (this handle's side of it).
    pub(super) lock: TableLock,
    /// This process's lease on the table; names it as slot owner and lock
    /// holder.
    pub(super) lease: ProcessLease,
    /// The backing file of a shared table, whose size is checked at every
    /// lock (a file shrunk under a mapping turns reads into SIGBUS).
    pub(super) backing: Option<File>,
    /// The rate limiter's settings, validated when the table was opened
    /// (the policy words are written once by the creator; later changes to
    /// them are corruption and are not read).
    pub(super) limiter_config: RateLimiterConfig,
    /// Written only under the table lock; read without it by samplers drawing
    /// through [`Selector::sample_shared`].
    pub(super) local: RwLock<Local>,
    /// Whether the sampler draws through a shared reference.
    pub(super) shared_draws: bool,
    /// Samplers made on this table by this process (each gets its own
    /// random stream).
    pub(super) samplers_made: AtomicU64,
    pub(crate) collector: gear_cpu::CpuCollector,
    pub(super) creator: bool,
    pub(super) max_times_sampled: Option<u64>,
    pub(super) sample_while_writing: bool,
    /// Milliseconds since `epoch_start` of this process's last full reap
    /// scan, and of its last background slice.
    pub(super) last_reap_ms: AtomicU64,
    pub(super) last_slice_ms: AtomicU64,
    /// Next slot the background reap slice checks.
    pub(super) reap_cursor: AtomicU64,
    /// Slots of this process's writers that could not be committed or
    /// given back because the lock was not had in time; the next holder of
    /// the lock in this process gives them back.
    pub(super) give_back: parking_lot::Mutex<Vec<SlotKey>>,
    pub(super) epoch_start: Instant,
    /// This process's waits on the table (`ReplayTable::wait_stats`).
    pub(super) waits: WaitCounters,
}

/// What a wait in [`ReplayTable::wait_until`] waits for, and so where it
/// is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LimiterWait {
    /// A writer admitted by the rate limiter.
    Insert,
    /// A sampler admitted by the rate limiter, or waiting for items.
    Sample,
}

/// One kind of wait: how many, and their nanoseconds in total.
#[derive(Debug, Default)]
pub(super) struct WaitCounter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl WaitCounter {
    fn record(&self, waited: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn read(&self) -> (u64, Duration) {
        (self.count.load(Ordering::Relaxed), Duration::from_nanos(self.ns.load(Ordering::Relaxed)))
    }
}

/// This process's waits on one table, by kind.
#[derive(Debug, Default)]
pub(super) struct WaitCounters {
    insert: WaitCounter,
    sample: WaitCounter,
    lock: WaitCounter,
}

impl WaitCounters {
    pub(super) fn snapshot(&self) -> super::WaitStats {
        let (insert_waits, insert_wait) = self.insert.read();
        let (sample_waits, sample_wait) = self.sample.read();
        let (lock_waits, lock_wait) = self.lock.read();
        super::WaitStats { insert_waits, insert_wait, sample_waits, sample_wait, lock_waits, lock_wait }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.creator {
            // Attached processes see a closed table, not a silent one.
            let ctl = self.region.control();
            ctl.closed.store(1, Ordering::Release);
            ctl.epoch.fetch_add(1, Ordering::Release);
            futex_wake_all(&ctl.epoch);
        }
    }
}

impl Shared {
    pub(super) fn open_table(
        opened: Opened,
        mut sampler: Box<dyn Selector>,
        mut remover: Box<dyn Selector>,
        collector_threads: Option<usize>,
        lock_timeout: Option<Duration>,
    ) -> Result<ReplayTable> {
        let Opened { region, lease, backing, creator } = opened;
        let capacity = region.spec().capacity();
        let limiter_config = read_limiter(region.control())?;
        sampler.prepare(capacity)?;
        remover.prepare(capacity)?;
        // A draw of zero rows answers whether the strategy draws through a
        // shared reference at all (the trait asks it to answer alike for
        // every call).
        let shared_draws = sampler.sample_shared(0, &mut Xoshiro256::seed_from_u64(0), &mut Vec::new()).is_some();
        let p = &region.control().policy;
        let seed = p[policy::SEED].load(Ordering::Relaxed);
        let local = Local {
            sampler,
            remover,
            in_sampler: vec![None; capacity as usize],
            in_remover: vec![None; capacity as usize],
            applied: 0,
            rebuild_epoch: 0,
            rng: Xoshiro256::seed_from_u64(seed ^ process_salt(creator, &lease)),
            scratch: Vec::new(),
            recorded: Vec::new(),
            recorded_remover: Vec::new(),
        };
        let collector = match collector_threads {
            Some(n) => gear_cpu::CpuCollector::with_threads(n),
            None => gear_cpu::CpuCollector::new(),
        };
        let max = p[policy::MAX_TIMES_SAMPLED].load(Ordering::Relaxed);
        let flags = p[policy::FLAGS].load(Ordering::Relaxed);
        let shared = Shared {
            region,
            lock: TableLock::new(),
            lease,
            backing,
            limiter_config,
            local: RwLock::new(local),
            shared_draws,
            samplers_made: AtomicU64::new(0),
            collector,
            creator,
            max_times_sampled: (max > 0).then_some(max),
            sample_while_writing: flags & policy::FLAG_SAMPLE_WHILE_WRITING != 0,
            last_reap_ms: AtomicU64::new(0),
            last_slice_ms: AtomicU64::new(0),
            reap_cursor: AtomicU64::new(0),
            give_back: parking_lot::Mutex::new(Vec::new()),
            epoch_start: Instant::now(),
            waits: WaitCounters::default(),
        };
        if !creator {
            // Start from the slot records, then follow the log.
            let mut l = shared.lock(lock_timeout.map(|t| Instant::now() + t))?;
            l.rebuild();
        }
        Ok(ReplayTable { shared: Arc::new(shared) })
    }

    /// The table lock (waiting at most until `deadline`), with this
    /// process's mirrors in step.
    pub(super) fn lock(&self, deadline: Option<Instant>) -> Result<Locked<'_>> {
        let (guard, state) = self.lock_shared(deadline)?;
        self.write_in_step(guard, state)
    }

    /// Takes the shared lock and checks the backing file.
    pub(super) fn lock_shared(&self, deadline: Option<Instant>) -> Result<(TableLockGuard<'_>, LockState)> {
        let ctl = self.region.control();
        let (guard, state) = self.lock.lock(ctl, &self.lease, deadline).map_err(|t| Error::Timeout {
            op: "take the table lock",
            waited: t.waited,
            holder: Some(if t.holder == 0 {
                "another thread of this process".to_owned()
            } else {
                ProcessLease::describe(t.holder, ctl)
            }),
        })?;
        if let Some(waited) = guard.waited() {
            self.waits.lock.record(waited);
        }
        self.check_backing()?;
        Ok((guard, state))
    }

    /// Refuses to go on when the backing file is shorter than the mapping:
    /// another process truncated it, and touching the missing pages would
    /// kill this process with SIGBUS.
    pub(super) fn check_backing(&self) -> Result<()> {
        let Some(file) = &self.backing else { return Ok(()) };
        let mapped = self.region.region().len();
        match file.metadata() {
            Ok(m) if m.len() < mapped => Err(Error::Corrupted(format!(
                "its file `{}` shrank from {mapped} to {} bytes (another process truncated it); \
                 the table cannot be used safely any more",
                self.region.region().name().unwrap_or("?"),
                m.len()
            ))),
            _ => Ok(()),
        }
    }

    /// With the lock held: the write lock on the mirrors, after repairing
    /// what a dead lock holder left and applying the log; reclaims a slice
    /// of dead writers' slots when it is time.
    pub(super) fn write_in_step<'a>(&'a self, guard: TableLockGuard<'a>, state: LockState) -> Result<Locked<'a>> {
        let mut l = Locked { sh: self, guard, local: self.local.write(), reap_checked: false };
        if state == LockState::OwnerDied {
            l.repair();
            // Writers (and the holder itself) may have died with it.
            l.reap(0..self.region.spec().capacity())?;
        }
        l.sync();
        l.give_back_deferred();
        l.maybe_reap_slice()?;
        Ok(l)
    }

    /// Leaves `keys` (slots this process is writing) for the next holder of
    /// the lock to give back.
    pub(super) fn give_back_later(&self, keys: &[SlotKey]) {
        self.give_back.lock().extend_from_slice(keys);
    }

    /// The shared lock and a read view of mirrors in step with the log.
    /// Threads of this process holding read views draw at the same time;
    /// the write lock is taken only when there are changes to apply.
    pub(super) fn lock_read(
        &self,
        deadline: Option<Instant>,
    ) -> Result<(TableLockGuard<'_>, RwLockReadGuard<'_, Local>)> {
        let (guard, state) = self.lock_shared(deadline)?;
        if state != LockState::OwnerDied && !self.reap_slice_due() {
            let local = self.local.read();
            if local.in_step_with(self.region.control()) {
                return Ok((guard, local));
            }
        }
        Ok(self.write_in_step(guard, state)?.downgrade())
    }

    /// Milliseconds since this handle was opened (at least 1).
    pub(super) fn now_ms(&self) -> u64 {
        (self.epoch_start.elapsed().as_millis() as u64).max(1)
    }

    /// Whether a background reap slice is due: writers are active and the
    /// last slice is old enough.
    pub(super) fn reap_slice_due(&self) -> bool {
        let ctl = self.region.control();
        let busy = ctl.pending_inserts.load(Ordering::Relaxed) > 0 || self.max_times_sampled.is_some();
        busy && self.now_ms().saturating_sub(self.last_slice_ms.load(Ordering::Relaxed))
            >= REAP_SLICE_INTERVAL.as_millis() as u64
    }

    pub(super) fn ctl(&self) -> &ControlBlock {
        self.region.control()
    }

    pub(super) fn limiter(&self) -> RateLimiter {
        let ctl = self.ctl();
        let mut rl = RateLimiter::new(self.limiter_config);
        rl.inserts = ctl.inserts.load(Ordering::Relaxed);
        rl.samples = ctl.samples.load(Ordering::Relaxed);
        rl
    }

    pub(super) fn can_sample(&self, n: u64) -> bool {
        self.limiter().can_sample(self.ctl().size.load(Ordering::Relaxed), n)
    }

    /// Tells waiters something changed (call holding the table lock).
    pub(super) fn wake(&self) {
        if self.ctl().bump_epoch() {
            futex_wake_all(&self.ctl().epoch);
        }
    }
}

/// Mixed into a process's random streams so that processes attached to one
/// seeded table draw differently, yet reproducibly: the creator adds
/// nothing, an attacher its lease index (the order processes attached in).
pub(super) fn process_salt(creator: bool, lease: &ProcessLease) -> u64 {
    if creator {
        0
    } else {
        (gear_cpu::sync::lease_index(lease.token()) as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03)
    }
}

/// The shared lock and this process's mirrors, held together.
pub(super) struct Locked<'a> {
    pub(super) sh: &'a Shared,
    pub(super) guard: TableLockGuard<'a>,
    pub(super) local: RwLockWriteGuard<'a, Local>,
    /// Whether [`Locked::maybe_reap`] already looked at the clock during
    /// this hold: a batch taking many slots asks once, not once a slot.
    reap_checked: bool,
}

/// Adds to a guarded counter (wrapping: a corrupted value must not panic).
pub(super) fn add(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
}

pub(super) fn sub(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed).saturating_sub(v), Ordering::Relaxed);
}

impl<'a> Locked<'a> {
    /// Keeps the table lock and turns the write lock on the mirrors into a read
    /// lock, letting this process's other threads draw.
    pub(super) fn downgrade(self) -> (TableLockGuard<'a>, RwLockReadGuard<'a, Local>) {
        (self.guard, RwLockWriteGuard::downgrade(self.local))
    }

    pub(super) fn ctl(&self) -> &ControlBlock {
        self.sh.ctl()
    }

    pub(super) fn limiter(&self) -> RateLimiter {
        self.sh.limiter()
    }

    pub(super) fn can_insert(&self) -> bool {
        let ctl = self.ctl();
        let pending = ctl.pending_inserts.load(Ordering::Relaxed);
        let mut rl = self.limiter();
        rl.inserts = rl.inserts.saturating_add(pending);
        rl.can_insert(ctl.size.load(Ordering::Relaxed).saturating_add(pending))
    }

    pub(super) fn can_sample(&self, n: u64) -> bool {
        self.sh.can_sample(n)
    }

    /// Tells waiters something changed.
    pub(super) fn wake(&self) {
        self.sh.wake()
    }

    /// Applies a change to this process's mirrors.
    pub(super) fn apply(&mut self, c: Change) -> gear_core::Result<()> {
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
    pub(super) fn record(&mut self, c: Change) -> gear_core::Result<()> {
        self.apply(c)?;
        self.append_log(c);
        Ok(())
    }

    /// Appends a change this process has already applied to its mirrors.
    pub(super) fn append_log(&mut self, c: Change) {
        let ctl = self.sh.region.control();
        let seq = ctl.log_head.load(Ordering::Relaxed);
        let log = self.sh.region.log();
        log[(seq % log.len() as u64) as usize].store(seq, c);
        ctl.log_head.store(seq.wrapping_add(1), Ordering::Relaxed);
        self.local.applied = seq.wrapping_add(1);
    }

    /// [`Locked::append_log`] of an `Insert` into both strategies for each
    /// of `keys`, with `priorities[i]`: the ring position is found once
    /// for the batch, not by a division per entry.
    pub(super) fn append_inserts(&mut self, keys: &[SlotKey], priorities: &[f64]) {
        let ctl = self.sh.region.control();
        let log = self.sh.region.log();
        let mut seq = ctl.log_head.load(Ordering::Relaxed);
        let Some(mut at) = seq.checked_rem(log.len() as u64) else { return };
        for (&key, &priority) in keys.iter().zip(priorities) {
            if let Some(entry) = log.get(at as usize) {
                entry.store(seq, Change { key, op: LogOp::Insert, target: target::BOTH, priority });
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
    pub(super) fn insert_new(&mut self, key: SlotKey, priority: Option<f64>, remover: bool) -> Result<f64> {
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
    pub(super) fn sync(&mut self) {
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
    pub(super) fn rebuild(&mut self) {
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
        for m in members {
            let slot = m.key.slot as usize;
            if l.sampler.insert(m.key, Some(m.priority)).is_ok() {
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

    /// After a lock holder died: recomputes what it may have left
    /// half-updated (free list, size, pending writers) from the slot
    /// records, and makes every process rebuild its mirrors.
    pub(super) fn repair(&mut self) {
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
    pub(super) fn pop_free(&mut self) -> Option<u32> {
        for _ in 0..2 {
            match self.try_pop_free() {
                Ok(slot) => return slot,
                Err(()) => self.repair(),
            }
        }
        None
    }

    pub(super) fn try_pop_free(&mut self) -> std::result::Result<Option<u32>, ()> {
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

    pub(super) fn push_free(&mut self, slot: u32) {
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
    pub(super) fn reap(&mut self, slots: std::ops::Range<u64>) -> Result<u64> {
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
    pub(super) fn reclaim_writer(&mut self, key: SlotKey, len: u64, priority: f64) -> Result<()> {
        let rec = self.sh.region.slot(key.slot)?;
        let ctl = self.sh.region.control();
        sub(&ctl.pending_inserts, 1);
        add(&ctl.reclaimed, 1);
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
    pub(super) fn give_back_deferred(&mut self) {
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
    pub(super) fn abandon(&mut self, key: SlotKey) {
        let sh = self.sh;
        let ctl = sh.region.control();
        if self.local.in_sampler.get(key.slot as usize) == Some(&Some(key)) {
            let _ = self.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
            sub(&ctl.size, 1);
        }
        if let Ok(rec) = sh.region.slot(key.slot) {
            if rec.free(key).is_ok() {
                self.push_free(key.slot);
                sub(&ctl.pending_inserts, 1);
            }
        }
    }

    /// A full scan for dead writers, at most once per [`REAP_INTERVAL`]
    /// per process and once per hold of the lock. Returns the slots
    /// reclaimed.
    pub(super) fn maybe_reap(&mut self) -> Result<u64> {
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
    /// table: every [`REAP_SLICE_INTERVAL`], the next [`REAP_SLICE`] slots,
    /// so a table nobody calls `reclaim_dead` on still gets its dead
    /// writers' slots back, at a cost that does not grow with capacity.
    pub(super) fn maybe_reap_slice(&mut self) -> Result<()> {
        let sh = self.sh;
        if !sh.reap_slice_due() {
            return Ok(());
        }
        sh.last_slice_ms.store(sh.now_ms(), Ordering::Relaxed);
        let capacity = sh.region.spec().capacity();
        let start = sh.reap_cursor.load(Ordering::Relaxed) % capacity;
        let end = (start + REAP_SLICE).min(capacity);
        sh.reap_cursor.store(if end == capacity { 0 } else { end }, Ordering::Relaxed);
        self.reap(start..end).map(|_| ())
    }
}

/// What a writer's or sampler's wait is: the operation named in a timeout,
/// the role and limit it is listed with, and the counters its time adds to.
pub(super) struct WaitFor<R> {
    /// The operation, as a timeout names it ("insert (rate limiter)").
    pub(super) op: &'static str,
    pub(super) role: WaitRole,
    /// Which limit holds the caller back, read under the lock at each turn.
    pub(super) reason: R,
    /// Which totals the time waited adds to: the control block's (every
    /// process) and this process's (`ReplayTable::wait_stats`).
    pub(super) kind: LimiterWait,
}

impl ReplayTable {
    /// Waits until `ready` holds, the table closes, the server dies or the
    /// deadline passes; adds the time waited to `what.kind`'s totals. While it
    /// waits the wait is listed in the control block (for `info()` in every
    /// process) and, past [`wait_warning_after`], logged as a warning that
    /// names the limit and its counters.
    pub(super) fn wait_until<'a>(
        &'a self,
        mut l: Locked<'a>,
        deadline: Option<Instant>,
        what: WaitFor<impl Fn(&Locked<'_>) -> WaitReason>,
        ready: impl Fn(&Locked<'_>) -> bool,
    ) -> Result<Locked<'a>> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        if ctl.closed.load(Ordering::Acquire) == 0 && ready(&l) {
            return Ok(l);
        }
        let start = Instant::now();
        let mut listing = WaitListing::begin(ctl, &sh.lease, what.role, (what.reason)(&l), Duration::ZERO);
        let mut warn_at = wait_warning_after();
        // Every process's waits add up in the control block; this
        // process's are counted apart too (`ReplayTable::wait_stats`).
        let (waited, local) = match what.kind {
            LimiterWait::Insert => (&ctl.insert_wait_ns, &sh.waits.insert),
            LimiterWait::Sample => (&ctl.sample_wait_ns, &sh.waits.sample),
        };
        let result = loop {
            if ctl.closed.load(Ordering::Acquire) != 0 {
                break Err(Error::Closed);
            }
            if ready(&l) {
                break Ok(());
            }
            let server = u32::try_from(ctl.server.load(Ordering::Relaxed)).unwrap_or(0);
            if !sh.creator && !sh.lease.is_alive(server, ctl) {
                break Err(Error::ServerGone { name: self.name().unwrap_or("?").to_owned() });
            }
            l.maybe_reap()?;
            if ready(&l) {
                break Ok(());
            }
            let reason = (what.reason)(&l);
            listing.set_reason(reason);
            let now = Instant::now();
            if let Some(after) = warn_at.filter(|a| now - start >= *a) {
                tracing::warn!("{}", self.wait_warning(&l, what.role, reason, now - start));
                // Then again at 4, 16, ... times the threshold.
                warn_at = Some(after * 4);
            }
            if deadline.is_some_and(|d| now >= d) {
                break Err(Error::Timeout { op: what.op, waited: start.elapsed(), holder: None });
            }
            let slice = deadline.map_or(WAIT_SLICE, |d| (d - now).min(WAIT_SLICE));
            let seen = ctl.epoch.load(Ordering::Acquire);
            ctl.waiters.fetch_add(1, Ordering::AcqRel);
            drop(l);
            futex_wait(&ctl.epoch, seen, Some(slice));
            ctl.waiters.fetch_sub(1, Ordering::AcqRel);
            let relocked = sh.lock(deadline);
            l = match relocked {
                Ok(l) => l,
                Err(e) => {
                    let elapsed = start.elapsed();
                    waited.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
                    local.record(elapsed);
                    return Err(e);
                }
            };
        };
        drop(listing);
        let elapsed = start.elapsed();
        let ns = elapsed.as_nanos() as u64;
        if ns > 1000 {
            waited.fetch_add(ns, Ordering::Relaxed);
        }
        // Not ready at the first look: a wait, however short.
        local.record(elapsed);
        result.map(|()| l)
    }

    /// The warning logged when a wait lasts: who waits, on which limit,
    /// the counters that keep it waiting, and what usually ends it.
    fn wait_warning(&self, l: &Locked<'_>, role: WaitRole, reason: WaitReason, waited: Duration) -> String {
        let table = self.name().map_or_else(|| "a process-private table".to_owned(), |n| format!("table `{n}`"));
        let ctl = l.ctl();
        let rl = l.limiter();
        let size = ctl.size.load(Ordering::Relaxed);
        let cfg = rl.config;
        let why = match reason {
            WaitReason::MinSize => format!(
                "min size: the table holds {size} trajectories and the rate limiter's min_size_to_sample is {}; \
                 sampling starts once writers have committed that many. Is a writer running?",
                cfg.min_size_to_sample
            ),
            WaitReason::SamplesPerInsert if role == WaitRole::Writer => format!(
                "samples per insert: the rate limiter holds inserts until samplers catch up ({} inserts, {} \
                 samples, samples_per_insert {}: one more insert would take inserts * samples_per_insert - \
                 samples to {:.1}, above max_diff {:.1}). Is a sampler running?",
                rl.inserts,
                rl.samples,
                cfg.samples_per_insert,
                rl.error() + cfg.samples_per_insert,
                cfg.max_diff
            ),
            WaitReason::SamplesPerInsert => format!(
                "samples per insert: the rate limiter holds sampling until writers insert more ({} inserts, {} \
                 samples, samples_per_insert {}: inserts * samples_per_insert - samples is {:.1} and a batch may \
                 not take it below min_diff {:.1}). Is a writer running?",
                rl.inserts,
                rl.samples,
                cfg.samples_per_insert,
                rl.error(),
                cfg.min_diff
            ),
            WaitReason::FullTable => format!(
                "full table: {} trajectories are stored unsampled, the most the table's queue holds, and each \
                 must be sampled before another goes in. Is a sampler running?",
                rl.error().max(0.0) as u64
            ),
            WaitReason::EmptyTable => {
                "empty table: it emptied while a batch was redrawn. Is a writer running?".to_owned()
            }
            WaitReason::TableLock => "the table lock.".to_owned(),
        };
        format!(
            "a {} (process {}) has waited {:.1} s on {table}: {why} A timeout bounds the wait \
             (Writer::with_timeout, SampleConfig::timeout); GEAR_WAIT_WARNING_SECS sets when this is logged",
            role.name(),
            std::process::id(),
            waited.as_secs_f64()
        )
    }

    /// The waits listed now, by every process of the table; entries left by
    /// processes that died while waiting are cleared on the way.
    pub(super) fn waiting_now(&self) -> Vec<super::Waiting> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        let now_ms = gear_cpu::sync::unix_ms();
        let mut waiting: Vec<super::Waiting> = ctl
            .waits_now()
            .filter(|w| {
                let alive = sh.lease.is_alive(w.token, ctl);
                if !alive {
                    ctl.clear_wait(w);
                }
                alive
            })
            .map(|w| super::Waiting {
                role: w.role,
                reason: w.reason,
                pid: ctl.lease_pids[gear_cpu::sync::lease_index(w.token)].load(Ordering::Relaxed),
                since: std::time::UNIX_EPOCH + Duration::from_millis(w.since_ms),
                waited: Duration::from_millis(now_ms.saturating_sub(w.since_ms)),
            })
            .collect();
        waiting.sort_by_key(|w| std::cmp::Reverse(w.waited));
        waiting
    }
}
