//! The replay table: a [`TableRegion`] in a memory pool, the selection
//! strategies, the rate limiter, and the protocol that ties them together,
//! for threads of one process and for processes attached by name alike.
//!
//! Shared state lives in the region: slot records (gear-core's seqlock
//! protocol), and the control block with the free list, the rate limiter's
//! counters and a change log (`gear_core::control`). One robust
//! process-shared mutex guards the control block; it is held for metadata
//! only, never while trajectory bytes are copied. Selection strategies are
//! process-local mirrors kept in step through the change log, so any
//! process can select, insert and update priorities. A mirror sits behind a
//! reader-writer lock: random strategies are drawn from under the read lock
//! once the mutex has admitted and counted the batch, so sampler threads of
//! one process draw at the same time.
//!
//! Failure handling: a writer that dies mid-trajectory is detected by its
//! owner identity (pid plus start time) and its slot reclaimed: the steps it
//! published are committed as a shorter trajectory, or the slot is freed if
//! it published none. A process that dies holding the mutex is detected by
//! the mutex itself (robust), and the next locker rebuilds the shared
//! counters and free list from the slot records. A sampler that dies
//! mid-copy pins nothing (reads are optimistic); slots it was retiring are
//! freed by the same reclamation.

use crate::error::{Error, Result};
use crate::limiter::{RateLimiter, RateLimiterConfig};
use crate::sampler::{SampleConfig, Sampler};
use crate::writer::Writer;
use gear_core::{
    check_priority, target, Change, ControlBlock, LogOp, MemoryRegion, Sampled, Selector, SlotKey, SlotState,
    TableRegion, TableSpec, Xoshiro256,
};
use gear_cpu::sync::{futex_wait, futex_wake_all, LockState, ProcessId, ShmMutex, ShmMutexGuard};
use gear_sampler::{StrategyKind, StrategyParams};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a table's bytes live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PoolConfig {
    /// Process-private, page-aligned host memory (the default).
    #[default]
    Host,
    /// Named shared memory other processes attach to: a file in `/dev/shm`,
    /// or in `dir` when given.
    Shared {
        /// Name other processes attach by.
        name: String,
        /// Directory for the backing file; `/dev/shm` when `None`.
        dir: Option<PathBuf>,
    },
}

/// Draws of rows evicted between their draw and the read of their slot
/// record, before [`ReplayTable::select`] gives up on a strategy that keeps
/// returning keys the table does not hold.
const STALE_DRAW_ATTEMPTS: usize = 8;

/// Longest a waiter sleeps before re-checking the server and dead writers.
const WAIT_SLICE: Duration = Duration::from_millis(50);
/// Least time between two scans for dead writers by one process.
const REAP_INTERVAL: Duration = Duration::from_millis(500);

/// Policy words in the control block (written by the creator, read by
/// attachers).
mod policy {
    pub const SPI: usize = 0;
    pub const MIN_SIZE: usize = 1;
    pub const MIN_DIFF: usize = 2;
    pub const MAX_DIFF: usize = 3;
    pub const MAX_TIMES_SAMPLED: usize = 4;
    pub const SAMPLER_KIND: usize = 5;
    pub const REMOVER_KIND: usize = 6;
    pub const ALPHA: usize = 7;
    pub const BETA: usize = 8;
    pub const FLAGS: usize = 9;
    pub const SEED: usize = 10;
    pub const FLAG_SAMPLE_WHILE_WRITING: u64 = 1;
    pub const FLAG_UNSTRATIFIED: u64 = 2;
}

/// A strategy as the builder received it: a built-in kind other processes
/// can rebuild, or a user's instance.
enum StrategyChoice {
    Kind(StrategyKind),
    Custom(Box<dyn Selector>),
}

fn kind_code(k: StrategyKind) -> u64 {
    StrategyKind::ALL.iter().position(|x| *x == k).map_or(0, |i| i as u64 + 1)
}

fn kind_from_code(c: u64) -> Option<StrategyKind> {
    c.checked_sub(1).and_then(|i| StrategyKind::ALL.get(i as usize)).copied()
}

/// Builds a [`ReplayTable`].
pub struct TableBuilder {
    spec: TableSpec,
    pool: PoolConfig,
    sampler: StrategyChoice,
    remover: StrategyChoice,
    params: StrategyParams,
    limiter: RateLimiterConfig,
    max_times_sampled: Option<u64>,
    sample_while_writing: bool,
    seed: u64,
    collector_threads: Option<usize>,
}

