//! [`Device`] for [`CpuDevice`]: allocation, registration, streams and
//! events, the queued copies and launches, and the host's reads and
//! writes, each checked by the tracker before it is queued or done.

use super::exec;
use super::stream::{StreamCore, Work};
use super::tracker::{Clock, Kind, Touch};
use super::{
    new_stream, CpuBuffer, CpuDevice, CpuDeviceApi, CpuEvent, CpuModule, CpuPinned, CpuRegistered, CpuStream,
    FailPoint, Mark,
};
use crate::error::{Error, Result};
use gear_core::{Access, Device, DeviceBuffer, KernelArg, Launch, MemoryRegion};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

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
