//! The CPU device: a [`DeviceApi`] that runs the same kernels as a GPU (the
//! `.cu` sources compiled as C++, `cpu/kernels.cpp`) on worker threads, one
//! per stream, asynchronously to the host, with events, asynchronous
//! copies, and frees that poison memory, and that checks every rule of the
//! ordering model a GPU leaves to the programmer (see `gear_core::device`):
//!
//! * **use after free**: memory freed while queued work may still use it,
//!   and work that uses freed memory (pointer arguments, and the addresses
//!   the gather reads from its tables);
//! * **reads of device results before their event**: the host reading a
//!   buffer or pinned memory that queued work writes, before it waited;
//! * **unordered writes**: a write (by a stream or the host) to bytes that
//!   work on another stream reads or writes, with no event wait between.
//!
//! The checks use the happens-before order of the calls (see `tracker`),
//! not timing, so a removed event wait fails the same test every run. A
//! misuse panics in the calling thread by default
//! ([`OnMisuse::Panic`]); found by a worker thread (while running a
//! kernel), it is kept and the next call into the device panics. With
//! [`OnMisuse::Record`] calls return [`Error::Misuse`] instead and
//! [`CpuDevice::misuse`] lists what was found, for tests that misuse the
//! device on purpose.
//!
//! Device addresses are host addresses (a kernel dereferences them), so
//! kernels read a registered table in place, as a GPU reads it over the
//! bus. Fresh device memory is filled with `0xA5` (a GPU's is undefined);
//! freed memory with `0xDB`, kept in quarantine (up to 256 MiB) so late uses
//! are reported as such. [`CpuDevice::fail_next`] makes chosen operations
//! fail, to test error paths.
//!
//! Figures measured on the CPU device are not GPU figures.

mod exec;
mod stream;
mod tracker;

use crate::error::{Error, Result};
use gear_core::{Access, Device, DeviceApi, DeviceBuffer, KernelArg, Launch, MemoryKind, MemoryRegion};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use stream::{StreamCore, StreamHandle, Work};
use tracker::{Actor, Clock, Kind, RawMemory, Touch, Tracker};

thread_local! {
    /// Set while a stream's worker runs a host function: host accesses made
    /// there are the stream's (device id, actor).
    static AS_STREAM: RefCell<Option<(u64, Actor)>> = const { RefCell::new(None) };
}

/// The marker type of the CPU device (see the module doc).
#[derive(Debug)]
pub enum CpuDeviceApi {}

impl DeviceApi for CpuDeviceApi {
    const NAME: &'static str = "cpu-device";
    type Device = CpuDevice;
    type Stream = CpuStream;
    type Event = CpuEvent;
    type Buffer = CpuBuffer;
    type Pinned = CpuPinned;
    type Registered<R: MemoryRegion + 'static> = CpuRegistered<R>;
    type Module = CpuModule;
    type Error = Error;
}

/// What the device does when it finds a misuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMisuse {
    /// Panic in the calling thread (or, when a worker found it, in the
    /// next call into the device), naming both operations.
    Panic,
    /// Return [`Error::Misuse`] from the call, and from every later call
    /// once a worker found one; [`CpuDevice::misuse`] lists them.
    Record,
}

/// How a [`CpuDevice`] behaves.
#[derive(Clone, Debug)]
pub struct CpuDeviceOptions {
    /// What a misuse does (default [`OnMisuse::Panic`]).
    pub on_misuse: OnMisuse,
    /// Each command waits a random 0 to `max_delay` before it runs (default
    /// 50 µs), so work completes late as on a busy GPU.
    pub max_delay: Duration,
    /// Seed of those pauses.
    pub seed: u64,
}

impl Default for CpuDeviceOptions {
    fn default() -> Self {
        CpuDeviceOptions { on_misuse: OnMisuse::Panic, max_delay: Duration::from_micros(50), seed: 0x5eed }
    }
}

/// Operations [`CpuDevice::fail_next`] can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailPoint {
    /// [`Device::alloc`] and [`Device::alloc_pinned`].
    Alloc,
    /// [`Device::record`].
    Record,
    /// [`Device::launch`].
    Launch,
    /// [`Device::write`] and the other copies.
    Copy,
}