impl TableBuilder {
    /// Where the bytes live (default: process-private host memory).
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }

    /// Shorthand for [`PoolConfig::Shared`] in `/dev/shm`. A table of the
    /// same name left behind by a creator that died is replaced; any other
    /// existing file of that name makes [`TableBuilder::build`] fail.
    pub fn shared_memory(self, name: impl Into<String>) -> Self {
        self.pool(PoolConfig::Shared { name: name.into(), dir: None })
    }

    /// A built-in sampling strategy (default: uniform). Processes that
    /// attach rebuild the same strategy from the table.
    pub fn sampler_kind(mut self, kind: StrategyKind, params: StrategyParams) -> Self {
        self.sampler = StrategyChoice::Kind(kind);
        self.params = params;
        self
    }

    /// A strategy of your own for sampling. Processes that attach must pass
    /// an equivalent one ([`AttachOptions::sampler`]).
    pub fn sampler(mut self, selector: impl Selector + 'static) -> Self {
        self.sampler = StrategyChoice::Custom(Box::new(selector));
        self
    }

    /// A built-in eviction strategy (default: FIFO, the oldest first).
    pub fn remover_kind(mut self, kind: StrategyKind) -> Self {
        self.remover = StrategyChoice::Kind(kind);
        self
    }

    /// An eviction strategy of your own.
    pub fn remover(mut self, selector: impl Selector + 'static) -> Self {
        self.remover = StrategyChoice::Custom(Box::new(selector));
        self
    }

    /// Flow control (default: sample once one item exists; never block
    /// writers).
    pub fn rate_limiter(mut self, config: RateLimiterConfig) -> Self {
        self.limiter = config;
        self
    }

    /// A queue of `size` trajectories (Reverb's `Queue`): FIFO selection,
    /// each trajectory sampled exactly once, writers wait while `size`
    /// unsampled trajectories are stored.
    pub fn queue(self, size: u64) -> Result<Self> {
        self.ordered(size, StrategyKind::Fifo)
    }

    /// A stack of `size` trajectories: like [`TableBuilder::queue`] but the
    /// newest trajectory is sampled first.
    pub fn stack(self, size: u64) -> Result<Self> {
        self.ordered(size, StrategyKind::Lifo)
    }

    fn ordered(self, size: u64, kind: StrategyKind) -> Result<Self> {
        if size > self.spec.capacity() {
            return Err(Error::Config(format!(
                "a queue of {size} needs at least {size} slots, the table has {}",
                self.spec.capacity()
            )));
        }
        let params = self.params;
        Ok(self
            .sampler_kind(kind, params)
            .remover_kind(StrategyKind::Fifo)
            .max_times_sampled(1)
            .rate_limiter(RateLimiterConfig::queue(size)?))
    }

    /// Remove a trajectory once it has been sampled this many times.
    pub fn max_times_sampled(mut self, n: u64) -> Self {
        self.max_times_sampled = Some(n);
        self
    }

    /// Let samplers draw trajectories that are still being written (only
    /// their published steps are read). Default: only committed ones.
    pub fn sample_while_writing(mut self, yes: bool) -> Self {
        self.sample_while_writing = yes;
        self
    }

    /// Seed of the table's random streams (default 0; each process mixes
    /// in its own id).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Threads the CPU collector may use for one batch (default: all cores).
    pub fn collector_threads(mut self, n: usize) -> Self {
        self.collector_threads = Some(n);
        self
    }

    /// Allocates the pool, lays the table out and returns it.
    pub fn build(self) -> Result<ReplayTable> {
        let limiter = self.limiter.validated()?;
        if self.max_times_sampled == Some(0) {
            return Err(Error::Config("max_times_sampled must be at least 1".into()));
        }
        let region_layout = gear_core::RegionLayout::for_spec(&self.spec)?;
        let pool: Box<dyn MemoryRegion> = match &self.pool {
            PoolConfig::Host => Box::new(gear_cpu::HostPool::new(region_layout.total_bytes)?),
            PoolConfig::Shared { name, dir } => {
                let mut opts = gear_cpu::ShmOptions::new();
                if let Some(d) = dir {
                    opts = opts.dir(d.clone());
                }
                match gear_cpu::ShmPool::create(name, region_layout.total_bytes, opts.clone()) {
                    Err(gear_cpu::Error::Exists { .. }) if stale_table(name, dir.as_deref()) => {
                        // Its creator died without removing it: replace it.
                        gear_cpu::ShmPool::unlink(name, dir.as_deref())?;
                        Box::new(gear_cpu::ShmPool::create(name, region_layout.total_bytes, opts)?)
                    }
                    other => Box::new(other?),
                }
            }
        };
        let region = TableRegion::create(pool, &self.spec)?;
        let ctl = region.control();
        // SAFETY: the mutex bytes are inside the fresh region, 64-byte
        // aligned, unused so far, and live as long as `region`, which the
        // returned table owns together with the mutex handle.
        let mutex = unsafe { ShmMutex::init(ctl.mutex_ptr()) }?;
        let capacity = self.spec.capacity();
        for (i, w) in region.free_list().iter().enumerate() {
            // Popped from the end: slot 0 is used first.
            w.store((capacity - 1 - i as u64) as u32, Ordering::Relaxed);
        }
        ctl.free_len.store(capacity, Ordering::Relaxed);
        ctl.next_seq.store(1, Ordering::Relaxed);
        ctl.server.store(ProcessId::current().0, Ordering::Relaxed);
        let p = &ctl.policy;
        p[policy::SPI].store(limiter.samples_per_insert.to_bits(), Ordering::Relaxed);
        p[policy::MIN_SIZE].store(limiter.min_size_to_sample, Ordering::Relaxed);
        p[policy::MIN_DIFF].store(limiter.min_diff.to_bits(), Ordering::Relaxed);
        p[policy::MAX_DIFF].store(limiter.max_diff.to_bits(), Ordering::Relaxed);
        p[policy::MAX_TIMES_SAMPLED].store(self.max_times_sampled.unwrap_or(0), Ordering::Relaxed);
        p[policy::ALPHA].store(self.params.alpha.to_bits(), Ordering::Relaxed);
        p[policy::BETA].store(self.params.beta.to_bits(), Ordering::Relaxed);
        let mut flags = 0;
        if self.sample_while_writing {
            flags |= policy::FLAG_SAMPLE_WHILE_WRITING;
        }
        if !self.params.stratified {
            flags |= policy::FLAG_UNSTRATIFIED;
        }
        p[policy::FLAGS].store(flags, Ordering::Relaxed);
        p[policy::SEED].store(self.seed, Ordering::Relaxed);
        let code = |choice: StrategyChoice, word: usize| -> Result<Box<dyn Selector>> {
            match choice {
                StrategyChoice::Kind(k) => {
                    p[word].store(kind_code(k), Ordering::Relaxed);
                    Ok(gear_sampler::build(k, &self.params)?)
                }
                StrategyChoice::Custom(s) => Ok(s),
            }
        };
        let sampler = code(self.sampler, policy::SAMPLER_KIND)?;
        let remover = code(self.remover, policy::REMOVER_KIND)?;
        Shared::open_table(region, mutex, sampler, remover, self.collector_threads, true)
    }
}

