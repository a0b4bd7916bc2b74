//! Cross-process synchronisation over shared memory: process leases, a
//! robust lock with deadlines, and futex waits.
//!
//! * [`ProcessLease`] tells a live process from a dead one across PID
//!   namespaces (two containers of a pod sharing `/dev/shm` see different
//!   process ids for the same process). A lease is an open-file-description
//!   lock (`F_OFD_SETLK`) on one byte of the table's file, far past its end,
//!   which the kernel releases when the process dies, plus a generation in
//!   the table's control block that the taker bumps while holding the lock,
//!   so a token of a lease that has since changed hands reads as dead.
//!   A token is `index | generation << LEASE_INDEX_BITS`, never 0.
//!   A lease is only ever reported dead when its holder has died: the
//!   generation changes only under the file lock, and the file lock is
//!   free only when no process holds it. A wrong "alive" (garbage that
//!   happens to name a live lease) only delays reclamation.
//! * [`TableLock`] is the lock over a table's control block: a 32-bit word
//!   holding the holder's lease token, taken with a deadline. A waiter
//!   checks the holder's lease from time to time and takes the lock over
//!   when the holder died ([`LockState::OwnerDied`]: repair what it
//!   guards). Threads of one process first take a process-local mutex, so
//!   the shared word only ever sees one thread per process, and a word
//!   naming this very process while no thread of it holds the lock is
//!   known to be stale.
//! * [`futex_wait`]/[`futex_wake_all`] block on and wake a 32-bit word in
//!   shared memory (Linux futexes keyed by the physical page, so they work
//!   across processes that map the same file).
//! * [`WaitListing`] lists a wait in the control block while it lasts, so
//!   every process can see who waits on what; a lock wait that lasts more
//!   than [`LOCK_WAIT_LISTED_AFTER`] is listed, and one that lasts more than
//!   [`wait_warning_after`] is logged (`tracing`, at warn level).

use crate::error::{Error, Result};
use gear_core::{ControlBlock, WaitReason, WaitRole, MAX_LEASES};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Bits of a lease token that hold the lease index.
pub const LEASE_INDEX_BITS: u32 = 10;
const _: () = assert!(MAX_LEASES == 1 << LEASE_INDEX_BITS);
const GENERATION_MASK: u32 = u32::MAX >> LEASE_INDEX_BITS;

/// Byte offset of lease 0's lock in a table's file: far past the end of
/// any table (locks past the end of a file are allowed and touch no data).
const LEASE_LOCK_BASE: i64 = 1 << 56;

/// How often a waiter checks whether the lock holder still lives.
const HOLDER_CHECK: Duration = Duration::from_millis(20);
/// Spins on a held lock before sleeping (holds are short).
const SPINS: u32 = 64;

/// The lease token's index part.
pub fn lease_index(token: u32) -> usize {
    (token & (MAX_LEASES as u32 - 1)) as usize
}

/// How a table's processes are told apart.
#[derive(Debug)]
enum Scope {
    /// A process-private table: only this process can use it.
    Private,
    /// A shared table: the file whose byte locks are the leases. Dropping
    /// it releases this process's lease.
    Shared(File),
}

/// This process's lease on one table (see the module doc).
#[derive(Debug)]
pub struct ProcessLease {
    scope: Scope,
    token: u32,
}

impl ProcessLease {
    /// The lease of a process-private table: no other process can reach
    /// it, so only this token is ever alive.
    pub fn private(ctl: &ControlBlock) -> ProcessLease {
        let token = 1 << LEASE_INDEX_BITS;
        ctl.leases[0].store(1, Ordering::Relaxed);
        ctl.lease_pids[0].store(std::process::id(), Ordering::Relaxed);
        ProcessLease { scope: Scope::Private, token }
    }

    /// Takes a free lease of the shared table whose file is `file` (opened
    /// read-write by this process; kept open for the lease's life).
    pub fn acquire(file: File, ctl: &ControlBlock) -> Result<ProcessLease> {
        for index in 0..MAX_LEASES {
            if !ofd_lock(&file, index, LockOp::TryLock)? {
                continue;
            }
            // We hold the lease's file lock: nobody else changes its
            // generation now.
            let old = ctl.leases[index].load(Ordering::Acquire);
            let mut generation = old.wrapping_add(1) & GENERATION_MASK;
            if generation == 0 {
                generation = 1;
            }
            ctl.leases[index].store(generation, Ordering::Release);
            ctl.lease_pids[index].store(std::process::id(), Ordering::Relaxed);
            let token = index as u32 | generation << LEASE_INDEX_BITS;
            return Ok(ProcessLease { scope: Scope::Shared(file), token });
        }
        Err(Error::Leases { max: MAX_LEASES })
    }

