//! What SIGINT (Ctrl-C) and SIGTERM do to a `gear` command, and the cleanup
//! that happens whatever the command was doing, so that no table file stays
//! behind in `/dev/shm`.
//!
//! * A command that can stop in an orderly way ([`Mode::Graceful`]: `gear
//!   serve`, `gear demo`, `gear cluster up`) sees the first signal as a
//!   request ([`stop_requested`]): it closes its table, lets its children
//!   finish and prints what it has (demo's summary, serve's last
//!   checkpoint). A second signal ends it at once, as below.
//! * Any other command ([`Mode::Immediate`]: `gear bench`) ends at the first
//!   signal: the children it registered ([`kill_on_exit`]) are killed and
//!   reaped, the files and directories it registered ([`remove_on_exit`])
//!   removed, and the process exits with 128 + the signal number.
//!
//! The handler itself only stores a flag and writes the signal number to a
//! pipe (both async-signal-safe); a thread reading the pipe does the
//! cleanup, which needs locks and allocation.
//!
//! Child `gear` processes (actors, trainers, bench writers) ignore SIGINT
//! ([`as_child`]): the terminal sends Ctrl-C to the whole process group, and
//! their parent stops them by closing the table, so they still report what
//! they did. They die with their parent (`PR_SET_PDEATHSIG`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;

/// How a command answers the first SIGINT or SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Asks the command to stop ([`stop_requested`]); a second signal ends
    /// it at once.
    Graceful,
    /// Cleans up and exits at once.
    Immediate,
}

static STOP: AtomicBool = AtomicBool::new(false);
static GRACEFUL: AtomicBool = AtomicBool::new(false);
/// The pipe's write end (-1 before [`install`]).
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// What is cleaned up when a signal ends the process.
#[derive(Default)]
struct Registry {
    next_id: u64,
    files: Vec<(u64, PathBuf)>,
    dirs: Vec<(u64, PathBuf)>,
    children: Vec<(u64, u32)>,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { next_id: 0, files: Vec::new(), dirs: Vec::new(), children: Vec::new() });

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    let fd = PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = sig as u8;
        // SAFETY: write(2) is async-signal-safe; `byte` lives for the call
        // and the descriptor is the pipe's write end, never closed.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
}

/// Installs the SIGINT and SIGTERM handlers and the cleanup thread. Call
/// once, early in `main`, before any child is started.
pub fn install(mode: Mode) {
    GRACEFUL.store(mode == Mode::Graceful, Ordering::SeqCst);
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    PIPE.store(write_fd, Ordering::SeqCst);
    std::thread::Builder::new()
        .name("gear-signals".into())
        .spawn(move || watch(read_fd))
        .map(drop)
        .unwrap_or_else(|e| tracing::warn!("cannot start the signal thread ({e}); Ctrl-C may leave files behind"));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only stores to atomics and calls write(2),
        // both async-signal-safe; the sigaction is fully initialised.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Whether SIGINT or SIGTERM asked this process to stop.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

fn watch(read_fd: libc::c_int) {
    let mut seen = 0;
    loop {
        let mut byte = 0u8;
        // SAFETY: reads one byte into `byte`, which lives for the call.
        let n = unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            seen += 1;
            if GRACEFUL.load(Ordering::SeqCst) && seen == 1 {
                continue;
            }
            clean_up();
            std::process::exit(128 + i32::from(byte));
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Kills the registered children and removes the registered files and
/// directories (a signal ends the process).
fn clean_up() {
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    for &(_, pid) in &registry.children {
        let Ok(pid) = libc::pid_t::try_from(pid) else { continue };
        // SAFETY: kill and waitpid on a child of ours; a child already
        // reaped makes them fail harmlessly.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    for (_, path) in &registry.files {
        let _ = std::fs::remove_file(path);
    }
    for (_, path) in &registry.dirs {
        let _ = std::fs::remove_dir_all(path);
    }
}

/// Keeps a registration until dropped (the normal way out cleans up by
/// itself: tables unlink their files, children are waited for).
#[derive(Debug)]
#[must_use = "the registration ends when this is dropped"]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let id = self.0;
        r.files.retain(|e| e.0 != id);
        r.dirs.retain(|e| e.0 != id);
        r.children.retain(|e| e.0 != id);
    }
}

fn register(add: impl FnOnce(&mut Registry, u64)) -> Registered {
    let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    r.next_id += 1;
    let id = r.next_id;
    add(&mut r, id);
    Registered(id)
}

/// Removes `path` (a file, or a directory and all it holds) if a signal
/// ends the process while the registration lives.
pub fn remove_on_exit(path: PathBuf) -> Registered {
    register(|r, id| {
        if path.is_dir() {
            r.dirs.push((id, path));
        } else {
            r.files.push((id, path));
        }
    })
}

/// Kills child `pid` if a signal ends the process while the registration
/// lives.
pub fn kill_on_exit(pid: u32) -> Registered {
    register(|r, id| r.children.push((id, pid)))
}

/// For a child `gear` process whose parent coordinates its stop: ignores
/// SIGINT (the parent closes the table instead) and dies with the parent.
pub fn as_child() {
    // SAFETY: setting SIGINT's disposition to ignore and asking for SIGKILL
    // when the parent dies have no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    }
}