const FAIL_POINTS: [FailPoint; 4] = [FailPoint::Alloc, FailPoint::Record, FailPoint::Launch, FailPoint::Copy];

pub(crate) struct DeviceState {
    id: u64,
    options: CpuDeviceOptions,
    tracker: Mutex<Tracker>,
    /// Streams of this device, for device-wide synchronisation.
    streams: Mutex<Vec<Weak<StreamCore>>>,
    /// A misuse found by a worker, not yet raised to a caller.
    pending: AtomicBool,
    fail: [AtomicU64; 4],
}

impl DeviceState {
    /// A worker found a misuse: keep it for the next call.
    fn report_from_worker(&self, message: String) {
        tracing::error!("gear cpu-device {}: misuse: {message}", self.id);
        self.tracker.lock().misuse.push(message);
        self.pending.store(true, Ordering::Release);
    }

    fn check_live(&self, addr: u64, len: u64) -> std::result::Result<(), String> {
        self.tracker.lock().live_range(addr, len.max(1)).map(|_| ())
    }

    fn live_range(&self, addr: u64, len: u64) -> std::result::Result<(u64, Kind), String> {
        self.tracker.lock().live_range(addr, len)
    }

    fn is_device_memory(&self, addr: u64) -> bool {
        self.tracker.lock().live_range(addr, 1).is_ok()
    }
}

/// A CPU device (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct CpuDevice {
    state: Arc<DeviceState>,
    stream: CpuStream,
    module: Arc<CpuModule>,
}

impl std::fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDevice").field("id", &self.state.id).finish()
    }
}

/// A stream of a [`CpuDevice`]: a queue run in order by a worker thread.
#[derive(Clone)]
pub struct CpuStream {
    handle: Arc<StreamHandle>,
}

impl std::fmt::Debug for CpuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuStream")
            .field("device", &self.handle.core.device_id)
            .field("actor", &self.handle.core.actor)
            .finish()
    }
}

impl CpuStream {
    fn core(&self) -> &Arc<StreamCore> {
        &self.handle.core
    }
}

/// What an event marks: a stream's position and the clock it had there.
#[derive(Clone)]
struct Mark {
    stream: Arc<StreamCore>,
    seq: u64,
    clock: Clock,
}

/// An event of a [`CpuDevice`].
pub struct CpuEvent {
    device_id: u64,
    mark: Mutex<Option<Mark>>,
}

impl std::fmt::Debug for CpuEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuEvent").field("device", &self.device_id).finish()
    }
}

/// Memory of a [`CpuDevice`] (device or pinned): freed, poisoned and
/// quarantined when dropped, after checking nothing queued still uses it.
struct Owned {
    addr: u64,
    len: u64,
    state: Arc<DeviceState>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        let found = self.state.tracker.lock().free(self.addr, "a drop (free)");
        raise_in_drop(&self.state, found);
    }
}

/// A misuse found while dropping: a drop cannot return it.
fn raise_in_drop(state: &DeviceState, found: Vec<String>) {
    if found.is_empty() {
        return;
    }
    for m in &found {
        tracing::error!("gear cpu-device {}: misuse: {m}", state.id);
    }
    match state.options.on_misuse {
        OnMisuse::Panic if !std::thread::panicking() => panic!("cpu-device misuse: {}", found.join("; ")),
        _ => state.pending.store(true, Ordering::Release),
    }
}

/// Device memory of a [`CpuDevice`].
pub struct CpuBuffer {
    owned: Option<Owned>,
    len: u64,
}

impl std::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBuffer")
            .field("addr", &format_args!("{:#x}", self.device_addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer for CpuBuffer {
    fn device_addr(&self) -> u64 {
        self.owned.as_ref().map_or(0, |o| o.addr)
    }
    fn len(&self) -> u64 {
        self.len
    }
}

/// Pinned host memory of a [`CpuDevice`].
pub struct CpuPinned {
    owned: Owned,
}

impl std::fmt::Debug for CpuPinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPinned")
            .field("addr", &format_args!("{:#x}", self.owned.addr))
            .field("len", &self.owned.len)
            .finish()
    }
}