    /// This process's token.
    pub fn token(&self) -> u32 {
        self.token
    }

    /// Whether the process holding `token` still lives (this process's
    /// own token always does).
    pub fn is_alive(&self, token: u32, ctl: &ControlBlock) -> bool {
        if token == self.token {
            return true;
        }
        match &self.scope {
            Scope::Private => false,
            Scope::Shared(file) => token_alive(file, token, ctl),
        }
    }

    /// A description of the holder of `token` for messages: its process id
    /// as its own PID namespace numbers it.
    pub fn describe(token: u32, ctl: &ControlBlock) -> String {
        let pid = ctl.lease_pids[lease_index(token)].load(Ordering::Relaxed);
        format!("process {pid} (lease {}, as its own PID namespace numbers it)", lease_index(token))
    }
}

/// Whether the lease `token` of the table whose file is `file` is held by a
/// live process; usable without a lease of one's own.
pub fn token_alive(file: &File, token: u32, ctl: &ControlBlock) -> bool {
    let generation = token >> LEASE_INDEX_BITS;
    let index = lease_index(token);
    if generation == 0 || ctl.leases[index].load(Ordering::Acquire) != generation {
        return false;
    }
    // An error of the query itself says nothing: count the holder alive.
    ofd_lock(file, index, LockOp::Query).unwrap_or(true)
}

enum LockOp {
    /// Take the byte's write lock if free; true when taken.
    TryLock,
    /// Whether another open file description holds the byte's lock.
    Query,
}

fn ofd_lock(file: &File, index: usize, op: LockOp) -> Result<bool> {
    // SAFETY: `flock` is plain data; all-zero is a valid value to start
    // from, and every field fcntl reads is set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = LEASE_LOCK_BASE + index as i64;
    fl.l_len = 1;
    let cmd = match op {
        LockOp::TryLock => libc::F_OFD_SETLK,
        LockOp::Query => libc::F_OFD_GETLK,
    };
    // SAFETY: the descriptor is open for the call (borrowed from `file`);
    // `fl` is a valid flock that fcntl reads and, for GETLK, writes.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if rc == -1 {
        let e = std::io::Error::last_os_error();
        return match (op, e.raw_os_error()) {
            (LockOp::TryLock, Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
            _ => Err(Error::Io { op: "lock a process lease of", path: "shared table".into(), source: e }),
        };
    }
    Ok(match op {
        LockOp::TryLock => true,
        LockOp::Query => fl.l_type != libc::F_UNLCK as _,
    })
}

/// A lock wait longer than this is listed in the control block's waits
/// (shorter ones are the lock's ordinary traffic, not worth the entry).
pub const LOCK_WAIT_LISTED_AFTER: Duration = Duration::from_millis(100);

/// Default of [`wait_warning_after`].
pub const DEFAULT_WAIT_WARNING: Duration = Duration::from_secs(10);

/// How long a writer's or sampler's wait (or a lock wait) lasts before it is
/// logged as a warning: `GEAR_WAIT_WARNING_SECS` when set (a number of
/// seconds; `0` or `off` never warns), else [`DEFAULT_WAIT_WARNING`].
/// Read once per process. `None`: never.
pub fn wait_warning_after() -> Option<Duration> {
    static AFTER: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *AFTER.get_or_init(|| parse_wait_warning(std::env::var("GEAR_WAIT_WARNING_SECS").ok().as_deref()))
}

fn parse_wait_warning(value: Option<&str>) -> Option<Duration> {
    let Some(text) = value.map(str::trim) else { return Some(DEFAULT_WAIT_WARNING) };
    if text.eq_ignore_ascii_case("off") {
        return None;
    }
    match text.parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(d) if d.is_zero() => None,
        Some(d) => Some(d),
        None => {
            tracing::warn!(
                "GEAR_WAIT_WARNING_SECS={text:?} is not a number of seconds; warning after the default {:?}",
                DEFAULT_WAIT_WARNING
            );
            Some(DEFAULT_WAIT_WARNING)
        }
    }
}

/// Milliseconds since the Unix epoch: the clock wait listings share
/// across processes.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A wait listed in a table's control block ([`ControlBlock::waits`]) for
/// as long as this value lives.
pub struct WaitListing<'a> {
    ctl: &'a ControlBlock,
    token: u32,
    role: WaitRole,
    reason: WaitReason,
    /// `None` when every entry was taken: the wait goes unlisted.
    entry: Option<usize>,
}

