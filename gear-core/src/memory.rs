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

/// Heap bytes as a [`MemoryRegion`], 8-byte aligned: the buffer a
/// transport's reads land in, or a region to expose in tests.
#[derive(Debug)]
pub struct HeapRegion {
    words: Box<[u64]>,
    len: usize,
}

impl HeapRegion {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        HeapRegion { words: vec![0u64; len.div_ceil(8)].into_boxed_slice(), len }
    }

    /// `len` bytes, byte `i` being `byte(i)`.
    pub fn from_fn(len: usize, byte: impl Fn(usize) -> u8) -> Self {
        let mut region = HeapRegion::zeroed(len);
        // SAFETY: the words hold at least `len` bytes, u8 has no alignment
        // needs, and `region` is not shared yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(region.words.as_mut_ptr().cast::<u8>(), len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = byte(i);
        }
        region
    }

    /// The bytes.
    ///
    /// # Safety
    /// Nothing may write the region while the slice lives: a transport that
    /// has it registered writes it while a read into it is in flight, so
    /// call this only once every such read has finished.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the words hold at least `len` bytes and live as long as
        // `self`; the caller promises no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

// SAFETY: the boxed words live as long as the value and `host_ptr` points
// at their first byte, 8-byte aligned, with at least `len()` bytes behind it.
unsafe impl MemoryRegion for HeapRegion {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn alignment(&self) -> u64 {
        8
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        std::ptr::NonNull::new(self.words.as_ptr() as *mut u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_regions_hold_their_bytes_aligned() {
        let r = HeapRegion::from_fn(13, |i| i as u8 * 3);
        assert_eq!((r.len(), r.alignment(), r.kind()), (13, 8, MemoryKind::Host));
        assert_eq!(r.host_ptr().unwrap().as_ptr() as usize % 8, 0);
        // SAFETY: nothing else holds the region.
        assert_eq!(unsafe { r.bytes() }, (0..13).map(|i| i * 3).collect::<Vec<u8>>().as_slice());
        assert!(HeapRegion::zeroed(0).is_empty());
    }
}