/// Whether `name` holds a GEAR table whose creating process is dead (left
/// behind by a crash). Anything else, including a file that is not a table,
/// is not stale: it is not ours to remove.
fn stale_table(name: &str, dir: Option<&std::path::Path>) -> bool {
    let Ok(pool) = gear_cpu::ShmPool::open_with(name, dir, false) else { return false };
    let Ok(region) = TableRegion::open(pool, None) else { return false };
    !ProcessId(region.control().server.load(Ordering::Relaxed)).is_alive()
}

/// How to attach to a table another process created.
#[derive(Default)]
pub struct AttachOptions {
    /// Directory of the backing file (`/dev/shm` when `None`).
    pub dir: Option<PathBuf>,
    /// The spec the table must have.
    pub expected: Option<TableSpec>,
    /// The sampling strategy, required when the creator used a custom one.
    pub sampler: Option<Box<dyn Selector>>,
    /// The eviction strategy, required when the creator used a custom one.
    pub remover: Option<Box<dyn Selector>>,
    /// Threads for the CPU collector.
    pub collector_threads: Option<usize>,
}

impl std::fmt::Debug for AttachOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachOptions").field("dir", &self.dir).field("expected", &self.expected).finish()
    }
}

/// State one process keeps: strategy mirrors in step with the change log.
struct Local {
    sampler: Box<dyn Selector>,
    remover: Box<dyn Selector>,
    /// The key each mirror holds per slot (for rebuilds and idempotence).
    in_sampler: Vec<Option<SlotKey>>,
    in_remover: Vec<Option<SlotKey>>,
    /// Log entries applied so far.
    applied: u64,
    /// The `rebuild_epoch` the mirrors were built for.
    rebuild_epoch: u64,
    /// The remover's random stream (samplers bring their own).
    rng: Xoshiro256,
    scratch: Vec<Sampled>,
}

impl Local {
    /// Whether the mirrors have applied every change in the log.
    fn in_step_with(&self, ctl: &ControlBlock) -> bool {
        self.applied == ctl.log_head.load(Ordering::Relaxed)
            && self.rebuild_epoch == ctl.rebuild_epoch.load(Ordering::Relaxed)
    }
}

/// What one sampler brings to [`ReplayTable::select`]: its own random
/// stream (so samplers on several threads draw independently, and a seeded
/// table draws the same rows run after run) and its reusable buffers.
#[derive(Debug)]
pub(crate) struct Selection {
    rng: Xoshiro256,
    drawn: Vec<Sampled>,
    /// Drawn keys whose rows were evicted before their record was read.
    stale: Vec<SlotKey>,
    /// Rows taken out by `max_times_sampled`, to be freed after the copy.
    pub(crate) retiring: Vec<SlotKey>,
}

pub(crate) struct Shared {
    pub(crate) region: TableRegion<Box<dyn MemoryRegion>>,
    mutex: ShmMutex,
    /// Written only under `mutex`; read without it by samplers drawing
    /// through [`Selector::sample_shared`].
    local: RwLock<Local>,
    /// Whether the sampler draws through a shared reference.
    shared_draws: bool,
    /// Samplers made on this table by this process (each gets its own
    /// random stream).
    samplers_made: AtomicU64,
    pub(crate) collector: gear_cpu::CpuCollector,
    me: ProcessId,
    creator: bool,
    max_times_sampled: Option<u64>,
    sample_while_writing: bool,
    /// Milliseconds since `epoch_start` of this process's last reap scan.
    last_reap_ms: AtomicU64,
    epoch_start: Instant,
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
    fn open_table(
        region: TableRegion<Box<dyn MemoryRegion>>,
        mutex: ShmMutex,
        mut sampler: Box<dyn Selector>,
        mut remover: Box<dyn Selector>,
        collector_threads: Option<usize>,
        creator: bool,
    ) -> Result<ReplayTable> {
        let capacity = region.spec().capacity();
        sampler.prepare(capacity)?;
        remover.prepare(capacity)?;
        // A draw of zero rows answers whether the strategy draws through a
        // shared reference at all (the trait asks it to answer alike for
        // every call).
        let shared_draws = sampler.sample_shared(0, &mut Xoshiro256::seed_from_u64(0), &mut Vec::new()).is_some();
        let p = &region.control().policy;
        let seed = p[policy::SEED].load(Ordering::Relaxed);
        let me = ProcessId::current();
        let local = Local {
            sampler,
            remover,
            in_sampler: vec![None; capacity as usize],
            in_remover: vec![None; capacity as usize],
            applied: 0,
            rebuild_epoch: 0,
            rng: Xoshiro256::seed_from_u64(seed ^ if creator { 0 } else { me.0.rotate_left(17) }),
            scratch: Vec::new(),
        };
        let collector = match collector_threads {
            Some(n) => gear_cpu::CpuCollector::with_threads(n),
            None => gear_cpu::CpuCollector::new(),
        };
        let max = p[policy::MAX_TIMES_SAMPLED].load(Ordering::Relaxed);
        let flags = p[policy::FLAGS].load(Ordering::Relaxed);
        let shared = Shared {
            region,
            mutex,
            local: RwLock::new(local),
            shared_draws,
            samplers_made: AtomicU64::new(0),
            collector,
            me,
            creator,
            max_times_sampled: (max > 0).then_some(max),
            sample_while_writing: flags & policy::FLAG_SAMPLE_WHILE_WRITING != 0,
            last_reap_ms: AtomicU64::new(0),
            epoch_start: Instant::now(),
        };
        if !creator {
            // Start from the slot records, then follow the log.
            let mut l = shared.lock()?;
            l.rebuild();
        }
        Ok(ReplayTable { shared: Arc::new(shared) })
    }