impl<'a> WaitListing<'a> {
    /// Lists a wait of `lease`'s process that began `waited` ago.
    pub fn begin(
        ctl: &'a ControlBlock,
        lease: &ProcessLease,
        role: WaitRole,
        reason: WaitReason,
        waited: Duration,
    ) -> Self {
        let since = unix_ms().saturating_sub(waited.as_millis() as u64);
        let entry = ctl.begin_wait(lease.token(), role, reason, since);
        WaitListing { ctl, token: lease.token(), role, reason, entry }
    }

    /// What the wait waits for now.
    pub fn set_reason(&mut self, reason: WaitReason) {
        if reason != self.reason {
            self.reason = reason;
            if let Some(e) = self.entry {
                self.ctl.set_wait_reason(e, self.token, self.role, reason);
            }
        }
    }
}

impl Drop for WaitListing<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.entry {
            self.ctl.end_wait(e);
        }
    }
}

impl std::fmt::Debug for WaitListing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitListing")
            .field("role", &self.role)
            .field("reason", &self.reason)
            .field("entry", &self.entry)
            .finish()
    }
}

/// How a lock was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockState {
    /// The previous holder unlocked normally.
    Clean,
    /// The previous holder died holding the lock (or the lock word held
    /// garbage); what it guards may be half-updated and must be repaired.
    OwnerDied,
}

/// Why a lock was not taken before its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockTimeout {
    /// How long the caller waited.
    pub waited: Duration,
    /// The token of the holder when the deadline passed (0: a thread of
    /// this process held the process-local part).
    pub holder: u32,
}

/// The lock over a table's control block (see the module doc). One per
/// table handle; it borrows the words from the control block on each call.
#[derive(Debug, Default)]
pub struct TableLock {
    /// Serialises this process's threads before the shared word.
    local: parking_lot::Mutex<()>,
}

/// Holds a [`TableLock`]; unlocks on drop.
pub struct TableLockGuard<'a> {
    word: &'a AtomicU32,
    waiters: &'a AtomicU32,
    token: u32,
    /// How long taking the lock waited: `None` when it was free at once.
    waited: Option<Duration>,
    _local: parking_lot::MutexGuard<'a, ()>,
}

impl TableLockGuard<'_> {
    /// How long taking this lock waited (for another thread of this
    /// process or another process), or `None` when it was free at once:
    /// what lock-contention figures count.
    pub fn waited(&self) -> Option<Duration> {
        self.waited
    }
}

impl std::fmt::Debug for TableLockGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLockGuard").field("token", &self.token).finish()
    }
}

impl TableLock {
    /// A lock handle for one table.
    pub fn new() -> TableLock {
        TableLock::default()
    }

