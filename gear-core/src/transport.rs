//! The transport trait: batched one-sided reads of byte ranges from a
//! remote region (another server's shard) into a local region, the way
//! RDMA READs work. Implementations: RDMA in gear-rdma; TCP later.

use crate::error::{Error, Result};
use crate::memory::MemoryRegion;

/// What a reader needs to know about a remote region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Which shard (server) holds it.
    pub shard: u32,
    /// Remote virtual address of the first byte.
    pub addr: u64,
    /// Size in bytes.
    pub len: u64,
    /// Access key the remote side registered the region with.
    pub rkey: u32,
}

/// One read: `len` bytes at `remote_offset` into `local_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOp {
    /// Offset in the remote region.
    pub remote_offset: u64,
    /// Offset in the local region.
    pub local_offset: u64,
    /// Bytes to read.
    pub len: u64,
}

/// Batched one-sided reads.
pub trait Transport: Send + Sync {
    /// Performs every read in `ops`, returning when all have landed.
    fn read(&self, remote: &RemoteRegion, ops: &[ReadOp], local: &dyn MemoryRegion) -> Result<()>;
}

/// Checks that every op lies inside both regions (transports call this
/// before posting anything, so a bad op harms nothing).
pub fn check_read_ops(remote_len: u64, local_len: u64, ops: &[ReadOp]) -> Result<()> {
    for (i, op) in ops.iter().enumerate() {
        let r_end = op.remote_offset.checked_add(op.len);
        let l_end = op.local_offset.checked_add(op.len);
        if r_end.is_none_or(|e| e > remote_len) || l_end.is_none_or(|e| e > local_len) {
            return Err(Error::Region(format!(
                "read op {i} ({} bytes, remote {} of {remote_len}, local {} of {local_len}) is out of bounds",
                op.len, op.remote_offset, op.local_offset
            )));
        }
    }
    Ok(())
}
