//! The error type of gear-rdma.

/// Result alias for gear-rdma.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-rdma can refuse or fail with.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// No usable RDMA device here (no libibverbs, no device, port down, or
    /// the crate built without the `rdma` feature).
    #[error("rdma unavailable: {0}")]
    Unavailable(String),
    /// A verb failed; `op` names it (`ibv_reg_mr`, `ibv_modify_qp(RTR)`, ...).
    #[error("{op} failed: {reason}")]
    Verbs {
        /// The verb.
        op: &'static str,
        /// What the library or the device said.
        reason: String,
    },
    /// An error of the shared vocabulary (bounds, descriptors, handles,
    /// timeouts, failed reads).
    #[error(transparent)]
    Core(#[from] gear_core::Error),
}

impl Error {
    /// A failed verb.
    pub(crate) fn verbs(op: &'static str, reason: impl std::fmt::Display) -> Self {
        Error::Verbs { op, reason: reason.to_string() }
    }
}

impl From<Error> for gear_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Unavailable(why) => gear_core::Error::TransportUnavailable(format!("rdma: {why}")),
            Error::Verbs { .. } => gear_core::Error::Transport(format!("rdma: {e}")),
            Error::Core(core) => core,
        }
    }
}
