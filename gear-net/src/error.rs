//! The crate's error type.

/// What can go wrong serving or reaching a shard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The replay table refused or failed.
    #[error(transparent)]
    Table(#[from] gear_api::Error),
    /// A spec, window or key was invalid.
    #[error(transparent)]
    Core(#[from] gear_core::Error),
    /// A configuration that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The transport failed (connect, TLS, listen).
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A shard answered with an error status.
    #[error("shard {shard}: {}: {}", status.code(), status.message())]
    Status {
        /// The shard's index in the cluster config.
        shard: usize,
        /// What it answered.
        status: Box<tonic::Status>,
    },
    /// A shard's reply broke the protocol (wrong sizes, counts, ids).
    #[error("shard {shard} sent a malformed reply: {what}")]
    Malformed {
        /// The shard's index in the cluster config.
        shard: usize,
        /// What was wrong.
        what: String,
    },
    /// No shard could serve the call.
    #[error("no live shard: {0}")]
    NoShard(String),
    /// The operation cannot keep its semantics across shards.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An insert failed part way. The trajectories listed (index in the
    /// list given to `insert`, and key) were committed and stay; the others
    /// were not stored (a trajectory is never stored in part).
    #[error("insert failed after {} trajectories were committed: {source}", committed.len())]
    PartialInsert {
        /// Index and key of each committed trajectory, in index order.
        committed: Vec<(usize, crate::client::RemoteKey)>,
        /// Why the rest failed.
        source: Box<Error>,
    },
    /// The blocking `ClusterClient` was called on a thread inside a tokio
    /// runtime, where blocking would stall the runtime.
    #[error(
        "the blocking ClusterClient was called inside a tokio runtime, where it would block the runtime; \
         use AsyncClusterClient (ClusterClient::as_async) in async code"
    )]
    InsideRuntime,
    /// An I/O error (sockets, runtime).
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
