//! Every `unsafe` operation of gear-cpu, behind small safe types (the
//! hashbrown `raw.rs` split): aligned heap blocks, the two file-system calls
//! libc has no safe wrapper for, and the reads of a table's data area that
//! other threads or processes may be writing.
//!
//! Reads of shared bytes follow the table's seqlock protocol (see
//! `gear_core::slot`): the collector copies without synchronisation, and the
//! table layer decides, by re-reading the slot generation, whether a copy
//! raced with a reuse of the slot and must be discarded. A racing copy
//! yields garbage bytes, never an out-of-bounds access: every address read
//! here is bounds-checked against the data area first.

use gear_core::hint::HUGE_PAGE;
use gear_core::TableView;
use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// Why an aligned allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocFailure {
    /// The size, rounded up to the alignment, exceeds `isize::MAX`.
    TooLarge,
    /// The allocator returned null.
    OutOfMemory,
}

impl AllocFailure {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            AllocFailure::TooLarge => "the size exceeds what one allocation may hold",
            AllocFailure::OutOfMemory => "the allocator is out of memory",
        }
    }
}

/// An owned, zero-initialised heap block with a chosen power-of-two
/// alignment, freed on drop.
pub(crate) struct AlignedBytes {
    /// Invariant: when `len > 0`, `ptr` is either a block from
    /// `alloc_zeroed` with `Layout::from_size_align(len, align)` (when
    /// `mapping` is `None`) or an `align`-aligned address inside the
    /// private anonymous mapping `mapping` names, with `len` bytes of it
    /// from `ptr` on; either is owned by this value. When `len == 0`, `ptr`
    /// is a dangling, `align`-aligned address that is never dereferenced or
    /// freed.
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    /// Start and length of the anonymous mapping holding the block (blocks
    /// of [`HUGE_PAGE`] or more), unmapped on drop.
    mapping: Option<(NonNull<u8>, usize)>,
}

// SAFETY: `AlignedBytes` owns its block exclusively, like a `Vec<u8>`;
// moving it to another thread moves that ownership.
unsafe impl Send for AlignedBytes {}
// SAFETY: `&AlignedBytes` only hands out `&[u8]` or the raw address; shared
// readers of plain bytes are fine, like `&Vec<u8>`.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two),
    /// every page faulted in. Never aborts: failures are returned.
    pub(crate) fn zeroed(len: usize, align: usize) -> Result<Self, AllocFailure> {
        Self::zeroed_with(len, align, true)
    }

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    /// Never aborts: failures are returned.
    ///
    /// Blocks of [`HUGE_PAGE`] or more are a private anonymous mapping
    /// (zero pages from the kernel, so no pass of `memset`) aligned to a
    /// huge page. With `prefault`, the block is advised as huge-page memory
    /// (`MADV_HUGEPAGE`) and every page faulted in (`MADV_POPULATE_WRITE`,
    /// or by writing zeros where the kernel lacks it): where transparent
    /// huge pages are enabled (`always` or `madvise` in
    /// `/sys/kernel/mm/transparent_hugepage/enabled`), the block is then
    /// backed by 2 MiB pages, random reads over it (sampling) miss the TLB
    /// far less often, and no later access pays for a fault. Without
    /// `prefault`, each page is faulted in at its first touch, as an
    /// ordinary page: for a block about to be overwritten whole (a
    /// restore), whose owner may advise huge pages afterwards. (A fresh
    /// huge page can cost far more to fault in than 512 small ones: in a
    /// virtual machine that hands free huge blocks back to its host, each
    /// must be backed again; a restore measured 4x slower with them.)
    pub(crate) fn zeroed_with(len: usize, align: usize, prefault: bool) -> Result<Self, AllocFailure> {
        let layout = Layout::from_size_align(len, align).map_err(|_| AllocFailure::TooLarge)?;
        if len == 0 {
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(align)).ok_or(AllocFailure::TooLarge)?;
            return Ok(AlignedBytes { ptr, len, align, mapping: None });
        }
        if len < HUGE_PAGE {
            // SAFETY: `layout` has a non-zero size (checked above) and a
            // valid power-of-two alignment (`from_size_align` succeeded).
            let p = unsafe { alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(p).ok_or(AllocFailure::OutOfMemory)?;
            return Ok(AlignedBytes { ptr, len, align, mapping: None });
        }
        let align = layout.align().max(HUGE_PAGE);
        // Room to move the start up to the alignment.
        let map_len = len.checked_add(align).filter(|&n| n <= isize::MAX as usize).ok_or(AllocFailure::TooLarge)?;
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks: it replaces no memory of this process.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(AllocFailure::OutOfMemory);
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or(AllocFailure::OutOfMemory)?;
        let skip = (base.as_ptr() as usize).next_multiple_of(align) - base.as_ptr() as usize;
        // SAFETY: `skip < align` and `skip + len <= map_len`: the address
        // lies inside the mapping.
        let ptr = unsafe { base.add(skip) };
        if prefault {
            gear_core::hint::advise_huge_pages(ptr.as_ptr(), len);
            populate(ptr, len);
        }
        Ok(AlignedBytes { ptr, len, align, mapping: Some((base, map_len)) })
    }
    /// Address of the first byte.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (zeroed at
        // allocation, only ever written as bytes), or `len == 0` with a
        // non-null aligned pointer; the borrow of `self` keeps it alive and
        // no `&mut` can coexist.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`; `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if let Some((base, map_len)) = self.mapping {
            // SAFETY: by the field invariant `mapping` is a mapping this
            // value made and owns; it is unmapped once, and no borrow of
            // its bytes outlives `self`.
            unsafe { libc::munmap(base.as_ptr().cast(), map_len) };
        } else if self.len > 0 {
            // SAFETY: by the field invariant the block came from the global
            // allocator with exactly this layout, and is freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, self.align)) };
        }
    }
}

