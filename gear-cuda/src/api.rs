//! gear-core's device trait for CUDA: [`CudaApi`] names gear-cuda's types
//! (the device handle [`CudaDevice`], cudarc's streams and events,
//! [`DeviceMemory`], [`PinnedMemory`], [`RegisteredRegion`]) and
//! [`CudaDevice`] implements the operations with the driver API, so
//! gear-device's gather, device selection and cache, and gear-api's device
//! sampler, run on a GPU unchanged from what CI runs on the CPU device.
//!
//! Kernel arguments are passed as cudarc launch arguments; the access
//! declarations the CPU device checks (`Access`, `Launch::indirect`) are
//! not needed here.

use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::ffi;
use crate::memory::{DeviceMemory, PinnedMemory, RegisteredRegion};
use cudarc::driver::{CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use gear_core::{Device, DeviceApi, DeviceBuffer, KernelArg, Launch, MemoryRegion};
use std::collections::HashMap;
use std::sync::Arc;

/// The marker type of the CUDA device (see the module doc).
#[derive(Debug)]
pub enum CudaApi {}

impl DeviceApi for CudaApi {
    const NAME: &'static str = "cuda";
    type Device = CudaDevice;
    type Stream = Arc<CudaStream>;
    type Event = CudaEvent;
    type Buffer = DeviceMemory;
    type Pinned = PinnedMemory;
    type Registered<R: MemoryRegion + 'static> = RegisteredRegion<R>;
    type Module = CudaKernels;
    type Error = Error;
}

/// Every kernel, loaded for one device, by name.
pub struct CudaKernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels").field("kernels", &self.functions.len()).finish()
    }
}

