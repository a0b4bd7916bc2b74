//! The device trait: what the sampling protocol needs of a GPU-like device,
//! written once so that the protocol (gear-device's collector, device
//! selection and cache, gear-api's `DeviceSampler`) runs on every device
//! that implements it: CUDA (gear-cuda), a CPU device that runs the same
//! kernels on worker threads and checks every ordering rule (gear-device's
//! `cpu` module, which CI runs), and later HIP/ROCm.
//!
//! In the style of wgpu-hal's `Api`: a marker type implementing
//! [`DeviceApi`] names the device's types (device handle, stream, event,
//! device buffer, pinned host buffer, registered host region, loaded
//! kernel module, error), and the device handle implements [`Device`],
//! whose methods are the operations. Static dispatch throughout: the
//! protocol is generic over `A: DeviceApi`.
//!
//! ## The ordering model (CUDA's)
//!
//! * Work is queued on a **stream** and runs in queue order, asynchronously
//!   to the host. Work on different streams is unordered unless a stream
//!   waits on an **event** recorded on another ([`Device::record`],
//!   [`Device::wait`]).
//! * The host sees a stream's results only after waiting for them: an event
//!   ([`Device::event_synchronize`], or [`Device::event_done`] returning
//!   `true`), the stream ([`Device::stream_synchronize`]) or the device.
//! * Memory must not be freed, and a buffer must not be written (by the host
//!   or by another stream), while queued work that reads it has not been
//!   waited for; a buffer queued work writes must not be read before that
//!   work is waited for. Drop of a [`DeviceApi::Buffer`] or
//!   [`DeviceApi::Pinned`] frees it at once: owners wait first.
//! * A registered region (a shared-memory table) is read by kernels while
//!   other processes write it; that race is the table's seqlock protocol's
//!   business (readers validate after the copy), not the device's.
//!
//! Kernels are the `.cu` sources of gear-device (`kernels/`), launched by
//! name with [`KernelArg`]s; each pointer argument says whether the kernel
//! reads or writes what it points at, and [`Launch::indirect`] lists memory
//! a kernel reaches through addresses stored in other buffers (the gather's
//! row and column tables). CUDA ignores both; the CPU device checks them.

use crate::memory::MemoryRegion;
use std::fmt::Debug;
use std::sync::Arc;

/// How a kernel (or a copy) uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only reads it.
    Read,
    /// Writes it (and may read it).
    Write,
}

/// One argument of a kernel launch, in the kernel's parameter order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 64-bit unsigned integer.
    U64(u64),
    /// A 64-bit signed integer.
    I64(i64),
    /// A double.
    F64(f64),
    /// A device address (passed as a 64-bit word), and how the kernel uses
    /// the buffer it lies in. Address 0 is a null pointer (never checked).
    Ptr(u64, Access),
}

/// Memory a kernel reaches through addresses it reads from another buffer
/// (not through a pointer argument), and how it uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indirect {
    /// The first byte (any address inside the buffer).
    pub addr: u64,
    /// Bytes from `addr`; `None`: to the end of the buffer `addr` lies in.
    pub len: Option<u64>,
    /// How the kernel uses it.
    pub access: Access,
}

/// One kernel launch.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    /// The kernel's `extern "C"` name (`gear_gather`, ...).
    pub kernel: &'static str,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// The arguments, in the kernel's parameter order.
    pub args: &'a [KernelArg],
    /// Buffers reached through addresses stored in other buffers.
    pub indirect: &'a [Indirect],
}

/// Checks that `bytes` bytes from `offset` lie in a buffer of `len` bytes,
/// for an operation named `what` (the error names it and the range).
pub fn check_range(len: u64, offset: u64, bytes: u64, what: &str) -> crate::Result<()> {
    if offset.checked_add(bytes).is_none_or(|end| end > len) {
        return Err(crate::Error::Device(format!(
            "{what}: bytes {offset}..{} outside a {len}-byte buffer",
            offset.saturating_add(bytes)
        )));
    }
    Ok(())
}

