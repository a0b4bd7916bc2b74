//! The shared control block of a table: what every process attached to the
//! table must agree on besides the slot records.
//!
//! ```text
//! | ControlBlock | free list: u32 x capacity | change log: LogEntry x log_entries(capacity) |
//! ```
//!
//! Everything here is atomics (any bit pattern is a valid value, so a region
//! written by another process can never make a read undefined). The fields
//! marked *guarded* are changed only while holding the table lock whose word
//! is [`ControlBlock::lock`] (a robust futex lock that names its holder's
//! process lease, see `gear_cpu::sync`); relaxed orderings suffice for them
//! because the lock orders every access. The rest are read and updated
//! without the lock.
//!
//! **Process leases.** Every process that opens a shared table holds one of
//! [`MAX_LEASES`] leases: an open-file-description lock on one byte of the
//! table's file (which the kernel drops when the process dies, whatever PID
//! namespace it runs in) plus a generation in [`ControlBlock::leases`],
//! bumped each time the lease changes hands. A lease token (index and
//! generation, never 0) names slot owners, the lock holder and the server,
//! so a dead process is told from a live one without comparing process ids.
//!
//! The change log makes selection strategies, which are process-local data
//! structures, agree across processes: every insert, priority update and
//! removal is appended (under the lock) with a sequence number, and a
//! process replays the entries it has not seen before it selects. A process
//! that fell more than [`log_entries`] behind, or that sees
//! `rebuild_epoch` change (after a crashed lock holder was repaired),
//! rebuilds its strategies from the slot records instead.

use crate::slot::SlotKey;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Fewest entries in the change log ring.
pub const MIN_LOG_ENTRIES: u64 = 1 << 14;

/// Entries in the change log ring of a table of `capacity` slots: at least
/// the capacity (rounded up to a power of two), so replaying the log is
/// never more work than rebuilding from the slot records, which a process
/// that fell further behind has to do.
pub fn log_entries(capacity: u64) -> u64 {
    capacity.checked_next_power_of_two().unwrap_or(1 << 63).max(MIN_LOG_ENTRIES)
}

/// Process leases a shared table hands out: at most this many processes
/// have it open at once.
pub const MAX_LEASES: usize = 1024;

/// Policy words gear-api stores for attachers (rate limiter, strategies).
pub const POLICY_WORDS: usize = 16;

/// The shared control block.
#[repr(C, align(64))]
pub struct ControlBlock {
    /// The table lock: 0 when free, else the lease token of the holder.
    pub lock: AtomicU32,
    /// Threads blocked on `lock` (unlockers skip the wake at 0).
    pub lock_waiters: AtomicU32,
    /// Bumped on every change a waiter may be waiting for (futex word).
    pub epoch: AtomicU32,
    /// Processes blocked on `epoch` (wakers skip the system call at 0).
    pub waiters: AtomicU32,
    /// Non-zero once the table is closed.
    pub closed: AtomicU64,
    /// Lease token of the creating (server) process.
    pub server: AtomicU64,
    /// *Guarded.* Items selectable by samplers.
    pub size: AtomicU64,
    /// *Guarded.* Writers admitted by the rate limiter, not yet committed.
    pub pending_inserts: AtomicU64,
    /// *Guarded.* Trajectories committed since creation.
    pub inserts: AtomicU64,
    /// *Guarded.* Rows sampled since creation.
    pub samples: AtomicU64,
    /// *Guarded.* Trajectories evicted.
    pub evictions: AtomicU64,
    /// *Guarded.* Trajectories removed by `max_times_sampled`.
    pub retired: AtomicU64,
    /// *Guarded.* Trajectories of dead writers that were reclaimed.
    pub reclaimed: AtomicU64,
    /// *Guarded.* Next insert sequence number.
    pub next_seq: AtomicU64,
    /// *Guarded.* Entries in use in the free list.
    pub free_len: AtomicU64,
    /// *Guarded.* Sequence number of the next log entry.
    pub log_head: AtomicU64,
    /// *Guarded.* Bumped when shared state was repaired; every process
    /// rebuilds its strategies when it sees a new value.
    pub rebuild_epoch: AtomicU64,
    /// Total nanoseconds writers waited.
    pub insert_wait_ns: AtomicU64,
    /// Total nanoseconds samplers waited.
    pub sample_wait_ns: AtomicU64,
    /// Bytes of steps written.
    pub bytes_written: AtomicU64,
    /// Bytes gathered into batches.
    pub bytes_gathered: AtomicU64,
    /// Written once by the creator: configuration attachers read.
    pub policy: [AtomicU64; POLICY_WORDS],
    /// Generation of each process lease (bumped by the process taking it,
    /// while it holds the lease's file lock).
    pub leases: [AtomicU32; MAX_LEASES],
    /// Process id of each lease's holder, as its own PID namespace sees it
    /// (for messages only; liveness never compares process ids).
    pub lease_pids: [AtomicU32; MAX_LEASES],
}

