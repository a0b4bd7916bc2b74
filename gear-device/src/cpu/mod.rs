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

mod device;
mod exec;
mod stream;
mod tracker;

use crate::error::{Error, Result};
use gear_core::{DeviceApi, DeviceBuffer, MemoryKind, MemoryRegion};
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
    /// [`Device::alloc`](gear_core::Device::alloc) and
    /// [`Device::alloc_pinned`](gear_core::Device::alloc_pinned).
    Alloc,
    /// [`Device::record`](gear_core::Device::record).
    Record,
    /// [`Device::launch`](gear_core::Device::launch).
    Launch,
    /// [`Device::write`](gear_core::Device::write) and the other copies.
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