/// A buffer a kernel can address: device memory, or page-locked host
/// memory mapped for the device.
pub trait DeviceBuffer: Send + Sync {
    /// Device address of the first byte (0 for an empty buffer).
    fn device_addr(&self) -> u64;
    /// Size in bytes.
    fn len(&self) -> u64;
    /// Whether the buffer holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The types of one device implementation (a marker type implements it;
/// see the module doc).
pub trait DeviceApi: Sized + Send + Sync + 'static {
    /// A short lowercase name for messages and reports (`cuda`, `cpu-device`).
    const NAME: &'static str;
    /// The device handle: cheap to clone, carries the operations.
    type Device: Device<Self>;
    /// A queue of device work (cheap to clone; clones name the same queue).
    type Stream: Clone + Send + Sync + 'static;
    /// A marker recorded on a stream, waited on by streams or the host.
    type Event: Send + Sync + 'static;
    /// Device memory; freed when dropped.
    type Buffer: DeviceBuffer + 'static;
    /// Page-locked host memory mapped for the device, freed when dropped:
    /// one set of bytes with a host address and a device address (as a
    /// [`MemoryRegion`], it can hold a table). The host reads and writes it
    /// through [`Device::read_pinned`] and [`Device::write_pinned`] (or the
    /// host pointer, under the same rules), which a checking device verifies.
    type Pinned: DeviceBuffer + MemoryRegion + 'static;
    /// A host region mapped for the device in place (no copy); unmapped
    /// when dropped, before the region itself is.
    type Registered<R: MemoryRegion + 'static>: MemoryRegion + 'static;
    /// The kernels, loaded for one device.
    type Module: Send + Sync + 'static;
    /// The implementation's error; gear-core's refusals convert into it.
    type Error: std::error::Error + Send + Sync + 'static + From<crate::Error>;
}

