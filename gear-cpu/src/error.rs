//! The error type of gear-cpu: gear-core's errors plus what files, shared
//! memory and host allocations can refuse. Messages are lowercase and say
//! what was expected and what came.

use std::path::PathBuf;

/// Result alias for gear-cpu.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-cpu can refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the shared vocabulary (specs, layouts, windows, slots).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
    /// A pool of zero bytes was asked for.
    #[error("pool size is zero: a pool needs at least one byte")]
    ZeroSize,
    /// Host memory could not be allocated.
    #[error("cannot allocate {bytes} bytes of host memory aligned to {align}: {reason}")]
    Alloc {
        /// Bytes asked for.
        bytes: u64,
        /// Alignment asked for.
        align: u64,
        /// Why the allocator refused.
        reason: &'static str,
    },
    /// A shared-memory name outside `[A-Za-z0-9._-]{1,255}`, or `.`/`..`.
    #[error("invalid shared memory name `{name}`: {reason}")]
    InvalidName {
        /// The name given (escaped for printing).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `create` on a name that already exists.
    #[error(
        "shared memory `{name}` already exists in {} (open it with ShmPool::open, or remove it with ShmPool::unlink)",
        .dir.display()
    )]
    Exists {
        /// The name.
        name: String,
        /// The directory searched.
        dir: PathBuf,
    },
    /// `open` on a name that does not exist.
    #[error("shared memory `{name}` not found in {}", .dir.display())]
    NotFound {
        /// The name.
        name: String,
        /// The directory searched.
        dir: PathBuf,
    },
    /// `open` on a file of zero bytes (its creator has not sized it yet).
    #[error("shared memory `{name}` in {} is empty (its creator has not sized it yet, or it is not a pool)", .dir.display())]
    Empty {
        /// The name.
        name: String,
        /// The directory.
        dir: PathBuf,
    },
    /// The file system holding the pool has too little free space.
    #[error(
        "{} is too small: shared memory `{name}` needs {needed} bytes, {} \
         (enlarge it, e.g. `docker run --shm-size`, or create the pool in another directory)",
        .dir.display(),
        .available.map_or_else(|| "fewer are free".to_owned(), |a| format!("only {a} are free"))
    )]
    NoSpace {
        /// The name.
        name: String,
        /// The directory.
        dir: PathBuf,
        /// Bytes the pool needs.
        needed: u64,
        /// Bytes the file system reported free, when it reports a limit.
        available: Option<u64>,
    },
    /// Every process lease of a shared table is taken.
    #[error(
        "shared table has {max} process leases and all are held: at most {max} processes can have it open at once"
    )]
    Leases {
        /// Leases a table has.
        max: usize,
    },
    /// A system call on a file failed.
    #[error("cannot {op} {}: {source}", .path.display())]
    Io {
        /// What was attempted ("open", "map", "reserve space for", ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }

    /// The gear-core error inside, if this is one.
    pub fn as_core(&self) -> Option<&gear_core::Error> {
        match self {
            Error::Core(e) => Some(e),
            _ => None,
        }
    }
}
