//! The replay table: a [`TableRegion`](gear_core::TableRegion) in a memory pool, the selection
//! strategies, the rate limiter, and the protocol that ties them together,
//! for threads of one process and for processes attached by name alike.
//!
//! Shared state lives in the region: slot records (gear-core's seqlock
//! protocol), and the control block with the free list, the rate limiter's
//! counters and a change log (`gear_core::control`). One robust
//! process-shared lock (`gear_cpu::sync::TableLock`, taken with deadlines)
//! guards the control block; it is held for metadata
//! only, never while trajectory bytes are copied. Selection strategies are
//! process-local mirrors kept in step through the change log, so any
//! process can select, insert and update priorities. A mirror sits behind a
//! reader-writer lock: random strategies are drawn from under the read lock
//! once the lock has admitted and counted the batch, so sampler threads of
//! one process draw at the same time.
//!
//! Failure handling: every process holds a lease on the table
//! (`gear_cpu::sync::ProcessLease`: a file lock the kernel drops when the
//! process dies, in whatever PID namespace), and slot owners, the lock
//! holder and the server are named by lease tokens. A writer that dies
//! mid-trajectory is found dead by its token and its slot reclaimed: the
//! steps it published are committed as a shorter trajectory, or the slot is
//! freed if it published none. Reclamation runs on its own: a full scan
//! when a writer finds no free slot, and a slice of the slots on a cadence
//! whenever any process takes the lock. A process that dies holding the
//! lock is found dead by the next locker, which rebuilds the shared
//! counters and free list from the slot records. A sampler that dies
//! mid-copy pins nothing (reads are optimistic); slots it was retiring are
//! freed by the same reclamation.
//!
//! Nothing read from the shared region is trusted: free-list entries,
//! strategy results and log entries are bounds-checked (a bad one repairs
//! the shared state from the slot records, or is an error), the rate
//! limiter's settings are validated once at open and kept, and a backing
//! file shrunk under the table is detected at every lock.

// The parts, each with one job; `shared` is the only one that touches the
// lock and the mirrors directly, the others go through `Locked`.
// * `builder`: pool choice, policy words, the creator's lease;
// * `attach`: attaching by name, what is validated on the way in;
// * `shared`: the protocol over the control block (lock, mirrors, log,
//   repair, reclamation, waits);
// * `insert`: the writer's side (slots, eviction, commit, abandon);
// * `select`: the sampler's side (admission, draws, checks, retirement);
// * `device`: admission of device draws and the slots a
//   device mirror must rewrite, from the change log.
// * `items`: items over stored trajectories (commit, eviction, reclaim and
//   additions of items; the sampler's keys are items', the remover's
//   trajectories').
// * `checkpoint`: writing a table to a file and restoring it.
mod attach;
mod builder;
pub mod checkpoint;
mod device;
mod export;
mod insert;
pub(crate) mod items;
pub mod ranges;
mod select;
mod shared;

pub use attach::{shared_tables, AttachOptions};
pub use builder::TableBuilder;
use builder::{policy, StrategyChoice};
pub use checkpoint::{latest_checkpoint, CheckpointReport};
pub(crate) use device::{DeviceCursor, DeviceSlot};
pub use export::CommittedTrajectory;
pub use items::{NewItem, StoredItem};
pub(crate) use select::{Drawn, Selection};

use crate::error::Result;
use crate::limiter::RateLimiterConfig;
use crate::sampler::{SampleConfig, Sampler};
use crate::writer::Writer;
use gear_core::{check_priority, target, Change, LogOp, SlotKey, SlotState, TableSpec, WaitReason, WaitRole};
use gear_cpu::sync::futex_wake_all;
use gear_sampler::{StrategyKind, StrategyParams};
use shared::Shared;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// A snapshot of a table's counters. In a table with items the rows are
/// items: `size`, `inserts`, `samples` and `retired` count items (the rate
/// limiter's units), while `evictions`, `reclaimed` and `slots` count
/// trajectories.
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    /// Trajectories (items) that can be sampled.
    pub size: u64,
    /// Slots.
    pub capacity: u64,
    /// Trajectories (items) committed since creation.
    pub inserts: u64,
    /// Rows sampled since creation.
    pub samples: u64,
    /// Trajectories evicted to make room.
    pub evictions: u64,
    /// Trajectories (items) removed after reaching `max_times_sampled`.
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
    /// Writers and samplers of every process waiting now, the longest
    /// wait first (a lock wait is listed once it passes 100 ms).
    pub waiting: Vec<Waiting>,
}

