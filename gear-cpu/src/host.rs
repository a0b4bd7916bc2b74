//! Process-private host memory.

use crate::error::{Error, Result};
use crate::raw::AlignedBytes;
use gear_core::{MemoryKind, MemoryRegion};
use std::ptr::NonNull;

/// Alignment of every [`HostPool`]: one page.
pub const HOST_POOL_ALIGN: u64 = 4096;

/// Page-aligned, zeroed heap memory private to this process, freed on drop.
pub struct HostPool {
    bytes: AlignedBytes,
}

impl HostPool {
    /// Allocates `bytes` zeroed bytes aligned to [`HOST_POOL_ALIGN`].
    /// Zero bytes, a size that does not fit this machine, or an allocator
    /// failure are errors (never an abort).
    pub fn new(bytes: u64) -> Result<Self> {
        Self::with_prefault(bytes, true)
    }

    /// Like [`HostPool::new`], but pages are left to be faulted in (and
    /// cleared by the kernel) at their first touch, as ordinary pages,
    /// instead of all up front as huge pages: for a pool about to be filled
    /// whole, such as a table being restored from a checkpoint, where the
    /// fill would otherwise be a second pass over every byte. Advise huge
    /// pages once it is filled ([`gear_core::hint::advise_huge_pages`]) to
    /// let the kernel merge them in the background.
    pub fn unpopulated(bytes: u64) -> Result<Self> {
        Self::with_prefault(bytes, false)
    }

    fn with_prefault(bytes: u64, prefault: bool) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::ZeroSize);
        }
        let alloc_err = |reason: &'static str| Error::Alloc { bytes, align: HOST_POOL_ALIGN, reason };
        let len =
            usize::try_from(bytes).map_err(|_| alloc_err("the size does not fit this machine's address space"))?;
        let bytes =
            AlignedBytes::zeroed_with(len, HOST_POOL_ALIGN as usize, prefault).map_err(|f| alloc_err(f.reason()))?;
        Ok(HostPool { bytes })
    }
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPool").field("len", &self.bytes.len()).finish()
    }
}

// SAFETY: the block is owned by `self` and lives until drop; it holds
// `len()` readable and writable bytes, aligned to `HOST_POOL_ALIGN`
// (`AlignedBytes` invariant, with a non-zero length checked in `new`).
unsafe impl MemoryRegion for HostPool {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn alignment(&self) -> u64 {
        HOST_POOL_ALIGN
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.bytes.ptr())
    }
}