/// Faults in every page of `[ptr, ptr + len)`, a fresh private anonymous
/// mapping of zero pages, without changing a byte.
fn populate(ptr: NonNull<u8>, len: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: MADV_POPULATE_WRITE faults the range in as if written,
        // changing no contents, protection or mapping; the range lies in a
        // mapping this caller owns, and `ptr` is page-aligned (a huge-page
        // multiple).
        let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
        if rc == 0 {
            return;
        }
    }
    // A kernel before 5.14: write the zeros the pages already hold.
    // SAFETY: `ptr` is valid for writes of `len` bytes (the caller's
    // mapping) and nothing else refers to them yet.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
}

/// Reserves `[0, len)` of `file` on its file system (`posix_fallocate`), so
/// later stores into a mapping of it cannot hit a missing page (SIGBUS).
/// Retries on `EINTR`; other failures come back as the raw OS error.
pub(crate) fn fallocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    loop {
        // SAFETY: the descriptor is open for as long as `file` is borrowed;
        // `posix_fallocate` reads and writes no memory of this process.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            e => return Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// Bytes an unprivileged user may still allocate on `file`'s file system,
/// or `None` when the file system reports no limit (a tmpfs mounted with
/// `size=0` reports zero blocks).
pub(crate) fn free_bytes(file: &File) -> io::Result<Option<u64>> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: the descriptor is open while `file` is borrowed, and `st` is
    // valid for writes of one `statvfs`.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fstatvfs` returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field widths differ between targets
    let (blocks, avail, frsize) = (st.f_blocks as u64, st.f_bavail as u64, st.f_frsize as u64);
    Ok((blocks != 0).then(|| avail.saturating_mul(frsize)))
}

/// `bytes` seen as bytes that may be uninitialised, for the gathers, which
/// write their destination and never read it.
///
/// # Safety
/// Only initialised bytes may be written through the returned slice (no
/// `MaybeUninit::uninit()`), so that `bytes` stays initialised. The gathers
/// write copies of table bytes and zeros only.
pub(crate) unsafe fn as_uninit(bytes: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has `u8`'s size and alignment, the borrow is
    // carried over, and the caller writes only initialised bytes.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len()) }
}

/// The host address of a table's data area, shared by the collector's
/// threads for the lifetime `'a` of the table borrow it came from. Copies
/// out of it are bounds-checked against `len`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharedBytes<'a> {
    /// Invariant (from `new`'s contract): valid for reads of `len` bytes
    /// for all of `'a`.
    base: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a [u8]>,
}

// SAFETY: `SharedBytes` is an address plus a length; the memory it names is
// shared memory that any thread may read under the seqlock protocol (module
// doc), so handing the address to another thread adds no new access.
unsafe impl Send for SharedBytes<'_> {}
// SAFETY: see `Send`; `&SharedBytes` only allows the same reads.
unsafe impl Sync for SharedBytes<'_> {}

impl<'a> SharedBytes<'a> {
    /// Wraps `len` bytes at `base`.
    ///
    /// # Safety
    /// * `base` must be valid for reads of `len` bytes for all of `'a`;
    /// * other parties may write the bytes concurrently only under the
    ///   table's seqlock protocol, whose readers discard racing copies.
    pub(crate) unsafe fn new(base: NonNull<u8>, len: usize) -> Self {
        SharedBytes { base, len, _borrow: PhantomData }
    }

