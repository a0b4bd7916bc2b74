//! The raw FFI calls that cudarc's safe layer does not cover: page-locked host allocation and
//! registration, and byte copies between raw host pointers and device
//! addresses. Every function is `unsafe` with its obligations listed; the
//! safe types in `memory`, `cache` and `probe` uphold them.
//!
//! Callers must have probed the driver ([`crate::probe::driver`]) before any
//! `cu*` call here: cudarc resolves the symbols lazily and panics when the
//! library is missing.

use cudarc::driver::{sys, DriverError};
use std::ffi::c_void;

/// Allocates `bytes` of page-locked host memory, portable across contexts
/// and mapped into the device address space.
///
/// # Safety
/// The driver was probed and a context is current on this thread.
pub(crate) unsafe fn host_alloc_mapped(bytes: usize) -> Result<*mut u8, DriverError> {
    let mut p: *mut c_void = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: `p` is a valid out-pointer; the caller guarantees the driver
    // is loaded and a context is current.
    unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) }.result()?;
    Ok(p.cast())
}

/// Makes `ctx` current on this thread.
///
/// # Safety
/// `ctx` is a live context; the driver was probed.
pub(crate) unsafe fn set_current(ctx: sys::CUcontext) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuCtxSetCurrent(ctx) }.result()
}

/// Frees memory from [`host_alloc_mapped`].
///
/// # Safety
/// `p` came from [`host_alloc_mapped`], is freed once, and no device work
/// that uses it is pending.
pub(crate) unsafe fn host_free(p: *mut u8) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemFreeHost(p.cast()) }.result()
}

/// Page-locks `[p, p+bytes)` and maps it for every context (PORTABLE |
/// DEVICEMAP, plus READ_ONLY when `read_only`: the device may then only
/// read it).
///
/// # Safety
/// The range is valid host memory for as long as it stays registered; the
/// driver was probed and a context is current.
pub(crate) unsafe fn host_register(p: *mut u8, bytes: usize, read_only: bool) -> Result<(), DriverError> {
    let mut flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
    if read_only {
        flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
    }
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemHostRegister_v2(p.cast(), bytes, flags) }.result()
}

/// Undoes [`host_register`].
///
/// # Safety
/// `p` is the start of a range registered by [`host_register`], unregistered
/// once, with no device work that uses it pending.
pub(crate) unsafe fn host_unregister(p: *mut u8) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemHostUnregister(p.cast()) }.result()
}

/// The device address of page-locked, mapped host memory.
///
/// # Safety
/// `p` lies in memory from [`host_alloc_mapped`] or [`host_register`]; a
/// context is current.
pub(crate) unsafe fn host_device_ptr(p: *mut u8) -> Result<u64, DriverError> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `d` is a valid out-pointer; flags must be 0 per the driver API.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p.cast(), 0) }.result()?;
    Ok(d)
}

/// Allocates `bytes` (> 0) of device memory.
///
/// # Safety
/// The driver was probed and a context is current.
pub(crate) unsafe fn device_alloc(bytes: usize) -> Result<u64, DriverError> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `d` is a valid out-pointer.
    unsafe { sys::cuMemAlloc_v2(&mut d, bytes) }.result()?;
    Ok(d)
}

/// Frees device memory.
///
/// # Safety
/// `d` came from [`device_alloc`], is freed once, with no work using it
/// pending; its context is current.
pub(crate) unsafe fn device_free(d: u64) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemFree_v2(d) }.result()
}

/// Copies `bytes` from host to device, returning when the copy is done.
///
/// # Safety
/// `src` is readable for `bytes`, `dst` is device memory of at least
/// `bytes`; a context is current.
pub(crate) unsafe fn copy_htod(dst: u64, src: *const u8, bytes: usize) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemcpyHtoD_v2(dst, src.cast(), bytes) }.result()
}

/// Queues a host-to-device copy on `stream`. From pageable memory the driver
/// stages the bytes before returning, so `src` may be reused at once; from
/// page-locked memory the copy is asynchronous and `src` must stay untouched
/// until the stream reaches it.
///
/// # Safety
/// As for [`copy_htod`], plus the page-locked rule above; `stream` belongs
/// to the current context.
pub(crate) unsafe fn copy_htod_async(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream) }.result()
}

/// Copies `bytes` from device to host, returning when the copy is done.
///
/// # Safety
/// `dst` is writable for `bytes`, `src` is device memory of at least
/// `bytes`; a context is current.
pub(crate) unsafe fn copy_dtoh(dst: *mut u8, src: u64, bytes: usize) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemcpyDtoH_v2(dst.cast(), src, bytes) }.result()
}

/// Queues a device-to-device copy on `stream`.
///
/// # Safety
/// Both ranges are device memory of at least `bytes`; `stream` belongs to
/// the current context.
pub(crate) unsafe fn copy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) }.result()
}

/// Queues a byte fill on `stream`.
///
/// # Safety
/// `dst` is device memory of at least `bytes`; `stream` belongs to the
/// current context.
pub(crate) unsafe fn memset_async(dst: u64, value: u8, bytes: usize, stream: sys::CUstream) -> Result<(), DriverError> {
    // SAFETY: forwarded obligations.
    unsafe { sys::cuMemsetD8Async(dst, value, bytes, stream) }.result()
}

/// A host function queued with [`launch_host_fn`].
type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// Runs the boxed function `data` points at (the driver calls this on its
/// callback thread when the stream reaches it). A panic is caught: it
/// must not unwind into the driver.
unsafe extern "C" fn run_host_fn(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Box<HostFn>` leaked by `launch_host_fn`, and
    // the driver calls each callback exactly once.
    let f = unsafe { Box::from_raw(data.cast::<HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(*f)).is_err() {
        tracing::error!("gear-cuda: a host function queued on a stream panicked");
    }
}

/// Queues `f` on `stream` (`cuLaunchHostFunc`): it runs on a driver thread
/// once the stream's earlier work completed, and holds later work until it
/// returns. `f` must not call CUDA.
///
/// # Safety
/// `stream` belongs to the current context; the driver was probed.
pub(crate) unsafe fn launch_host_fn(stream: sys::CUstream, f: HostFn) -> Result<(), DriverError> {
    let data = Box::into_raw(Box::new(f));
    // SAFETY: `run_host_fn` takes back the box `data` points at, once.
    let r = unsafe { sys::cuLaunchHostFunc(stream, Some(run_host_fn), data.cast()) }.result();
    if r.is_err() {
        // Not queued: the callback never runs, so the box is ours again.
        // SAFETY: `data` came from Box::into_raw above and was not consumed.
        drop(unsafe { Box::from_raw(data) });
    }
    r
}
