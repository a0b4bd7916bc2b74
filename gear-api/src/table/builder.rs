//! Building a table: the pool it lives in, its strategies and policy,
//! and this process's lease on it.

use super::shared::Shared;
use super::{PoolConfig, ReplayTable};
use crate::error::{Error, Result};
use crate::limiter::RateLimiterConfig;
use gear_core::{MemoryRegion, Selector, TableRegion, TableSpec};
use gear_cpu::sync::{token_alive, ProcessLease};
use gear_sampler::{StrategyKind, StrategyParams};
use std::fs::File;
use std::sync::atomic::Ordering;

/// Policy words in the control block (written by the creator, read by
/// attachers).
pub(super) mod policy {
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
pub(super) enum StrategyChoice {
    Kind(StrategyKind),
    Custom(Box<dyn Selector>),
}

/// The built-in kind (and parameters) of a fresh gear-sampler strategy
/// instance, so that a table built from one can be attached to without
/// passing it again; `None` for any other type, or for an instance that
/// already holds keys (its state would be lost by rebuilding it).
fn builtin<S: Selector + 'static>(selector: &S) -> Option<(StrategyKind, StrategyParams)> {
    use gear_sampler::{Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform};
    if !selector.is_empty() {
        return None;
    }
    let any: &dyn std::any::Any = selector;
    let plain = |kind| Some((kind, StrategyParams::default()));
    if let Some(p) = any.downcast_ref::<Prioritized>() {
        let params = StrategyParams { alpha: p.alpha(), beta: p.beta(), stratified: p.is_stratified() };
        return Some((StrategyKind::Prioritized, params));
    }
    if any.is::<Uniform>() {
        return plain(StrategyKind::Uniform);
    }
    if any.is::<Fifo>() {
        return plain(StrategyKind::Fifo);
    }
    if any.is::<Lifo>() {
        return plain(StrategyKind::Lifo);
    }
    if any.is::<MaxHeap>() {
        return plain(StrategyKind::MaxHeap);
    }
    if any.is::<MinHeap>() {
        return plain(StrategyKind::MinHeap);
    }
    None
}

pub(super) fn kind_code(k: StrategyKind) -> u64 {
    StrategyKind::ALL.iter().position(|x| *x == k).map_or(0, |i| i as u64 + 1)
}

pub(super) fn kind_from_code(c: u64) -> Option<StrategyKind> {
    c.checked_sub(1).and_then(|i| StrategyKind::ALL.get(i as usize)).copied()
}

/// Builds a [`ReplayTable`].
pub struct TableBuilder {
    pub(super) spec: TableSpec,
    pub(super) pool: PoolConfig,
    pub(super) sampler: StrategyChoice,
    pub(super) remover: StrategyChoice,
    pub(super) params: StrategyParams,
    pub(super) limiter: RateLimiterConfig,
    pub(super) max_times_sampled: Option<u64>,
    pub(super) sample_while_writing: bool,
    pub(super) seed: u64,
    pub(super) collector_threads: Option<usize>,
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

