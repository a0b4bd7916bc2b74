//! The error type of gear-core, shared in spirit by every backend: messages
//! are lowercase and say what was expected and what came.

/// Result alias for gear-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything gear-core can refuse.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A table or column spec is not valid; the message names the field.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    /// A size computation overflowed 64 bits.
    #[error("size overflow: {0} does not fit in 64 bits")]
    SizeOverflow(String),
    /// A dtype name that is not one of ours.
    #[error(
        "unknown dtype `{0}` (expected one of bool, u8, i8, i16, i32, i64, f16, bf16, f32, f64, or NumPy's names: \
         uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)"
    )]
    UnknownDType(String),
    /// A column name that the table does not have.
    #[error("unknown column `{0}`")]
    UnknownColumn(String),
    /// A column index outside the spec.
    #[error("column index {index} out of range: the table has {count} columns")]
    ColumnIndex {
        /// The index given.
        index: usize,
        /// How many columns the spec has.
        count: usize,
    },
    /// Step data whose byte length does not match the column.
    #[error("column `{column}`: step has {got} bytes, spec needs {expected}")]
    StepSize {
        /// Column name.
        column: String,
        /// Bytes given.
        got: u64,
        /// Bytes per step in the spec.
        expected: u64,
    },
    /// Step data whose dtype does not match the column.
    #[error("column `{column}`: step has dtype {got}, spec needs {expected}")]
    StepDType {
        /// Column name.
        column: String,
        /// Dtype given.
        got: crate::DType,
        /// Dtype in the spec.
        expected: crate::DType,
    },
    /// Step data whose shape does not match the column.
    #[error("column `{column}`: step has shape {got:?}, spec needs {expected:?}")]
    StepShape {
        /// Column name.
        column: String,
        /// Shape given.
        got: Vec<u64>,
        /// Shape in the spec.
        expected: Vec<u64>,
    },
    /// A step was given with the wrong number of columns.
    #[error("step has {got} columns, table has {expected}")]
    StepColumns {
        /// Columns given.
        got: usize,
        /// Columns in the spec.
        expected: usize,
    },
    /// Appending would make the trajectory longer than the table allows.
    #[error("trajectory would exceed the maximum length of {max_len} steps (column `{column}`)")]
    TrajectoryTooLong {
        /// The column that overflowed.
        column: String,
        /// T, the table's maximum trajectory length.
        max_len: u64,
    },
    /// A key whose slot has since been reused or freed.
    #[error("stale key: slot {slot} generation {generation} is no longer current")]
    StaleKey {
        /// The slot.
        slot: u32,
        /// The generation the key carried.
        generation: u32,
    },
    /// A slot index beyond capacity.
    #[error("slot {slot} out of range: capacity is {capacity}")]
    SlotOutOfRange {
        /// The slot.
        slot: u64,
        /// Table capacity.
        capacity: u64,
    },
    /// An operation not allowed in the slot's current state.
    #[error("slot {slot}: cannot {op} in state {state}")]
    SlotState {
        /// The slot.
        slot: u32,
        /// What was attempted.
        op: &'static str,
        /// The state it was in.
        state: crate::SlotState,
    },
    /// A priority that is negative, NaN or infinite.
    #[error("invalid priority {0}: priorities must be finite and non-negative")]
    InvalidPriority(f64),
    /// A finite priority too large for the strategy: `p^alpha` would
    /// overflow its sums.
    #[error(
        "priority {priority:e} is too large: with alpha {alpha}, priorities above {limit:e} overflow the sum tree"
    )]
    PriorityTooLarge {
        /// The priority given.
        priority: f64,
        /// The strategy's exponent.
        alpha: f64,
        /// The largest priority the strategy accepts.
        limit: f64,
    },
    /// A key given to a strategy twice, or unknown to it.
    #[error("selection: {0}")]
    Selection(String),
    /// Nothing can be sampled right now.
    #[error("nothing to sample: {0}")]
    Empty(String),
    /// A window spec that cannot be satisfied.
    #[error("invalid window: {0}")]
    InvalidWindow(String),
    /// A region header or encoded spec that cannot be read.
    #[error("cannot decode table header: {0}")]
    Decode(String),
    /// An attacher expected a different spec than the region holds.
    #[error("spec mismatch: the table holds {found}, expected {expected}")]
    SpecMismatch {
        /// The spec the attacher asked for, summarised.
        expected: String,
        /// The spec stored in the region, summarised.
        found: String,
    },
    /// A memory region too small or unsuitable for the table.
    #[error("memory region: {0}")]
    Region(String),
    /// A buffer too small for what must go in it.
    #[error("buffer too small: {what} needs {needed} bytes, has {got}")]
    BufferTooSmall {
        /// Which buffer.
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        got: u64,
    },
    /// A transport that cannot run on this machine (no device, no driver
    /// library); the message says what is missing.
    #[error("transport unavailable: {0}")]
    TransportUnavailable(String),
    /// A transport operation that failed (a verb, a connection); the
    /// message names the transport and the operation.
    #[error("transport failure: {0}")]
    Transport(String),
    /// A remote-region descriptor or endpoint (from the network) that is
    /// malformed or does not match; the message names the field.
    #[error("invalid descriptor: {0}")]
    Descriptor(String),
    /// A transport handle (buffer, connection, ticket) that this transport
    /// did not issue or has already released.
    #[error("invalid handle: {0}")]
    InvalidHandle(String),
    /// A resource still in use (a buffer with reads in flight).
    #[error("busy: {0}")]
    Busy(String),
    /// A bounded resource is used up (a server's queue pairs, a completion
    /// queue's room); the message names the bound. Try later, or another
    /// way (the shard-gather data plane).
    #[error("exhausted: {0}")]
    Exhausted(String),
    /// Remote reads that failed after the transport's retries.
    #[error("remote read from shard {shard} failed: {} of {total_ops} ops ({reason})", .failed.len())]
    RemoteRead {
        /// The shard read from.
        shard: u32,
        /// Indices (into the posted `ops`) of the ops whose bytes did not
        /// land; the other ops' bytes are valid.
        failed: Vec<u32>,
        /// How many ops the batch had.
        total_ops: u64,
        /// The first failure's cause, as the transport reported it.
        reason: String,
    },
    /// A wait that reached its deadline first; what it waited for is still
    /// in flight.
    #[error("timed out: {0}")]
    Timeout(String),
    /// An optional capability this backend does not have.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A device operation given arguments that do not fit it (a buffer of
    /// another size, a stream of another device); the message says which.
    #[error("device: {0}")]
    Device(String),
}
