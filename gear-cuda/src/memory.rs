//! Memory the GPU can reach, each a [`gear_core::MemoryRegion`]:
//!
//! * [`DeviceMemory`]: `cuMemAlloc`; kind `Device`, no host pointer.
//! * [`PinnedMemory`]: `cuMemHostAlloc(DEVICEMAP | PORTABLE)`; kind
//!   `Pinned`, a host pointer and a device pointer to the same bytes.
//! * [`RegisteredRegion`]: any host region (a shared-memory table that actor
//!   processes write, say) page-locked in place by
//!   `cuMemHostRegister(DEVICEMAP | PORTABLE | READ_ONLY)`; keeps the wrapped region's
//!   kind and name and gains a device pointer, so kernels read it with no
//!   copy.
//!
//! Release order: each value holds an `Arc` of its context, dropped after
//! the memory is released, so the context outlives every allocation; a
//! registered region is unregistered before the wrapped region (and its
//! memory) is dropped. These types do not wait for queued device work when
//! dropped: their owners do ([`crate::CudaBatch`], [`crate::DeviceCache`]
//! and [`crate::DevicePriorities`] wait for their own queued work first);
//! callers who queue work on raw memory keep it alive until that work
//! completes. (A registered region is also only dropped with its table.)

use crate::error::{Error, Result};
use crate::ffi;
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use gear_core::{MemoryKind, MemoryRegion};
use std::ptr::NonNull;
use std::sync::Arc;

fn to_usize(bytes: u64, what: &str) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::InvalidArgument(format!("{what}: {bytes} bytes do not fit in usize")))
}

/// Releases memory in a `Drop`: makes `ctx` current directly (not through
/// `CudaContext::bind_to_thread`, which first returns, and clears, any error
/// an earlier call recorded on the context, so a release guarded by it would
/// be skipped), then runs `free` whatever happened. Failures are logged
/// (`tracing`, warn level), since a drop cannot return them.
fn release(ctx: &CudaContext, what: &str, free: impl FnOnce() -> std::result::Result<(), DriverError>) {
    // SAFETY: `ctx` is alive (the caller holds it), so its CUcontext is valid.
    let set = unsafe { ffi::set_current(ctx.cu_ctx()) };
    for failure in release_with(set, free, what) {
        tracing::warn!("{failure}");
    }
}

/// [`release`]'s logic: `free` runs even when making the context current
/// failed. Returns the failures.
fn release_with<E: std::fmt::Display>(
    set_current: std::result::Result<(), E>,
    free: impl FnOnce() -> std::result::Result<(), E>,
    what: &str,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Err(e) = set_current {
        failures.push(format!("{what}: making the context current failed ({e}); releasing anyway"));
    }
    if let Err(e) = free() {
        failures.push(format!("{what} failed: {e}; the memory may leak"));
    }
    failures
}

/// The largest power of two (up to a page) dividing `addr`.
fn alignment_of(addr: u64) -> u64 {
    if addr == 0 {
        4096
    } else {
        (1u64 << addr.trailing_zeros()).min(4096)
    }
}

/// Device memory from `cuMemAlloc`. A zero-length allocation holds no memory
/// and reports device address 0.
pub struct DeviceMemory {
    /// Device address; 0 iff `len == 0`.
    ptr: u64,
    len: u64,
    /// Declared last: dropped after `Drop::drop` freed `ptr`.
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory").field("ptr", &format_args!("{:#x}", self.ptr)).field("len", &self.len).finish()
    }
}