    fn lock(&self) -> Result<Locked<'_>> {
        let (guard, state) = self.mutex.lock()?;
        Ok(self.write_in_step(guard, state))
    }

    /// With the mutex held: the write lock on the mirrors, after repairing
    /// what a dead lock holder left and applying the log.
    fn write_in_step<'a>(&'a self, guard: ShmMutexGuard<'a>, state: LockState) -> Locked<'a> {
        let mut l = Locked { sh: self, guard, local: self.local.write() };
        if state == LockState::OwnerDied {
            l.repair();
        }
        l.sync();
        l
    }

    /// The shared mutex and a read view of mirrors in step with the log.
    /// Threads of this process holding read views draw at the same time;
    /// the write lock is taken only when there are changes to apply.
    fn lock_read(&self) -> Result<(ShmMutexGuard<'_>, RwLockReadGuard<'_, Local>)> {
        let (guard, state) = self.mutex.lock()?;
        if state != LockState::OwnerDied {
            let local = self.local.read();
            if local.in_step_with(self.region.control()) {
                return Ok((guard, local));
            }
        }
        Ok(self.write_in_step(guard, state).downgrade())
    }

    fn ctl(&self) -> &ControlBlock {
        self.region.control()
    }

    fn limiter(&self) -> RateLimiter {
        let ctl = self.ctl();
        let p = &ctl.policy;
        let mut rl = RateLimiter::new(RateLimiterConfig {
            samples_per_insert: f64::from_bits(p[policy::SPI].load(Ordering::Relaxed)),
            min_size_to_sample: p[policy::MIN_SIZE].load(Ordering::Relaxed),
            min_diff: f64::from_bits(p[policy::MIN_DIFF].load(Ordering::Relaxed)),
            max_diff: f64::from_bits(p[policy::MAX_DIFF].load(Ordering::Relaxed)),
        });
        rl.inserts = ctl.inserts.load(Ordering::Relaxed);
        rl.samples = ctl.samples.load(Ordering::Relaxed);
        rl
    }

    fn can_sample(&self, n: u64) -> bool {
        self.limiter().can_sample(self.ctl().size.load(Ordering::Relaxed), n)
    }

    /// Tells waiters something changed (call holding the mutex).
    fn wake(&self) {
        if self.ctl().bump_epoch() {
            futex_wake_all(&self.ctl().epoch);
        }
    }
}

/// The shared mutex and this process's mirrors, held together.
struct Locked<'a> {
    sh: &'a Shared,
    guard: ShmMutexGuard<'a>,
    local: RwLockWriteGuard<'a, Local>,
}

fn add(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed) + v, Ordering::Relaxed);
}

fn sub(a: &AtomicU64, v: u64) {
    a.store(a.load(Ordering::Relaxed).saturating_sub(v), Ordering::Relaxed);
}

impl<'a> Locked<'a> {
    /// Keeps the mutex and turns the write lock on the mirrors into a read
    /// lock, letting this process's other threads draw.
    fn downgrade(self) -> (ShmMutexGuard<'a>, RwLockReadGuard<'a, Local>) {
        (self.guard, RwLockWriteGuard::downgrade(self.local))
    }

    fn ctl(&self) -> &ControlBlock {
        self.sh.ctl()
    }

    fn limiter(&self) -> RateLimiter {
        self.sh.limiter()
    }

    fn can_insert(&self) -> bool {
        let ctl = self.ctl();
        let pending = ctl.pending_inserts.load(Ordering::Relaxed);
        let mut rl = self.limiter();
        rl.inserts += pending;
        rl.can_insert(ctl.size.load(Ordering::Relaxed) + pending)
    }

    fn can_sample(&self, n: u64) -> bool {
        self.sh.can_sample(n)
    }

    /// Tells waiters something changed.
    fn wake(&self) {
        self.sh.wake()
    }

    /// Applies a change to this process's mirrors.
    fn apply(&mut self, c: Change) -> gear_core::Result<()> {
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
    fn record(&mut self, c: Change) -> gear_core::Result<()> {
        self.apply(c)?;
        self.append_log(c);
        Ok(())
    }

    /// Appends a change this process has already applied to its mirrors.
    fn append_log(&mut self, c: Change) {
        let ctl = self.sh.region.control();
        let seq = ctl.log_head.load(Ordering::Relaxed);
        let log = self.sh.region.log();
        log[(seq % log.len() as u64) as usize].store(seq, c);
        ctl.log_head.store(seq + 1, Ordering::Relaxed);
        self.local.applied = seq + 1;
    }

    /// Inserts `key` into this process's sampler (which chooses the
    /// priority when `priority` is `None`) and, with `remover`, into the
    /// remover with the same priority; logs the insert. Returns the priority.
    fn insert_new(&mut self, key: SlotKey, priority: Option<f64>, remover: bool) -> Result<f64> {
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
    fn sync(&mut self) {
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
                Some(Ok(())) => self.local.applied = seq + 1,
                _ => return self.rebuild(),
            }
        }
    }