    /// A strategy instance for sampling. One of gear-sampler's built-in
    /// strategies (`Prioritized::new(0.6, 0.4)?`, `Uniform::new()`, ...) is
    /// recorded as [`TableBuilder::sampler_kind`] would record it, so
    /// processes that attach rebuild it themselves; for a strategy of your
    /// own they must pass an equivalent one
    /// ([`AttachOptions::sampler`](crate::AttachOptions::sampler)).
    pub fn sampler<S: Selector + 'static>(mut self, selector: S) -> Self {
        match builtin(&selector) {
            Some((kind, params)) => {
                self.sampler = StrategyChoice::Kind(kind);
                self.params = params;
            }
            None => self.sampler = StrategyChoice::Custom(Box::new(selector)),
        }
        self
    }

    /// A built-in eviction strategy (default: FIFO, the oldest first).
    pub fn remover_kind(mut self, kind: StrategyKind) -> Self {
        self.remover = StrategyChoice::Kind(kind);
        self
    }

    /// An eviction strategy instance: a built-in one without parameters
    /// (`Fifo`, `Lifo`, `Uniform`, the heaps) is recorded as
    /// [`TableBuilder::remover_kind`] would; one of your own must be passed
    /// to attachers too ([`AttachOptions::remover`](crate::AttachOptions::remover)).
    pub fn remover<S: Selector + 'static>(mut self, selector: S) -> Self {
        match builtin(&selector) {
            Some((kind, _)) if kind != StrategyKind::Prioritized => self.remover = StrategyChoice::Kind(kind),
            _ => self.remover = StrategyChoice::Custom(Box::new(selector)),
        }
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

    pub(super) fn ordered(self, size: u64, kind: StrategyKind) -> Result<Self> {
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

    /// Builds the table as [`TableBuilder::build`] does, then fills it from
    /// the checkpoint at `path` (a file, or a directory of numbered
    /// checkpoints, whose newest is read): trajectories with their keys,
    /// priorities and times sampled, the rate limiter's counters and the
    /// strategies' state, so a sampler seeded alike draws the same rows as
    /// on the table checkpointed. The spec must equal the checkpoint's;
    /// strategies, pool and policy are this builder's. A file that is
    /// truncated, corrupted, of another format version or another spec is
    /// refused with [`Error::Checkpoint`] naming the problem, and no table
    /// is returned.
    pub fn restore(self, path: impl AsRef<std::path::Path>) -> Result<ReplayTable> {
        // Pages are faulted in as the checkpoint's bytes land in them, not
        // in a pass of their own before (fresh memory is what a restore
        // spends most of its time on).
        let table = self.build_with(false)?;
        super::checkpoint::restore_into(&table, path.as_ref())?;
        Ok(table)
    }

    /// Allocates the pool, lays the table out and returns it.
    pub fn build(self) -> Result<ReplayTable> {
        self.build_with(true)
    }

    /// Checks everything [`TableBuilder::build`] checks before it allocates
    /// (the spec's sizes, the rate limiter, `max_times_sampled`) and
    /// returns the bytes the table's memory will take: header, control
    /// block, slot records and trajectory data. Allocates nothing (`gear
    /// serve --dry-run`).
    pub fn check(&self) -> Result<u64> {
        Ok(self.checked()?.1.total_bytes)
    }

    fn checked(&self) -> Result<(RateLimiterConfig, gear_core::RegionLayout)> {
        let limiter = self.limiter.validated()?;
        let capacity = self.spec.capacity();
        if self.max_times_sampled == Some(0) {
            return Err(Error::Config("max_times_sampled must be at least 1".into()));
        }
        if limiter.min_size_to_sample > capacity {
            return Err(Error::Config(format!(
                "min_size_to_sample {} is above the capacity of {capacity} trajectories: nothing could ever be sampled",
                limiter.min_size_to_sample
            )));
        }
        Ok((limiter, gear_core::RegionLayout::for_spec(&self.spec)?))
    }

    /// [`TableBuilder::build`], with the pool's pages faulted in up front
    /// (`prefault`) or at first touch.
    fn build_with(self, prefault: bool) -> Result<ReplayTable> {
        let (limiter, region_layout) = self.checked()?;
        let capacity = self.spec.capacity();
        let (pool, backing): (Box<dyn MemoryRegion>, Option<File>) = match &self.pool {
            PoolConfig::Host if prefault => (Box::new(gear_cpu::HostPool::new(region_layout.total_bytes)?), None),
            PoolConfig::Host => (Box::new(gear_cpu::HostPool::unpopulated(region_layout.total_bytes)?), None),
            PoolConfig::Shared { name, dir } => {
                let mut opts = gear_cpu::ShmOptions::new().populate(prefault);
                if let Some(d) = dir {
                    opts = opts.dir(d.clone());
                }
                let pool = match gear_cpu::ShmPool::create(name, region_layout.total_bytes, opts.clone()) {
                    Err(gear_cpu::Error::Exists { .. }) if stale_table(name, dir.as_deref()) => {
                        // Its creator died without removing it: replace it.
                        gear_cpu::ShmPool::unlink(name, dir.as_deref())?;
                        gear_cpu::ShmPool::create(name, region_layout.total_bytes, opts)?
                    }
                    Err(gear_cpu::Error::Exists { name, dir }) => {
                        let holder = describe_existing(&name, Some(&dir));
                        return Err(Error::TableExists { name, dir, holder });
                    }
                    other => other?,
                };
                let file = pool.file()?;
                (Box::new(pool), Some(file))
            }
        };
        let region = TableRegion::create(pool, &self.spec)?;
        let ctl = region.control();
        let lease = match &backing {
            None => ProcessLease::private(ctl),
            Some(file) => ProcessLease::acquire(file.try_clone().map_err(lease_io)?, ctl)?,
        };
        for (i, w) in region.free_list().iter().enumerate() {
            // Popped from the end: slot 0 is used first.
            w.store((capacity - 1 - i as u64) as u32, Ordering::Relaxed);
        }
        ctl.free_len.store(capacity, Ordering::Relaxed);
        ctl.next_seq.store(1, Ordering::Relaxed);
        ctl.server.store(u64::from(lease.token()), Ordering::Relaxed);
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
        let opened = Opened { region, lease, backing, creator: true };
        Shared::open_table(opened, sampler, remover, self.collector_threads, None)
    }
}