impl DeviceMemory {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: u64) -> Result<Self> {
        let n = to_usize(bytes, "device allocation")?;
        let ptr = if n == 0 {
            0
        } else {
            ctx.bind_to_thread()?;
            // SAFETY: the driver was probed (a context exists) and the
            // context is current on this thread.
            unsafe { ffi::device_alloc(n) }?
        };
        Ok(DeviceMemory { ptr, len: bytes, ctx: ctx.clone() })
    }

    /// Device address of the first byte (0 for an empty allocation).
    pub fn device_addr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn check_range(&self, offset: u64, bytes: usize, what: &str) -> Result<()> {
        if offset.checked_add(bytes as u64).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidArgument(format!(
                "{what}: bytes {offset}..{} outside the {}-byte device buffer",
                offset.saturating_add(bytes as u64),
                self.len
            )));
        }
        Ok(())
    }

    /// Copies `src` to `offset` and waits for the copy (ordered after all
    /// work already queued on the context's null stream only: callers
    /// synchronise their own streams first).
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len(), "write")?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `src` is a live slice; the destination range was checked
        // against this allocation; the context is current.
        unsafe { ffi::copy_htod(self.ptr + offset, src.as_ptr(), src.len()) }?;
        Ok(())
    }

    /// Copies bytes from `offset` into `dst` and waits for the copy (see
    /// [`DeviceMemory::write`] for ordering).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len(), "read")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `dst` is a live, writable slice; the source range was
        // checked; the context is current.
        unsafe { ffi::copy_dtoh(dst.as_mut_ptr(), self.ptr + offset, dst.len()) }?;
        Ok(())
    }

    /// The whole buffer copied to a host vector (synchronous).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; to_usize(self.len, "read")?];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Queues a copy of `src` to `offset` on `stream`. The driver stages
    /// pageable host memory before returning, so `src` may be dropped after
    /// the call.
    pub fn write_async(&self, offset: u64, src: &[u8], stream: &CudaStream) -> Result<()> {
        self.check_range(offset, src.len(), "write")?;
        self.check_stream(stream)?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `src` is a live slice in pageable memory (a Rust slice the
        // caller owns: staged by the driver before the call returns); the
        // destination was checked; the stream belongs to this context.
        unsafe { ffi::copy_htod_async(self.ptr + offset, src.as_ptr(), src.len(), stream.cu_stream()) }?;
        Ok(())
    }

    /// Queues an asynchronous copy of all of `src` (page-locked) to `offset`
    /// on `stream`.
    ///
    /// # Safety
    /// `src` is neither written nor freed until `stream` has passed the copy.
    pub unsafe fn copy_from_pinned_async(&self, offset: u64, src: &PinnedMemory, stream: &CudaStream) -> Result<()> {
        let n = to_usize(src.len, "copy")?;
        self.check_range(offset, n, "copy destination")?;
        self.check_stream(stream)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: `src` is page-locked memory of `n` bytes, kept alive and
        // unwritten until the stream passes the copy (the caller's
        // obligation); the destination range was checked.
        unsafe { ffi::copy_htod_async(self.ptr + offset, src.host.as_ptr(), n, stream.cu_stream()) }?;
        Ok(())
    }

    /// Queues a fill of the whole buffer with `value` on `stream`.
    pub fn fill_async(&self, value: u8, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        if self.len == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the whole allocation; the stream belongs to this context.
        unsafe { ffi::memset_async(self.ptr, value, self.len as usize, stream.cu_stream()) }?;
        Ok(())
    }

    /// Queues a device-to-device copy of `bytes` from `src` (a device
    /// address range the caller vouches for through `src_mem`) on `stream`.
    pub fn copy_from_async(
        &self,
        offset: u64,
        src_mem: &DeviceMemory,
        src_offset: u64,
        bytes: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = to_usize(bytes, "copy")?;
        self.check_range(offset, n, "copy destination")?;
        src_mem.check_range(src_offset, n, "copy source")?;
        self.check_stream(stream)?;
        if n == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: both ranges were checked against their allocations, which
        // live for the call (queued work must not outlive them: module doc).
        unsafe { ffi::copy_dtod_async(self.ptr + offset, src_mem.ptr + src_offset, n, stream.cu_stream()) }?;
        Ok(())
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if **stream.context() != *self.ctx {
            return Err(Error::InvalidArgument("stream belongs to another context than the memory".into()));
        }
        Ok(())
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // SAFETY: `ptr` came from device_alloc in this context and is freed
        // exactly once, here.
        release(&self.ctx, "cuMemFree", || unsafe { ffi::device_free(self.ptr) });
    }
}