    /// Takes the lock for `lease`'s process, waiting at most until
    /// `deadline` (`None`: as long as it takes). A holder whose lease is
    /// dead is taken over ([`LockState::OwnerDied`]).
    pub fn lock<'a>(
        &'a self,
        ctl: &'a ControlBlock,
        lease: &ProcessLease,
        deadline: Option<Instant>,
    ) -> std::result::Result<(TableLockGuard<'a>, LockState), LockTimeout> {
        let start = Instant::now();
        // Contended: this process's part or the shared word was not free
        // at the first try.
        let mut contended = false;
        let local = match self.local.try_lock() {
            Some(local) => local,
            None => {
                contended = true;
                match deadline {
                    None => self.local.lock(),
                    Some(d) => {
                        self.local.try_lock_until(d).ok_or(LockTimeout { waited: start.elapsed(), holder: 0 })?
                    }
                }
            }
        };
        let (word, waiters, me) = (&ctl.lock, &ctl.lock_waiters, lease.token());
        let guard = |state, contended: bool| {
            let waited = contended.then(|| start.elapsed());
            (TableLockGuard { word, waiters, token: me, waited, _local: local }, state)
        };
        let mut spins = 0;
        let mut next_check = start;
        // A long wait is listed, then logged (see the module doc).
        let mut listing: Option<WaitListing<'_>> = None;
        let mut warn_at = wait_warning_after();
        loop {
            let cur = match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(guard(LockState::Clean, contended)),
                Err(cur) => cur,
            };
            if cur == me {
                // No other thread of this process holds the lock (we hold
                // the local mutex): a holder of ours died mid-section in a
                // way a process cannot survive, or the word was corrupted.
                return Ok(guard(LockState::OwnerDied, contended));
            }
            contended = true;
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let waited = now - start;
            if listing.is_none() && waited >= LOCK_WAIT_LISTED_AFTER {
                listing = Some(WaitListing::begin(ctl, lease, WaitRole::Other, WaitReason::TableLock, waited));
            }
            if let Some(after) = warn_at.filter(|a| waited >= *a) {
                tracing::warn!(
                    "waited {:.1} s for the lock of a shared table, held by {}; is that process stopped \
                     (SIGSTOP, a debugger) or stuck?",
                    waited.as_secs_f64(),
                    ProcessLease::describe(cur, ctl)
                );
                // Then again at 4, 16, ... times the threshold.
                warn_at = Some(after * 4);
            }
            if now >= next_check {
                next_check = now + HOLDER_CHECK;
                if !lease.is_alive(cur, ctl) {
                    if word.compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        return Ok(guard(LockState::OwnerDied, contended));
                    }
                    continue;
                }
            }
            let mut sleep = next_check.saturating_duration_since(now).max(Duration::from_micros(100));
            if let Some(d) = deadline {
                if now >= d {
                    return Err(LockTimeout { waited: start.elapsed(), holder: cur });
                }
                sleep = sleep.min(d - now);
            }
            // SeqCst here and in the unlock: either the unlocker sees this
            // waiter, or this waiter's futex call sees the word changed
            // (a store-buffer race would otherwise cost a whole sleep).
            waiters.fetch_add(1, Ordering::SeqCst);
            futex_wait(word, cur, Some(sleep));
            waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for TableLockGuard<'_> {
    fn drop(&mut self) {
        // Only our own token is cleared: a word another process overwrote
        // (which only a corrupted region can make happen) is left alone.
        let released = self.word.compare_exchange(self.token, 0, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        if released && self.waiters.load(Ordering::SeqCst) > 0 {
            futex_wake_one(self.word);
        }
    }
}

/// Blocks while `*word == expected`, at most `timeout` (`None`: until
/// woken). Returns early on a wake, a signal or a spurious wake-up; callers
/// re-check their condition in a loop.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which lives for
    // the call; the timeout pointer is null or points to a live timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, ts_ptr, std::ptr::null::<u32>(), 0);
    }
}

/// Wakes every waiter blocked on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    futex_wake(word, i32::MAX);
}

/// Wakes one waiter blocked on `word`.
pub fn futex_wake_one(word: &AtomicU32) {
    futex_wake(word, 1);
}

