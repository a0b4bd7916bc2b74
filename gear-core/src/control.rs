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
//!
//! **Waits.** A writer or sampler that waits (on the rate limiter, a full
//! queue, an empty table or a table lock held for long) lists itself in
//! [`ControlBlock::waits`] for as long as it waits, so any process can say
//! who waits, since when and on which limit ([`ControlBlock::begin_wait`],
//! [`ControlBlock::waits_now`]). An entry names its process by lease token:
//! one left by a process that died while waiting is recognised as dead by
//! whoever reads it, and cleared.

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

/// Waits the control block lists at once; a wait beyond them goes unlisted
/// (it still waits, and still ends, exactly as a listed one).
pub const MAX_WAITS: usize = 512;

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
    /// Writers and samplers waiting now (see the module doc).
    pub waits: [WaitEntry; MAX_WAITS],
}

impl ControlBlock {
    /// Wakes waiters after a change: bumps `epoch`; returns whether anyone
    /// waits (the caller then issues the futex wake).
    pub fn bump_epoch(&self) -> bool {
        self.epoch.fetch_add(1, Ordering::Release);
        self.waiters.load(Ordering::Acquire) > 0
    }
}

impl ControlBlock {
    /// Lists a wait of the process holding lease `token` that started at
    /// `since_ms` (milliseconds since the Unix epoch). Returns the entry to
    /// pass to [`ControlBlock::set_wait_reason`] and
    /// [`ControlBlock::end_wait`], or `None` when every entry is taken.
    pub fn begin_wait(&self, token: u32, role: WaitRole, reason: WaitReason, since_ms: u64) -> Option<usize> {
        if token == 0 {
            return None;
        }
        // Start at an index of the process's own so that processes do not
        // all compete for the first entries.
        let start = (token as usize).wrapping_mul(0x9e37_79b9) % MAX_WAITS;
        for i in (start..MAX_WAITS).chain(0..start) {
            let e = &self.waits[i];
            // Claimed with no reason first: readers skip it until the start
            // time is written, so they never pair it with a previous wait's.
            let claiming = WaitEntry::pack(token, role, None);
            if e.who.compare_exchange(0, claiming, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                e.since_ms.store(since_ms, Ordering::Relaxed);
                e.who.store(WaitEntry::pack(token, role, Some(reason)), Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Changes what a listed wait waits for (a sampler past the minimum
    /// size may go on waiting on the ratio).
    pub fn set_wait_reason(&self, entry: usize, token: u32, role: WaitRole, reason: WaitReason) {
        if let Some(e) = self.waits.get(entry) {
            e.who.store(WaitEntry::pack(token, role, Some(reason)), Ordering::Release);
        }
    }

    /// Takes a wait off the list.
    pub fn end_wait(&self, entry: usize) {
        if let Some(e) = self.waits.get(entry) {
            e.who.store(0, Ordering::Release);
        }
    }

    /// The waits listed now, whoever listed them (dead processes' entries
    /// included: check the tokens, then [`ControlBlock::clear_wait`] the
    /// dead ones). Entries holding garbage are left out.
    pub fn waits_now(&self) -> impl Iterator<Item = ListedWait> + '_ {
        self.waits.iter().enumerate().filter_map(|(entry, e)| {
            let word = e.who.load(Ordering::Acquire);
            let (token, role, reason) = WaitEntry::unpack(word)?;
            let since_ms = e.since_ms.load(Ordering::Relaxed);
            // A start time written after the word was read belongs to a
            // newer wait: read the word again to pair them right.
            if e.who.load(Ordering::Acquire) != word {
                return None;
            }
            Some(ListedWait { entry, word, token, role, reason, since_ms })
        })
    }

    /// Clears `wait`'s entry if it still holds that wait (its process
    /// died while waiting).
    pub fn clear_wait(&self, wait: &ListedWait) {
        if let Some(e) = self.waits.get(wait.entry) {
            let _ = e.who.compare_exchange(wait.word, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Who waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WaitRole {
    /// A writer, to begin a trajectory or a batch of them.
    Writer = 1,
    /// A sampler, to draw a batch.
    Sampler = 2,
    /// Any caller of a call that takes the table lock.
    Other = 3,
}

impl WaitRole {
    /// The lowercase name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            WaitRole::Writer => "writer",
            WaitRole::Sampler => "sampler",
            WaitRole::Other => "caller",
        }
    }

    fn from_code(code: u64) -> Option<Self> {
        Some(match code {
            1 => WaitRole::Writer,
            2 => WaitRole::Sampler,
            3 => WaitRole::Other,
            _ => return None,
        })
    }
}

/// Which limit holds a waiting writer or sampler back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WaitReason {
    /// A sampler: the table holds fewer trajectories than the rate
    /// limiter's `min_size_to_sample` (or none at all).
    MinSize = 1,
    /// The samples-per-insert ratio: a writer waits for samplers to catch
    /// up, a sampler for writers.
    SamplesPerInsert = 2,
    /// A writer: the table is full of trajectories not yet sampled (a
    /// queue's limit: each must be sampled before another goes in).
    FullTable = 3,
    /// The table lock, held by another process for longer than it should.
    TableLock = 4,
    /// A sampler redrawing rows evicted under its batch found the table
    /// emptied and waits for it to refill.
    EmptyTable = 5,
}

impl WaitReason {
    /// Every reason, in code order.
    pub const ALL: [WaitReason; 5] = [
        WaitReason::MinSize,
        WaitReason::SamplesPerInsert,
        WaitReason::FullTable,
        WaitReason::TableLock,
        WaitReason::EmptyTable,
    ];

    /// A short lowercase name (`min size`, `samples per insert`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            WaitReason::MinSize => "min size",
            WaitReason::SamplesPerInsert => "samples per insert",
            WaitReason::FullTable => "full table",
            WaitReason::TableLock => "table lock",
            WaitReason::EmptyTable => "empty table",
        }
    }

    fn from_code(code: u64) -> Option<Self> {
        WaitReason::ALL.get((code as usize).checked_sub(1)?).copied()
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of [`ControlBlock::waits`].
#[repr(C)]
#[derive(Debug, Default)]
pub struct WaitEntry {
    /// 0 when free, else `token | role << 32 | reason << 40` (reason 0
    /// while the entry is being claimed).
    who: AtomicU64,
    /// When the wait began, in milliseconds since the Unix epoch (a clock
    /// every process of the machine shares).
    since_ms: AtomicU64,
}

impl WaitEntry {
    fn pack(token: u32, role: WaitRole, reason: Option<WaitReason>) -> u64 {
        u64::from(token) | (role as u64) << 32 | reason.map_or(0, |r| r as u64) << 40
    }

    fn unpack(word: u64) -> Option<(u32, WaitRole, WaitReason)> {
        let token = word as u32;
        if token == 0 || word >> 48 != 0 {
            return None;
        }
        Some((token, WaitRole::from_code((word >> 32) & 0xff)?, WaitReason::from_code((word >> 40) & 0xff)?))
    }
}

/// A wait as listed in the control block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListedWait {
    /// The entry's index.
    pub entry: usize,
    /// The entry's word as read (for [`ControlBlock::clear_wait`]).
    word: u64,
    /// The lease token of the waiting process.
    pub token: u32,
    /// Writer or sampler.
    pub role: WaitRole,
    /// What it waits for.
    pub reason: WaitReason,
    /// When the wait began, in milliseconds since the Unix epoch.
    pub since_ms: u64,
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

    fn zeroed_control() -> Box<ControlBlock> {
        // SAFETY: ControlBlock is atomics only, for which all-zero is valid;
        // the allocation has its size and alignment.
        unsafe {
            let layout = std::alloc::Layout::new::<ControlBlock>();
            let p = std::alloc::alloc_zeroed(layout).cast::<ControlBlock>();
            assert!(!p.is_null());
            Box::from_raw(p)
        }
    }

    #[test]
    fn waits_are_listed_changed_and_ended() {
        let ctl = zeroed_control();
        assert_eq!(ctl.waits_now().count(), 0);
        let a = ctl.begin_wait(5, WaitRole::Writer, WaitReason::SamplesPerInsert, 1000).unwrap();
        let b = ctl.begin_wait(5, WaitRole::Sampler, WaitReason::MinSize, 2000).unwrap();
        assert_ne!(a, b);
        let listed: Vec<_> = ctl.waits_now().collect();
        assert_eq!(listed.len(), 2);
        let w = listed.iter().find(|w| w.entry == a).unwrap();
        assert_eq!((w.token, w.role, w.reason, w.since_ms), (5, WaitRole::Writer, WaitReason::SamplesPerInsert, 1000));
        ctl.set_wait_reason(b, 5, WaitRole::Sampler, WaitReason::SamplesPerInsert);
        assert!(ctl.waits_now().any(|w| w.entry == b && w.reason == WaitReason::SamplesPerInsert));
        ctl.end_wait(a);
        assert_eq!(ctl.waits_now().map(|w| w.entry).collect::<Vec<_>>(), vec![b]);
        // A dead process's entry is cleared only while it holds that wait.
        let dead = ctl.waits_now().next().unwrap();
        ctl.end_wait(b);
        let c = ctl.begin_wait(7, WaitRole::Writer, WaitReason::FullTable, 3000).unwrap();
        ctl.clear_wait(&dead);
        assert!(ctl.waits_now().any(|w| w.entry == c), "a newer wait in the same entry survives");
        assert_eq!(ctl.begin_wait(0, WaitRole::Writer, WaitReason::FullTable, 0), None, "token 0 names no process");
    }

    #[test]
    fn a_full_list_and_garbage_are_handled() {
        let ctl = zeroed_control();
        for i in 0..MAX_WAITS {
            assert!(ctl.begin_wait(1 + i as u32, WaitRole::Sampler, WaitReason::MinSize, 1).is_some());
        }
        assert_eq!(ctl.begin_wait(9, WaitRole::Sampler, WaitReason::MinSize, 1), None);
        assert_eq!(ctl.waits_now().count(), MAX_WAITS);
        let ctl = zeroed_control();
        // Words no process writes: unknown role or reason, high bits set,
        // an entry still being claimed.
        for (i, word) in [u64::MAX, 5 | 9 << 32 | 1 << 40, 5 | 1 << 32 | 77 << 40, 5 | 1 << 32].into_iter().enumerate()
        {
            ctl.waits[i].who.store(word, Ordering::Relaxed);
        }
        assert_eq!(ctl.waits_now().count(), 0);
    }
}