impl DeviceBuffer for CpuPinned {
    fn device_addr(&self) -> u64 {
        self.owned.addr
    }
    fn len(&self) -> u64 {
        self.owned.len
    }
}

// SAFETY: the memory is owned by the allocation and reachable from any
// thread; access follows the device's rules (checked by the tracker).
unsafe impl MemoryRegion for CpuPinned {
    fn kind(&self) -> MemoryKind {
        MemoryKind::Pinned
    }
    fn len(&self) -> u64 {
        self.owned.len
    }
    fn alignment(&self) -> u64 {
        4096
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        NonNull::new(self.owned.addr as *mut u8)
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.owned.addr)
    }
}

/// A host region mapped for a [`CpuDevice`] in place.
pub struct CpuRegistered<R: MemoryRegion> {
    /// Unmapped (checked) in `Drop::drop`, before this field is dropped.
    inner: R,
    addr: u64,
    state: Arc<DeviceState>,
}

impl<R: MemoryRegion> std::fmt::Debug for CpuRegistered<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuRegistered")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.inner.len())
            .finish()
    }
}

impl<R: MemoryRegion> CpuRegistered<R> {
    /// The wrapped region.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: MemoryRegion> Drop for CpuRegistered<R> {
    fn drop(&mut self) {
        let found = self.state.tracker.lock().free(self.addr, "unregistering a host region");
        raise_in_drop(&self.state, found);
    }
}

// SAFETY: host pointer, length, alignment and name are the wrapped
// region's; the device address is the same host address, mapped (for the
// tracker) as long as this value lives.
unsafe impl<R: MemoryRegion> MemoryRegion for CpuRegistered<R> {
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
        self.inner.host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.addr)
    }
    fn name(&self) -> Option<&str> {
        self.inner.name()
    }
}

/// The kernels of a [`CpuDevice`] (linked in; nothing to load).
#[derive(Debug)]
pub struct CpuModule(());

static NEXT_DEVICE: AtomicU64 = AtomicU64::new(0);

impl CpuDevice {
    /// A device with the default options (misuse panics).
    pub fn new() -> Result<Self> {
        Self::with_options(CpuDeviceOptions::default())
    }

    /// A device with `options`. Unavailable when the crate was built
    /// without a C++ compiler (no kernels).
    pub fn with_options(options: CpuDeviceOptions) -> Result<Self> {
        if !exec::KERNELS_BUILT {
            return Err(Error::Unavailable(
                "gear-device was built without a C++ compiler, so the CPU device has no kernels".into(),
            ));
        }
        let state = Arc::new(DeviceState {
            id: NEXT_DEVICE.fetch_add(1, Ordering::Relaxed),
            options,
            tracker: Mutex::new(Tracker::default()),
            streams: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            fail: Default::default(),
        });
        let stream = new_stream(&state)?;
        Ok(CpuDevice { state, stream, module: Arc::new(CpuModule(())) })
    }

    /// Makes the next `n` operations of kind `point` fail with
    /// [`Error::Injected`].
    pub fn fail_next(&self, point: FailPoint, n: u64) {
        let i = FAIL_POINTS.iter().position(|&p| p == point).expect("listed");
        self.state.fail[i].store(n, Ordering::Relaxed);
    }

    /// Every misuse found so far, in order.
    pub fn misuse(&self) -> Vec<String> {
        self.state.tracker.lock().misuse.clone()
    }

    fn injected(&self, point: FailPoint) -> Result<()> {
        let i = FAIL_POINTS.iter().position(|&p| p == point).expect("listed");
        let f = &self.state.fail[i];
        let mut n = f.load(Ordering::Relaxed);
        while n > 0 {
            match f.compare_exchange(n, n - 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Err(Error::Injected(format!("{point:?}"))),
                Err(now) => n = now,
            }
        }
        Ok(())
    }

    /// Raises a misuse a worker found earlier.
    fn raise_pending(&self) -> Result<()> {
        if !self.state.pending.load(Ordering::Acquire) {
            return Ok(());
        }
        let all = self.misuse().join("; ");
        match self.state.options.on_misuse {
            OnMisuse::Panic => {
                self.state.pending.store(false, Ordering::Release);
                panic!("cpu-device misuse: {all}")
            }
            OnMisuse::Record => Err(Error::Misuse(all)),
        }
    }