impl TableInfo {
    /// Writers waiting now (in every process).
    pub fn waiting_writers(&self) -> usize {
        self.waiting.iter().filter(|w| w.role == WaitRole::Writer).count()
    }

    /// Samplers waiting now (in every process).
    pub fn waiting_samplers(&self) -> usize {
        self.waiting.iter().filter(|w| w.role == WaitRole::Sampler).count()
    }

    /// The waits grouped by who and what for, each with its count and
    /// longest wait, for one-line summaries: `2 writers (samples per
    /// insert, 12.5 s), 1 sampler (min size, 0.3 s)`; empty when nobody
    /// waits.
    pub fn waiting_summary(&self) -> String {
        let mut groups: Vec<(WaitRole, WaitReason, usize, Duration)> = Vec::new();
        for w in &self.waiting {
            match groups.iter_mut().find(|g| g.0 == w.role && g.1 == w.reason) {
                Some(g) => {
                    g.2 += 1;
                    g.3 = g.3.max(w.waited);
                }
                None => groups.push((w.role, w.reason, 1, w.waited)),
            }
        }
        groups
            .iter()
            .map(|(role, reason, n, longest)| {
                let who = match role {
                    WaitRole::Writer => "writer",
                    WaitRole::Sampler => "sampler",
                    WaitRole::Other => "caller",
                };
                format!("{n} {who}{} ({reason}, {:.1} s)", if *n == 1 { "" } else { "s" }, longest.as_secs_f64())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A writer or sampler waiting now, in any process of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Writer, sampler, or (for the table lock) any caller.
    pub role: WaitRole,
    /// The limit it waits on.
    pub reason: WaitReason,
    /// Its process id, as its own PID namespace numbers it.
    pub pid: u32,
    /// When the wait began.
    pub since: std::time::SystemTime,
    /// How long it has waited.
    pub waited: Duration,
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in process {} waiting {:.1} s on {}",
            self.role.name(),
            self.pid,
            self.waited.as_secs_f64(),
            self.reason
        )
    }
}

/// The waits of this process's handles on one table since it opened the
/// table here (clones of a [`ReplayTable`] share one count): how often and
/// how long writers waited for the rate limiter, samplers for the rate
/// limiter or for data, and any call for the table lock held by another
/// thread or process. [`TableInfo::insert_wait`] and
/// [`TableInfo::sample_wait`] add up the rate-limiter waits of every
/// process instead, without counts; these figures are what a server
/// process reports about the traffic it serves.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitStats {
    /// Inserts that waited for the rate limiter.
    pub insert_waits: u64,
    /// Their time waiting, in total.
    pub insert_wait: Duration,
    /// Samples that waited for the rate limiter or for data.
    pub sample_waits: u64,
    /// Their time waiting, in total.
    pub sample_wait: Duration,
    /// Takes of the table lock that found it held.
    pub lock_waits: u64,
    /// Their time waiting, in total.
    pub lock_wait: Duration,
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
            item_pattern: gear_core::ItemPattern::default(),
        }
    }

    /// The table's spec.
    pub fn spec(&self) -> &TableSpec {
        self.shared.region.spec()
    }

    /// The seed the table was built with.
    pub(crate) fn seed(&self) -> u64 {
        self.shared.region.control().policy[policy::SEED].load(Ordering::Relaxed)
    }

    /// Where the table's bytes live (host, shared or pinned memory).
    pub fn memory_kind(&self) -> gear_core::MemoryKind {
        self.shared.region.region().kind()
    }

    /// Bytes of the whole region: header, control block, slot records and
    /// trajectory data (`spec().data_bytes()` is the data alone).
    pub fn region_bytes(&self) -> u64 {
        self.shared.region.region_layout().total_bytes
    }

    /// Trajectories committed since creation, read without the lock (a
    /// cheap progress counter; [`ReplayTable::info`] gives a consistent
    /// snapshot of every counter).
    pub fn inserts(&self) -> u64 {
        self.shared.region.control().inserts.load(Ordering::Relaxed)
    }

    /// The memory region's name, for shared tables.
    pub fn name(&self) -> Option<&str> {
        self.shared.region.region().name()
    }

    /// A writer for actors; clone or create one per thread.
    pub fn writer(&self) -> Writer {
        Writer::new(self.clone())
    }

    /// A sampler for trainers, with reusable batch buffers (its own are
    /// allocated by its first [`Sampler::sample`]; [`Sampler::sample_into`]
    /// never allocates them).
    pub fn sampler(&self, config: SampleConfig) -> Result<Sampler> {
        Sampler::new(self.clone(), config)
    }

    /// Counts `bytes` of window steps read out of the table by a reader
    /// that copies them itself (a shard that sends rows straight from the
    /// table's memory) in [`TableInfo::bytes_gathered`], as a gather counts
    /// the bytes it copies.
    pub fn count_bytes_read_out(&self, bytes: u64) {
        self.shared.region.control().bytes_gathered.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counters and rate-limiter state.
    pub fn info(&self) -> Result<TableInfo> {
        let l = self.shared.lock(None)?;
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
            waiting: self.waiting_now(),
        })
    }

    /// How often and how long this process waited on this table (see
    /// [`WaitStats`]); reads counters only, without the table lock.
    pub fn wait_stats(&self) -> WaitStats {
        self.shared.waits.snapshot()
    }

    /// Closes the table for every process: blocked writers and samplers
    /// wake with [`Error::Closed`](crate::Error::Closed), later waits fail at once. Data stays
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
    /// time; call it to force a scan. Returns the slots reclaimed by this
    /// call, those the background reclamation freed while it took the
    /// table's lock included.
    pub fn reclaim_dead(&self) -> Result<u64> {
        let mut l = self.shared.lock(None)?;
        let on_lock = l.reaped_on_lock;
        Ok(on_lock + l.reap(0..self.spec().capacity())?)
    }

    /// The sampling strategy's mass (total and smallest positive), with
    /// this process's mirror brought in step first; `None` for strategies
    /// that pick deterministically. Multi-shard samplers weigh shards by it.
    pub fn selection_mass(&self) -> Result<Option<gear_core::SelectionMass>> {
        let l = self.shared.lock(None)?;
        Ok(l.local.sampler.mass())
    }

    /// Updates priorities by key; keys whose trajectory was evicted or
    /// replaced are ignored (late updates are normal in prioritized replay).
    /// Every priority is checked first: one bad value refuses the whole
    /// batch and changes nothing. Duplicate keys: the last one wins.
    /// Returns how many updates were applied.
    ///
    /// In a table with items, an item's key (as sampled rows carry them)
    /// sets the item's priority; a trajectory's key sets the priority its
    /// remover sees (eviction by priority). Keys of removed items are
    /// stale like keys of evicted trajectories.
    pub fn update_priorities(&self, updates: &[(SlotKey, f64)]) -> Result<usize> {
        for &(_, p) in updates {
            check_priority(p)?;
        }
        let mut l = self.shared.lock(None)?;
        let mut applied = 0;
        if self.shared.items_per_slot > 0 {
            for &(key, p) in updates {
                let (held, target) = if key.is_item() {
                    (&l.local.in_sampler, target::SAMPLER)
                } else {
                    (&l.local.in_remover, target::REMOVER)
                };
                if held.get(key.slot as usize) != Some(&Some(key)) {
                    continue;
                }
                l.record(Change { key, op: LogOp::Update, target, priority: p })?;
                if key.is_item() {
                    self.shared.region.items()[key.slot as usize].set_priority(key, p);
                } else {
                    self.shared.region.slots()[key.slot as usize].set_priority(key, p);
                }
                applied += 1;
            }
            return Ok(applied);
        }
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
}
