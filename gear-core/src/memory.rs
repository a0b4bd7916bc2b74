//! Memory regions: the bytes a table (or a batch) lives in, whichever
//! backend provides them.

/// Where a region's bytes physically are and who can reach them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Process-private host memory.
    Host,
    /// Host memory shared between processes (a named mapping).
    Shared,
    /// Page-locked host memory mapped into a device's address space.
    Pinned,
    /// Device (GPU) memory; no host pointer.
    Device,
}

impl MemoryKind {
    /// A short lowercase name for messages ("host memory", ...).
    pub const fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host memory",
            MemoryKind::Shared => "shared memory",
            MemoryKind::Pinned => "pinned memory",
            MemoryKind::Device => "device memory",
        }
    }
}

/// A contiguous range of bytes with a host pointer, a device pointer, or
/// both (pinned memory mapped for the device has both).
///
/// # Safety
/// Implementors promise that, for as long as the value lives, `host_ptr()`
/// (when `Some`) points to `len()` bytes that are readable and writable from
/// this process, aligned to `alignment()`, and that `device_ptr()` (when
/// `Some`) is a device address of `len()` bytes. The bytes may be changed by
/// other threads or processes at any time (they are shared memory): users
/// synchronise through the table's slot protocol, never through `&`/`&mut`.
pub unsafe trait MemoryRegion: Send + Sync {
    /// What kind of memory this is.
    fn kind(&self) -> MemoryKind;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// Whether the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Guaranteed alignment of the first byte.
    fn alignment(&self) -> u64;
    /// Host address of the first byte, if the host can reach the bytes.
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>>;
    /// Device address of the first byte, if a device can reach the bytes.
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    /// The name another process attaches by, for shared regions.
    fn name(&self) -> Option<&str> {
        None
    }
}

// SAFETY: forwarding to the boxed region keeps every promise it made.
unsafe impl<R: MemoryRegion + ?Sized> MemoryRegion for Box<R> {
    fn kind(&self) -> MemoryKind {
        (**self).kind()
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn alignment(&self) -> u64 {
        (**self).alignment()
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        (**self).host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        (**self).device_ptr()
    }
    fn name(&self) -> Option<&str> {
        (**self).name()
    }
}