    /// The data area a [`TableView`] names, or `None` if it has no host
    /// address.
    pub(crate) fn of_view(view: &TableView<'a>) -> Option<Self> {
        let base = view.host()?;
        // `Layout::new` checked that the data area's size fits a usize.
        let len = usize::try_from(view.layout().total_bytes()).ok()?;
        // SAFETY: a `TableView<'a>` is made by `TableRegion::view`, whose
        // `host` is the data area of a region that holds at least
        // `data_offset + layout.total_bytes()` bytes (checked by
        // `TableRegion::create`/`open`) and stays alive and mapped while the
        // region is borrowed for `'a`. Concurrent writers follow the slot
        // protocol. (`TableView`'s fields are public, so this trusts callers
        // not to build one by hand with a wrong address or layout.)
        Some(unsafe { SharedBytes::new(base, len) })
    }

    /// Starts loading the cache line at `offset` (a hint: an offset past
    /// the area is harmless and loads nothing useful).
    #[inline(always)]
    pub(crate) fn prefetch(&self, offset: usize) {
        gear_core::hint::prefetch(self.base.as_ptr().wrapping_add(offset));
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst` (which may
    /// be uninitialised: it is written, never read).
    ///
    /// Panics if the range runs past the area: callers validate slots,
    /// lengths and windows first, so this only guards the invariant.
    #[inline]
    pub(crate) fn copy_to(&self, offset: usize, dst: &mut [MaybeUninit<u8>]) {
        let end = offset.checked_add(dst.len());
        assert!(
            end.is_some_and(|e| e <= self.len),
            "gather range {offset}+{} outside the {}-byte area",
            dst.len(),
            self.len
        );
        // SAFETY: `[offset, offset + dst.len())` lies inside the area
        // (asserted above), which is readable for all of `'a` (the `new`
        // contract); `dst` is a unique borrow of our own buffer, so the
        // ranges do not overlap. Bytes another process writes concurrently
        // may be torn; the seqlock reader discards such copies (module doc).
        unsafe { gear_core::copy::copy_bytes(self.base.as_ptr().add(offset), dst.as_mut_ptr().cast(), dst.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_bytes_are_aligned_and_zeroed() {
        let cases = [(1, 64), (4097, 4096), (0, 64), (0, 4096), (100, 1), (HUGE_PAGE, 64), (3 * HUGE_PAGE + 5, 4096)];
        // Miri runs the global allocator's path; the huge blocks are mmap
        // and madvise, system calls it cannot make.
        let cases = if cfg!(miri) { &cases[..5] } else { &cases[..] };
        for &(len, align) in cases {
            for prefault in [true, false] {
                let mut b = AlignedBytes::zeroed_with(len, align, prefault).unwrap();
                assert_eq!(b.ptr().as_ptr() as usize % align, 0);
                if len >= HUGE_PAGE {
                    assert_eq!(b.ptr().as_ptr() as usize % HUGE_PAGE, 0, "large blocks start on a huge page");
                }
                assert_eq!(b.len(), len);
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice().fill(7);
                assert!(b.as_slice().iter().all(|&x| x == 7));
            }
        }
        assert_eq!(AlignedBytes::zeroed(usize::MAX - 10, 4096).err(), Some(AllocFailure::TooLarge));
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn shared_copy_is_bounds_checked() {
        let b = AlignedBytes::zeroed(16, 64).unwrap();
        // SAFETY: `b` outlives `s` and nobody writes it.
        let s = unsafe { SharedBytes::new(b.ptr(), b.len()) };
        s.copy_to(8, &mut [MaybeUninit::new(0u8); 9]);
    }

    /// The inlined small copies and the `memcpy` path land exactly the
    /// source bytes for every length around their thresholds, at every
    /// source offset within a line, and write nothing past the destination.
    #[test]
    fn shared_copy_is_exact_for_every_small_length_and_offset() {
        let mut b = AlignedBytes::zeroed(256, 64).unwrap();
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = (i * 7 + 1) as u8;
        }
        // SAFETY: `b` outlives `s` and nobody writes it while `s` lives.
        let s = unsafe { SharedBytes::new(b.ptr(), b.len()) };
        for offset in 0..64 {
            for len in 0..=130 {
                let mut out = vec![0xEEu8; len + 8];
                // SAFETY: `copy_to` writes copies of initialised bytes only.
                s.copy_to(offset, unsafe { as_uninit(&mut out[..len]) });
                assert_eq!(&out[..len], &b.as_slice()[offset..offset + len], "offset {offset} len {len}");
                assert!(out[len..].iter().all(|&x| x == 0xEE), "offset {offset} len {len}: wrote past the end");
            }
        }
    }
}