    /// Raises misuses the calling thread just found.
    fn raise(&self, found: Vec<String>) -> Result<()> {
        if found.is_empty() {
            return Ok(());
        }
        for m in &found {
            tracing::error!("gear cpu-device {}: misuse: {m}", self.state.id);
        }
        match self.state.options.on_misuse {
            OnMisuse::Panic => panic!("cpu-device misuse: {}", found.join("; ")),
            OnMisuse::Record => Err(Error::Misuse(found.join("; "))),
        }
    }

    fn own(&self, stream: &CpuStream) -> Result<()> {
        if stream.core().device_id != self.state.id {
            return Err(Error::InvalidArgument("the stream belongs to another device".into()));
        }
        Ok(())
    }

    /// The actor a host call acts as: the stream whose host function runs
    /// on this thread, else the host.
    fn host_actor(&self) -> Actor {
        AS_STREAM.with(|s| match &*s.borrow() {
            Some((id, actor)) if *id == self.state.id => actor.clone(),
            _ => Actor::Host,
        })
    }

    /// Queues `work` on `stream` after checking `touches` (all under the
    /// tracker's lock, so the queue order is the tracker's order).
    fn enqueue(
        &self,
        stream: &CpuStream,
        touches: &[Touch],
        what: String,
        work: impl FnOnce(&Clock) -> Work,
    ) -> Result<()> {
        self.raise_pending()?;
        self.own(stream)?;
        let core = stream.core();
        let found = {
            let mut tr = self.state.tracker.lock();
            let (seq, clock) = tr.enqueue(core.actor);
            let found = tr.access(&Actor::Stream { actor: core.actor, seq, clock: clock.clone() }, touches, &what);
            let mut q = core.queue.lock();
            q.queued = seq;
            q.commands.push_back(stream::Command { seq, work: work(&clock), what });
            found
        };
        core.changed.notify_all();
        self.raise(found)
    }

    fn host_access(&self, touches: &[Touch], what: &str) -> Result<()> {
        self.raise_pending()?;
        let actor = self.host_actor();
        let found = self.state.tracker.lock().access(&actor, touches, what);
        self.raise(found)
    }

    fn alloc_owned(&self, bytes: u64, align: usize, fill: u8, kind: Kind) -> Result<Owned> {
        self.raise_pending()?;
        self.injected(FailPoint::Alloc)?;
        let mem = RawMemory::new(bytes, align, fill)
            .ok_or_else(|| Error::InvalidArgument(format!("cannot allocate {bytes} bytes")))?;
        let addr = mem.addr();
        self.state.tracker.lock().insert(addr, bytes, kind, Some(mem)).map_err(Error::InvalidArgument)?;
        Ok(Owned { addr, len: bytes, state: self.state.clone() })
    }

    fn stream_label(&self, stream: &CpuStream) -> String {
        format!("stream {}", stream.core().actor)
    }
}

fn new_stream(state: &Arc<DeviceState>) -> Result<CpuStream> {
    let actor = state.tracker.lock().add_stream();
    let handle =
        stream::spawn(state, actor).map_err(|e| Error::Unavailable(format!("cannot start a stream thread: {e}")))?;
    state.streams.lock().push(Arc::downgrade(&handle.core));
    Ok(CpuStream { handle })
}

fn whole(addr: u64, access: Access) -> Touch {
    Touch { addr, len: None, access }
}

fn range(addr: u64, len: u64, access: Access) -> Touch {
    Touch { addr, len: Some(len), access }
}

impl Device<CpuDeviceApi> for CpuDevice {
    fn ordinal(&self) -> usize {
        self.state.id as usize
    }

    fn name(&self) -> String {
        format!("cpu-device {} (the GPU kernels as C++ on worker threads)", self.state.id)
    }

    fn stream(&self) -> &CpuStream {
        &self.stream
    }

    fn new_stream(&self) -> Result<CpuStream> {
        self.raise_pending()?;
        new_stream(&self.state)
    }