// SAFETY: `device_ptr()` is a device address of `len()` bytes owned by this
// value until drop; there is no host pointer.
unsafe impl MemoryRegion for DeviceMemory {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn alignment(&self) -> u64 {
        // cuMemAlloc aligns to at least 256 bytes.
        256
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        None
    }
    fn device_ptr(&self) -> Option<u64> {
        (self.ptr != 0).then_some(self.ptr)
    }
}

/// Page-locked host memory mapped for the device, from
/// `cuMemHostAlloc(DEVICEMAP | PORTABLE)`; zeroed at allocation.
pub struct PinnedMemory {
    host: NonNull<u8>,
    device: u64,
    len: u64,
    /// Declared last: dropped after `Drop::drop` freed the memory.
    ctx: Arc<CudaContext>,
}

// SAFETY: the memory is owned by this value and reachable from any thread;
// concurrent access follows the MemoryRegion contract (callers synchronise).
unsafe impl Send for PinnedMemory {}
// SAFETY: see Send; `&PinnedMemory` hands out only raw pointers.
unsafe impl Sync for PinnedMemory {}

impl std::fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("host", &self.host)
            .field("device", &format_args!("{:#x}", self.device))
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedMemory {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: u64) -> Result<Self> {
        let n = to_usize(bytes, "pinned allocation")?;
        if n == 0 {
            return Err(Error::InvalidArgument("pinned allocation of zero bytes".into()));
        }
        ctx.bind_to_thread()?;
        // SAFETY: the driver was probed and the context is current.
        let p = unsafe { ffi::host_alloc_mapped(n) }?;
        let Some(host) = NonNull::new(p) else {
            return Err(Error::InvalidArgument("cuMemHostAlloc returned a null pointer".into()));
        };
        // Build the value first so an error below frees the memory.
        let mut mem = PinnedMemory { host, device: 0, len: bytes, ctx: ctx.clone() };
        // SAFETY: `host` points to `n` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, n) };
        // SAFETY: `host` is mapped memory from host_alloc_mapped; context current.
        mem.device = unsafe { ffi::host_device_ptr(host.as_ptr()) }?;
        Ok(mem)
    }

    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.device
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // SAFETY: the pointer came from host_alloc_mapped and is freed
        // exactly once, here.
        release(&self.ctx, "cuMemFreeHost", || unsafe { ffi::host_free(self.host.as_ptr()) });
    }
}

// SAFETY: `host` points to `len` readable and writable bytes, page-aligned
// (alignment() reports the actual alignment), and `device` is the device
// address of the same bytes; both live until drop.
unsafe impl MemoryRegion for PinnedMemory {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Pinned
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn alignment(&self) -> u64 {
        alignment_of(self.host.as_ptr() as u64)
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.host)
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.device)
    }
}

/// A host region page-locked and mapped for the device in place
/// (`cuMemHostRegister` with DEVICEMAP | PORTABLE, and READ_ONLY where the
/// device supports it: kernels only read a table, and recent Linux kernels
/// refuse writable pins of file-backed shared mappings). The wrapped region
/// keeps its kind and name; the device pointer addresses the same bytes, so
/// a kernel reads what other processes write there, with no copy. Kernels
/// must not write through the device pointer.
///
/// Registration needs memory the kernel can pin: anonymous or shared
/// (`/dev/shm`) mappings work; a refusal is reported as an error.
pub struct RegisteredRegion<R: MemoryRegion> {
    /// Unregistered in `Drop::drop`, before this field is dropped.
    inner: R,
    host: NonNull<u8>,
    device: u64,
    read_only: bool,
    /// Declared last: outlives both the registration and `inner`.
    ctx: Arc<CudaContext>,
}

