//! The crate's one error type: what the CPU device reports. (The generic
//! parts of the crate return their device's error, `A::Error`.)

/// Result alias for gear-device.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the CPU device can refuse or fail at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A gear-core refusal (bad window, slot out of range, ...).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
    /// The device cannot run here (built without a C++ compiler, no
    /// thread for a stream); the message says why.
    #[error("cpu device unavailable: {0}")]
    Unavailable(String),
    /// A call that breaks the device's ordering rules (use after free, a
    /// read before the event, an unordered write); the message names both
    /// operations. Returned under `OnMisuse::Record`; the default panics.
    #[error("cpu device misuse: {0}")]
    Misuse(String),
    /// An argument that does not fit the call; the message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A failure injected with `CpuDevice::fail_next`.
    #[error("injected failure: {0}")]
    Injected(String),
}
