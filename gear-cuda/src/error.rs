//! The crate's one error type.

/// Result alias for gear-cuda.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-cuda can refuse or fail at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver, a device or NVRTC is missing or unusable on this
    /// machine. Returned instead of panicking, so callers can fall back to
    /// another backend.
    #[error("cuda backend unavailable: {0}")]
    BackendUnavailable(String),
    /// A gear-core refusal (bad window, slot out of range, stale key, ...).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
    /// A CUDA driver call failed.
    #[error("cuda driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// An NVRTC call other than compilation itself failed.
    #[error("nvrtc: {0}")]
    Nvrtc(String),
    /// A kernel source did not compile; `log` is NVRTC's program log.
    #[error("kernel `{kernel}` does not compile for {arch}: {log}")]
    KernelCompile {
        /// Which kernel source.
        kernel: &'static str,
        /// The `--gpu-architecture` value used.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// An argument that does not fit the call (wrong batch, foreign context,
    /// region without the needed pointer, ...); the message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<Error> for gear_core::Error {
    /// Folds a CUDA error into gear-core's error, for trait methods (the
    /// [`gear_core::Collector`] and [`gear_core::Selector`] impls) whose
    /// signatures return gear-core's type. gear-core errors pass through;
    /// everything else becomes [`gear_core::Error::Region`] with the message,
    /// because gear-core has no variant for a backend failure.
    fn from(e: Error) -> Self {
        match e {
            Error::Core(c) => c,
            other => gear_core::Error::Region(format!("cuda backend: {other}")),
        }
    }
}