// SAFETY: `inner` is Send + Sync (MemoryRegion's supertraits); the raw
// pointer is derived from it and the device address is plain data.
unsafe impl<R: MemoryRegion> Send for RegisteredRegion<R> {}
// SAFETY: see Send.
unsafe impl<R: MemoryRegion> Sync for RegisteredRegion<R> {}

impl<R: MemoryRegion> std::fmt::Debug for RegisteredRegion<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredRegion")
            .field("kind", &self.inner.kind())
            .field("name", &self.inner.name())
            .field("len", &self.inner.len())
            .field("device", &format_args!("{:#x}", self.device))
            .finish()
    }
}

impl<R: MemoryRegion> RegisteredRegion<R> {
    pub(crate) fn register(ctx: &Arc<CudaContext>, region: R) -> Result<Self> {
        let host = region
            .host_ptr()
            .ok_or_else(|| Error::InvalidArgument("only host-addressable regions can be registered".into()))?;
        if region.device_ptr().is_some() {
            return Err(Error::InvalidArgument("region is already mapped for a device".into()));
        }
        let n = to_usize(region.len(), "registration")?;
        if n == 0 {
            return Err(Error::InvalidArgument("cannot register an empty region".into()));
        }
        ctx.bind_to_thread()?;
        let attr = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED;
        let read_only = ctx.attribute(attr).is_ok_and(|v| v != 0);
        // SAFETY: `host` points to `n` bytes that live as long as `region`,
        // which the returned value owns and drops only after unregistering;
        // the context is current.
        unsafe { ffi::host_register(host.as_ptr(), n, read_only) }?;
        // SAFETY: the range was just registered; context current.
        let device = match unsafe { ffi::host_device_ptr(host.as_ptr()) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: registered just above, unregistered once here.
                let _ = unsafe { ffi::host_unregister(host.as_ptr()) };
                return Err(e.into());
            }
        };
        Ok(RegisteredRegion { inner: region, host, device, read_only, ctx: ctx.clone() })
    }

    /// Whether the device maps the region read-only
    /// (`CU_MEMHOSTREGISTER_READ_ONLY`, used where the device supports it).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The wrapped region.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.device
    }
}

impl<R: MemoryRegion> Drop for RegisteredRegion<R> {
    fn drop(&mut self) {
        // SAFETY: `host` is the start of the range registered in
        // `register`, unregistered exactly once, here, while `inner` (the
        // memory) is still alive: it is dropped after this function.
        release(&self.ctx, "cuMemHostUnregister", || unsafe { ffi::host_unregister(self.host.as_ptr()) });
    }
}

// SAFETY: host pointer, length, alignment and name are the wrapped region's
// (which keeps its own promises); `device` maps the same `len()` bytes for
// as long as this value lives.
unsafe impl<R: MemoryRegion> MemoryRegion for RegisteredRegion<R> {
    fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.host)
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.device)
    }
    fn name(&self) -> Option<&str> {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::{alignment_of, release_with};

    /// A recorded error (or a failure to make the context current) must not
    /// skip the release: the old `if bind_to_thread().is_ok()` guard did.
    #[test]
    fn release_runs_even_when_the_context_reports_an_error() {
        let mut freed = false;
        let failures = release_with(
            Err("CUDA_ERROR_LAUNCH_FAILED recorded earlier"),
            || {
                freed = true;
                Ok(())
            },
            "cuMemFree",
        );
        assert!(freed);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("releasing anyway"));
        let failures = release_with(Ok(()), || Err("CUDA_ERROR_INVALID_VALUE"), "cuMemFreeHost");
        assert_eq!(failures.len(), 1);
        assert!(failures[0].starts_with("cuMemFreeHost failed"));
        assert!(release_with::<&str>(Ok(()), || Ok(()), "x").is_empty());
    }

    #[test]
    fn alignment_is_the_lowest_set_bit_capped_at_a_page() {
        assert_eq!(alignment_of(0x1000_0000), 4096);
        assert_eq!(alignment_of(0x1000_0040), 64);
        assert_eq!(alignment_of(0x1000_0001), 1);
    }
}