/// The operations of a device (see the module doc for the ordering model
/// every implementation follows and every caller must respect).
pub trait Device<A: DeviceApi<Device = Self>>: Clone + Send + Sync + Debug + 'static {
    /// A number identifying the device among those of its kind in this
    /// process (the CUDA ordinal).
    fn ordinal(&self) -> usize;

    /// The device's name, for reports.
    fn name(&self) -> String;

    /// The stream this handle uses unless given another.
    fn stream(&self) -> &A::Stream;

    /// A new stream on this device.
    fn new_stream(&self) -> Result<A::Stream, A::Error>;

    /// Whether `stream` belongs to this device.
    fn owns_stream(&self, stream: &A::Stream) -> bool;

    /// Whether two handles name the same stream.
    fn same_stream(&self, a: &A::Stream, b: &A::Stream) -> bool;

    /// The kernels, loaded once per device and shared.
    fn module(&self) -> Result<Arc<A::Module>, A::Error>;

    /// `bytes` of device memory (contents undefined).
    fn alloc(&self, bytes: u64) -> Result<A::Buffer, A::Error>;

    /// `bytes` (> 0) of zeroed page-locked host memory mapped for the device.
    fn alloc_pinned(&self, bytes: u64) -> Result<A::Pinned, A::Error>;

    /// Maps `region` (host-addressable, not yet mapped) for the device in
    /// place, read-only for kernels. Mapping a range twice is an error.
    fn register<R: MemoryRegion + 'static>(&self, region: R) -> Result<A::Registered<R>, A::Error>;

    /// A new event (recorded nowhere yet: waiting on it returns at once).
    fn new_event(&self) -> Result<A::Event, A::Error>;

    /// Queues a copy of `src` to `dst[offset..]`. `src` is staged before
    /// the call returns, so it may be reused at once.
    fn write(&self, stream: &A::Stream, dst: &A::Buffer, offset: u64, src: &[u8]) -> Result<(), A::Error>;

    /// Queues a copy of `len` bytes of host memory at `src` to
    /// `dst[offset..]`.
    ///
    /// # Safety
    /// `src..src+len` is readable host memory (page-locked or registered
    /// for the copy to be asynchronous) that stays allocated, and is not
    /// written, until the stream has passed the copy.
    unsafe fn upload(
        &self,
        stream: &A::Stream,
        dst: &A::Buffer,
        offset: u64,
        src: *const u8,
        len: u64,
    ) -> Result<(), A::Error>;

    /// Queues a copy of `len` bytes of pinned memory `src[src_offset..]` to
    /// device memory `dst[dst_offset..]` (the staging copy of a trainer fed
    /// from host memory).
    fn copy_from_pinned(
        &self,
        stream: &A::Stream,
        dst: &A::Buffer,
        dst_offset: u64,
        src: &A::Pinned,
        src_offset: u64,
        len: u64,
    ) -> Result<(), A::Error>;

    /// Queues a fill of all of `dst` with `value`.
    fn fill(&self, stream: &A::Stream, dst: &A::Buffer, value: u8) -> Result<(), A::Error>;

    /// Queues a device-to-device copy of `len` bytes.
    fn copy(
        &self,
        stream: &A::Stream,
        dst: &A::Buffer,
        dst_offset: u64,
        src: &A::Buffer,
        src_offset: u64,
        len: u64,
    ) -> Result<(), A::Error>;

    /// Queues a kernel.
    ///
    /// # Safety
    /// The arguments match the kernel's parameters in number, order and
    /// type; every address the kernel reaches (pointer arguments and the
    /// addresses stored in the buffers they point at) lies in memory the
    /// kernel may use as `launch` declares it, sized for what the kernel
    /// touches given the scalar arguments, and alive until the stream has
    /// passed the launch.
    unsafe fn launch(&self, stream: &A::Stream, module: &A::Module, launch: &Launch<'_>) -> Result<(), A::Error>;

    /// Queues `f` to run on a host thread once the stream reaches it (work
    /// queued before has completed; work queued after waits for it). `f`
    /// must not call the device.
    fn host_fn(&self, stream: &A::Stream, f: Box<dyn FnOnce() + Send + 'static>) -> Result<(), A::Error>;

    /// Records `event` at the current end of `stream` (replacing what it
    /// marked before).
    fn record(&self, event: &A::Event, stream: &A::Stream) -> Result<(), A::Error>;

    /// Makes `stream`'s later work wait (on the device) for the work
    /// `event` marks now.
    fn wait(&self, stream: &A::Stream, event: &A::Event) -> Result<(), A::Error>;

    /// Blocks the host until the work `event` marks has completed.
    fn event_synchronize(&self, event: &A::Event) -> Result<(), A::Error>;

    /// Whether the work `event` marks has completed (without blocking);
    /// `true` counts as having waited for it.
    fn event_done(&self, event: &A::Event) -> Result<bool, A::Error>;

    /// Blocks the host until everything queued on `stream` has completed.
    fn stream_synchronize(&self, stream: &A::Stream) -> Result<(), A::Error>;

    /// Blocks the host until everything queued on the device has completed.
    fn synchronize(&self) -> Result<(), A::Error>;

    /// Copies `src[offset..]` into `dst` and returns when done. Queued
    /// work that writes `src` must have been waited for.
    fn read(&self, src: &A::Buffer, offset: u64, dst: &mut [u8]) -> Result<(), A::Error>;

    /// Copies `src` into `dst[offset..]` and returns when done. Queued work
    /// that uses `dst` must have been waited for.
    fn write_now(&self, dst: &A::Buffer, offset: u64, src: &[u8]) -> Result<(), A::Error>;

    /// Reads pinned memory from the host.
    ///
    /// # Safety
    /// Queued work that writes `src[offset..offset+dst.len()]` has been
    /// waited for (the CPU device checks this and reports a violation).
    unsafe fn read_pinned(&self, src: &A::Pinned, offset: u64, dst: &mut [u8]) -> Result<(), A::Error>;

    /// Writes pinned memory from the host.
    ///
    /// # Safety
    /// Queued work that reads or writes `dst[offset..offset+src.len()]`
    /// has been waited for (checked by the CPU device).
    unsafe fn write_pinned(&self, dst: &A::Pinned, offset: u64, src: &[u8]) -> Result<(), A::Error>;
}