    fn owns_stream(&self, stream: &CpuStream) -> bool {
        stream.core().device_id == self.state.id
    }

    fn same_stream(&self, a: &CpuStream, b: &CpuStream) -> bool {
        Arc::ptr_eq(a.core(), b.core())
    }

    fn module(&self) -> Result<Arc<CpuModule>> {
        self.raise_pending()?;
        Ok(self.module.clone())
    }

    fn alloc(&self, bytes: u64) -> Result<CpuBuffer> {
        if bytes == 0 {
            return Ok(CpuBuffer { owned: None, len: 0 });
        }
        // 256-byte aligned like cuMemAlloc; undefined contents shown as 0xA5.
        Ok(CpuBuffer { owned: Some(self.alloc_owned(bytes, 256, 0xA5, Kind::Device)?), len: bytes })
    }

    fn alloc_pinned(&self, bytes: u64) -> Result<CpuPinned> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("pinned allocation of zero bytes".into()));
        }
        Ok(CpuPinned { owned: self.alloc_owned(bytes, 4096, 0, Kind::Pinned)? })
    }

    fn register<R: MemoryRegion + 'static>(&self, region: R) -> Result<CpuRegistered<R>> {
        self.raise_pending()?;
        let host = region
            .host_ptr()
            .ok_or_else(|| Error::InvalidArgument("only host-addressable regions can be registered".into()))?;
        if region.device_ptr().is_some() {
            return Err(Error::InvalidArgument("region is already mapped for a device".into()));
        }
        if region.is_empty() {
            return Err(Error::InvalidArgument("cannot register an empty region".into()));
        }
        let addr = host.as_ptr() as u64;
        self.state.tracker.lock().insert(addr, region.len(), Kind::Registered, None).map_err(Error::InvalidArgument)?;
        Ok(CpuRegistered { inner: region, addr, state: self.state.clone() })
    }

    fn new_event(&self) -> Result<CpuEvent> {
        Ok(CpuEvent { device_id: self.state.id, mark: Mutex::new(None) })
    }

    fn write(&self, stream: &CpuStream, dst: &CpuBuffer, offset: u64, src: &[u8]) -> Result<()> {
        check_range(dst.len, offset, src.len() as u64, "write")?;
        self.injected(FailPoint::Copy)?;
        if src.is_empty() {
            return Ok(());
        }
        let to = dst.device_addr() + offset;
        let what = format!("write of {} bytes on {}", src.len(), self.stream_label(stream));
        let bytes = src.to_vec();
        self.enqueue(stream, &[range(to, src.len() as u64, Access::Write)], what, move |_| Work::CopyStaged {
            dst: to,
            bytes,
        })
    }

    unsafe fn upload(&self, stream: &CpuStream, dst: &CpuBuffer, offset: u64, src: *const u8, len: u64) -> Result<()> {
        check_range(dst.len, offset, len, "upload")?;
        self.injected(FailPoint::Copy)?;
        if len == 0 {
            return Ok(());
        }
        let to = dst.device_addr() + offset;
        let from = src as u64;
        let what = format!("upload of {len} bytes on {}", self.stream_label(stream));
        // The source is host memory; when it is a registered region or
        // pinned buffer of this device, its liveness is checked too.
        let mut touches = vec![range(to, len, Access::Write)];
        if self.state.is_device_memory(from) {
            touches.push(range(from, len, Access::Read));
        }
        self.enqueue(stream, &touches, what, move |_| Work::Copy { dst: to, src: from, len })
    }

    fn copy_from_pinned(
        &self,
        stream: &CpuStream,
        dst: &CpuBuffer,
        dst_offset: u64,
        src: &CpuPinned,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        check_range(dst.len, dst_offset, len, "copy destination")?;
        check_range(src.owned.len, src_offset, len, "copy source")?;
        self.injected(FailPoint::Copy)?;
        if len == 0 {
            return Ok(());
        }
        let (to, from) = (dst.device_addr() + dst_offset, src.owned.addr + src_offset);
        let what = format!("copy of {len} pinned bytes on {}", self.stream_label(stream));
        let touches = [range(to, len, Access::Write), range(from, len, Access::Read)];
        self.enqueue(stream, &touches, what, move |_| Work::Copy { dst: to, src: from, len })
    }

    fn fill(&self, stream: &CpuStream, dst: &CpuBuffer, value: u8) -> Result<()> {
        self.injected(FailPoint::Copy)?;
        if dst.len == 0 {
            return Ok(());
        }
        let (to, len) = (dst.device_addr(), dst.len);
        let what = format!("fill on {}", self.stream_label(stream));
        self.enqueue(stream, &[whole(to, Access::Write)], what, move |_| Work::Fill { dst: to, len, value })
    }

    fn copy(
        &self,
        stream: &CpuStream,
        dst: &CpuBuffer,
        dst_offset: u64,
        src: &CpuBuffer,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        check_range(dst.len, dst_offset, len, "copy destination")?;
        check_range(src.len, src_offset, len, "copy source")?;
        self.injected(FailPoint::Copy)?;
        if len == 0 {
            return Ok(());
        }
        let (to, from) = (dst.device_addr() + dst_offset, src.device_addr() + src_offset);
        let what = format!("device copy of {len} bytes on {}", self.stream_label(stream));
        let touches = [range(to, len, Access::Write), range(from, len, Access::Read)];
        self.enqueue(stream, &touches, what, move |_| Work::Copy { dst: to, src: from, len })
    }

    unsafe fn launch(&self, stream: &CpuStream, _module: &CpuModule, launch: &Launch<'_>) -> Result<()> {
        self.injected(FailPoint::Launch)?;
        let kernel = crate::kernels::KernelFn::by_name(launch.kernel)
            .ok_or_else(|| Error::InvalidArgument(format!("no kernel named `{}`", launch.kernel)))?;
        crate::launch::check_args(kernel, launch.args).map_err(Error::InvalidArgument)?;
        let mut touches = Vec::with_capacity(launch.args.len() + launch.indirect.len());
        let mut words = Vec::with_capacity(launch.args.len());
        for a in launch.args {
            words.push(match *a {
                KernelArg::U32(v) => u64::from(v),
                KernelArg::U64(v) => v,
                KernelArg::I64(v) => v as u64,
                KernelArg::F64(v) => v.to_bits(),
                KernelArg::Ptr(p, access) => {
                    touches.push(whole(p, access));
                    p
                }
            });
        }
        for i in launch.indirect {
            touches.push(Touch { addr: i.addr, len: i.len, access: i.access });
        }
        let declared = {
            let tr = self.state.tracker.lock();
            touches.iter().filter_map(|t| tr.live_range(t.addr, 1).ok().map(|(s, _)| (s, t.access))).collect()
        };
        let what = format!("{} on {}", launch.kernel, self.stream_label(stream));
        let call = exec::KernelCall { kernel, grid: launch.grid, block: launch.block, words, declared };
        self.enqueue(stream, &touches, what, move |_| Work::Kernel(call))
    }

    fn host_fn(&self, stream: &CpuStream, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        let what = format!("host function on {}", self.stream_label(stream));
        self.enqueue(stream, &[], what, move |clock| Work::HostFn { f, clock: clock.clone() })
    }

    fn record(&self, event: &CpuEvent, stream: &CpuStream) -> Result<()> {
        self.raise_pending()?;
        self.own(stream)?;
        self.injected(FailPoint::Record)?;
        if event.device_id != self.state.id {
            return Err(Error::InvalidArgument("the event belongs to another device".into()));
        }
        let core = stream.core();
        let tr = self.state.tracker.lock();
        let seq = core.queue.lock().queued;
        *event.mark.lock() = Some(Mark { stream: core.clone(), seq, clock: tr.stream_clock(core.actor) });
        Ok(())
    }

    fn wait(&self, stream: &CpuStream, event: &CpuEvent) -> Result<()> {
        self.raise_pending()?;
        self.own(stream)?;
        if event.device_id != self.state.id {
            return Err(Error::InvalidArgument("the event belongs to another device".into()));
        }
        let Some(mark) = event.mark.lock().clone() else { return Ok(()) };
        self.state.tracker.lock().stream_waits(stream.core().actor, &mark.clock);
        let what = format!("wait for stream {} on {}", mark.stream.actor, self.stream_label(stream));
        self.enqueue(stream, &[], what, move |_| Work::Wait { stream: mark.stream, seq: mark.seq })
    }

    fn event_synchronize(&self, event: &CpuEvent) -> Result<()> {
        self.raise_pending()?;
        let Some(mark) = event.mark.lock().clone() else { return Ok(()) };
        mark.stream.wait_for(mark.seq);
        self.state.tracker.lock().host_waited(&mark.clock);
        self.raise_pending()
    }

    fn event_done(&self, event: &CpuEvent) -> Result<bool> {
        self.raise_pending()?;
        let Some(mark) = event.mark.lock().clone() else { return Ok(true) };
        if !mark.stream.done(mark.seq) {
            return Ok(false);
        }
        self.state.tracker.lock().host_waited(&mark.clock);
        Ok(true)
    }

    fn stream_synchronize(&self, stream: &CpuStream) -> Result<()> {
        self.raise_pending()?;
        self.own(stream)?;
        let core = stream.core();
        let (seq, clock) = {
            let tr = self.state.tracker.lock();
            (core.queue.lock().queued, tr.stream_clock(core.actor))
        };
        core.wait_for(seq);
        self.state.tracker.lock().host_waited(&clock);
        self.raise_pending()
    }

    fn synchronize(&self) -> Result<()> {
        self.raise_pending()?;
        let streams: Vec<Arc<StreamCore>> = self.state.streams.lock().iter().filter_map(Weak::upgrade).collect();
        let marks: Vec<(Arc<StreamCore>, u64, Clock)> = {
            let tr = self.state.tracker.lock();
            streams.into_iter().map(|c| (c.clone(), c.queue.lock().queued, tr.stream_clock(c.actor))).collect()
        };
        for (core, seq, clock) in marks {
            core.wait_for(seq);
            self.state.tracker.lock().host_waited(&clock);
        }
        self.raise_pending()
    }

    fn read(&self, src: &CpuBuffer, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(src.len, offset, dst.len() as u64, "read")?;
        if dst.is_empty() {
            return Ok(());
        }
        let from = src.device_addr() + offset;
        self.host_access(&[range(from, dst.len() as u64, Access::Read)], "a host read of a device buffer")?;
        // SAFETY: the range lies in `src`'s live allocation (checked above
        // against its length) and no unordered device work writes it (the
        // tracker checked; a violation panicked or returned).
        unsafe { std::ptr::copy_nonoverlapping(from as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn write_now(&self, dst: &CpuBuffer, offset: u64, src: &[u8]) -> Result<()> {
        check_range(dst.len, offset, src.len() as u64, "write")?;
        if src.is_empty() {
            return Ok(());
        }
        let to = dst.device_addr() + offset;
        self.host_access(&[range(to, src.len() as u64, Access::Write)], "a host write of a device buffer")?;
        // SAFETY: as in `read`, for writing.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), to as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn read_pinned(&self, src: &CpuPinned, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(src.owned.len, offset, dst.len() as u64, "pinned read")?;
        if dst.is_empty() {
            return Ok(());
        }
        let from = src.owned.addr + offset;
        self.host_access(&[range(from, dst.len() as u64, Access::Read)], "a host read of pinned memory")?;
        // SAFETY: the range lies in `src` (checked); ordering was checked.
        unsafe { std::ptr::copy_nonoverlapping(from as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn write_pinned(&self, dst: &CpuPinned, offset: u64, src: &[u8]) -> Result<()> {
        check_range(dst.owned.len, offset, src.len() as u64, "pinned write")?;
        if src.is_empty() {
            return Ok(());
        }
        let to = dst.owned.addr + offset;
        self.host_access(&[range(to, src.len() as u64, Access::Write)], "a host write of pinned memory")?;
        // SAFETY: as in `read_pinned`, for writing.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), to as *mut u8, src.len()) };
        Ok(())
    }
}

fn check_range(len: u64, offset: u64, bytes: u64, what: &str) -> Result<()> {
    Ok(gear_core::device::check_range(len, offset, bytes, what)?)
}