impl ControlBlock {
    /// Wakes waiters after a change: bumps `epoch`; returns whether anyone
    /// waits (the caller then issues the futex wake).
    pub fn bump_epoch(&self) -> bool {
        self.epoch.fetch_add(1, Ordering::Release);
        self.waiters.load(Ordering::Acquire) > 0
    }
}

/// What a log entry does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LogOp {
    /// Insert the key with its (assigned) priority.
    Insert = 1,
    /// Set the key's priority.
    Update = 2,
    /// Remove the key.
    Remove = 3,
}

/// Which strategies a log entry applies to.
pub mod target {
    /// The sampler.
    pub const SAMPLER: u8 = 1;
    /// The remover.
    pub const REMOVER: u8 = 2;
    /// Both.
    pub const BOTH: u8 = SAMPLER | REMOVER;
}

/// One change, as stored in the ring.
#[repr(C)]
#[derive(Debug, Default)]
pub struct LogEntry {
    /// Sequence number of this entry (a reader checks it to detect that the
    /// ring wrapped over the entry it wanted).
    seq: AtomicU64,
    key: AtomicU64,
    /// `op | target << 8`.
    op: AtomicU64,
    priority: AtomicU64,
}

/// A decoded log entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    /// The key changed.
    pub key: SlotKey,
    /// What happened.
    pub op: LogOp,
    /// Which strategies it concerns (bits of [`target`]).
    pub target: u8,
    /// The priority (for inserts and updates).
    pub priority: f64,
}

impl LogEntry {
    /// Writes an entry (under the lock).
    pub fn store(&self, seq: u64, c: Change) {
        self.key.store(c.key.to_u64(), Ordering::Relaxed);
        self.op.store(c.op as u64 | u64::from(c.target) << 8, Ordering::Relaxed);
        self.priority.store(c.priority.to_bits(), Ordering::Relaxed);
        self.seq.store(seq, Ordering::Relaxed);
    }

    /// Reads the entry with sequence `seq` (under the lock); `None` if the
    /// slot holds another sequence (the ring wrapped) or garbage.
    pub fn load(&self, seq: u64) -> Option<Change> {
        if self.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        let op = self.op.load(Ordering::Relaxed);
        let kind = match op & 0xff {
            1 => LogOp::Insert,
            2 => LogOp::Update,
            3 => LogOp::Remove,
            _ => return None,
        };
        Some(Change {
            key: SlotKey::from_u64(self.key.load(Ordering::Relaxed)),
            op: kind,
            target: ((op >> 8) & 0xff) as u8,
            priority: f64::from_bits(self.priority.load(Ordering::Relaxed)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_detect_wrapping() {
        let e = LogEntry::default();
        let c =
            Change { key: SlotKey { slot: 3, generation: 9 }, op: LogOp::Update, target: target::BOTH, priority: 2.5 };
        e.store(77, c);
        assert_eq!(e.load(77), Some(c));
        assert_eq!(e.load(77 + MIN_LOG_ENTRIES), None);
        assert_eq!(log_entries(10), MIN_LOG_ENTRIES);
        assert_eq!(log_entries(1_000_000), 1 << 20);
        assert_eq!(std::mem::size_of::<ControlBlock>() % 64, 0);
    }
}
