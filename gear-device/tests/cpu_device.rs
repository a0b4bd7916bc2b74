//! The CPU device itself: it runs work asynchronously on stream threads,
//! and it reports each misuse of the ordering model (gear-core's `device`
//! module doc) the moment the call that makes it happens, whatever the
//! timing. Misuses here are made on purpose, on devices built with
//! `OnMisuse::Record`, and must come back as `Error::Misuse` naming both
//! operations; the same calls in order must pass.

mod common;

use gear_core::{Access, Device, DeviceBuffer, KernelArg, Launch, MemoryRegion, SlotKey, TableRegion};
use gear_device::{CpuDevice, CpuDeviceOptions, DeviceCache, Error, FailPoint, OnMisuse, TrainStep};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn recording() -> Option<CpuDevice> {
    common::cpu_device_with(CpuDeviceOptions { on_misuse: OnMisuse::Record, ..Default::default() })
}

fn misuse<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Misuse(m)) => m,
        other => panic!("expected a misuse, got {other:?}"),
    }
}

/// Work runs after the call that queued it returns, in stream order, and
/// an event says when it is done.
#[test]
fn streams_run_their_work_asynchronously_in_order() {
    let Some(dev) = common::cpu_device() else { return };
    let s = dev.new_stream().unwrap();
    let buf = dev.alloc(64).unwrap();
    let step = TrainStep::<gear_device::CpuDeviceApi>::new(&dev).unwrap();
    let ev = dev.new_event().unwrap();
    let start = Instant::now();
    step.queue(&s, &[&buf], Duration::from_millis(200)).unwrap();
    dev.fill(&s, &buf, 7).unwrap();
    dev.record(&ev, &s).unwrap();
    assert!(start.elapsed() < Duration::from_millis(150), "queueing waited for the work");
    assert!(!dev.event_done(&ev).unwrap(), "the step cannot have finished yet");
    dev.event_synchronize(&ev).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200), "the step held its stream");
    let mut out = [0u8; 64];
    dev.read(&buf, 0, &mut out).unwrap();
    assert_eq!(out, [7; 64]);
    // A fresh allocation is not zeroed (a GPU's is undefined).
    let fresh = dev.alloc(16).unwrap();
    let mut f = [0u8; 16];
    dev.read(&fresh, 0, &mut f).unwrap();
    assert_eq!(f, [0xA5; 16]);
}

#[test]
fn freeing_memory_a_queued_kernel_uses_is_reported() {
    let Some(dev) = recording() else { return };
    let s = dev.stream().clone();
    let buf = dev.alloc(1 << 16).unwrap();
    let step = TrainStep::<gear_device::CpuDeviceApi>::new(&dev).unwrap();
    step.queue(&s, &[&buf], Duration::from_millis(50)).unwrap();
    drop(buf);
    let found = dev.misuse();
    assert!(found.iter().any(|m| m.contains("frees device buffer") && m.contains("gear_train_step")), "{found:?}");
    assert!(matches!(dev.stream_synchronize(&s), Err(Error::Misuse(_))), "later calls report it too");
    // Waiting first is the rule, and passes.
    let Some(dev) = recording() else { return };
    let buf = dev.alloc(1 << 16).unwrap();
    let step = TrainStep::<gear_device::CpuDeviceApi>::new(&dev).unwrap();
    step.queue(dev.stream(), &[&buf], Duration::ZERO).unwrap();
    dev.stream_synchronize(dev.stream()).unwrap();
    drop(buf);
    assert!(dev.misuse().is_empty());
}

#[test]
fn a_kernel_given_freed_memory_is_not_run() {
    let Some(dev) = recording() else { return };
    let buf = dev.alloc(256).unwrap();
    let addr = buf.device_addr();
    dev.stream_synchronize(dev.stream()).unwrap();
    drop(buf);
    let partial = dev.alloc(8 * 8192).unwrap();
    let args = [
        KernelArg::Ptr(addr, Access::Read),
        KernelArg::U64(256),
        KernelArg::U64(0),
        KernelArg::Ptr(partial.device_addr(), Access::Write),
    ];
    let l = Launch { kernel: "gear_train_step", grid: [32, 1, 1], block: [256, 1, 1], args: &args, indirect: &[] };
    let module = dev.module().unwrap();
    // SAFETY: a deliberate use after free, which the device refuses before
    // running anything.
    let m = misuse(unsafe { dev.launch(dev.stream(), &module, &l) });
    assert!(m.starts_with("use after free"), "{m}");
}

#[test]
fn reading_results_before_their_event_is_reported() {
    let Some(dev) = recording() else { return };
    let s = dev.new_stream().unwrap();
    let buf = dev.alloc(64).unwrap();
    dev.fill(&s, &buf, 1).unwrap();
    let mut out = [0u8; 64];
    let m = misuse(dev.read(&buf, 0, &mut out));
    assert!(m.contains("read of device buffer") && m.contains("fill on stream"), "{m}");
    // Pinned memory a stream writes: the same.
    let pinned = dev.alloc_pinned(64).unwrap();
    let ev = dev.new_event().unwrap();
    let d = dev.alloc(64).unwrap();
    dev.copy_from_pinned(&s, &d, 0, &pinned, 0, 64).unwrap();
    // SAFETY: a deliberate write under a queued read, which is refused.
    let m = misuse(unsafe { dev.write_pinned(&pinned, 0, &[9; 64]) });
    assert!(m.contains("write of pinned buffer"), "{m}");
    // After the event, reads and writes are fine.
    dev.record(&ev, &s).unwrap();
    dev.event_synchronize(&ev).unwrap();
    let Some(dev2) = recording() else { return };
    let b = dev2.alloc(8).unwrap();
    dev2.fill(dev2.stream(), &b, 3).unwrap();
    let ev = dev2.new_event().unwrap();
    dev2.record(&ev, dev2.stream()).unwrap();
    while !dev2.event_done(&ev).unwrap() {
        std::thread::yield_now();
    }
    let mut out = [0u8; 8];
    dev2.read(&b, 0, &mut out).unwrap();
    assert_eq!(out, [3; 8]);
}