impl CudaKernels {
    /// Loads every kernel of `device` (its modules are loaded once per
    /// process and device).
    pub(crate) fn load(device: &CudaDevice) -> Result<Self> {
        let functions = crate::kernels::KernelFn::ALL
            .iter()
            .map(|&f| Ok((f.name(), device.function(f)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(CudaKernels { functions })
    }
}

impl DeviceBuffer for DeviceMemory {
    fn device_addr(&self) -> u64 {
        DeviceMemory::device_addr(self)
    }
    fn len(&self) -> u64 {
        DeviceMemory::len(self)
    }
}

impl DeviceBuffer for PinnedMemory {
    fn device_addr(&self) -> u64 {
        PinnedMemory::device_addr(self)
    }
    fn len(&self) -> u64 {
        MemoryRegion::len(self)
    }
}

fn check_range(len: u64, offset: u64, bytes: u64, what: &str) -> Result<()> {
    Ok(gear_core::device::check_range(len, offset, bytes, what)?)
}

impl Device<CudaApi> for CudaDevice {
    fn ordinal(&self) -> usize {
        CudaDevice::ordinal(self)
    }

    fn name(&self) -> String {
        let (major, minor) = self.compute_capability();
        format!("{} (sm_{major}{minor})", CudaDevice::name(self))
    }

    fn stream(&self) -> &Arc<CudaStream> {
        CudaDevice::stream(self)
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>> {
        CudaDevice::new_stream(self)
    }

    fn owns_stream(&self, stream: &Arc<CudaStream>) -> bool {
        **stream.context() == **self.context()
    }

    fn same_stream(&self, a: &Arc<CudaStream>, b: &Arc<CudaStream>) -> bool {
        **a == **b
    }

    fn module(&self) -> Result<Arc<CudaKernels>> {
        self.kernels()
    }

    fn alloc(&self, bytes: u64) -> Result<DeviceMemory> {
        CudaDevice::alloc(self, bytes)
    }

    fn alloc_pinned(&self, bytes: u64) -> Result<PinnedMemory> {
        CudaDevice::alloc_pinned(self, bytes)
    }

    fn register<R: MemoryRegion + 'static>(&self, region: R) -> Result<RegisteredRegion<R>> {
        CudaDevice::register(self, region)
    }

    fn new_event(&self) -> Result<CudaEvent> {
        Ok(self.context().new_event(None)?)
    }

    fn write(&self, stream: &Arc<CudaStream>, dst: &DeviceMemory, offset: u64, src: &[u8]) -> Result<()> {
        dst.write_async(offset, src, stream)
    }

    unsafe fn upload(
        &self,
        stream: &Arc<CudaStream>,
        dst: &DeviceMemory,
        offset: u64,
        src: *const u8,
        len: u64,
    ) -> Result<()> {
        check_range(dst.len(), offset, len, "upload")?;
        if len == 0 {
            return Ok(());
        }
        self.context().bind_to_thread()?;
        // SAFETY: the destination range was checked against `dst`; the
        // source is the caller's obligation (readable host memory alive
        // until the stream passed the copy); the stream is the caller's, of
        // this context (checked by the driver).
        unsafe { ffi::copy_htod_async(dst.device_addr() + offset, src, len as usize, stream.cu_stream()) }?;
        Ok(())
    }

    fn copy_from_pinned(
        &self,
        stream: &Arc<CudaStream>,
        dst: &DeviceMemory,
        dst_offset: u64,
        src: &PinnedMemory,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        check_range(MemoryRegion::len(src), src_offset, len, "copy source")?;
        let host = src.host_ptr().expect("pinned memory has a host address").as_ptr();
        // SAFETY: the source range lies in `src` (checked), page-locked
        // memory the caller keeps alive and unwritten until the stream
        // passed the copy (the device trait's ordering rules).
        unsafe { self.upload(stream, dst, dst_offset, host.add(src_offset as usize), len) }
    }

    fn fill(&self, stream: &Arc<CudaStream>, dst: &DeviceMemory, value: u8) -> Result<()> {
        dst.fill_async(value, stream)
    }

    fn copy(
        &self,
        stream: &Arc<CudaStream>,
        dst: &DeviceMemory,
        dst_offset: u64,
        src: &DeviceMemory,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        dst.copy_from_async(dst_offset, src, src_offset, len, stream)
    }

    unsafe fn launch(&self, stream: &Arc<CudaStream>, module: &CudaKernels, launch: &Launch<'_>) -> Result<()> {
        let func = module
            .functions
            .get(launch.kernel)
            .ok_or_else(|| Error::InvalidArgument(format!("no kernel named `{}`", launch.kernel)))?;
        // The launch builder takes references that live until the launch:
        // every value is stored first, then pushed in order.
        let mut words = Vec::with_capacity(launch.args.len());
        let mut halves = Vec::with_capacity(launch.args.len());
        let mut signed = Vec::with_capacity(launch.args.len());
        let mut doubles = Vec::with_capacity(launch.args.len());
        for a in launch.args {
            match *a {
                KernelArg::U32(v) => halves.push(v),
                KernelArg::U64(v) | KernelArg::Ptr(v, _) => words.push(v),
                KernelArg::I64(v) => signed.push(v),
                KernelArg::F64(v) => doubles.push(v),
            }
        }
        let (mut w, mut h, mut s, mut d) = (words.iter(), halves.iter(), signed.iter(), doubles.iter());
        let mut b = stream.launch_builder(func);
        for a in launch.args {
            match a {
                KernelArg::U32(_) => b.arg(h.next().expect("stored")),
                KernelArg::U64(_) | KernelArg::Ptr(..) => b.arg(w.next().expect("stored")),
                KernelArg::I64(_) => b.arg(s.next().expect("stored")),
                KernelArg::F64(_) => b.arg(d.next().expect("stored")),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are the kernel's in number, order and type
        // (the caller's contract, checked by gear-device's `launch` against
        // the kernel's parameter list); what they point at is the caller's
        // contract too.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    fn host_fn(&self, stream: &Arc<CudaStream>, f: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        self.context().bind_to_thread()?;
        // SAFETY: the stream belongs to this device's context (the caller's
        // handle), made current just now; the driver was probed when the
        // device was opened.
        unsafe { ffi::launch_host_fn(stream.cu_stream(), f) }?;
        Ok(())
    }

    fn record(&self, event: &CudaEvent, stream: &Arc<CudaStream>) -> Result<()> {
        Ok(event.record(stream)?)
    }

    fn wait(&self, stream: &Arc<CudaStream>, event: &CudaEvent) -> Result<()> {
        Ok(stream.wait(event)?)
    }

    fn event_synchronize(&self, event: &CudaEvent) -> Result<()> {
        Ok(event.synchronize()?)
    }

    fn event_done(&self, event: &CudaEvent) -> Result<bool> {
        Ok(event.try_is_complete()?)
    }

    fn stream_synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        Ok(stream.synchronize()?)
    }

    fn synchronize(&self) -> Result<()> {
        CudaDevice::synchronize(self)
    }

    fn read(&self, src: &DeviceMemory, offset: u64, dst: &mut [u8]) -> Result<()> {
        src.read(offset, dst)
    }

    fn write_now(&self, dst: &DeviceMemory, offset: u64, src: &[u8]) -> Result<()> {
        dst.write(offset, src)
    }

    unsafe fn read_pinned(&self, src: &PinnedMemory, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range(MemoryRegion::len(src), offset, dst.len() as u64, "pinned read")?;
        let host = src.host_ptr().expect("pinned memory has a host address").as_ptr();
        // SAFETY: the range lies in `src` (checked); no device work writes
        // it now (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(host.add(offset as usize), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn write_pinned(&self, dst: &PinnedMemory, offset: u64, src: &[u8]) -> Result<()> {
        check_range(MemoryRegion::len(dst), offset, src.len() as u64, "pinned write")?;
        let host = dst.host_ptr().expect("pinned memory has a host address").as_ptr();
        // SAFETY: the range lies in `dst` (checked); no device work uses it
        // now (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), host.add(offset as usize), src.len()) };
        Ok(())
    }
}
