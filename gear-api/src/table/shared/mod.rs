//! The protocol over the shared control block: the table lock, this
//! process's strategy mirrors kept in step with the change log, repair
//! after a dead lock holder, reclamation of dead writers' slots, and waits.

mod mirrors;
mod reclaim;
mod waits;

pub(super) use waits::{LimiterWait, WaitFor};

use super::attach::read_limiter;
use super::builder::{policy, Opened};
use super::ReplayTable;
use crate::error::{Error, Result};
use crate::limiter::{RateLimiter, RateLimiterConfig};
use gear_core::{ControlBlock, ItemPattern, MemoryRegion, Sampled, Selector, SlotKey, TableRegion, Xoshiro256};
use gear_cpu::sync::{futex_wake_all, LockState, ProcessLease, TableLock, TableLockGuard};
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
    /// The key each mirror holds per slot (for rebuilds and idempotence);
    /// in a table with items, the sampler's keys are items' and
    /// `in_sampler` is indexed by item.
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
    /// Item keys and priorities of a batch being committed (reused).
    pub(super) item_keys: Vec<SlotKey>,
    pub(super) item_priorities: Vec<f64>,
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
    /// Item records per slot (0: the rows are whole trajectories).
    pub(crate) items_per_slot: u32,
    /// The items a trajectory committed without items of its own gets.
    pub(super) item_pattern: ItemPattern,
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
        let item_pattern = super::items::read_pattern(region.control())?;
        let items_per_slot = region.spec().items_per_trajectory() as u32;
        // The sampler draws items where the table has them; the remover
        // always evicts whole trajectories.
        let selectable = if items_per_slot > 0 { region.spec().item_capacity() } else { capacity };
        sampler.prepare(selectable)?;
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
            in_sampler: vec![None; selectable as usize],
            in_remover: vec![None; capacity as usize],
            applied: 0,
            rebuild_epoch: 0,
            rng: Xoshiro256::seed_from_u64(seed ^ process_salt(creator, &lease)),
            scratch: Vec::new(),
            recorded: Vec::new(),
            recorded_remover: Vec::new(),
            item_keys: Vec::new(),
            item_priorities: Vec::new(),
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
            items_per_slot,
            item_pattern,
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
        let mut l = Locked { sh: self, guard, local: self.local.write(), reap_checked: false, reaped_on_lock: 0 };
        let mut reaped = 0;
        if state == LockState::OwnerDied {
            l.repair();
            // Writers (and the holder itself) may have died with it.
            reaped += l.reap(0..self.region.spec().capacity())?;
        }
        l.sync();
        l.give_back_deferred();
        reaped += l.maybe_reap_slice()?;
        l.reaped_on_lock = reaped;
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
    /// Slots of dead processes reclaimed while this hold was taken (the
    /// repair after a dead holder, the background slice), so that
    /// `reclaim_dead` can count them as its own.
    pub(super) reaped_on_lock: u64,
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
        // A limiter with no upper bound (the default) never holds writers
        // back: batches skip its arithmetic for every row.
        if self.sh.limiter_config.max_diff == f64::INFINITY {
            return true;
        }
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
}
