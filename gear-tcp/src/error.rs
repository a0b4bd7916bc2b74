//! The error type of gear-tcp.

/// Result alias for gear-tcp.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-tcp can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting that cannot work (chunk size, header values).
    #[error("invalid tcp transport configuration: {0}")]
    Config(String),
    /// The runtime or a socket could not be set up.
    #[error("tcp transport i/o: {0}")]
    Io(#[from] std::io::Error),
    /// An error of the shared vocabulary (bounds, descriptors, handles,
    /// timeouts, failed reads).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
}

impl From<Error> for gear_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(core) => core,
            other => gear_core::Error::Transport(format!("tcp: {other}")),
        }
    }
}
