//! Cross-process synchronisation over shared memory: a robust mutex, futex
//! waits, and process liveness.
//!
//! * [`ShmMutex`] is a POSIX mutex that is process-shared and robust
//!   (`PTHREAD_PROCESS_SHARED` + `PTHREAD_MUTEX_ROBUST`): when its holder
//!   dies, the next locker gets it with [`LockState::OwnerDied`] and must
//!   repair what the lock guards. It lives in caller-provided bytes inside a
//!   shared mapping.
//! * [`futex_wait`]/[`futex_wake`] block on and wake a 32-bit word in
//!   shared memory (Linux futexes keyed by the physical page, so they work
//!   across processes that map the same file).
//! * [`process_alive`] and [`ProcessId`] let a table tell a dead owner from
//!   a slow one. A process id alone can be reused after the process dies,
//!   so [`ProcessId`] pairs it with the process start time.

use crate::error::{Error, Result};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Bytes reserved for a [`ShmMutex`] in a shared layout.
pub const SHM_MUTEX_BYTES: usize = 64;

const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= SHM_MUTEX_BYTES);
const _: () = assert!(std::mem::align_of::<libc::pthread_mutex_t>() <= 8);

/// How a lock was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockState {
    /// The previous holder unlocked normally.
    Clean,
    /// The previous holder died holding the lock; what it guards may be
    /// half-updated and must be repaired before use.
    OwnerDied,
}

/// A robust, process-shared mutex in shared memory.
#[derive(Debug)]
pub struct ShmMutex {
    raw: *mut libc::pthread_mutex_t,
}

// SAFETY: the mutex is designed to be used from many threads and processes
// at once; the pointer stays valid as long as the mapping (see `from_raw`).
unsafe impl Send for ShmMutex {}
// SAFETY: see Send.
unsafe impl Sync for ShmMutex {}

/// Unlocks on drop.
#[derive(Debug)]
pub struct ShmMutexGuard<'a> {
    mutex: &'a ShmMutex,
}

impl ShmMutex {
    /// Initialises a mutex in `bytes` (its creator does this once, before any
    /// other process can see the bytes).
    ///
    /// # Safety
    /// `bytes` must point to [`SHM_MUTEX_BYTES`] writable bytes, 8-byte
    /// aligned, that no one uses as a mutex yet and that stay mapped while
    /// any `ShmMutex` made from them lives.
    pub unsafe fn init(bytes: *mut u8) -> Result<ShmMutex> {
        let raw = bytes.cast::<libc::pthread_mutex_t>();
        let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
        // SAFETY: attr is initialised by pthread_mutexattr_init before the
        // setters read it, and destroyed after pthread_mutex_init copied it;
        // `raw` is valid for a pthread_mutex_t (caller's obligation).
        unsafe {
            check("initialise mutex attributes", libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
            let a = attr.as_mut_ptr();
            let set = check(
                "make the mutex process-shared",
                libc::pthread_mutexattr_setpshared(a, libc::PTHREAD_PROCESS_SHARED),
            )
            .and_then(|()| {
                check("make the mutex robust", libc::pthread_mutexattr_setrobust(a, libc::PTHREAD_MUTEX_ROBUST))
            })
            .and_then(|()| check("initialise the mutex", libc::pthread_mutex_init(raw, a)));
            libc::pthread_mutexattr_destroy(a);
            set?;
        }
        Ok(ShmMutex { raw })
    }

    /// A handle to a mutex another party initialised.
    ///
    /// # Safety
    /// `bytes` must point to a mutex made by [`ShmMutex::init`] that stays
    /// mapped while the handle lives.
    pub unsafe fn from_raw(bytes: *mut u8) -> ShmMutex {
        ShmMutex { raw: bytes.cast() }
    }

    /// Locks, blocking. If the previous holder died, the lock is made
    /// consistent again and [`LockState::OwnerDied`] says the guarded data
    /// needs repair.
    pub fn lock(&self) -> Result<(ShmMutexGuard<'_>, LockState)> {
        // SAFETY: `raw` points to an initialised robust mutex (constructor
        // obligations).
        let rc = unsafe { libc::pthread_mutex_lock(self.raw) };
        let state = match rc {
            0 => LockState::Clean,
            libc::EOWNERDEAD => {
                // SAFETY: we hold the lock (EOWNERDEAD grants it).
                check("recover the mutex of a dead holder", unsafe { libc::pthread_mutex_consistent(self.raw) })?;
                LockState::OwnerDied
            }
            rc => return Err(os_error("lock the table mutex", rc)),
        };
        Ok((ShmMutexGuard { mutex: self }, state))
    }
}

impl Drop for ShmMutexGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { libc::pthread_mutex_unlock(self.mutex.raw) };
    }
}

