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
    /// The host address and length of the whole region, for a transport
    /// that reads into it or exposes it: `Unsupported(unsupported)` when
    /// the host cannot reach the bytes, `Region` when the length does not
    /// fit a `usize`.
    fn host_span(&self, unsupported: &'static str) -> crate::Result<(std::ptr::NonNull<u8>, usize)> {
        let ptr = self.host_ptr().ok_or(crate::Error::Unsupported(unsupported))?;
        let len = usize::try_from(self.len())
            .map_err(|_| crate::Error::Region(format!("region of {} bytes is too large", self.len())))?;
        Ok((ptr, len))
    }
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

// SAFETY: forwarding to the shared region keeps every promise it made;
// each clone keeps the region (and so its bytes) alive.
unsafe impl<R: MemoryRegion + ?Sized> MemoryRegion for std::sync::Arc<R> {
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

/// The unit a [`HeapRegion`] is allocated in: a cache line.
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// Heap bytes as a [`MemoryRegion`], aligned to a cache line (64 bytes, so
/// a table can be laid out in it): the buffer a transport's reads land in,
/// or a region to expose or hold a table in tests.
///
/// The bytes are a raw allocation that no Rust reference ever covers, so
/// writing them through [`host_ptr`](MemoryRegion::host_ptr) (a transport's
/// receiving thread, a NIC, the in-process verbs) while the region is
/// shared behind `&self` or an `Arc` is sound: a `Box<[u64]>` would make
/// such writes undefined behaviour (its bytes are immutable behind `&`).
pub struct HeapRegion {
    /// Start of `lines` zeroed cache lines from the global allocator, or a
    /// dangling (aligned) pointer when `lines` is 0. Only ever accessed
    /// through raw pointers.
    ptr: std::ptr::NonNull<CacheLine>,
    /// Allocated cache lines: `len.div_ceil(64)`.
    lines: usize,
    /// Bytes the region reports.
    len: usize,
}

// SAFETY: the allocation is owned by the value and freed only in `drop`;
// every access goes through raw pointers whose users synchronise as
// `MemoryRegion` says (the region's bytes may change at any time).
unsafe impl Send for HeapRegion {}
// SAFETY: see `Send`; `&HeapRegion` gives no safe access to the bytes.
unsafe impl Sync for HeapRegion {}

impl std::fmt::Debug for HeapRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRegion").field("addr", &self.ptr).field("len", &self.len).finish()
    }
}

impl HeapRegion {
    fn layout(lines: usize) -> std::alloc::Layout {
        // More than `isize::MAX` bytes is more than the address space; that
        // aborts like any failed allocation would.
        std::alloc::Layout::array::<CacheLine>(lines)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<CacheLine>()))
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let lines = len.div_ceil(64);
        if lines == 0 {
            return HeapRegion { ptr: std::ptr::NonNull::dangling(), lines, len };
        }
        let layout = Self::layout(lines);
        // SAFETY: `layout` has a non-zero size (lines > 0).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw.cast::<CacheLine>()) else { std::alloc::handle_alloc_error(layout) };
        HeapRegion { ptr, lines, len }
    }

    /// `len` bytes, byte `i` being `byte(i)`.
    pub fn from_fn(len: usize, byte: impl Fn(usize) -> u8) -> Self {
        let region = HeapRegion::zeroed(len);
        let bytes = region.ptr.as_ptr().cast::<u8>();
        for i in 0..len {
            // SAFETY: the allocation holds at least `len` bytes, u8 has no
            // alignment needs, and `region` is not shared yet.
            unsafe { bytes.add(i).write(byte(i)) };
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
        // SAFETY: the allocation holds at least `len` initialised (zeroed
        // or written) bytes and lives as long as `self`; the caller
        // promises no concurrent writer for the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>(), self.len) }
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        if self.lines > 0 {
            // SAFETY: `ptr` was allocated in `zeroed` with this layout and
            // is freed once, here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), Self::layout(self.lines)) };
        }
    }
}

// SAFETY: the allocation lives as long as the value and `host_ptr` points
// at its first byte, 64-byte aligned, with at least `len()` bytes behind
// it, readable and writable through that pointer whatever references to
// the `HeapRegion` exist (no reference covers the bytes).
unsafe impl MemoryRegion for HeapRegion {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn alignment(&self) -> u64 {
        std::mem::align_of::<CacheLine>() as u64
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        Some(self.ptr.cast::<u8>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_regions_hold_their_bytes_aligned() {
        let r = HeapRegion::from_fn(13, |i| i as u8 * 3);
        assert_eq!((r.len(), r.alignment(), r.kind()), (13, 64, MemoryKind::Host));
        assert_eq!(r.host_ptr().unwrap().as_ptr() as usize % 64, 0);
        assert_eq!(HeapRegion::zeroed(0).host_ptr().unwrap().as_ptr() as usize % 64, 0);
        // SAFETY: nothing else holds the region.
        assert_eq!(unsafe { r.bytes() }, (0..13).map(|i| i * 3).collect::<Vec<u8>>().as_slice());
        assert!(HeapRegion::zeroed(0).is_empty());
    }

    /// What a transport does: write through `host_ptr` while the region is
    /// shared (here behind an `Arc` and a live `&`), then read it back once
    /// the write finished. Under Miri this fails for a region whose bytes
    /// sit behind a shared reference without interior mutability.
    #[test]
    fn writes_through_the_host_pointer_of_a_shared_region_are_sound() {
        let region = std::sync::Arc::new(HeapRegion::zeroed(20));
        let shared: &HeapRegion = &region;
        let writer = std::sync::Arc::clone(&region);
        let p = writer.host_ptr().unwrap().as_ptr();
        // SAFETY: 20 bytes lie behind `p`; nothing reads them meanwhile.
        unsafe {
            p.add(3).write(7);
            std::ptr::copy_nonoverlapping([1u8, 2, 3].as_ptr(), p.add(17), 3);
        }
        // SAFETY: the writes above finished.
        let bytes = unsafe { shared.bytes() };
        assert_eq!((bytes[3], &bytes[17..]), (7, &[1u8, 2, 3][..]));
        assert_eq!(bytes.iter().map(|&b| u32::from(b)).sum::<u32>(), 13);
        // A thread writes while this one holds the region, as gear-tcp's
        // receiving task does.
        let thread_writer = std::sync::Arc::clone(&region);
        std::thread::spawn(move || {
            // SAFETY: the region lives in the `Arc` the thread holds, and
            // no one reads byte 0 until the thread is joined.
            unsafe { thread_writer.host_ptr().unwrap().as_ptr().write(9) }
        })
        .join()
        .unwrap();
        // SAFETY: the writing thread was joined.
        assert_eq!(unsafe { region.bytes() }[0], 9);
        drop(writer);
    }
}