fn futex_wake(word: &AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            count,
            std::ptr::null::<u32>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_warning_threshold_parses() {
        assert_eq!(parse_wait_warning(None), Some(DEFAULT_WAIT_WARNING));
        assert_eq!(parse_wait_warning(Some("2.5")), Some(Duration::from_millis(2500)));
        assert_eq!(parse_wait_warning(Some(" 0 ")), None);
        assert_eq!(parse_wait_warning(Some("OFF")), None);
        assert_eq!(parse_wait_warning(Some("soon")), Some(DEFAULT_WAIT_WARNING));
        assert_eq!(parse_wait_warning(Some("-1")), Some(DEFAULT_WAIT_WARNING));
    }

    fn control() -> Box<ControlBlock> {
        // SAFETY: ControlBlock is atomics only, for which all-zero is valid.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    fn table_file(dir: &std::path::Path) -> File {
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("t")).unwrap()
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gear-sync-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn leases_are_distinct_and_released_on_drop() {
        let dir = temp_dir("leases");
        let ctl = control();
        let a = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let b = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        assert_ne!(lease_index(a.token()), lease_index(b.token()));
        assert!(a.is_alive(b.token(), &ctl) && b.is_alive(a.token(), &ctl));
        assert!(!a.is_alive(0, &ctl), "token 0 names nobody");
        let gone = b.token();
        drop(b);
        assert!(!a.is_alive(gone, &ctl), "a dropped lease is dead");
        let c = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        assert_eq!(lease_index(c.token()), lease_index(gone), "the free lease is taken again");
        assert!(!a.is_alive(gone, &ctl), "the old token stays dead once its lease changed hands");
        assert!(a.is_alive(c.token(), &ctl));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn lock_excludes_threads_and_times_out_naming_the_holder() {
        let dir = temp_dir("lock");
        let ctl = control();
        let lease = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let other = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let lock = TableLock::new();
        let (g, state) = lock.lock(&ctl, &lease, None).unwrap();
        assert_eq!(state, LockState::Clean);
        let t = Instant::now();
        let e = lock.lock(&ctl, &lease, Some(Instant::now() + Duration::from_millis(50))).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(45) && e.holder == 0, "{e:?}");
        // Another process's handle (a live lease) waits, then times out.
        let other_lock = TableLock::new();
        let e = other_lock.lock(&ctl, &other, Some(Instant::now() + Duration::from_millis(50))).unwrap_err();
        assert_eq!(e.holder, lease.token());
        drop(g);
        assert_eq!(other_lock.lock(&ctl, &other, None).unwrap().1, LockState::Clean);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn a_long_lock_wait_is_listed_while_it_lasts() {
        let dir = temp_dir("listed");
        let ctl = control();
        let holder = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let waiter = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let (holder_lock, waiter_lock) = (TableLock::new(), TableLock::new());
        let g = holder_lock.lock(&ctl, &holder, None).unwrap();
        std::thread::scope(|s| {
            let w = s.spawn(|| waiter_lock.lock(&ctl, &waiter, None).map(|_| ()).unwrap());
            let seen = Instant::now();
            let listed = loop {
                if let Some(l) = ctl.waits_now().next() {
                    break l;
                }
                assert!(seen.elapsed() < Duration::from_secs(10), "the wait was never listed");
                std::thread::sleep(Duration::from_millis(10));
            };
            assert!(seen.elapsed() >= LOCK_WAIT_LISTED_AFTER / 2, "listed at once: short waits would be listed too");
            assert_eq!(
                (listed.token, listed.role, listed.reason),
                (waiter.token(), WaitRole::Other, WaitReason::TableLock)
            );
            assert!(listed.since_ms <= unix_ms());
            drop(g);
            w.join().unwrap();
        });
        assert_eq!(ctl.waits_now().count(), 0, "the listing ends with the wait");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn a_guard_says_whether_and_how_long_taking_it_waited() {
        let dir = temp_dir("waited");
        let ctl = control();
        let lease = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let other = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let (lock, other_lock) = (TableLock::new(), TableLock::new());
        let (g, _) = lock.lock(&ctl, &lease, None).unwrap();
        assert_eq!(g.waited(), None, "a free lock is taken without waiting");
        drop(g);
        let ctl = &ctl;
        std::thread::scope(|s| {
            // Held by this process's handle: a thread of this process, then
            // another process's handle, wait for it.
            for (l, who) in [(&lock, &lease), (&other_lock, &other)] {
                let (g, _) = lock.lock(ctl, &lease, None).unwrap();
                let waiter = s.spawn(move || l.lock(ctl, who, None).unwrap().0.waited());
                std::thread::sleep(Duration::from_millis(30));
                drop(g);
                let waited = waiter.join().unwrap().expect("a held lock is waited for");
                assert!(waited >= Duration::from_millis(20), "{waited:?}");
            }
        });
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn a_dead_or_garbage_holder_is_taken_over() {
        let dir = temp_dir("takeover");
        let ctl = control();
        let lease = ProcessLease::acquire(table_file(&dir), &ctl).unwrap();
        let lock = TableLock::new();
        for garbage in [0xdead_beef_u32, 1 << LEASE_INDEX_BITS | 5, lease.token()] {
            ctl.lock.store(garbage, Ordering::Relaxed);
            let deadline = Some(Instant::now() + Duration::from_secs(5));
            let (g, state) = lock.lock(&ctl, &lease, deadline).unwrap();
            assert_eq!(state, LockState::OwnerDied, "{garbage:#x}");
            drop(g);
            assert_eq!(lock.lock(&ctl, &lease, deadline).unwrap().1, LockState::Clean);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    #[cfg_attr(miri, ignore = "system calls Miri cannot make (futexes, open-file-description locks, /dev/shm)")]
    fn futex_wait_times_out_and_wakes() {
        let word = AtomicU32::new(0);
        let t = std::time::Instant::now();
        futex_wait(&word, 0, Some(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(25));
        futex_wait(&word, 1, Some(Duration::from_secs(10))); // value differs: returns at once
        std::thread::scope(|s| {
            s.spawn(|| {
                while word.load(Ordering::Acquire) == 0 {
                    futex_wait(&word, 0, Some(Duration::from_secs(10)));
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            word.store(1, Ordering::Release);
            futex_wake_all(&word);
        });
    }
}