fn os_error(op: &'static str, rc: i32) -> Error {
    Error::Io { op, path: "shared table".into(), source: std::io::Error::from_raw_os_error(rc) }
}

fn check(op: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(os_error(op, rc))
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
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<u32>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// A process identity that survives pid reuse: pid in the low 32 bits,
/// the low 32 bits of its start time (clock ticks since boot) above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId(pub u64);

impl ProcessId {
    /// This process.
    pub fn current() -> ProcessId {
        static ME: std::sync::OnceLock<ProcessId> = std::sync::OnceLock::new();
        *ME.get_or_init(|| {
            let pid = std::process::id();
            ProcessId(u64::from(pid) | (start_time(pid).unwrap_or(0) & 0xffff_ffff) << 32)
        })
    }

    /// The pid part.
    pub fn pid(self) -> u32 {
        self.0 as u32
    }

    /// Whether this process still runs: its pid exists and, when a start
    /// time was recorded, it started at that time (the pid was not reused).
    pub fn is_alive(self) -> bool {
        let pid = self.pid();
        if pid == 0 || !process_alive(pid) {
            return false;
        }
        let recorded = self.0 >> 32;
        match start_time(pid) {
            Some(t) if recorded != 0 => t & 0xffff_ffff == recorded,
            _ => true,
        }
    }
}

/// Whether a process with this pid exists (it may be a zombie or another
/// process that reused the pid; see [`ProcessId::is_alive`]).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc == 0 {
        // A zombie (dead, not yet reaped) still answers kill(0).
        return !is_zombie(pid as u32);
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Fields of /proc/PID/stat after the command name, which may contain
/// spaces and parentheses.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn mutex_locks_and_this_process_is_alive() {
        let mut bytes = vec![0u64; SHM_MUTEX_BYTES / 8];
        // SAFETY: 64 aligned bytes used only as this mutex, alive for the test.
        let m = unsafe { ShmMutex::init(bytes.as_mut_ptr().cast()) }.unwrap();
        let (g, state) = m.lock().unwrap();
        assert_eq!(state, LockState::Clean);
        drop(g);
        assert_eq!(m.lock().unwrap().1, LockState::Clean);
        assert!(ProcessId::current().is_alive());
        assert!(!ProcessId(0).is_alive());
        assert!(!ProcessId(u64::from(i32::MAX as u32 - 1)).is_alive());
    }

    #[test]
    fn a_mutex_whose_holder_thread_died_reports_it() {
        let mut bytes = vec![0u64; SHM_MUTEX_BYTES / 8];
        // SAFETY: as above.
        let m = unsafe { ShmMutex::init(bytes.as_mut_ptr().cast()) }.unwrap();
        std::thread::scope(|s| {
            s.spawn(|| std::mem::forget(m.lock().unwrap()));
        });
        assert_eq!(m.lock().unwrap().1, LockState::OwnerDied);
        assert_eq!(m.lock().unwrap().1, LockState::Clean, "consistent again after recovery");
    }

    #[test]
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
