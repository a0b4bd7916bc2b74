//! The error type of gear-api. Backend errors are boxed so this enum needs
//! no cfg-gated variants (candle's `Error::Cuda(Box<..>)` pattern).

use std::time::Duration;

/// Result alias for gear-api.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the public API can refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Specs, keys, steps, windows and priorities (from gear-core).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
    /// A backend (CPU pools and collector, CUDA, RDMA) failed.
    #[error("backend: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A wait ran out.
    #[error(
        "timed out after {:.1} s waiting to {op}{}",
        .waited.as_secs_f64(),
        .holder.as_ref().map(|h| format!(" (the table lock is held by {h})")).unwrap_or_default()
    )]
    Timeout {
        /// What was being waited for.
        op: &'static str,
        /// How long the call waited.
        waited: Duration,
        /// Who held the table lock, when the wait was for the lock.
        holder: Option<String>,
    },
    /// The shared region holds what no correct process writes, and it
    /// cannot be repaired from the slot records.
    #[error("shared table is corrupted: {0}")]
    Corrupted(String),
    /// A shared table was created under a name already taken.
    #[error("shared memory `{name}` already exists in {}: {holder}", .dir.display())]
    TableExists {
        /// The name.
        name: String,
        /// The directory.
        dir: std::path::PathBuf,
        /// What holds the name, and what to do about it.
        holder: String,
    },
    /// No shared table of that name exists.
    #[error(
        "shared table `{name}` not found in {} ({})",
        .dir.display(),
        if .existing.is_empty() {
            "no GEAR tables are there".to_owned()
        } else {
            format!("tables there: {}", .existing.join(", "))
        }
    )]
    TableNotFound {
        /// The name asked for.
        name: String,
        /// The directory searched.
        dir: std::path::PathBuf,
        /// The names of the GEAR tables that are there.
        existing: Vec<String>,
    },
    /// The table was closed while or before waiting.
    #[error("table is closed")]
    Closed,
    /// The process that created the shared table is gone.
    #[error("the server process of shared table `{name}` is gone")]
    ServerGone {
        /// The table's name.
        name: String,
    },
    /// No slot can be had: every slot holds a trajectory still being written.
    #[error("table is full: all {capacity} slots hold trajectories still being written")]
    TableFull {
        /// Table capacity.
        capacity: u64,
    },
    /// A builder or sampler configuration that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A trajectory writer used in a way its protocol does not allow.
    #[error("trajectory: {0}")]
    Trajectory(String),
    /// Sampled data that does not hold what was written.
    #[error("sampled data failed its integrity check: {0}")]
    Integrity(String),
    /// A checkpoint that cannot be restored (truncated, corrupted, of
    /// another format version or another spec) or written.
    #[error("checkpoint `{}`: {problem}", .path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Reading or writing a checkpoint file failed.
    #[error("checkpoint `{}`: cannot {op}: {source}", .path.display())]
    CheckpointIo {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Sampled rows kept being overwritten by writers while copying.
    #[error("sampled rows were overwritten while copying {attempts} times in a row; the table is evicting faster than it can be read")]
    Torn {
        /// Attempts made.
        attempts: u32,
    },
}

impl From<gear_cpu::Error> for Error {
    fn from(e: gear_cpu::Error) -> Self {
        match e {
            gear_cpu::Error::Core(c) => Error::Core(c),
            other => Error::Backend(Box::new(other)),
        }
    }
}

impl From<gear_sampler::Error> for Error {
    fn from(e: gear_sampler::Error) -> Self {
        Error::Config(e.to_string())
    }
}

impl Error {
    /// A [`gear_core::Collector`]'s error: gear-core refusals keep their
    /// variant, a known backend's error converts as its `From` says, and
    /// anything else is boxed as [`Error::Backend`].
    pub(crate) fn from_collector<E: std::error::Error + Send + Sync + 'static>(e: E) -> Self {
        let e: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
        let e = match e.downcast::<gear_core::Error>() {
            Ok(core) => return Error::Core(*core),
            Err(e) => e,
        };
        let e = match e.downcast::<gear_device::Error>() {
            Ok(dev) => match *dev {
                gear_device::Error::Core(c) => return Error::Core(c),
                other => Box::new(other),
            },
            Err(e) => e,
        };
        #[cfg(feature = "cuda")]
        let e = match e.downcast::<gear_cuda::Error>() {
            Ok(cuda) => return Error::from(*cuda),
            Err(e) => e,
        };
        Error::Backend(e)
    }
}