#[test]
fn unordered_writes_across_streams_are_reported_and_event_waits_order_them() {
    let Some(dev) = recording() else { return };
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let buf = dev.alloc(1024).unwrap();
    let other = dev.alloc(1024).unwrap();
    dev.copy(&a, &other, 0, &buf, 0, 1024).unwrap();
    let m = misuse(dev.fill(&b, &buf, 0));
    assert!(m.contains("write of device buffer") && m.contains("device copy"), "{m}");

    let Some(dev) = recording() else { return };
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let buf = dev.alloc(1024).unwrap();
    let other = dev.alloc(1024).unwrap();
    let (ev, ev2) = (dev.new_event().unwrap(), dev.new_event().unwrap());
    dev.copy(&a, &other, 0, &buf, 0, 1024).unwrap();
    dev.record(&ev, &a).unwrap();
    dev.wait(&b, &ev).unwrap();
    dev.fill(&b, &buf, 0).unwrap();
    dev.record(&ev2, &b).unwrap();
    dev.wait(&a, &ev2).unwrap();
    // A read of some bytes and a write of others do not conflict.
    dev.copy(&a, &other, 0, &buf, 0, 512).unwrap();
    dev.write(&b, &buf, 512, &[1; 512]).unwrap();
    dev.synchronize().unwrap();
    assert!(dev.misuse().is_empty(), "{:?}", dev.misuse());
}

#[test]
fn a_range_is_registered_once_and_launches_must_fit_their_kernel() {
    let Some(dev) = recording() else { return };
    let region = common::SharedMapping::new(1 << 16);
    let again = region.host_ptr().unwrap();
    let reg = dev.register(region).unwrap();
    // The same range again (what CUDA refuses too).
    struct Alias(std::ptr::NonNull<u8>);
    // SAFETY: a test alias of a live mapping, used only to be refused.
    unsafe impl MemoryRegion for Alias {
        fn kind(&self) -> gear_core::MemoryKind {
            gear_core::MemoryKind::Shared
        }
        fn len(&self) -> u64 {
            4096
        }
        fn alignment(&self) -> u64 {
            4096
        }
        fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
            Some(self.0)
        }
    }
    // SAFETY: see Alias.
    unsafe impl Send for Alias {}
    // SAFETY: see Alias.
    unsafe impl Sync for Alias {}
    let err = dev.register(Alias(again)).unwrap_err();
    assert!(err.to_string().contains("already mapped"), "{err}");
    drop(reg);
    let module = dev.module().unwrap();
    let l = Launch {
        kernel: "gear_train_step",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        args: &[KernelArg::U64(1)],
        indirect: &[],
    };
    // SAFETY: refused before anything runs.
    let err = unsafe { dev.launch(dev.stream(), &module, &l) }.unwrap_err();
    assert!(err.to_string().contains("takes 4 arguments"), "{err}");
    let l = Launch { kernel: "gear_nothing", grid: [1, 1, 1], block: [1, 1, 1], args: &[], indirect: &[] };
    // SAFETY: refused before anything runs.
    assert!(unsafe { dev.launch(dev.stream(), &module, &l) }.is_err());
}

/// A failed `record` while an entry is being replaced used to leave that
/// entry marked as being filled for the cache's life: the cache lost one
/// entry of capacity per failure. Now nothing is taken out until every
/// mark is made, and the cache still fills to capacity.
#[test]
fn the_device_cache_keeps_its_capacity_when_marking_fails() {
    let Some(dev) = common::cpu_device() else { return };
    let spec =
        gear_core::TableSpec::new(vec![gear_core::ColumnSpec::new("x", gear_core::DType::U8, [64])], 8, 16).unwrap();
    let bytes = gear_core::RegionLayout::for_spec(&spec).unwrap().total_bytes;
    let table = Arc::new(TableRegion::create(dev.alloc_pinned(bytes).unwrap(), &spec).unwrap());
    common::fill_table(&table, 1);
    let keys: Vec<SlotKey> = common::commit_all(&table);
    let cache = Arc::new(DeviceCache::<gear_device::CpuDeviceApi, _>::new(&dev, table.clone(), 4).unwrap());
    let collector = gear_device::DeviceCollector::new(&dev).with_cache(cache.clone()).unwrap();
    // A gather that read the cache makes inserts mark its stream.
    cache.insert(keys[0]).unwrap();
    let bl = gear_core::BatchLayout::new(table.layout(), &[0], 1, gear_core::WindowSpec::last(8)).unwrap();
    let mut batch = collector.alloc(&bl).unwrap();
    collector.gather_into(&table.view(), &[gear_core::GatherRow::whole(0, 8)], &mut batch).unwrap();
    for k in &keys[1..4] {
        dev.fail_next(FailPoint::Record, 1);
        assert!(matches!(cache.insert(*k), Err(Error::Injected(_))));
    }
    for k in &keys[1..8] {
        cache.insert(*k).unwrap();
    }
    assert_eq!(cache.len(), 4, "every entry still usable");
    assert_eq!(cache.free_entries(), 0);
    assert_eq!(cache.keys(), keys[4..8].to_vec());
}