    /// Rebuilds the mirrors from the slot records.
    fn rebuild(&mut self) {
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
    fn repair(&mut self) {
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

    fn pop_free(&mut self) -> Option<u32> {
        let ctl = self.sh.region.control();
        let n = ctl.free_len.load(Ordering::Relaxed);
        let n = n.min(self.sh.region.spec().capacity());
        if n == 0 {
            return None;
        }
        ctl.free_len.store(n - 1, Ordering::Relaxed);
        Some(self.sh.region.free_list()[(n - 1) as usize].load(Ordering::Relaxed))
    }

    fn push_free(&mut self, slot: u32) {
        let ctl = self.sh.region.control();
        let n = ctl.free_len.load(Ordering::Relaxed);
        if let Some(w) = self.sh.region.free_list().get(n as usize) {
            w.store(slot, Ordering::Relaxed);
            ctl.free_len.store(n + 1, Ordering::Relaxed);
        }
    }

    /// Reclaims slots of dead writers and of dead samplers' retirements.
    /// Returns how many slots changed.
    fn reap(&mut self) -> Result<u64> {
        let sh = self.sh;
        let mut alive: Vec<(u64, bool)> = Vec::new();
        let mut is_alive = |owner: u64| -> bool {
            if let Some(&(_, a)) = alive.iter().find(|(o, _)| *o == owner) {
                return a;
            }
            let a = owner == 0 || ProcessId(owner).is_alive();
            alive.push((owner, a));
            a
        };
        let mut changed = 0;
        for s in 0..sh.region.spec().capacity() as u32 {
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
    fn reclaim_writer(&mut self, key: SlotKey, len: u64, priority: f64) -> Result<()> {
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

    fn maybe_reap(&mut self) -> Result<()> {
        let sh = self.sh;
        let now = sh.epoch_start.elapsed().as_millis() as u64;
        let last = sh.last_reap_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < REAP_INTERVAL.as_millis() as u64 {
            return Ok(());
        }
        sh.last_reap_ms.store(now.max(1), Ordering::Relaxed);
        self.reap().map(|_| ())
    }
}

/// A snapshot of a table's counters.
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    /// Trajectories that can be sampled.
    pub size: u64,
    /// Slots.
    pub capacity: u64,
    /// Trajectories committed since creation.
    pub inserts: u64,
    /// Rows sampled since creation.
    pub samples: u64,
    /// Trajectories evicted to make room.
    pub evictions: u64,
    /// Trajectories removed after reaching `max_times_sampled`.
    pub retired: u64,
    /// Trajectories of dead writers reclaimed.
    pub reclaimed: u64,
    /// The rate limiter's `inserts * spi - samples`.
    pub limiter_error: f64,
    /// The rate limiter's configuration.
    pub limiter: RateLimiterConfig,
    /// Total time writers waited on the rate limiter.
    pub insert_wait: Duration,
    /// Total time samplers waited on the rate limiter (or an empty table).
    pub sample_wait: Duration,
    /// Bytes of step data written.
    pub bytes_written: u64,
    /// Bytes copied into batches.
    pub bytes_gathered: u64,
    /// Slots by state, from a scan of the slot records.
    pub slots: SlotCounts,
}

/// How many slots are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// Holding nothing.
    pub free: u64,
    /// Being written.
    pub writing: u64,
    /// Committed.
    pub committed: u64,
    /// Being retired after their last sample.
    pub retiring: u64,
}

/// A replay table. Cheap to clone: clones share one table.
#[derive(Clone)]
pub struct ReplayTable {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for ReplayTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayTable").field("region", &self.shared.region).finish()
    }
}

impl ReplayTable {
    /// Starts building a table for `spec`.
    pub fn builder(spec: TableSpec) -> TableBuilder {
        TableBuilder {
            spec,
            pool: PoolConfig::Host,
            sampler: StrategyChoice::Kind(StrategyKind::Uniform),
            remover: StrategyChoice::Kind(StrategyKind::Fifo),
            params: StrategyParams::default(),
            limiter: RateLimiterConfig::default(),
            max_times_sampled: None,
            sample_while_writing: false,
            seed: 0,
            collector_threads: None,
        }
    }

    /// Attaches to the shared table `name` (in `/dev/shm` unless
    /// `options.dir`) that another process created. The attached handle
    /// writes, samples and updates priorities like the creator's.
    pub fn attach(name: &str, options: AttachOptions) -> Result<ReplayTable> {
        let pool: Box<dyn MemoryRegion> = Box::new(gear_cpu::ShmPool::open(name, options.dir.as_deref())?);
        let region = TableRegion::open(pool, options.expected.as_ref()).map_err(|e| match e {
            gear_core::Error::Decode(m) => gear_core::Error::Decode(format!("shared memory `{name}`: {m}")),
            other => other,
        })?;
        let ctl = region.control();
        if ctl.closed.load(Ordering::Acquire) != 0 {
            return Err(Error::Closed);
        }
        if !ProcessId(ctl.server.load(Ordering::Relaxed)).is_alive() {
            return Err(Error::ServerGone { name: name.to_owned() });
        }
        let p = &ctl.policy;
        let flags = p[policy::FLAGS].load(Ordering::Relaxed);
        let params = StrategyParams {
            alpha: f64::from_bits(p[policy::ALPHA].load(Ordering::Relaxed)),
            beta: f64::from_bits(p[policy::BETA].load(Ordering::Relaxed)),
            stratified: flags & policy::FLAG_UNSTRATIFIED == 0,
        };
        let strategy = |given: Option<Box<dyn Selector>>, word: usize, role: &str| -> Result<Box<dyn Selector>> {
            if let Some(s) = given {
                return Ok(s);
            }
            match kind_from_code(p[word].load(Ordering::Relaxed)) {
                Some(k) => Ok(gear_sampler::build(k, &params)?),
                None => Err(Error::Config(format!(
                    "table `{name}` uses a custom {role} strategy; pass an equivalent one in AttachOptions"
                ))),
            }
        };
        let sampler = strategy(options.sampler, policy::SAMPLER_KIND, "sampling")?;
        let remover = strategy(options.remover, policy::REMOVER_KIND, "eviction")?;
        // SAFETY: the creator initialised the mutex before marking the
        // region ready (TableRegion::open checked `ready`), and the mutex
        // lives as long as `region`, which the table owns with it.
        let mutex = unsafe { ShmMutex::from_raw(ctl.mutex_ptr()) };
        Shared::open_table(region, mutex, sampler, remover, options.collector_threads, false)
    }

    /// The table's spec.
    pub fn spec(&self) -> &TableSpec {
        self.shared.region.spec()
    }

    /// The seed the table was built with.
    pub(crate) fn seed(&self) -> u64 {
        self.shared.region.control().policy[policy::SEED].load(Ordering::Relaxed)
    }

    /// The memory region's name, for shared tables.
    pub fn name(&self) -> Option<&str> {
        self.shared.region.region().name()
    }

    /// A writer for actors; clone or create one per thread.
    pub fn writer(&self) -> Writer {
        Writer::new(self.clone())
    }

    /// A sampler for trainers, with reusable batch buffers.
    pub fn sampler(&self, config: SampleConfig) -> Result<Sampler> {
        Sampler::new(self.clone(), config)
    }

    /// Counters and rate-limiter state.
    pub fn info(&self) -> Result<TableInfo> {
        let l = self.shared.lock()?;
        let ctl = l.ctl();
        let rl = l.limiter();
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        let mut slots = SlotCounts::default();
        for (s, rec) in self.shared.region.slots().iter().enumerate() {
            match rec.key_state(s as u32).1 {
                SlotState::Free => slots.free += 1,
                SlotState::Writing => slots.writing += 1,
                SlotState::Committed => slots.committed += 1,
                SlotState::Retiring => slots.retiring += 1,
            }
        }
        Ok(TableInfo {
            slots,
            size: ctl.size.load(Ordering::Relaxed),
            capacity: self.spec().capacity(),
            inserts: rl.inserts,
            samples: rl.samples,
            evictions: ctl.evictions.load(Ordering::Relaxed),
            retired: ctl.retired.load(Ordering::Relaxed),
            reclaimed: ctl.reclaimed.load(Ordering::Relaxed),
            limiter_error: rl.error(),
            limiter: rl.config,
            insert_wait: ns(&ctl.insert_wait_ns),
            sample_wait: ns(&ctl.sample_wait_ns),
            bytes_written: ctl.bytes_written.load(Ordering::Relaxed),
            bytes_gathered: ctl.bytes_gathered.load(Ordering::Relaxed),
        })
    }

    /// Closes the table for every process: blocked writers and samplers
    /// wake with [`Error::Closed`], later waits fail at once. Data stays
    /// readable.
    pub fn close(&self) {
        let ctl = self.shared.region.control();
        ctl.closed.store(1, Ordering::Release);
        ctl.epoch.fetch_add(1, Ordering::Release);
        futex_wake_all(&ctl.epoch);
    }

    /// Reclaims the slots of writers (and samplers) that died: a dead
    /// writer's published steps are committed as a shorter trajectory, or
    /// its slot freed if it published none. Runs on its own from time to
    /// time; call it to force a scan. Returns the slots reclaimed.
    pub fn reclaim_dead(&self) -> Result<u64> {
        self.shared.lock()?.reap()
    }

    /// Updates priorities by key; keys whose trajectory was evicted or
    /// replaced are ignored (late updates are normal in prioritized replay).
    /// Every priority is checked first: one bad value refuses the whole
    /// batch and changes nothing. Duplicate keys: the last one wins.
    /// Returns how many updates were applied.
    pub fn update_priorities(&self, updates: &[(SlotKey, f64)]) -> Result<usize> {
        for &(_, p) in updates {
            check_priority(p)?;
        }
        let mut l = self.shared.lock()?;
        let mut applied = 0;
        for &(key, p) in updates {
            let Some(slot) = l.local.in_sampler.get(key.slot as usize) else { continue };
            let in_remover = l.local.in_remover[key.slot as usize] == Some(key);
            if *slot != Some(key) {
                continue;
            }
            let target = if in_remover { target::BOTH } else { target::SAMPLER };
            l.record(Change { key, op: LogOp::Update, target, priority: p })?;
            self.shared.region.slots()[key.slot as usize].set_priority(key, p);
            applied += 1;
        }
        Ok(applied)
    }

    /// Waits until `ready` holds, the table closes, the server dies or the
    /// deadline passes; adds the time waited to `waited`.
    fn wait_until<'a>(
        &'a self,
        mut l: Locked<'a>,
        timeout: Option<Duration>,
        op: &'static str,
        ready: impl Fn(&Locked<'_>) -> bool,
        waited: fn(&ControlBlock) -> &AtomicU64,
    ) -> Result<Locked<'a>> {
        let sh = &*self.shared;
        let ctl = sh.region.control();
        if ctl.closed.load(Ordering::Acquire) == 0 && ready(&l) {
            return Ok(l);
        }
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let result = loop {
            if ctl.closed.load(Ordering::Acquire) != 0 {
                break Err(Error::Closed);
            }
            if ready(&l) {
                break Ok(());
            }
            if !sh.creator && !ProcessId(ctl.server.load(Ordering::Relaxed)).is_alive() {
                break Err(Error::ServerGone { name: self.name().unwrap_or("?").to_owned() });
            }
            l.maybe_reap()?;
            if ready(&l) {
                break Ok(());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break Err(Error::Timeout { op, waited: start.elapsed() });
            }
            let slice = deadline.map_or(WAIT_SLICE, |d| (d - now).min(WAIT_SLICE));
            let seen = ctl.epoch.load(Ordering::Acquire);
            ctl.waiters.fetch_add(1, Ordering::AcqRel);
            drop(l);
            futex_wait(&ctl.epoch, seen, Some(slice));
            ctl.waiters.fetch_sub(1, Ordering::AcqRel);
            l = sh.lock()?;
        };
        let ns = start.elapsed().as_nanos() as u64;
        if ns > 1000 {
            waited(ctl).fetch_add(ns, Ordering::Relaxed);
        }
        result.map(|()| l)
    }

    /// Admits one writer (rate limiter) and hands it a slot in `Writing`
    /// state, evicting with the remover when no slot is free.
    pub(crate) fn begin_slot(&self, priority: f64, timeout: Option<Duration>) -> Result<SlotKey> {
        let l = self.shared.lock()?;
        let mut l = self.wait_until(l, timeout, "insert (rate limiter)", |l| l.can_insert(), |c| &c.insert_wait_ns)?;
        self.take_slot(&mut l, priority)
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
        let l = self.shared.lock()?;
        let mut l = self.wait_until(l, timeout, "insert (rate limiter)", |l| l.can_insert(), |c| &c.insert_wait_ns)?;
        let mut keys = Vec::with_capacity(count);
        keys.push(self.take_slot(&mut l, priority(0))?);
        for i in 1..count {
            let ctl = l.sh.region.control();
            let room = ctl.free_len.load(Ordering::Relaxed) > 0 || !l.local.remover.is_empty();
            // Without room, the next slot must come from this batch's own
            // rows once they commit: stop here and let the caller commit.
            if ctl.closed.load(Ordering::Acquire) != 0 || !l.can_insert() || !room {
                break;
            }
            match self.take_slot(&mut l, priority(i)) {
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

    /// Hands out a slot in `Writing` state to a writer the rate limiter
    /// admitted, evicting with the remover when no slot is free.
    fn take_slot(&self, l: &mut Locked<'_>, priority: f64) -> Result<SlotKey> {
        let slot = match l.pop_free() {
            Some(slot) => slot,
            None => match self.evict_one(l)? {
                Some(slot) => slot,
                None => {
                    // Nothing committed to evict: maybe dead writers hold slots.
                    l.reap()?;
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
        let rec = &self.shared.region.slots()[slot as usize];
        let key = match rec.begin_write(slot, self.shared.me.0, seq, priority) {
            Ok(key) => key,
            Err(e) => {
                l.push_free(slot);
                return Err(e.into());
            }
        };
        ctl.next_seq.store(seq + 1, Ordering::Relaxed);
        add(&ctl.pending_inserts, 1);
        Ok(key)
    }

    fn evict_one(&self, l: &mut Locked<'_>) -> Result<Option<u32>> {
        if l.local.remover.is_empty() {
            return Ok(None);
        }
        let Local { remover, rng, scratch, .. } = &mut *l.local;
        scratch.clear();
        remover.sample(1, rng, scratch)?;
        let victim = scratch[0].key;
        let in_sampler = l.local.in_sampler[victim.slot as usize] == Some(victim);
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
        let mut l = self.shared.lock()?;
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
    /// the slot is given back, so nothing is left half-inserted.
    pub(crate) fn commit_slot(&self, key: SlotKey, priority: Option<f64>) -> Result<()> {
        let mut l = self.shared.lock()?;
        let result = self.commit_locked(&mut l, key, priority);
        l.wake();
        result
    }

    /// [`ReplayTable::commit_slot`] for many trajectories under one lock,
    /// in order. At the first that fails, it and every later one are given
    /// back and the error is returned: what precedes it stays committed.
    pub(crate) fn commit_slots(&self, keys: &[SlotKey], priorities: Option<&[f64]>) -> Result<()> {
        let mut l = match self.shared.lock() {
            Ok(l) => l,
            Err(e) => {
                for &key in keys {
                    self.abandon_slot(key);
                }
                return Err(e);
            }
        };
        let mut result = Ok(());
        for (i, &key) in keys.iter().enumerate() {
            if let Err(e) = self.commit_locked(&mut l, key, priorities.map(|p| p[i])) {
                for &later in &keys[i + 1..] {
                    self.abandon_locked(&mut l, later);
                }
                result = Err(e);
                break;
            }
        }
        l.wake();
        result
    }

    /// Commits one trajectory under the lock; on an error gives its slot
    /// back. The caller wakes waiters.
    fn commit_locked(&self, l: &mut Locked<'_>, key: SlotKey, priority: Option<f64>) -> Result<()> {
        let ctl = self.shared.region.control();
        let rec = self.shared.region.slot(key.slot)?;
        sub(&ctl.pending_inserts, 1);
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
    pub(crate) fn abandon_slot(&self, key: SlotKey) {
        let Ok(mut l) = self.shared.lock() else { return };
        self.abandon_locked(&mut l, key);
        l.wake();
    }

    /// [`ReplayTable::abandon_slot`] under the lock; the caller wakes
    /// waiters.
    fn abandon_locked(&self, l: &mut Locked<'_>, key: SlotKey) {
        let ctl = self.shared.region.control();
        if l.local.in_sampler.get(key.slot as usize) == Some(&Some(key)) {
            let _ = l.record(Change { key, op: LogOp::Remove, target: target::SAMPLER, priority: 0.0 });
            sub(&ctl.size, 1);
        }
        if let Ok(rec) = self.shared.region.slot(key.slot) {
            if rec.free(key).is_ok() {
                l.push_free(key.slot);
                sub(&ctl.pending_inserts, 1);
            }
        }
    }

    /// The table's `max_times_sampled`, if set.
    pub(crate) fn max_times_sampled(&self) -> Option<u64> {
        self.shared.max_times_sampled
    }

    /// A sampler's random stream and buffers for [`ReplayTable::select`]:
    /// each sampler of a seeded table gets its own stream, the same one in
    /// every run.
    pub(crate) fn selection(&self) -> Selection {
        let sh = &*self.shared;
        let n = sh.samplers_made.fetch_add(1, Ordering::Relaxed);
        let process = if sh.creator { 0 } else { sh.me.0.rotate_left(17) };
        Selection {
            rng: Xoshiro256::seed_from_u64(self.seed() ^ process ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            drawn: Vec::new(),
            stale: Vec::new(),
            retiring: Vec::new(),
        }
    }

    /// Refuses a batch the rate limiter can never admit.
    fn check_batch(&self, n: usize) -> Result<()> {
        let cfg = self.shared.limiter().config;
        if (n as f64) > cfg.max_diff - cfg.min_diff {
            return Err(Error::Config(format!(
                "a batch of {n} can never be sampled: the rate limiter allows at most {} samples ahead",
                cfg.max_diff - cfg.min_diff
            )));
        }
        Ok(())
    }

    /// Waits (with `l` released meanwhile) until `n` rows may be drawn:
    /// the rate limiter admits them when `count_against_limiter`, else the
    /// sampler holds something.
    fn admit<'a>(
        &'a self,
        l: Locked<'a>,
        n: usize,
        timeout: Option<Duration>,
        count_against_limiter: bool,
    ) -> Result<Locked<'a>> {
        if count_against_limiter {
            self.check_batch(n)?;
            self.wait_until(
                l,
                timeout,
                "sample (empty table or rate limiter)",
                |l| l.can_sample(n as u64),
                |c| &c.sample_wait_ns,
            )
        } else if l.local.sampler.is_empty() {
            Err(Error::Core(gear_core::Error::Empty("table holds no trajectory".into())))
        } else {
            Ok(l)
        }
    }

    /// Waits for the rate limiter, draws `n` rows and appends to `out`, for
    /// each, its key, probability, weight and published length. Rows that
    /// reached `max_times_sampled` are taken out of the strategies and
    /// listed in `sel.retiring`; the caller frees them after copying.
    pub(crate) fn select(
        &self,
        n: usize,
        timeout: Option<Duration>,
        count_against_limiter: bool,
        sel: &mut Selection,
        out: &mut Vec<(Sampled, u64)>,
    ) -> Result<()> {
        let sh = &*self.shared;
        if sh.shared_draws && sh.max_times_sampled.is_none() {
            return self.select_shared(n, timeout, count_against_limiter, sel, out);
        }
        let mut l = self.admit(sh.lock()?, n, timeout, count_against_limiter)?;
        sel.drawn.clear();
        l.local.sampler.sample(n, &mut sel.rng, &mut sel.drawn)?;
        prefetch_records(sh, &sel.drawn);
        let ctl = sh.region.control();
        for s in &sel.drawn {
            let rec = &sh.region.slots()[s.key.slot as usize];
            let Some(len) = rec.read_begin(s.key) else {
                return Err(not_stored(l.local.sampler.name(), s.key));
            };
            out.push((*s, len));
            let times = rec.add_sampled();
            if let Some(max) = sh.max_times_sampled {
                if times >= max && !sel.retiring.contains(&s.key) && rec.retire(s.key, sh.me.0).is_ok() {
                    l.record(Change { key: s.key, op: LogOp::Remove, target: target::BOTH, priority: 0.0 })?;
                    sub(&ctl.size, 1);
                    sel.retiring.push(s.key);
                }
            }
        }
        if count_against_limiter {
            add(&ctl.samples, n as u64);
        }
        l.wake();
        Ok(())
    }

    /// [`ReplayTable::select`] for strategies that draw through a shared
    /// reference, without `max_times_sampled`: the mutex is held only to
    /// admit the batch and count it; the draw runs under a read lock on this
    /// process's mirrors, so several threads draw at once, and the slot
    /// records are read under no lock at all. A row evicted between the
    /// draw and the read of its record is drawn again.
    fn select_shared(
        &self,
        n: usize,
        timeout: Option<Duration>,
        count_against_limiter: bool,
        sel: &mut Selection,
        out: &mut Vec<(Sampled, u64)>,
    ) -> Result<()> {
        let sh = &*self.shared;
        let (mut want, mut count) = (n, count_against_limiter);
        for _ in 0..STALE_DRAW_ATTEMPTS {
            self.draw_shared(want, timeout, count, sel)?;
            prefetch_records(sh, &sel.drawn);
            sel.stale.clear();
            for s in &sel.drawn {
                let rec = &sh.region.slots()[s.key.slot as usize];
                match rec.read_begin(s.key) {
                    Some(len) => {
                        out.push((*s, len));
                        rec.add_sampled();
                    }
                    None => sel.stale.push(s.key),
                }
            }
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
    fn draw_shared(&self, n: usize, timeout: Option<Duration>, count: bool, sel: &mut Selection) -> Result<()> {
        let sh = &*self.shared;
        let (guard, local) = sh.lock_read()?;
        let ready = if count {
            self.check_batch(n)?;
            sh.ctl().closed.load(Ordering::Acquire) == 0 && sh.can_sample(n as u64)
        } else {
            !local.sampler.is_empty()
        };
        let (guard, local) = if ready {
            (guard, local)
        } else {
            drop((guard, local));
            self.admit(sh.lock()?, n, timeout, count)?.downgrade()
        };
        if count {
            // `can_sample` or `admit` said the batch fits.
            add(&sh.ctl().samples, n as u64);
        }
        sh.wake();
        drop(guard);
        sel.drawn.clear();
        let drawn = local.sampler.sample_shared(n, &mut sel.rng, &mut sel.drawn).unwrap_or_else(|| {
            Err(gear_core::Error::Selection(format!(
                "strategy `{}` drew 0 rows through a shared reference but refuses to draw {n}",
                local.sampler.name()
            )))
        });
        drop(local);
        if let Err(e) = drawn {
            if count {
                // Nothing was drawn: give the batch back to the limiter.
                let l = sh.lock()?;
                sub(&l.ctl().samples, n as u64);
                l.wake();
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Frees slots taken out by `max_times_sampled`, after their bytes were
    /// copied.
    pub(crate) fn retire(&self, keys: &[SlotKey]) {
        if keys.is_empty() {
            return;
        }
        let Ok(mut l) = self.shared.lock() else { return };
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

/// Starts loading every drawn row's slot record, so that the misses
/// overlap instead of following one another.
fn prefetch_records(sh: &Shared, drawn: &[Sampled]) {
    let slots = sh.region.slots();
    for s in drawn {
        if let Some(rec) = slots.get(s.key.slot as usize) {
            gear_core::hint::prefetch(rec);
        }
    }
}

/// A strategy returned a key the table does not hold.
fn not_stored(strategy: &str, key: SlotKey) -> Error {
    Error::Core(gear_core::Error::Selection(format!("strategy `{strategy}` returned key {key} that is not stored")))
}