pub(super) fn lease_io(e: std::io::Error) -> gear_cpu::Error {
    gear_cpu::Error::Io { op: "duplicate the descriptor of", path: "shared table".into(), source: e }
}

/// A region with this process's lease on it, ready to become a table.
pub(super) struct Opened {
    pub(super) region: TableRegion<Box<dyn MemoryRegion>>,
    pub(super) lease: ProcessLease,
    /// The backing file of a shared table (for size checks).
    pub(super) backing: Option<File>,
    pub(super) creator: bool,
}

/// What holds the name `name` in `dir`, for the error of a create that
/// found it taken: the live process that created the table there (and how
/// to reach it instead), or a file that is no table of this build.
fn describe_existing(name: &str, dir: Option<&std::path::Path>) -> String {
    let opened = gear_cpu::ShmPool::open_with(name, dir, false).map_err(Error::from).and_then(|pool| {
        let file = pool.file()?;
        let region = TableRegion::open(pool, None)?;
        Ok((file, region))
    });
    match opened {
        Ok((file, region)) => {
            let ctl = region.control();
            let server = u32::try_from(ctl.server.load(Ordering::Relaxed)).unwrap_or(0);
            let pid = ctl.lease_pids[gear_cpu::sync::lease_index(server)].load(Ordering::Relaxed);
            let state = if token_alive(&file, server, ctl) { "which is running" } else { "which has exited" };
            format!(
                "a table created by process {pid} ({state}); attach to it with ReplayTable::attach(\"{name}\", ..) \
                 (Python: gear.Table.attach(\"{name}\")), or give this table another name"
            )
        }
        Err(e) => format!(
            "the file is not a table this build can open ({e}); remove it if it is yours (rm {}), or give this \
             table another name",
            dir.unwrap_or(std::path::Path::new(gear_cpu::DEFAULT_SHM_DIR)).join(name).display()
        ),
    }
}

/// Whether `name` holds a GEAR table whose creating process is dead (left
/// behind by a crash). Anything else, including a file that is not a table,
/// is not stale: it is not ours to remove.
pub(super) fn stale_table(name: &str, dir: Option<&std::path::Path>) -> bool {
    let Ok(pool) = gear_cpu::ShmPool::open_with(name, dir, false) else { return false };
    let Ok(file) = pool.file() else { return false };
    let Ok(region) = TableRegion::open(pool, None) else { return false };
    let ctl = region.control();
    let server = ctl.server.load(Ordering::Relaxed);
    !token_alive(&file, u32::try_from(server).unwrap_or(0), ctl)
}
